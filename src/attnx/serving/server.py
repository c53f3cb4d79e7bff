"""An HTTP translation service on LitServe: `POST /translate` with `{"text": [...]}`.

Three kinds of process, all started by `serve`:

- the main process checks the model loads, starts the others, prints one line when the service answers, and
  on SIGTERM or SIGINT shuts everything down in order (`serve` returns normally);
- HTTP processes (uvicorn, one per worker) check every request against `RequestLimits` before it is
  queued (`attnx.serving.validation.RequestLimitsMiddleware`), so a bad request is answered 4xx at
  once and never joins a batch;
- inference workers (`workers`, each with its own `attnx.inference.translator.Translator`, from `attnx.inference.load.load`) take up
  to `max_batch_size` queued requests, waiting at most `batch_timeout` seconds for the batch to fill,
  and translate all their lines with one `Translator.generate` call (which batches them by tokens) per
  search setting asked for (requests that change none share one call). A call that fails is made again
  for each of its requests alone: only a request that fails by itself is answered 500, its neighbours are
  translated as if it had not been sent.

Shutdown: the HTTP processes stop accepting, finish the requests they hold (up to 30 s), and only then are
the inference workers stopped. Send the signal to the main process; the workers ignore SIGINT so a Ctrl+C
sent to the whole process group cannot cut a batch short.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import litserve as ls

from attnx.errors import ConfigError
from attnx.inference.config import SearchConfig, worded
from attnx.inference.formats import hypothesis_fields
from attnx.serving.processes import (
    GracefulStop,
    announce_when_ready,
    check_port_free,
    exit_quietly,
    say,
    stop_processes,
)
from attnx.serving.settings import ServeSettings
from attnx.serving.validation import (
    CONSTRAINTS,
    FIELD,
    SCORES,
    SEARCH,
    RequestLimitsMiddleware,
    request_option,
)

if TYPE_CHECKING:
    from attnx.inference.translator import Translator

API_PATH = "/translate"
WARM_UP_LINE = "A dog runs."
"""What each inference worker translates once before it takes requests."""
WARM_UP_PIECES = 4
"""Target pieces the warm-up translation may have at most: enough to run every part of a decoding step."""
log = logging.getLogger(__name__)


def lines_of(payload: dict[str, Any]) -> list[str]:
    """The lines of a request already checked by `attnx.serving.validation.request_lines`."""
    text = payload[FIELD]
    return [text] if isinstance(text, str) else list(text)


def request_of(payload: dict[str, Any]) -> tuple[list[str], dict[str, Any], bool, list[Any]]:
    """A checked request as (lines, search settings it changes, whether it wants the hypotheses, each line's
    constraints)."""
    lines = lines_of(payload)
    given = payload.get(CONSTRAINTS)
    constraints = (
        [None] * len(lines) if given is None else [given] if isinstance(payload[FIELD], str) else given
    )
    return lines, dict(payload.get(SEARCH, {})), bool(payload.get(SCORES, False)), constraints


def split_as(flat: list[str], counts: list[int]) -> list[list[str]]:
    """`flat` cut into consecutive pieces of `counts` items."""
    pieces, start = [], 0
    for count in counts:
        pieces.append(flat[start : start + count])
        start += count
    return pieces


@dataclass(frozen=True)
class Failed:
    """The answer to a request that failed while decoding, alone (not the fault of a batch it was in)."""

    message: str
    status: int = 500
    """422 for settings that cannot work for this request (a phrase longer than its line may be), else 500."""


class TranslationAPI(ls.LitAPI):
    """The model side of the service: decode a request to lines, translate a batch of requests at once.

    Holds only settings until `setup` runs in an inference worker, so it pickles cheaply into one.

    Args:
        model: Checkpoint file or exported CTranslate2 directory (anything `attnx.load` reads).
        search: How to decode.
        max_tokens: Source tokens per decoding batch, padding included.
        threads: Torch threads per worker on CPU; 0 leaves torch's default.
        max_batch_size: Requests translated together at most.
        batch_timeout: Seconds a request may wait for others to fill its batch.
    """

    def __init__(
        self,
        model: str,
        search: SearchConfig,
        max_tokens: int,
        threads: int = 0,
        max_batch_size: int = 32,
        batch_timeout: float = 0.01,
        precision: str = "32-true",
        compute_type: str | None = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path=API_PATH)
        self.model = model
        self.search = search
        self.max_tokens = max_tokens
        self.threads = threads
        self.precision = precision
        self.compute_type = compute_type

    def setup(self, device: str) -> None:
        import torch

        from attnx.inference.load import load

        # The main process decides when this worker stops: it sends SIGTERM once no request is left, and the
        # worker then exits through SystemExit so that its resources (tqdm's semaphore...) are released.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, exit_quietly)
        warnings = logging.StreamHandler(sys.stderr)
        warnings.setFormatter(logging.Formatter("attnx serve: warning: %(message)s"))
        logging.getLogger("attnx").addHandler(warnings)
        if self.threads and torch.device(device).type == "cpu":
            torch.set_num_threads(self.threads)
        worker = f"inference worker (pid {os.getpid()})"
        say(f"{worker}: loading {self.model} on {device} in {self.compute_type or self.precision}")
        self.translator = load(
            self.model,
            device=device,
            search=self.search,
            max_tokens=self.max_tokens,
            precision=self.precision,
            compute_type=self.compute_type,
        )
        say(f"{worker}: warming up (one short line, so that the first request does not wait for it)")
        self.warm_up()
        say(f"{worker}: ready")

    def warm_up(self) -> None:
        """Translate [`WARM_UP_LINE`][attnx.serving.server.WARM_UP_LINE] to at most a few pieces, so that what
        an engine does on its first call (kernels chosen, buffers allocated, lazy imports) is done before the
        first request. A failure is one warning line and serving goes on: a request that fails the same way is
        answered with its own error."""
        try:
            self.translator.with_search(max_len_a=0.0, max_len_b=WARM_UP_PIECES).generate([WARM_UP_LINE])
        except Exception as err:
            log.warning("warming up failed (%s: %s); serving without it", type(err).__name__, err)

    # No annotation on purpose: LitServe turns an annotated `request` into a FastAPI parameter; unannotated,
    # it hands over the JSON body (already checked in the HTTP process).
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        return request_of(request)

    def predict(self, x: Any) -> Any:
        """One `generate` call over every line of the batch's requests that ask for the same search settings,
        then one answer per request. A call that raises is made again for each of its requests alone, so a
        request that fails (a case the HTTP process's checks did not foresee) fails by itself: it is answered
        500 with its error, its neighbours as if it had not been sent."""
        requests: list[tuple[list[str], dict[str, Any], bool, list[Any]]] = (
            x if self.max_batch_size > 1 else [x]
        )
        answers: list[dict[str, Any] | Failed] = [Failed("not translated") for _ in requests]
        groups: dict[str, list[int]] = {}
        for i, (_, changes, *_) in enumerate(requests):
            groups.setdefault(json.dumps(changes, sort_keys=True), []).append(i)
        for key, members in groups.items():
            try:
                self.answer(json.loads(key), [requests[i] for i in members], members, answers)
            except Exception as err:
                if len(members) == 1:
                    answers[members[0]] = self.failed(err)
                    continue
                for i in members:
                    try:
                        self.answer(json.loads(key), [requests[i]], [i], answers)
                    except Exception as alone:
                        answers[i] = self.failed(alone)
        return answers if self.max_batch_size > 1 else answers[0]

    def answer(
        self,
        changes: dict[str, Any],
        requests: list[tuple[list[str], dict[str, Any], bool, list[Any]]],
        members: list[int],
        answers: list[dict[str, Any] | Failed],
    ) -> None:
        """Translate `requests` (asking for `changes`) in one `generate` call; answers[members[j]] is the answer
        to requests[j]."""
        translator = self.translator.with_search(**changes) if changes else self.translator
        lines = [line for request in requests for line in request[0]]
        constraints = [c for request in requests for c in request[3]]
        flat = (
            translator.generate(lines, constraints=constraints)
            if any(constraints)
            else translator.generate(lines)
        )
        pieces = split_as(flat, [len(request[0]) for request in requests])
        for i, (_, _, scores, _), results in zip(members, requests, pieces, strict=True):
            answer: dict[str, Any] = {"translations": [hyps[0].text for hyps in results]}
            if scores or translator.search.nbest > 1:
                answer["hypotheses"] = [[hypothesis_fields(h) for h in hyps] for hyps in results]
            answers[i] = answer

    @staticmethod
    def failed(err: Exception) -> Failed:
        """The answer to a request that failed by itself: 422 for what it asked that cannot be done (a
        [ConfigError][attnx.errors.ConfigError], the client's to change: logged in one line), 500 for any
        other error (logged with its traceback)."""
        if isinstance(err, ConfigError):
            message = worded(err, request_option)  # a setting to change, as the client sets it
            log.warning("a request was refused while decoding; answered 422 alone: %s", message)
            return Failed(message, 422)
        log.error("a request failed while decoding; answered 500 alone", exc_info=err)
        return Failed(f"translating this request failed: {type(err).__name__}: {err}")

    def encode_response(self, output: dict[str, Any] | Failed) -> Any:
        if isinstance(output, Failed):
            from starlette.responses import JSONResponse

            return JSONResponse({"detail": output.message}, status_code=output.status)
        return output


def device_placement(device: str) -> tuple[str, list[int] | int]:
    """LitServe's `accelerator` and `devices` for a torch device name (`cuda` means `cuda:0`)."""
    import torch

    where = torch.device(device)
    if where.type == "cpu":
        return "cpu", 1
    if where.type in ("cuda", "mps"):
        return where.type, [where.index or 0]
    raise ConfigError(f"--device {device}: the server runs on cpu, cuda[:N] or mps")


def model_info(model: str, search: SearchConfig, settings: ServeSettings) -> dict[str, Any]:
    """What `GET /info` tells about the model (under `"model"`), JSON-serializable."""
    from attnx import __version__

    return {
        "path": str(Path(model).resolve()),
        "format": "ctranslate2" if Path(model).is_dir() else "checkpoint",
        "attnx": __version__,
        "device": settings.device,
        "precision": settings.compute_type or settings.precision,
        "search": dataclasses.asdict(search),
        "max_tokens": settings.max_tokens,
        "batching": {"max_batch_size": settings.max_batch_size, "batch_timeout": settings.batch_timeout},
        "limits": dataclasses.asdict(settings.limits),
        "workers": settings.workers,
    }


def build_server(model: str, search: SearchConfig, settings: ServeSettings) -> ls.LitServer:
    """The LitServer for `model` (nothing started yet). `search` should be the resolved settings."""
    accelerator, devices = device_placement(settings.device)
    api = TranslationAPI(
        model,
        search,
        max_tokens=settings.max_tokens,
        threads=settings.threads,
        max_batch_size=settings.max_batch_size,
        batch_timeout=settings.batch_timeout,
        precision=settings.precision,
        compute_type=settings.compute_type,
    )
    return ls.LitServer(
        api,
        accelerator=accelerator,
        devices=devices,
        workers_per_device=settings.workers,
        timeout=settings.timeout,
        model_metadata=model_info(model, search, settings),
        middlewares=[
            (RequestLimitsMiddleware, {"path": API_PATH, "limits": settings.limits, "search": search})
        ],
    )


def resolved_precision(
    model: str, settings: ServeSettings, loaded: Translator | None = None
) -> ServeSettings:
    """`settings` with `auto` resolved on their device (measured on the model and said once, here): every
    worker then decodes in the same precision, and `/info` names it. `loaded`: the model already loaded on the
    CPU, which a CPU server measures instead of loading it again."""
    from attnx.inference.load import DecodingPrecision, decoding_precision

    if loaded is not None and str(settings.device).split(":")[0] == "cpu":
        runs_in = DecodingPrecision.of(loaded, settings.precision)
    else:
        runs_in = decoding_precision(model, settings.precision, settings.device)
    return dataclasses.replace(settings, precision=runs_in.precision, compute_type=runs_in.compute_type)


def serve(model: str, search: SearchConfig, settings: ServeSettings) -> None:
    """Check `model` loads, then serve it until SIGTERM or SIGINT; returns after a clean shutdown."""
    from attnx.checkpoint.ema import checkpoint_weights_line
    from attnx.inference.load import load

    check_port_free(settings.host, settings.port)
    # Load once here so a bad model or search setting is a one-line error, not a worker's traceback; the
    # workers load their own copy, in the precision chosen here once for all of them.
    on_cpu = str(settings.device).split(":")[0] == "cpu"
    check = load(
        model,
        device="cpu",
        search=search,
        max_tokens=settings.max_tokens,
        precision=settings.precision if on_cpu else "32-true",
        compute_type=settings.compute_type if on_cpu else None,
    )
    if ema := checkpoint_weights_line(model, "serve"):  # from what the check read
        print(ema, flush=True)
    resolved = check.search
    settings = resolved_precision(model, settings, check)
    server = build_server(model, resolved, settings)
    ready = threading.Event()
    announce_when_ready(
        settings.url,
        f'attnx serve: ready: {model} on {settings.url}{API_PATH} (POST {{"text": [...]}}; GET /health, /info)',
        ready,
    )
    workers = f"{settings.workers} inference worker{'s' if settings.workers > 1 else ''}"
    say(
        f"starting {workers} on {settings.device} in {settings.compute_type or settings.precision}, then the "
        f"HTTP server on {settings.url}"
    )
    with GracefulStop() as stop:
        before = set(multiprocessing.active_children())
        try:
            server.run(
                host=settings.host,
                port=settings.port,
                log_level="warning",
                generate_client_file=False,
            )
        except KeyboardInterrupt:  # a signal before LitServe was serving: stop what it had started
            # LitServer.run starts its request manager and workers, then waits for the workers to load; a
            # signal meanwhile escapes it before its own shutdown path (which runs only once uvicorn is up),
            # and it has no public way to stop them. They are this process's children that were not there
            # before `run`, which multiprocessing lists publicly.
            stop_processes(set(multiprocessing.active_children()) - before)
        finally:
            ready.set()
    if stop.stopping:
        print("attnx serve: stopped", file=sys.stderr, flush=True)

"""`attnx export` and `attnx serve`: a trained model as another engine's model, or behind an HTTP API."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from attnx.commands.translate import own_search
from attnx.inference.config import Precision, SearchConfig
from attnx.serving.settings import RequestLimits, ServeSettings

SERVE = ServeSettings()
"""The server's own defaults: `attnx serve` offers each field of `ServeSettings` and `RequestLimits` as an
option with that default."""


def serve(
    model: str,
    host: str = SERVE.host,
    port: int = SERVE.port,
    search: SearchConfig | None = None,
    device: str = SERVE.device,
    max_tokens: int = SERVE.max_tokens,
    max_batch_size: int = SERVE.max_batch_size,
    batch_timeout: float = SERVE.batch_timeout,
    max_lines: int = SERVE.limits.max_lines,
    max_line_chars: int = SERVE.limits.max_line_chars,
    max_body_bytes: int = SERVE.limits.max_body_bytes,
    max_beam: int = SERVE.limits.max_beam,
    workers: int = SERVE.workers,
    threads: int = SERVE.threads,
    timeout: float = SERVE.timeout,
    precision: Precision = SERVE.precision,
) -> int:
    """Serve a trained model over HTTP: POST /translate, with concurrent requests translated together.

    POST /translate {"text": ["line", ...]} (or {"text": "one line"}) answers {"translations": [...]}, one
    translation per line in the same order, blank for blank. A request may change some search settings for
    itself, {"text": [...], "search": {"nbest": 4}} or {"search": {"sampling": true, "top_p": 0.9}}, and
    with n-best or "scores": true the answer also holds "hypotheses": per line, every hypothesis best first
    with text, score, log_prob and tokens (as attnx translate --format jsonl). Requests arriving together are translated together (up to --max_batch_size requests, waiting at most
    --batch_timeout seconds for them). GET /health answers "ok" once the model is loaded; GET /info shows the
    model, search settings and limits. A request over a limit, or not of that shape, gets a 4xx with
    {"detail": "<message>"}. SIGTERM or Ctrl+C finishes the requests in flight, then exits 0. Needs the serve
    extra: pip install "attnx[serve]".
    Example: attnx serve --model base.ckpt --port 8000

    Args:
        model: Checkpoint file (*.ckpt) or exported CTranslate2 directory.
        host: Interface to listen on: 127.0.0.1 (this machine only), 0.0.0.0 or :: (every interface).
        port: TCP port to listen on (1024-65535).
        search: Beam size, length penalty and maximum output length, each changing the model's own (a
            checkpoint: §6.1's beam 4, α 0.6, input + 50; an export: the settings stored with it, so --beam 2
            keeps its length penalty).
        device: Where to decode: cpu, cuda, cuda:1, ...
        max_tokens: Source tokens per decoding batch, padding included.
        max_batch_size: Requests translated together at most.
        batch_timeout: Seconds a request waits for others to join its batch.
        max_lines: Lines per request at most (413 above).
        max_line_chars: Characters per line at most (413 above).
        max_body_bytes: Bytes per request body at most (413 above).
        max_beam: Beam size or hypotheses per line (n-best, samples) a request's "search" may ask for.
        workers: Inference processes, each with its own copy of the model.
        threads: Torch threads per worker on CPU; 0: torch's default (all cores) for one worker, cores /
            workers for several.
        timeout: Seconds a request may wait in the queue before it is answered 504.
        precision: As attnx translate's: a checkpoint decodes in 32-true, bf16-mixed or 16-mixed (CUDA only);
            an export loads with the matching CTranslate2 compute type; auto (the default): chosen by a probe
            of the device once, before the workers start, and said on standard error.
    """
    import os

    from attnx.commands.translate import check_device
    from attnx.commands.usage import require_extra
    from attnx.errors import UsageError

    try:
        import litserve  # noqa: F401
    except ImportError:
        raise UsageError('attnx serve needs LitServe: pip install "attnx[serve]"') from None
    from attnx.inference.ctranslate2 import is_ctranslate2_model
    from attnx.serving.server import serve as run_server

    check_device(device)
    if not os.path.exists(model):
        raise FileNotFoundError(f"--model {model} does not exist")
    if is_ctranslate2_model(model):
        require_extra("ct2", f"attnx serve --model {model} (a CTranslate2 model)")
    if threads == 0 and workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
    settings = ServeSettings(
        host=host,
        port=port,
        device=device,
        max_tokens=max_tokens,
        max_batch_size=max_batch_size,
        batch_timeout=batch_timeout,
        timeout=timeout,
        workers=workers,
        threads=threads,
        precision=precision,
        limits=RequestLimits(
            max_lines=max_lines,
            max_line_chars=max_line_chars,
            max_body_bytes=max_body_bytes,
            max_beam=max_beam,
        ),
    )
    run_server(model, search, settings)  # it says which weights a checkpoint holds once it has read it
    return 0


serve.own_search = own_search  # --search.* change an export's stored settings


Quantization = Literal[
    "none", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16"
]
"""CTranslate2 weight types; `none` keeps the weights as trained (float32)."""


def export(
    ckpt_path: Path,
    format: Literal["ctranslate2", "huggingface"],
    output: Path,
    quantization: Quantization = "none",
    search: SearchConfig | None = None,
    force: bool = False,
) -> int:
    """Write a trained checkpoint as a CTranslate2 model (fast CPU/GPU inference, int8) or a Marian model.

    ctranslate2 (pip install "attnx[ct2]"): a directory that attnx translate --model, attnx serve and
    attnx.load read, and that ctranslate2.Translator loads with its sentencepiece.model. huggingface (pip
    install "attnx[hf]"): a MarianMTModel directory for transformers' from_pretrained. Components the engine
    cannot represent (a plugin's attention, pre-norm or learned positions for Marian) are refused by name.
    Example: attnx export --ckpt_path runs/multi30k_cpu/version_0/checkpoints/averaged.ckpt --format ctranslate2 --output model-ct2 --quantization int8

    Args:
        ckpt_path: Checkpoint written by attnx fit or attnx average.
        format: ctranslate2 or huggingface.
        output: Directory to create (it must not exist, or be empty, unless --force).
        quantization: ctranslate2 only: weight type; none keeps float32 as trained.
        search: ctranslate2 only: default search stored with the model: beam 4, α 0.6 with length_penalty
            fairseq (CTranslate2 has only the |Y|^α length penalty), of which --search.* change some
            (--beam 5 keeps the length penalty).
        force: Replace an existing output directory.
    """
    from attnx.checkpoint.ema import checkpoint_weights_line
    from attnx.commands.usage import require_extra
    from attnx.export.common import ExportError

    require_extra("hf" if format == "huggingface" else "ct2", f"attnx export --format {format}")
    if ema := checkpoint_weights_line(ckpt_path, "export"):
        print(ema)
    weights = None if quantization == "none" else quantization
    if format == "huggingface":
        if weights is not None or search is not None:
            raise ExportError("--quantization and --search apply to --format ctranslate2 only")
        from attnx.export.huggingface import export_huggingface

        written = export_huggingface(ckpt_path, output, force=force)
        print(f"wrote a Marian model to {written}: MarianMTModel.from_pretrained({str(written)!r})")
        return 0
    from attnx.export.ctranslate2 import export_ctranslate2

    written = export_ctranslate2(ckpt_path, output, quantization=weights, search=search, force=force)
    print(
        f"wrote a CTranslate2 model ({weights or 'float32'}) to {written}: attnx translate --model {written}"
    )
    return 0


def export_search(values: dict[str, Any]) -> SearchConfig | None:
    """The search settings `attnx export --format ctranslate2` stores unless its `--search.*` options change
    them: [`DEFAULT_SEARCH`][attnx.inference.ctranslate2.DEFAULT_SEARCH], with the length penalty CTranslate2
    has; None for the other formats, which store none."""
    if values["format"] != "ctranslate2":
        return None
    from attnx.inference.ctranslate2 import DEFAULT_SEARCH

    return DEFAULT_SEARCH


export.own_search = export_search  # --search.* change the default an export stores

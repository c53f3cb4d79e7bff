"""The translation service: its parts in-process, then ``attnx serve`` end to end over real HTTP."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("litserve", reason="attnx serve needs the serve extra: pip install 'attnx[serve]'")

import attnx  # noqa: E402
from attnx.inference.config import SearchConfig  # noqa: E402
from attnx.serving import server as server_module  # noqa: E402
from attnx.serving.server import (  # noqa: E402
    ServeSettings,
    TranslationAPI,
    device_placement,
    model_info,
    serve,
    split_as,
)
from tests.inference.test_translator import LINES  # noqa: E402

FAST = SearchConfig(beam=2, max_len_b=6)
FAST_ARGS = ["--search.beam", "2", "--search.max_len_b", "6"]
STARTUP_S = 600  # generous (waited out only by a server that never starts): cold processes importing torch
# on a 2-core machine at a load of 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------- in-process


@pytest.fixture
def api(checkpoint):
    """A :class:`TranslationAPI` set up in this process, as a worker would; what setup changes is undone."""
    import logging

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    handlers = list(logging.getLogger("attnx").handlers)

    def make(max_batch_size: int, **kw) -> TranslationAPI:
        lit = TranslationAPI(str(checkpoint), FAST, max_tokens=4096, max_batch_size=max_batch_size, **kw)
        lit.pre_setup()  # what LitServer does before starting a worker
        lit.setup("cpu")
        return lit

    yield make
    for sig, handler in saved.items():
        signal.signal(sig, handler)
    logging.getLogger("attnx").handlers[:] = handlers


def test_a_batch_of_requests_is_one_generate_call_split_back(api, checkpoint, monkeypatch):
    lit = api(max_batch_size=8)
    requests = [{"text": LINES[:3]}, {"text": "A dog runs."}, {"text": LINES[3:]}]
    calls: list[int] = []
    generate = lit.translator.generate
    monkeypatch.setattr(lit.translator, "generate", lambda lines: calls.append(len(lines)) or generate(lines))
    outputs = lit.predict(lit.batch([lit.decode_request(r) for r in requests]))
    assert calls == [len(LINES) + 1]
    reference = attnx.load(checkpoint, search=FAST)
    expected = [
        reference.translate(LINES[:3]),
        reference.translate(["A dog runs."]),
        reference.translate(LINES[3:]),
    ]
    assert lit.unbatch(outputs) == [{"translations": lines} for lines in expected]
    assert lit.encode_response(outputs[1]) == {"translations": expected[1]}


def test_a_request_may_ask_for_an_nbest_list_or_samples_with_scores(api, checkpoint):
    lit = api(max_batch_size=8)
    requests = [
        {"text": ["A dog runs.", ""], "search": {"nbest": 2}},
        {"text": "A dog runs.", "scores": True},
        {"text": ["Two men."], "search": {"sampling": True, "nbest": 3, "seed": 7, "top_k": 5}},
        {"text": ["A cat."]},
    ]
    answers = lit.unbatch(lit.predict(lit.batch([lit.decode_request(r) for r in requests])))
    nbest = attnx.load(checkpoint, search=dataclasses.replace(FAST, nbest=2)).generate(["A dog runs.", ""])
    assert answers[0]["translations"] == [nbest[0][0].text, ""]
    assert [[h["text"] for h in hyps] for hyps in answers[0]["hypotheses"]] == [
        [h.text for h in hyps] for hyps in nbest
    ]
    assert [h["score"] for h in answers[0]["hypotheses"][0]] == pytest.approx([h.score for h in nbest[0]])
    best = answers[1]["hypotheses"][0][0]
    assert (
        set(best) == {"text", "score", "log_prob", "tokens"} and best["text"] == answers[1]["translations"][0]
    )
    assert len(answers[2]["hypotheses"][0]) == 3  # three samples
    assert answers[3] == {"translations": attnx.load(checkpoint, search=FAST).translate(["A cat."])}


def test_a_request_s_constraints_are_met_per_line_and_a_line_they_cannot_fit_is_refused_alone(trained):
    """Each line's phrases to include appear and those to exclude do not, as the Python API gives them; a
    request whose phrases are longer than its line may be is answered 422 alone, its neighbours served."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        lit = TranslationAPI(str(trained), SearchConfig(beam=4), max_tokens=4096, max_batch_size=8)
        lit.pre_setup()
        lit.setup("cpu")
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    lines = ["A man is walking a dog.", "Two children play with a ball."]
    requests = [
        {"text": lines, "constraints": [{"include": ["Katze"], "exclude": ["Hund"]}, ["Ball", "Kinder"]]},
        {"text": "A woman reads a book.", "constraints": {"include": [" ".join(["Buch"] * 40)]}},
        {"text": lines},
    ]
    answers = lit.unbatch(lit.predict(lit.batch([lit.decode_request(r) for r in requests])))
    first = answers[0]["translations"]
    assert "Katze" in first[0] and "Hund" not in first[0]
    assert "Ball" in first[1] and "Kinder" in first[1]
    expected = attnx.load(trained, search=SearchConfig(beam=4)).translate(
        lines, constraints=requests[0]["constraints"]
    )
    assert first == expected
    refused = lit.encode_response(answers[1])
    assert refused.status_code == 422 and b"more than the" in refused.body
    assert answers[2] == {"translations": attnx.load(trained, search=SearchConfig(beam=4)).translate(lines)}


def test_a_blank_line_with_phrases_to_include_is_answered_with_them_unmet(api):
    """Nothing is searched for a blank line: its translation is blank and its hypothesis lists every phrase it
    was to include as unmet. A string is read as a line of a constraints file."""
    lit = api(max_batch_size=8)
    requests = [
        {"text": ["", "A dog."], "constraints": [["Hund"], None], "scores": True},
        {"text": " ", "constraints": '{"include": ["Ball"]}', "scores": True},
    ]
    answers = lit.unbatch(lit.predict(lit.batch([lit.decode_request(r) for r in requests])))
    assert answers[0]["translations"][0] == "" and answers[0]["hypotheses"][0][0]["unmet"] == [0]
    assert "unmet" not in answers[0]["hypotheses"][1][0]
    assert answers[1]["translations"] == [""] and answers[1]["hypotheses"][0][0]["unmet"] == [0]


def test_a_request_that_fails_while_decoding_fails_alone(api, checkpoint, monkeypatch):
    """A failing `generate` call is made again per request: the neighbours get their translations, the
    request that fails by itself a 500 naming its error (LitServe answers every request of a batch whose
    `predict` raises with a 500)."""
    lit = api(max_batch_size=8)
    generate = lit.translator.generate

    def fragile(lines):
        if "BOOM" in lines:
            raise RuntimeError("index 1000 is out of bounds")
        return generate(lines)

    monkeypatch.setattr(lit.translator, "generate", fragile)
    requests = [{"text": LINES[:2]}, {"text": ["A dog.", "BOOM"]}, {"text": "A cat."}, {"text": ["BOOM"]}]
    answers = lit.unbatch(lit.predict(lit.batch([lit.decode_request(r) for r in requests])))
    reference = attnx.load(checkpoint, search=FAST)
    assert answers[0] == {"translations": reference.translate(LINES[:2])}
    assert answers[2] == {"translations": reference.translate(["A cat."])}
    for failed in (answers[1], answers[3]):
        response = lit.encode_response(failed)
        assert response.status_code == 500
        assert json.loads(response.body) == {
            "detail": "translating this request failed: RuntimeError: index 1000 is out of bounds"
        }
    alone = api(max_batch_size=1)  # no batch: the request's own error all the same
    monkeypatch.setattr(alone.translator, "generate", fragile)
    assert alone.encode_response(alone.predict(alone.decode_request({"text": "BOOM"}))).status_code == 500


def test_a_request_refused_while_decoding_is_logged_as_a_422_in_one_line(api, checkpoint, capsys):
    """A request whose phrases are longer than its line may be (a ConfigError: the client's to change) is
    answered 422 and logged as such, in one line without a traceback; its neighbour is served and a real
    failure is still logged as a 500 with its traceback."""
    lit = api(max_batch_size=8)
    capsys.readouterr()
    requests = [
        {"text": "A woman reads a book.", "constraints": {"include": [" ".join(["Buch"] * 40)]}},
        {"text": "A cat."},
    ]
    answers = lit.unbatch(lit.predict(lit.batch([lit.decode_request(r) for r in requests])))
    assert lit.encode_response(answers[0]).status_code == 422
    assert answers[1] == {"translations": attnx.load(checkpoint, search=FAST).translate(["A cat."])}
    err = capsys.readouterr().err
    assert "Traceback" not in err and "500" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("attnx serve: warning: a request was refused while decoding; answered 422 alone: ")
    assert "more than the" in err
    lit.failed(RuntimeError("index 1000 is out of bounds"))
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "attnx serve: warning: a request failed while decoding; answered 500 alone",
        "RuntimeError: index 1000 is out of bounds",  # its exception logged (a traceback where it was raised)
    ]


def test_a_worker_says_that_it_loads_warms_up_and_is_ready(api, checkpoint, capsys, monkeypatch):
    """Each step of a worker's start is a line on standard error; the warm-up translates one short line (a
    few pieces at most), and a warm-up that fails is one warning, not a worker that never starts."""
    warmed = []
    real = server_module.TranslationAPI.warm_up

    def warm_up(self):
        real_generate = self.translator.with_search

        def with_search(**changes):
            warmed.append(changes)
            return real_generate(**changes)

        monkeypatch.setattr(self.translator, "with_search", with_search)
        real(self)

    monkeypatch.setattr(server_module.TranslationAPI, "warm_up", warm_up)
    api(1)
    pid = f"attnx serve: inference worker (pid {os.getpid()})"
    assert capsys.readouterr().err.splitlines() == [
        f"{pid}: loading {checkpoint} on cpu in 32-true",
        f"{pid}: warming up (one short line, so that the first request does not wait for it)",
        f"{pid}: ready",
    ]
    assert warmed == [{"max_len_a": 0.0, "max_len_b": server_module.WARM_UP_PIECES}]
    monkeypatch.setattr(server_module.TranslationAPI, "warm_up", real)
    lit = api(1)
    monkeypatch.setattr(lit.translator, "with_search", lambda **changes: 1 / 0)
    capsys.readouterr()
    lit.warm_up()
    assert set(capsys.readouterr().err.splitlines()) == {  # once per setup in this process: two handlers
        "attnx serve: warning: warming up failed (ZeroDivisionError: division by zero); serving without it"
    }


def test_a_refusal_while_decoding_names_the_request_field_to_raise(api, checkpoint):
    """Phrases a worker refuses for the beam (the HTTP process's checks bypassed, as in a batch it did not
    foresee): the 422 names the field of the request that changes the beam, not the command line's option."""
    lit = api(max_batch_size=8)
    request = {"text": "A woman reads a book.", "constraints": ["Buch", "Frau"]}  # 2 phrases, beam 2
    (answer,) = lit.unbatch(lit.predict(lit.batch([lit.decode_request(request)])))
    response = lit.encode_response(answer)
    detail = json.loads(response.body)["detail"]
    assert response.status_code == 422, detail
    assert 'raise "beam" in the request\'s "search" to 3 or give fewer phrases' in detail, detail
    assert "--search" not in detail


def test_a_sampling_request_to_a_server_of_another_beam_is_served(api, checkpoint):
    lit = api(max_batch_size=8)  # beam 2, which sampling does not use
    requests = [
        {"text": ["Two men."], "search": {"sampling": True, "nbest": 2, "seed": 3}},
        {"text": "A cat."},
    ]
    answers = lit.unbatch(lit.predict(lit.batch([lit.decode_request(r) for r in requests])))
    sampler = attnx.load(checkpoint, search=dataclasses.replace(FAST, beam=4, sampling=True, nbest=2, seed=3))
    assert [h["text"] for h in answers[0]["hypotheses"][0]] == [
        h.text for h in sampler.generate(["Two men."])[0]
    ]
    assert answers[1] == {"translations": attnx.load(checkpoint, search=FAST).translate(["A cat."])}


def test_a_worker_decodes_in_the_precision_asked_and_info_says_which(api, checkpoint):
    assert api(1).translator.precision == "32-true"
    assert api(1, precision="bf16-mixed").translator.precision == "bf16-mixed"
    settings = ServeSettings(precision="bf16-mixed")
    assert model_info(str(checkpoint), FAST, settings)["precision"] == "bf16-mixed"
    assert server_module.build_server(str(checkpoint), FAST, settings).lit_api.precision == "bf16-mixed"


def test_auto_is_resolved_once_before_the_workers_and_info_says_what_runs(checkpoint, ct2_export, capsys):
    from attnx.inference.compute_type import compute_type_probe
    from attnx.inference.precision import PrecisionChoice, decoding_probe

    with decoding_probe(lambda device, decoder: PrecisionChoice("bf16-mixed", "injected")):
        settings = server_module.resolved_precision(str(checkpoint), ServeSettings())
    assert ServeSettings().precision == "auto" and settings.precision == "bf16-mixed"
    assert model_info(str(checkpoint), FAST, settings)["precision"] == "bf16-mixed"
    assert server_module.build_server(str(checkpoint), FAST, settings).lit_api.precision == "bf16-mixed"
    assert capsys.readouterr().err == "decoding in bf16-mixed: injected (--precision 32-true to override)\n"
    with compute_type_probe(
        lambda directory, device, threads, types: {t: 0.5 if t == "int8" else 1.0 for t in types}
    ):
        exported = server_module.resolved_precision(str(ct2_export), ServeSettings())
    assert (
        exported.compute_type == "int8" and model_info(str(ct2_export), FAST, exported)["precision"] == "int8"
    )
    assert server_module.build_server(str(ct2_export), FAST, exported).lit_api.compute_type == "int8"


def test_split_as_keeps_order_and_empty_pieces():
    assert split_as(["a", "b", "c"], [2, 0, 1]) == [["a", "b"], [], ["c"]]


def test_device_placement_names_one_device():
    assert device_placement("cpu") == ("cpu", 1)
    assert device_placement("cuda") == ("cuda", [0])
    assert device_placement("cuda:1") == ("cuda", [1])


def test_model_info_is_json(checkpoint):
    info = json.loads(json.dumps(model_info(str(checkpoint), FAST, ServeSettings())))
    assert info["format"] == "checkpoint" and info["search"]["beam"] == 2
    assert info["limits"] == {
        "max_lines": 64,
        "max_line_chars": 2000,
        "max_body_bytes": 1_000_000,
        "max_beam": 16,
    }


def test_a_signal_before_serving_stops_the_processes_the_server_started_and_no_other(monkeypatch):
    """A signal while LitServe's workers load escapes `LitServer.run`; `serve` stops the processes that run
    started (found through multiprocessing's public `active_children`, not LitServe's undocumented list)."""
    spawn = multiprocessing.get_context("spawn")
    ours = spawn.Process(target=time.sleep, args=(60,))
    ours.start()
    started: list = []

    class Interrupted:
        def run(self, **options) -> None:
            for _ in range(2):  # a manager and a worker
                started.append(spawn.Process(target=time.sleep, args=(60,)))
                started[-1].start()
            raise KeyboardInterrupt

    monkeypatch.setattr(server_module, "check_port_free", lambda host, port: None)
    monkeypatch.setattr(server_module, "build_server", lambda model, search, settings: Interrupted())
    monkeypatch.setattr(server_module, "announce_when_ready", lambda url, message, ready: None)
    monkeypatch.setattr(
        "attnx.inference.load.load",
        lambda *args, **kwargs: types.SimpleNamespace(search=FAST, precision="32-true"),
    )
    try:
        serve("model.ckpt", FAST, ServeSettings())
        assert [p.is_alive() for p in started] == [False, False] and ours.is_alive()
    finally:
        ours.terminate()
        ours.join()


# ----------------------------------------------------------------------------------------------- end to end


@dataclass
class Served:
    process: subprocess.Popen
    url: str
    log: Path  # the server's standard error

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=300) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def post(self, body: bytes | dict, content_type: str = "application/json") -> tuple[int, dict]:
        data = json.dumps(body).encode("utf-8") if isinstance(body, dict) else body
        request = urllib.request.Request(
            self.url + "/translate", data=data, headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def stop(self) -> tuple[int, str]:
        """SIGTERM; the exit status and everything the server wrote on stderr."""
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=300)
        finally:
            self.kill()
        return self.process.returncode, self.log.read_text(encoding="utf-8")

    def kill(self) -> None:
        """Kill whatever of the server is left: its own process group (HTTP processes, workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def start_server(checkpoint: Path, log: Path, *options: str) -> Served:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "attnx", "serve", "--model", str(checkpoint), "--port", str(port)]
    fp32 = (
        [] if "--precision" in options else ["--precision", "32-true"]
    )  # as the test process's expectations
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [*command, *FAST_ARGS, "--threads", "1", *fp32, *options],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # a group of its own, so that a failed test can kill all of it
        )
    served = Served(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            served.kill()
            pytest.fail(f"attnx serve exited with {process.returncode}: {log.read_text()}")
        try:
            # ready as a user sees it: /health answers and the startup line (printed by a thread of its own
            # once /health answers it) is out
            if served.get("/health") == (200, b"ok") and f"on {served.url}/translate" in log.read_text():
                return served
        except OSError:
            pass
        time.sleep(0.2)
    served.kill()
    pytest.fail(f"attnx serve did not answer /health and say so within {STARTUP_S} s: {log.read_text()}")


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    served = start_server(
        checkpoint,
        tmp_path_factory.mktemp("serve") / "stderr.txt",
        *("--workers", "2", "--max_batch_size", "8", "--batch_timeout", "0.05"),
        *("--max_lines", "8", "--max_line_chars", "3000", "--max_body_bytes", "100000"),
    )
    yield served
    served.kill()


REQUESTS = [LINES[i : i + n] for n in (1, 2, 3) for i in range(0, len(LINES) - n + 1, 2)]


@pytest.mark.slow
def test_concurrent_requests_get_the_translations_of_the_python_api(server, checkpoint):
    reference = attnx.load(checkpoint, search=FAST)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda lines: server.post({"text": lines}), REQUESTS * 2))
    for lines, (status, body) in zip(REQUESTS * 2, answers, strict=True):
        assert status == 200, body
        assert body == {"translations": reference.translate(lines)}
    assert server.post({"text": "A dog runs."}) == (
        200,
        {"translations": reference.translate(["A dog runs."])},
    )
    # curl -d declares a form; the body is JSON all the same
    form = server.post(b'{"text": ["Zwei Hunde."]}', content_type="application/x-www-form-urlencoded")
    assert form == (200, {"translations": reference.translate(["Zwei Hunde."])})


@pytest.mark.slow
def test_health_and_info(server, checkpoint):
    assert server.get("/health") == (200, b"ok")
    status, body = server.get("/info")
    info = json.loads(body)["model"]
    assert status == 200 and info["path"] == str(checkpoint.resolve())
    assert info["search"]["beam"] == 2 and info["search"]["max_positions"] == 64  # resolved from the model
    assert info["limits"] == {
        "max_lines": 8,
        "max_line_chars": 3000,
        "max_body_bytes": 100000,
        "max_beam": 16,
    }
    assert info["batching"] == {"max_batch_size": 8, "batch_timeout": 0.05} and info["workers"] == 2


@pytest.mark.slow
def test_starting_says_each_step_on_standard_error_until_ready(server, checkpoint):
    """Nothing is silent while the server starts: the workers are said to start, each says it loads the model,
    warms up and is ready, and the last line of the start names the URL."""
    lines = server.log.read_text(encoding="utf-8").splitlines()
    start = [line for line in lines if "inference worker" in line or ": ready: " in line]
    assert start[0] == (
        f"attnx serve: starting 2 inference workers on cpu in 32-true, then the HTTP server on {server.url}"
    ), lines
    for step in (f"loading {checkpoint} on cpu in 32-true", "warming up (one short line", "ready"):
        assert sum(": " + step in line and "(pid " in line for line in start) == 2, (step, lines)
    assert start[-1].startswith(f"attnx serve: ready: {checkpoint} on {server.url}/translate (POST"), lines


BAD = [
    (b'{"text": [', 400, "not valid JSON"),
    ({"txt": ["A dog runs."]}, 422, 'unknown field "txt"'),
    ({"text": [1, 2]}, 422, '"text" item 0 is a number'),
    ({"text": {"en": "A dog."}}, 422, '"text" is an object'),
    ({"text": []}, 422, "empty list"),
    ({"text": ["A dog."] * 9}, 413, "9 lines"),
    ({"text": [" ".join(["word"] * 10_000)]}, 413, "49999 characters"),
    ({"text": ["x" * 1000] * 120}, 413, "over 100000 bytes"),
    ({"text": "A dog.", "search": {"nbest": 3}}, 422, "cannot exceed search.beam (2)"),
    ({"text": "A dog.", "search": {"max_len_b": 900}}, 422, 'cannot set "max_len_b" per request'),
]


@pytest.mark.slow
def test_bad_requests_get_a_4xx_and_a_message_and_the_server_keeps_serving(server, checkpoint):
    for body, status, words in BAD:
        got, answer = server.post(body)
        assert got == status and words in answer["detail"], (body if isinstance(body, bytes) else "", answer)
    # bad requests amid good ones, concurrently: each good one still gets its translation
    good = {"text": ["A man rides a bike.", "Zwei Hunde."]}
    expected = attnx.load(checkpoint, search=FAST).translate(good["text"])
    mixed = [good if i % 2 else BAD[i % len(BAD)][0] for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(server.post, mixed))
    for body, (status, answer) in zip(mixed, answers, strict=True):
        if body is good:
            assert (status, answer) == (200, {"translations": expected})
        else:
            assert 400 <= status < 500 and answer["detail"]
    assert server.get("/health") == (200, b"ok")
    # a request's own search settings, through the HTTP process's checks
    status, answer = server.post({"text": ["A dog runs."], "search": {"nbest": 2}})
    assert status == 200 and len(answer["hypotheses"][0]) == 2
    assert answer["hypotheses"][0][0]["text"] == answer["translations"][0]


SAMPLE = {"sampling": True, "nbest": 2}
UNSAFE = [
    (
        {"text": "A dog.", "search": {**SAMPLE, "temperature": 1e-300}},
        "search.temperature must be from 0.001",
    ),
    ({"text": "A dog.", "search": {**SAMPLE, "temperature": 1e300}}, "search.temperature must be from 0.001"),
    ({"text": "A dog.", "search": {"alpha": 1e308}}, "search.alpha must be from -5 to 5"),
    ({"text": "A dog.", "search": {**SAMPLE, "seed": 2**80}}, "search.seed must be from 0 to 2**64 - 1"),
    (b'{"text": "A dog.", "search": {"alpha": NaN}}', "search.alpha must be from -5 to 5, got nan"),
    ({"text": "A dog.", "search": {**SAMPLE, "beam": 8}}, "search.beam (8) is not used by sampling"),
]


@pytest.mark.slow
def test_values_that_failed_a_batch_are_refused_before_it_and_the_neighbours_are_answered(server, checkpoint):
    """Each of these once reached a worker, raised there and failed every request batched with it (500)."""
    goods = [{"text": lines} for lines in REQUESTS[:6]]
    mixed = [body for pair in zip(goods, [bad for bad, _ in UNSAFE], strict=True) for body in pair]
    with ThreadPoolExecutor(len(mixed)) as pool:
        answers = list(pool.map(server.post, mixed))
    reference = attnx.load(checkpoint, search=FAST)
    for good, (status, answer) in zip(goods, answers[::2], strict=True):
        assert (status, answer) == (200, {"translations": reference.translate(good["text"])})
    for (_, words), (status, answer) in zip(UNSAFE, answers[1::2], strict=True):
        assert status == 422 and words in answer["detail"], answer


def raw_post(url: str, body: dict) -> socket.socket:
    """Send a POST /translate and return the open socket, without waiting for the answer."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode("utf-8")
    sock = socket.create_connection((host, int(port)), timeout=300)
    head = f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict]:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.mark.slow
def test_sigterm_finishes_the_requests_in_flight_and_exits_0(checkpoint, tmp_path):
    served = start_server(
        checkpoint, tmp_path / "stderr.txt", "--max_batch_size", "4", "--batch_timeout", "0.5"
    )
    lines = ["A man in a red shirt rides a bike down the hill.", "Zwei Hunde spielen im Schnee."] * 4
    in_flight = [raw_post(served.url, {"text": lines}) for _ in range(3)]
    # The listening socket hands connections over in order, so once /health is answered the three
    # requests above have been accepted: they are in flight (waiting for their batch) when SIGTERM comes.
    assert served.get("/health") == (200, b"ok")
    status, err = served.stop()
    expected = attnx.load(checkpoint, search=FAST).translate(lines)
    for sock in in_flight:
        assert read_response(sock) == (200, {"translations": expected})
    assert status == 0, err
    (startup,) = [line for line in err.splitlines() if line.startswith("attnx serve: ready: ")]
    assert f"on {served.url}/translate" in startup and str(checkpoint) in startup
    assert "SIGTERM received" in err and err.rstrip().endswith("attnx serve: stopped")
    assert "Did not terminate gracefully" not in err  # the workers exit on their own, none is killed
    assert "Traceback" not in err


def test_a_phrase_the_model_cannot_write_is_answered_422_naming_its_characters(api):
    """A phrase in a script the model has no pieces for is refused, not counted as met; its neighbour is served."""
    lit = api(max_batch_size=8)
    requests = [{"text": ["A dog."], "constraints": [["שלום"]]}, {"text": "A cat."}]
    answers = lit.unbatch(lit.predict(lit.batch([lit.decode_request(r) for r in requests])))
    response = lit.encode_response(answers[0])
    assert response.status_code == 422
    assert (
        "cannot write" in json.loads(response.body)["detail"]
        and "U+05E9" in json.loads(response.body)["detail"]
    )
    assert "translations" in answers[1]

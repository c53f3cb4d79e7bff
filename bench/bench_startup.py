"""Start-up: one sentence translated from the shell, and ``attnx serve`` to its first answer.

    python bench/bench_startup.py --model CKPT [--sentence TEXT] [--repeats 5] [--warm_ups 1]
        [--precision auto] [--threads 0] [--no_serve] [--no_ctranslate2] [--output FILE]

Every figure is the wall time of a fresh process, from its launch to its answer, as a shell user sees it:

- ``import torch``: ``python -c "import torch"``, the floor of anything that decodes with torch;
- ``translate``: ``echo SENTENCE | attnx translate --model CKPT`` (the ``attnx`` command of this Python);
- ``serve``: ``attnx serve --model CKPT`` from its launch to the answer of its first ``POST /translate`` of the
  sentence (polled every 20 ms; the server is then stopped, untimed);
- ``translate, CTranslate2``: the same translate of an export written once beforehand (``attnx export --format
  ctranslate2``, untimed);
- ``bare CTranslate2``: a ``python -c`` script that loads the export with ``ctranslate2`` and
  ``sentencepiece`` alone and translates the sentence (beam 4), for reference.

The kinds run in turns (one of each, then the next round), so that a change in the machine's load falls on
all of them alike; each is run ``--warm_ups`` times untimed first (the page cache; a precision ``auto`` chooses
is kept per machine, so no probe is timed). Each row gives the median and the best of ``--repeats`` runs and
its ratio to ``import torch`` and to the bare CTranslate2 script. The machine (CPU model, cores, the load,
torch's version) is printed above the table. Figures of a busy machine are not facts: take them on a quiet one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness import REPO, machine_line, publish, run_timed

SENTENCE = "A little girl climbs into a wooden playhouse."
COLUMNS = ["what", "command", "median s", "best s", "× import torch", "× bare CTranslate2"]
SERVE_POLL_S = 0.02
STARTUP_LIMIT_S = 600.0
"""A run that takes longer is a failure (a server that never answers), not a figure."""

BARE_CTRANSLATE2 = """
import json, sys
import ctranslate2, sentencepiece as spm

directory, sentence = sys.argv[1:3]
sp = spm.SentencePieceProcessor(model_file=f"{directory}/sentencepiece.model")
translator = ctranslate2.Translator(directory, device="cpu")
tokens = sp.encode(sentence, out_type=str)
with open(f"{directory}/attnx.json") as f:  # the model's positions bound the output
    positions = json.load(f)["transformer"]["max_len"]
limit = min(len(tokens) + 52, positions - 1)
result = translator.translate_batch([tokens], beam_size=4, max_decoding_length=limit)
print(sp.decode(result[0].hypotheses[0]))
"""


def attnx_command() -> list[str]:
    """The ``attnx`` command installed beside this Python (what a shell runs), else ``python -m attnx``."""
    script = Path(sys.executable).with_name("attnx")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "attnx"]


def environment(threads: int) -> dict[str, str]:
    """This checkout's attnx first on the path; ``threads`` (0: each library's default) for torch and OpenMP."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_once(command: list[str], stdin: str | None, env: dict[str, str]) -> float:
    """Seconds from the launch of `command` to its exit; a failure ends the benchmark naming the command."""
    start = time.perf_counter()
    done = subprocess.run(
        command, input=stdin, capture_output=True, text=True, env=env, timeout=STARTUP_LIMIT_S
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0 or (stdin is not None and not done.stdout.strip()):
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_once(command: list[str], sentence: str, env: dict[str, str]) -> float:
    """Seconds from the launch of ``attnx serve`` to the answer of its first ``POST /translate``."""
    port = free_port()
    body = json.dumps({"text": [sentence]}).encode("utf-8")
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/translate", data=body, headers={"Content-Type": "application/json"}
    )
    with tempfile.TemporaryFile("w+") as log:
        start = time.perf_counter()
        process = subprocess.Popen(
            [*command, "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
        try:
            while time.perf_counter() - start < STARTUP_LIMIT_S:
                if process.poll() is not None:
                    log.seek(0)
                    raise SystemExit(
                        f"{' '.join(command)} exited with {process.returncode}: {log.read()[-2000:]}"
                    )
                try:
                    with urllib.request.urlopen(request, timeout=STARTUP_LIMIT_S) as response:
                        if response.status == 200 and json.loads(response.read())["translations"]:
                            return time.perf_counter() - start
                except OSError:
                    time.sleep(SERVE_POLL_S)
            raise SystemExit(f"{' '.join(command)} did not answer within {STARTUP_LIMIT_S:.0f} s")
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@dataclass
class Kind:
    """One row: what is timed, the command as a shell would show it, and how one run is made."""

    what: str
    shown: str
    run: Callable[[], float]
    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def kinds(args: argparse.Namespace, export: Path | None, env: dict[str, str]) -> list[Kind]:
    attnx = attnx_command()
    precision = ["--precision", args.precision]
    translate = [*attnx, "translate", "--model", str(args.model), *precision]
    echo = f"echo {args.sentence!r} |"
    rows = [
        Kind(
            "import torch",
            'python -c "import torch"',
            lambda: run_once([sys.executable, "-c", "import torch"], None, env),
        ),
        Kind(
            "translate",
            f"{echo} attnx translate --model {args.model}",
            lambda: run_once(translate, args.sentence + "\n", env),
        ),
    ]
    if not args.no_serve:
        serve = [*attnx, "serve", "--model", str(args.model), *precision]
        if args.threads:
            serve += ["--threads", str(args.threads)]
        rows.append(
            Kind(
                "serve, to its first answer",
                f"attnx serve --model {args.model}",
                lambda: serve_once(serve, args.sentence, env),
            )
        )
    if export is not None:
        exported = [*attnx, "translate", "--model", str(export), *precision]
        bare = [sys.executable, "-c", BARE_CTRANSLATE2, str(export), args.sentence]
        rows += [
            Kind(
                "translate, CTranslate2",
                f"{echo} attnx translate --model {export.name}",
                lambda: run_once(exported, args.sentence + "\n", env),
            ),
            Kind(
                "bare CTranslate2",
                "python -c (ctranslate2 + sentencepiece)",
                lambda: run_once(bare, None, env),
            ),
        ]
    return rows


def export_model(model: Path, directory: Path, env: dict[str, str]) -> Path:
    """``attnx export --format ctranslate2`` of `model` into `directory` (untimed)."""
    output = directory / "model_ct2"
    command = [*attnx_command(), "export", "--ckpt_path", str(model), "--format", "ctranslate2"]
    run_once([*command, "--output", str(output)], None, env)
    return output


def ratio(seconds: float, reference: Kind | None) -> str:
    return "-" if reference is None else f"{seconds / reference.median:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="checkpoint of attnx fit or attnx average")
    parser.add_argument("--sentence", default=SENTENCE, help="the sentence every command translates")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each kind (median and best)")
    parser.add_argument("--warm_ups", type=int, default=1, help="untimed runs of each kind first")
    parser.add_argument("--precision", default="auto", help="attnx's --precision for every command")
    parser.add_argument(
        "--threads", type=int, default=0, help="OMP_NUM_THREADS and serve's --threads (0: defaults)"
    )
    parser.add_argument("--no_serve", action="store_true", help="leave attnx serve out")
    parser.add_argument("--no_ctranslate2", action="store_true", help="leave the CTranslate2 rows out")
    parser.add_argument("--output", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warm_ups < 0:
        parser.error("--repeats must be at least 1 and --warm_ups at least 0")
    if not args.model.is_file():
        parser.error(f"--model {args.model} is not a checkpoint file")
    env = environment(args.threads)
    print(machine_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="attnx-startup-") as scratch:
        ct2 = not args.no_ctranslate2 and importlib.util.find_spec("ctranslate2") is not None
        export = export_model(args.model, Path(scratch), env) if ct2 else None
        rows = kinds(args, export, env)
        for _ in range(args.warm_ups):
            for kind in rows:
                kind.run()
        for _ in range(args.repeats):  # in turns: the machine's load falls on every kind alike
            for kind in rows:
                kind.seconds.append(kind.run())
    torch_row = rows[0]
    bare = next((kind for kind in rows if kind.what == "bare CTranslate2"), None)
    table = [
        [
            kind.what,
            "`" + kind.shown.replace("|", "\\|") + "`",  # a pipe inside a Markdown table's cell
            f"{kind.median:.2f}",
            f"{min(kind.seconds):.2f}",
            ratio(kind.median, torch_row),
            ratio(kind.median, bare),
        ]
        for kind in rows
    ]
    import torch

    title = (
        f"Start-up, one sentence from the shell (--precision {args.precision}, median and best of "
        f"{args.repeats} runs in turns, torch {torch.__version__})"
    )
    publish(title, COLUMNS, table, args.output)
    return 0


if __name__ == "__main__":
    run_timed(main)

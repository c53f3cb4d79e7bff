"""Steps shared by the research benchmarks (bench_backtranslation.py, bench_mbr_decode.py): each one a real
`attnx` command in a subprocess, run in a work directory, its output kept in `<work>/logs/`.

A step whose result is already there (a prepared corpus's meta.json, a run's averaged checkpoint, a complete
translation, a score) is not run again, so an interrupted benchmark continues where it stopped.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from harness import data_root

PAPER_BEAM = ("--search.beam", "4", "--search.alpha", "0.6")
"""The paper's search (§6.1: beam 4, length penalty α 0.6), as `attnx translate` options."""

MODEL_CONFIG = "multi30k_cpu"
"""The README's model: 3+3 layers, d_model 256, trained for `--minutes` on CPU."""


def model_config() -> dict:
    """The README model's config as attnx reads it (`attnx fit --config multi30k_cpu`)."""
    text = resources.files("attnx.configs").joinpath(f"{MODEL_CONFIG}.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def add_budget_options(parser: argparse.ArgumentParser) -> None:
    """The training budget every arm of a study gets: `--minutes` of wall-clock time, or `--steps` updates."""
    parser.add_argument("--minutes", type=float, default=30, help="wall-clock training budget of every arm")
    parser.add_argument(
        "--steps", type=int, help="training budget in optimizer updates, instead of --minutes"
    )


def budget(args: argparse.Namespace) -> tuple[dict[str, float], str]:
    """`add_budget_options`' budget as `Steps.arm_config` takes it, and in words for a table's title."""
    if args.steps:
        return {"steps": args.steps}, f"{args.steps} updates"
    return {"minutes": args.minutes}, f"{args.minutes:g} minutes"


def add_step_options(parser: Any, required: bool = True) -> None:
    """What every research benchmark takes: its work directory (`required` unless the script has another
    mode), the corpora, the vocabulary, the threads of every command and where its table goes."""
    parser.add_argument(
        "--work", type=Path, required=required, help="work directory (created; reused to continue)"
    )
    parser.add_argument("--data", help="corpora directory (default $ATTNX_DATA_DIR or ../shared/data)")
    parser.add_argument(
        "--vocab_size", type=int, default=8000, help="joint BPE pieces of every prepared corpus"
    )
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of every command")
    parser.add_argument("--output", type=Path, help="also write the table here")


def newer(result: Path, source: Path) -> bool:
    """Whether `result` exists and was written after `source` (a step's result, not one of an earlier input)."""
    return result.is_file() and (not source.exists() or result.stat().st_mtime >= source.stat().st_mtime)


def plain(source: Path, out: Path, lines: int | None) -> Path:
    """`source` (a .gz corpus side) as plain text in `out`, its first `lines` lines when given."""
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(source, "rt", encoding="utf-8") as f:
            kept = f if lines is None else (line for _, line in zip(range(lines), f, strict=False))
            out.write_text("".join(kept), encoding="utf-8")
    return out


def logged_rows(run: Path) -> list[dict[str, str]]:
    """Every row of the run's CSV logs (`runs/NAME/version_*/metrics.csv`), its versions (a resumed run adds one)
    in order."""
    rows: list[dict[str, str]] = []
    for metrics in sorted(run.glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:])):
        with open(metrics, newline="", encoding="utf-8") as f:
            rows += list(csv.DictReader(f))
    return rows


def tokens_per_s(run: Path) -> float:
    """Median of the run's logged `train/tokens_per_s` (source + target real tokens)."""
    rates = [float(r["train/tokens_per_s"]) for r in logged_rows(run) if r.get("train/tokens_per_s")]
    return statistics.median(rates) if rates else float("nan")  # nan: none logged


def updates(run: Path) -> int:
    """The optimizer updates the run made: Lightning logs a row with the count of updates before it, so the
    last row's `step` is one less."""
    return max((int(r["step"]) + 1 for r in logged_rows(run) if r.get("step")), default=0)


class Steps:
    def __init__(self, work: Path, data: Path, threads: int | None = None, vocab_size: int = 8000) -> None:
        self.work = work
        self.vocab_size = vocab_size
        self.data = data
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ)
        if threads:
            self.env["OMP_NUM_THREADS"] = str(threads)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Steps:
        """Steps in ``--work`` over Multi30k of ``--data`` (the options of ``add_step_options``)."""
        return cls(args.work.resolve(), data_root(args.data) / "multi30k", args.threads, args.vocab_size)

    def attnx(self, name: str, *argv: str) -> float:
        """Run `attnx ARGV` in the work directory; its output goes to logs/NAME.log. Returns the seconds it took."""
        command = [sys.executable, "-m", "attnx", *argv]
        print(f"$ attnx {shlex.join(argv)}", flush=True)
        start = time.perf_counter()
        with open(self.logs / f"{name}.log", "w", encoding="utf-8") as log:
            done = subprocess.run(command, cwd=self.work, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"attnx {argv[0]} failed ({done.returncode}): see {self.logs / name}.log")
        return seconds

    def prepare(
        self,
        name: str,
        src: str,
        tgt: str,
        train: list[str],
        *extra: str,
        tests: tuple[str, ...] = (),
    ) -> Path:
        """Prepare (once) data/NAME: `train` corpora, Multi30k's val and test_2016_flickr (as `test`), `tests` more."""
        out = self.work / "data" / name
        if not (out / "meta.json").is_file():
            test = ", ".join([str(self.data / "test_2016_flickr"), *tests])
            self.attnx(
                f"prepare_{name}", "prepare", "--src_lang", src, "--tgt_lang", tgt, "--train", f"[{', '.join(train)}]",
                "--valid", str(self.data / "val"), "--test", f"[{test}]", "--vocab_size", str(self.vocab_size),
                "--output", str(out), *extra,
            )  # fmt: skip
        return out

    def multi30k(
        self,
        train_lines: int | None = None,
        test_lines: int | None = None,
        name: str = "multi30k",
        *extra: str,
    ) -> tuple[Path, Path, Path]:
        """Multi30k prepared (once) as data/NAME (`extra`: more `attnx prepare` options), and test_2016_flickr's
        two sides as plain text in raw/: `(prepared folder, source, reference)`. `train_lines`, `test_lines`: the
        first lines only (a smoke test of a script; its numbers mean nothing)."""
        raw, train = self.work / "raw", self.data / "train"
        if train_lines:
            for lang in ("en", "de"):
                plain(self.data / f"train.{lang}.gz", raw / f"train.{lang}", train_lines)
            train = raw / "train"
        data = self.prepare(name, "en", "de", [str(train)], *extra)
        source = plain(self.data / "test_2016_flickr.en.gz", raw / "test.en", test_lines)
        reference = plain(self.data / "test_2016_flickr.de.gz", raw / "test.de", test_lines)
        return data, source, reference

    def multi30k_valid(self, lines: int | None = None) -> tuple[Path, Path]:
        """Multi30k's validation set (the one `attnx fit` validates on, 1,014 pairs) as plain text in raw/:
        `(source, reference)`; `lines`: the first lines only (a smoke test)."""
        raw = self.work / "raw"
        return (
            plain(self.data / "val.en.gz", raw / "valid.en", lines),
            plain(self.data / "val.de.gz", raw / "valid.de", lines),
        )

    def arm_config(
        self,
        arm: str,
        data_dir: Path,
        minutes: float | None = None,
        steps: int | None = None,
        warmup_steps: int | None = None,
        precision: str | None = None,
        model: dict[str, Any] | None = None,
        **data: str,
    ) -> Path:
        """An override config: the run's data, its name (runs/ARM) and its budget: `minutes` of training, or
        `steps` optimizer updates (a budget that gives the same run on a busy machine, only later; its
        checkpoints every `steps // 15` updates instead of every 2 minutes, the last 5 averaged as before, and
        its speed logged at least 10 times); `precision` pins `trainer.precision`, `model` overrides `model`
        keys (`transformer`, `loss`, ...)."""
        loggers = [
            {
                "class_path": f"lightning.pytorch.loggers.{kind}",
                "init_args": {"save_dir": "runs", "name": arm},
            }
            for kind in ("CSVLogger", "TensorBoardLogger")
        ]
        if (minutes is None) == (steps is None):
            raise ValueError("give the budget in minutes or in steps")
        if steps is None:
            hours, rest = divmod(int(round(minutes * 60)), 3600)
            trainer = {"max_time": f"00:{hours:02d}:{rest // 60:02d}:{rest % 60:02d}", "logger": loggers}
        else:
            callbacks = model_config()["trainer"]["callbacks"]
            for callback in callbacks:
                if callback["class_path"].endswith(".PeriodicCheckpoint"):
                    every = max(1, steps // 15)
                    callback["init_args"] = {**callback["init_args"], "minutes": None, "every_n_steps": every}
            trainer = {
                "max_time": None,
                "max_steps": steps,
                "logger": loggers,
                "callbacks": callbacks,
                "log_every_n_steps": max(1, min(25, steps // 10)),
            }  # a short budget still logs its speed
        if precision is not None:
            trainer["precision"] = precision
        config = {"trainer": trainer, "data": {"data_dir": str(data_dir), **data}}
        model = dict(model or {})
        if warmup_steps is not None:
            model["warmup_steps"] = warmup_steps
        if model:
            config["model"] = model
        path = self.work / "configs" / f"{arm}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return path

    def fit(self, arm: str, config: Path, *extra: str) -> Path:
        """Train (once) and return the run's averaged checkpoint; a run stopped halfway resumes from its
        `last.ckpt` (its `--init_from`, if any, left out as `attnx fit` asks)."""
        runs = self.work / "runs" / arm

        def newest(name: str) -> Path | None:
            found = sorted(runs.glob(f"version_*/checkpoints/{name}"), key=lambda p: int(p.parts[-3][8:]))
            return found[-1] if found else None

        if (done := newest("averaged.ckpt")) is not None:
            return done
        if (last := newest("last.ckpt")) is not None:
            start = list(extra)
            if "--init_from" in start:
                del start[start.index("--init_from") : start.index("--init_from") + 2]
            extra = (*start, "--ckpt_path", str(last))
        self.attnx(f"fit_{arm}", "fit", "--config", MODEL_CONFIG, "--config", str(config), *extra)
        done = newest("averaged.ckpt")
        if done is None:
            raise SystemExit(
                f"attnx fit wrote no averaged checkpoint under {runs}: see {self.logs}/fit_{arm}.log"
            )
        return done

    def translate(self, name: str, model: str | Path, source: Path, *search: str) -> tuple[Path, float]:
        """Translate `source` into outputs/NAME (once for each model file: a model written since is translated
        again); returns the file and the seconds the command took."""
        out = self.work / "outputs" / name
        timing = out.with_suffix(".seconds")
        if not newer(timing, Path(model)):
            out.parent.mkdir(exist_ok=True)
            seconds = self.attnx(f"translate_{name}", "translate", "--model", str(model), "--input", str(source),
                                 "--output", str(out), "--force", "true", *search)  # fmt: skip
            timing.write_text(f"{seconds}\n")
        return out, float(timing.read_text())

    def decoding_rows(
        self, arms: list[tuple[str, str | Path, tuple[str, ...]]], source: Path, reference: Path
    ) -> list[list[str]]:
        """Translate `source` with each `(name, model, search options)` arm and score it against `reference`:
        a table row each, `[name, sacreBLEU, chrF2, sentences/s]` (sentences over the whole command's time)."""
        sentences = len(source.read_text(encoding="utf-8").splitlines())
        rows = []
        for i, (name, model, search) in enumerate(arms):
            hyp, seconds = self.translate(f"arm{i}", model, source, *search)
            score = self.score(f"arm{i}", hyp, reference)
            rows.append([name, f"{score['bleu']:.2f}", f"{score['chrf']:.2f}", f"{sentences / seconds:.1f}"])
        return rows

    def score(self, name: str, hypotheses: Path, references: Path) -> dict[str, float]:
        """`attnx score --format json` of a translation file (again when the file is newer than its score)."""
        out = self.work / "scores" / f"{name}.json"
        if not newer(out, hypotheses):
            out.parent.mkdir(exist_ok=True)
            self.attnx(f"score_{name}", "score", "--hypotheses", str(hypotheses), "--references", str(references),
                       "--format", "json")  # fmt: skip
            text = (self.logs / f"score_{name}.log").read_text(encoding="utf-8")
            out.write_text(text.strip().splitlines()[-1] + "\n")
        return json.loads(out.read_text())

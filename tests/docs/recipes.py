"""Run a docs page's shell recipes as written, in this process: the machinery of the tests of the docs' recipes.

A page's ```bash blocks are cut into commands (a trailing `\\` continues a line). Each command runs in bash, as
a reader's shell would run it, with `attnx` a shell function that records what it was given: its arguments
(after bash's quoting and `${VAR:+...}` expansions), its standard input where a pipe feeds it, and where its
standard output goes (a `> FILE`). The recorded command then runs here, through `attnx.cli.main`, so that a
recipe of ten commands costs ten commands and not ten starts of Python, torch and Lightning (some ten seconds
each on a busy 2-core machine). A command without `attnx` (`zcat`, `head`) runs in bash alone.

A test appends its own options to some commands (`Recipe.options`, by subcommand: a tiny model, a few steps):
where the page sets an option the test sets again, the page's value gives way, since an option given twice is
refused. Everything else is the page's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

SHIM = """attnx() {
  [ -e "$RECIPE_RECORD/argv" ] && { echo "one attnx command a line" >&2; return 97; }
  printf '%s\\0' "$@" > "$RECIPE_RECORD/argv"
  readlink "/proc/$BASHPID/fd/1" > "$RECIPE_RECORD/stdout"
  if [ -p /dev/stdin ]; then cat > "$RECIPE_RECORD/stdin"; fi
}
"""
"""`attnx` for bash: records the command, its standard input from a pipe and where its output goes."""


def bash_blocks(text: str) -> list[str]:
    """The ```bash blocks of a page (or of a part of one)."""
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)


def commands(block: str) -> list[str]:
    """A block's commands, one a line, continuation lines joined."""
    lines = block.replace("\\\n", " ").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def sections(page: Path) -> dict[str, str]:
    """The `## ` sections of `page`: title → text up to the next one."""
    parts = re.split(r"^## (.+)\n", page.read_text(encoding="utf-8"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def with_options(argv: list[str], options: list[str]) -> list[str]:
    """`argv` with `options` appended; an option of `argv` that `options` sets again (but `--config`, which
    stacks) is left out, with its value."""
    again = {option.split("=", 1)[0] for option in options if option.startswith("--")} - {"--config"}
    kept: list[str] = []
    words = iter(argv)
    for word in words:
        name = word.split("=", 1)[0]
        if name not in again:
            kept.append(word)
        elif "=" not in word:
            next(words, None)  # its value
    return kept + options


@dataclass
class Ran:
    """One command of a page and what it did."""

    line: str  # as the page writes it, continuation lines joined
    argv: list[str]  # what attnx ran, the test's options appended; [] for a command without attnx
    code: int
    out: str  # its standard output (what a `> FILE` received)
    err: str  # its standard error

    @property
    def said(self) -> str:
        """Everything it printed."""
        return self.out + self.err


@dataclass
class Recipe:
    """Runs commands in `work` (the current directory while they run), `options` appended by subcommand."""

    work: Path
    capfd: pytest.CaptureFixture[str]
    monkeypatch: pytest.MonkeyPatch
    options: dict[str, list[str]] = field(default_factory=dict)
    applied: set[str] = field(default_factory=set)  # the subcommands that were given `options`

    def run(self, line: str) -> Ran:
        record = self.work / ".recipe"
        record.mkdir(exist_ok=True)
        for name in ("argv", "stdout", "stdin"):
            (record / name).unlink(missing_ok=True)
        env = os.environ | {
            "RECIPE_RECORD": str(record),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        shell = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", SHIM + line],
            cwd=self.work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if shell.returncode != 0 or not (record / "argv").exists():
            return Ran(line, [], shell.returncode, shell.stdout, shell.stderr)
        argv = (record / "argv").read_bytes().decode("utf-8").split("\0")[:-1]
        if argv and argv[0] in self.options:
            argv = with_options(argv, self.options[argv[0]])
            self.applied.add(argv[0])
        stdin = (record / "stdin").read_bytes() if (record / "stdin").exists() else None
        code, out, err = self.attnx(argv, stdin)
        target = (record / "stdout").read_text(encoding="utf-8").strip()
        if target.startswith("/") and not target.startswith("/dev/"):
            Path(target).write_text(out, encoding="utf-8")  # what `> FILE` would have received
        return Ran(line, argv, code, out, err)

    def attnx(self, argv: list[str], stdin: bytes | None) -> tuple[int, str, str]:
        """`attnx ARGV` in this process, in `work`, with `stdin` (if any) fed through a pipe."""
        from attnx.cli import main

        self.capfd.readouterr()
        with self.monkeypatch.context() as patch:
            patch.chdir(self.work)
            if stdin is not None:
                assert len(stdin) < 60_000, "more input than a pipe holds before it is read"
                read, write = os.pipe()
                os.write(write, stdin)
                os.close(write)
                patch.setattr(sys, "stdin", os.fdopen(read, "r", encoding="utf-8"))
            try:
                code = main(argv)
            except SystemExit as stop:  # --help, --print_config
                code = stop.code if isinstance(stop.code, int) else 1
            finally:
                if stdin is not None:
                    sys.stdin.close()
        done = self.capfd.readouterr()
        return code, done.out, done.err

    def run_all(self, blocks: list[str], skip: dict[str, str] | None = None) -> list[Ran]:
        """Every command of `blocks` in order, each asserted to exit 0; a command holding a key of `skip` is not
        run (its value says why)."""
        done = []
        for block in blocks:
            for line in commands(block):
                if any(key in line for key in skip or {}):
                    continue
                ran = self.run(line)
                assert ran.code == 0, f"$ {line}\n  ran as {ran.argv}\n{ran.said[-4000:]}"
                done.append(ran)
        return done


def tiny_fit(steps: int = 6, keep: int = 3) -> str:
    """An override for any fit config: a 2+2-layer, d_model 32 model on one CPU in fp32, `steps` optimizer
    steps on batches of 512 tokens per side, a checkpoint every step (`keep` kept, averaged at the end), a
    validation of one batch (its loss) halfway, and greedy decoding of at most 5 tokens beyond the source."""
    callbacks = [
        {
            "class_path": "attnx.training.checkpointing.PeriodicCheckpoint",
            "init_args": {"minutes": 0, "keep": keep},
        },
        {"class_path": "attnx.training.checkpointing.AverageCheckpoints", "init_args": {"last": keep}},
    ]
    override = {
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "num_nodes": 1,
            "strategy": "auto",
            "precision": "32-true",
            "accumulate_grad_batches": 1,
            "max_steps": steps,
            "max_time": None,
            "val_check_interval": max(1, steps // 2),
            "limit_val_batches": 1,
            "num_sanity_val_steps": 0,
            "log_every_n_steps": 1,
            "callbacks": callbacks,
        },
        "model": {
            "transformer": {"d_model": 32, "n_heads": 4, "d_ff": 64, "encoder_layers": 2, "decoder_layers": 2}
        },
        # no validation BLEU: it scores the first sentences of the corpus, which the one batch validated (of
        # length-sorted batches) need not hold
        "evaluation": {"bleu_samples": 0, "search": {"beam": 1, "max_len_b": 5}},
        "data": {"max_tokens": 512, "eval_max_tokens": 512},
    }
    return yaml.safe_dump(override, sort_keys=False)

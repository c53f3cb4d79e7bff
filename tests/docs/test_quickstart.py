"""Every command of docs/quickstart.md, executed in order in a fresh directory, so the page cannot drift.

The ```bash blocks of the page run one after the other with ``bash -euo pipefail`` in a temporary directory
holding a link to ``configs/`` (the page runs from a clone's root), with ``ATTNX_DATA_DIR`` pointing at the
shared corpora, so ``attnx download --from_dir`` copies them instead of fetching them. The ```sh block
(installation) is not run: this test already runs inside the installed environment.

The page's commands run exactly as written, except that this test appends options to three of them, because
the page's real run takes about half an hour on a CPU and this test must take a minute or two:

``attnx fit``
    ``--config short_fit.yaml``, an override config (:func:`short_fit`) merged over the page's: 6 optimizer steps
    on batches of 500 padded tokens per side instead of 30 minutes on batches of 2,500, validation after every 3
    steps on 2 batches with greedy BLEU of 16 sentences of at most 10 tokens beyond the source length (see
    ``attnx test``), and a checkpoint after every step instead of every 2 minutes, so that
    ``attnx average --last 5`` finds 5 (it averages those there are when fewer than 5 were kept, and says so).
``attnx test``
    one test batch of at most 400 tokens (a few dozen sentences) with greedy search and at most 10 tokens
    beyond the source length: a 6-step model rambles to the length limit, which with beam 4 on all 1,000
    sentences would take minutes alone.
``attnx translate``
    greedy search with the same length limit, for the same reason.

Everything else — download, prepare with the page's vocabulary, the config itself, averaging, the outputs'
paths — is the page's. Then the ```python blocks of the quickstart and of the docs' first page run in the same
directory, on the checkpoint the page made, each in a namespace of its own.

What is asserted is what the commands guarantee — exit codes, files, score lines, one output line per input
line — never what a 6-step model happens to say.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

PAGE = REPO / "docs" / "quickstart.md"
INDEX = REPO / "docs" / "index.md"

CONFIG = REPO / "configs" / "multi30k_cpu.yaml"
STEPS = 6  # of the shortened `attnx fit`: more than the 5 checkpoints `attnx average --last 5` takes


def short_fit() -> str:
    """The override config for ``attnx fit``: the page's config, shortened, with its own callbacks.

    A list replaces a list when configs merge, so the callbacks are the page config's own, with only
    ``PeriodicCheckpoint``'s interval shortened.
    """
    callbacks = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["trainer"]["callbacks"]
    periodic = [c for c in callbacks if c["class_path"].endswith(".PeriodicCheckpoint")]
    assert len(periodic) == 1, f"{CONFIG.name} should keep exactly one PeriodicCheckpoint"
    periodic[0]["init_args"]["minutes"] = 0  # every optimizer step: the same checkpoints on any machine
    override = {
        "trainer": {
            "max_steps": STEPS,
            "val_check_interval": STEPS // 2,
            "limit_val_batches": 2,
            "callbacks": callbacks,
        },
        "evaluation": {"bleu_samples": 16, "search": {"max_len_b": 10}},
        "data": {"max_tokens": 500},
    }
    return yaml.safe_dump(override, sort_keys=False)


OVERRIDES: dict[str, str] = {
    "attnx fit": "--config short_fit.yaml",
    "attnx test": "--trainer.limit_test_batches 1 --data.eval_max_tokens 400 --evaluation.search.beam 1 "
    "--evaluation.search.max_len_b 10",
    "attnx translate": "--search.beam 1 --search.max_len_b 10",
}


def blocks(language: str, page: Path = PAGE) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)


def with_overrides(block: str, applied: list[str]) -> str:
    """``block`` with the test's options appended to each command that :data:`OVERRIDES` names."""
    lines = block.replace("\\\n", " ").splitlines()  # one line per command
    for i, line in enumerate(lines):
        for command, options in OVERRIDES.items():
            if re.search(rf"(^|\| *){command} ", line):
                lines[i] = f"{line} {options}"
                applied.append(command)
    return "\n".join(lines) + "\n"


def test_page_has_the_quickstart_commands():
    text = "\n".join(blocks("bash"))
    for command in ("attnx download", "attnx prepare", "attnx fit", "attnx average", "attnx test"):
        assert command in text, f"{PAGE.name} lost its `{command}` step"
    assert "attnx translate" in text
    install = "\n".join(blocks("sh"))
    assert 'pip install -e ".[dev,docs]" -e plugins/restricted_attention -e plugins/alibi' in install
    assert f"attnx fit --config configs/{CONFIG.name}" in text


def test_short_fit_keeps_the_configs_callbacks():
    override = yaml.safe_load(short_fit())
    page_config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    kinds = [c["class_path"] for c in override["trainer"]["callbacks"]]
    assert kinds == [c["class_path"] for c in page_config["trainer"]["callbacks"]]


@pytest.mark.slow
def test_quickstart_runs_as_written(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / "short_fit.yaml").write_text(short_fit(), encoding="utf-8")
    env = os.environ | {
        "ATTNX_DATA_DIR": str(shared_data),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": "100",
    }
    applied: list[str] = []
    outputs = []
    for block in blocks("bash"):
        script = with_overrides(block, applied)
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert done.returncode == 0, f"$ {script}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        outputs.append(done.stdout)
    assert sorted(set(applied)) == sorted(OVERRIDES), f"overrides applied to {applied}"
    assert "sacreBLEU BLEU = " in outputs[-2]  # attnx test scored the averaged checkpoint
    assert outputs[-1].count("\n") == 1, "attnx translate: one line in, one line out"
    assert "averaged 5 checkpoints" in outputs[-3] and f"step={STEPS}.ckpt" in outputs[-3]
    for path in (
        f"runs/multi30k_cpu/version_0/checkpoints/step={STEPS - 4}.ckpt",
        "runs/multi30k_cpu/version_0/metrics.csv",
    ):
        assert (tmp_path / path).is_file(), path
    # The Python API of the quickstart and of the first page, on the checkpoint the page made: run here, as
    # tests/docs/test_decoding_page.py runs its page's, each block in a namespace of its own.
    python = blocks("python") + blocks("python", INDEX)
    assert len(python) == 2 and all("attnx.load(" in block for block in python)
    monkeypatch.chdir(tmp_path)
    for page, block in zip((PAGE, INDEX), python, strict=True):
        capsys.readouterr()
        exec(compile(block, str(page), "exec"), {"__name__": "__main__"})  # noqa: S102 - the pages' own examples
    printed = capsys.readouterr().out
    assert len(printed.splitlines()) == 2  # the first page prints one translation per sentence
    # The files the page points the reader to exist where it says.
    hyp = "multi30k.test/test.hyp"
    assert hyp in PAGE.read_text(encoding="utf-8")
    for path in (hyp, "runs/multi30k_cpu/version_0/checkpoints/averaged.ckpt", "multi30k.ckpt"):
        assert (tmp_path / path).is_file(), path


def test_the_undertrained_warning_it_quotes_is_the_one_fit_prints():
    """The page's example of the warning is the line `attnx fit` prints (numbers aside), for the steps the
    config's RecipePace says its 30 minutes were written for."""
    from attnx.training.fit_estimate import RecipePace, undertrained_line
    from tests.training.test_fit_estimate import estimate_of

    [pace] = [
        c
        for c in yaml.safe_load(CONFIG.read_text())["trainer"]["callbacks"]
        if "RecipePace" in c["class_path"]
    ]
    assert pace["init_args"] == {"steps": 3000, "minutes": 30}
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    assert "what its 30 minutes were written for, about 3,000 steps" in text
    quoted = re.search(r"`(warning: the model will be undertrained: [^`]+)`", text)
    assert quoted, f"{PAGE.name} lost its example of the warning"
    printed = undertrained_line(RecipePace(**pace["init_args"]), estimate_of(142, step_seconds=12.6), 1800.0)
    assert printed is not None

    def numbers_aside(line: str) -> str:
        return re.sub(r"\d[\d,:.]*", "N", line)

    assert numbers_aside(quoted.group(1)) == numbers_aside(printed)

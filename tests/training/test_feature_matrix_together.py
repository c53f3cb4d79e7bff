"""The feature matrix's runs with every feature on but one of each refused pair
([`test_feature_matrix`][tests.training.test_feature_matrix] says what each run checks): the four such runs in
every precision Lightning offers on a CPU, in one process, and two of them (which hold every feature between them)
under 2-process DDP (gloo) with two batches a step, launched as a user launches them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port
from tests.training.test_feature_matrix import (
    PRECISIONS,
    RUN,
    TOGETHER,
    case_options,
    checkpoint_at,
    fit_argv,
    held_right,
    make_corpus,
    make_parents,
    resumes_alike,
    resuming,
    same_weights,
)

IN_ONE_PROCESS = [(p, c) for p in PRECISIONS for c in TOGETHER]


@pytest.fixture(scope="module")
def matrix_corpus(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(shared_data, tmp_path_factory)


@pytest.fixture(scope="module")
def parents(matrix_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_parents(matrix_corpus, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize(("precision", "case"), IN_ONE_PROCESS)
def test_every_feature_together_holds_in_each_precision_and_resumes(
    matrix_corpus: Path, parents: dict[str, Path], tmp_path: Path, precision: str, case: str
) -> None:
    resumes_alike(matrix_corpus, tmp_path, precision, case_options(case, parents))


UNDER_DDP = [
    ("64-true", "all but lora and subword sampling"),
    ("64-true", "all but ema and guided alignment"),
    ("bf16-true", "all but lora and subword sampling"),
]
"""Two runs together hold every feature between them; both in `64-true`, and the one with an EMA (an fp32
average beside 16-bit weights) in `bf16-true`."""


def fit_ddp(corpus: Path, cwd: Path, precision: str, *extra: str) -> Path:
    """`attnx fit` on 2 CPU processes (gloo), launched as a user launches it; the run folder."""
    cwd.mkdir(parents=True)
    argv = [*fit_argv(corpus, precision), *RUN, "--trainer.devices", "2", "--trainer.strategy", "ddp", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "MASTER_PORT": str(free_port())}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "tests.training.matrix_main", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "MEMBER: 2/2" in done.stderr
    return cwd / "runs" / "tiny" / "version_0"


@pytest.mark.slow
@pytest.mark.parametrize(("precision", "case"), UNDER_DDP)
def test_every_feature_together_under_2_process_ddp_holds_and_resumes(
    matrix_corpus: Path, parents: dict[str, Path], tmp_path: Path, precision: str, case: str
) -> None:
    """Two batches a step: under DDP captured steps replay the first of each step and run the last eagerly."""
    options = [*case_options(case, parents), "--trainer.accumulate_grad_batches", "2"]
    whole = fit_ddp(matrix_corpus, tmp_path / "whole", precision, *options)
    held_right(tmp_path / "whole", ranks=2)
    middle = tmp_path / "middle.ckpt"
    shutil.copy(checkpoint_at(whole, 2), middle)
    resumed = fit_ddp(matrix_corpus, tmp_path / "resumed", precision, *resuming(options, middle))
    held_right(tmp_path / "resumed", ranks=2)
    same_weights(whole, resumed, precision)

"""A small real corpus (a slice of Multi30k, prepared by `attnx prepare`) and helpers to run `attnx fit` here."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.conftest import REPO, one_thread

TINY = REPO / "configs" / "tiny.yaml"


_one_thread = pytest.fixture(autouse=True, scope="module")(one_thread)


def fit_args(corpus: Path, *extra: str, subcommand: str = "fit") -> list[str]:
    """``attnx <subcommand> --config configs/tiny.yaml`` on the slice, logging under the current directory."""
    return [subcommand, "--config", str(TINY), "--data.data_dir", str(corpus), *extra]


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def train_losses(run_dir: Path) -> dict[int, float]:
    """Training loss per optimizer step, from the CSV logger."""
    return {
        int(row["step"]): float(row["train/loss"]) for row in read_metrics(run_dir) if row.get("train/loss")
    }


@pytest.fixture(scope="session")
def uninterrupted_run(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of a 12-step ``attnx fit`` never interrupted (tests/training/test_resume.py's settings, a
    checkpoint every second step, the last 3 kept and averaged), run once for the tests that stop runs and
    resume them: tests/training/test_runs.py compares their checkpoints and logs with it, test_stopping.py the
    weights they end with."""
    from tests.training.test_runs import STEPS, every_two_steps
    from tests.training.test_stopping import attnx_command, run

    work = tmp_path_factory.mktemp("uninterrupted")
    run(attnx_command(corpus, "--trainer.max_steps", str(STEPS), config=every_two_steps(work)), work)
    return work / "runs" / "tiny" / "version_0"

"""Two CPU processes under Lightning's DDP strategy (gloo), launched the way a user launches them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.training.conftest import fit_args, train_losses


def test_two_process_ddp_fit(corpus: Path, tmp_path: Path) -> None:
    args = fit_args(corpus, "--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.max_steps", "4")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-m", "attnx", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in done.stderr
    run = tmp_path / "runs" / "tiny" / "version_0"
    assert len(train_losses(run)) == 4
    averaged = torch.load(run / "checkpoints" / "averaged.ckpt", weights_only=True)
    assert averaged["global_step"] == 4 and averaged["attnx"]["transformer"]["vocab_size"] == 300

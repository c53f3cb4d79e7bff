"""Two CPU processes under Lightning's DDP strategy (gloo), launched the way a user launches them; captured steps
(tests/training/test_captured_steps.py) stay off on CPUs, said once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import free_port
from tests.training.conftest import fit_args, train_losses


def test_two_process_ddp_fit(corpus: Path, tmp_path: Path) -> None:
    args = fit_args(corpus, "--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.max_steps", "4")
    args += ["--cuda_graphs", "true"]  # asked for on CPUs: said once (rank 0), then eager training
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "MASTER_PORT": str(free_port())}
    done = subprocess.run(
        [sys.executable, "-m", "attnx", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in done.stderr
    line = "--cuda_graphs: CUDA graphs need a CUDA device; this run trains on cpu, eagerly"
    assert done.stdout.count(line) == 1, done.stdout[-2000:]
    run = tmp_path / "runs" / "tiny" / "version_0"
    assert len(train_losses(run)) == 4
    averaged = torch.load(run / "checkpoints" / "averaged.ckpt", weights_only=True)
    assert averaged["global_step"] == 4 and averaged["attnx"]["transformer"]["vocab_size"] == 300

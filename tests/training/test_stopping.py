"""A run told to stop saves first: SIGTERM anywhere, Ctrl+C and Slurm's SIGUSR1 (requeue) end a real ``attnx fit`` with a
checkpoint, one line saying how to resume and a non-zero status; resuming ends with the uninterrupted run's weights."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import free_port
from tests.training.conftest import TINY
from tests.training.test_resume import resume_args

STEPS = "12"  # the uninterrupted run; the interrupted ones are stopped near step 3


def attnx_command(corpus: Path, *extra: str, config: Path = TINY) -> list[str]:
    args = ["fit", "--config", str(config), "--data.data_dir", str(corpus), *resume_args(), *extra]
    return [sys.executable, "-m", "attnx", *args]


def environment(**extra: str) -> dict[str, str]:
    port = str(free_port())  # for the DDP runs' ranks, outside the ports other tests' connections take
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "MASTER_PORT": port, **extra}


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        command, cwd=cwd, env=env or environment(), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def signal_when(
    command: list[str],
    cwd: Path,
    ready: str,
    signals: list[int],
    env: dict[str, str] | None = None,
    timeout: float = 240,
    gap: float = 0.0,
    group: bool = False,
) -> subprocess.CompletedProcess:
    """Start ``command``, send ``signals`` (``gap`` seconds apart) once it prints a line starting with ``ready``,
    and wait for it to end; with ``group``, to its whole process group, as Slurm, `timeout` or a service
    manager do."""
    cwd.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env or environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
    )
    try:
        for line in process.stdout:  # e.g. rank 0's plain progress lines: "step 2/100000 | ..."
            if line.startswith(ready):
                break
        else:
            pytest.fail(f"the run ended before {ready!r}: {process.wait()}, {process.stderr.read()[-3000:]}")
        for i, signum in enumerate(signals):
            time.sleep(gap if i else 0.0)
            if group:
                os.killpg(process.pid, signum)
            else:
                process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def stop_at(
    command: list[str], cwd: Path, step: int, signum: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``command`` until it prints its progress line of ``step``, then send ``signum`` and wait."""
    return signal_when([*command, "--progress.every_n_steps", "1"], cwd, f"step {step}/", [signum], env)


def interrupt(
    command: list[str], cwd: Path, signum: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Send ``signum`` once ``command`` has printed its progress line of step 2, wait for it to end."""
    return stop_at(command, cwd, 2, signum, env)


def hourly_checkpoints(tmp_path: Path) -> Path:
    """configs/tiny.yaml saving once an hour instead of every step: a checkpoint can only come from the signal."""
    config = yaml.safe_load(TINY.read_text())
    config["trainer"]["callbacks"][0]["init_args"]["minutes"] = 60
    path = tmp_path / "hourly.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def resume_hint(stderr: str) -> tuple[int, list[str]]:
    """The step and the command of ``attnx fit: interrupted at step N (SIG...); resume with: attnx fit ...``."""
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("attnx fit: interrupted at step "), stderr[-3000:]
    step = int(line.split("interrupted at step ")[1].split()[0])
    command = shlex.split(line.split("resume with: ")[1])
    assert command[:2] == ["attnx", "fit"]
    return step, [sys.executable, "-m", "attnx", *command[1:]]


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, weights_only=True)["state_dict"]


def assert_same_weights(a: Path, b: Path) -> None:
    ours, theirs = weights(a), weights(b)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run: Path) -> Path:
    """``last.ckpt`` of a 12-step run never interrupted (its checkpoints, every second step, do not change its
    weights)."""
    last = uninterrupted_run / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == int(STEPS)
    return last


@pytest.mark.parametrize(
    ("signum", "status", "said"),
    [
        (signal.SIGTERM, 143, ""),
        (signal.SIGINT, 130, "Ctrl+C: saving a checkpoint"),
        (signal.SIGUSR1, 138, ""),  # outside Slurm: as SIGTERM, with its own status
    ],
    ids=["SIGTERM", "Ctrl+C", "SIGUSR1"],
)
def test_a_stop_signal_saves_says_how_to_resume_and_exits_non_zero(
    corpus: Path, tmp_path: Path, uninterrupted: Path, signum: int, status: int, said: str
) -> None:
    hourly = attnx_command(corpus, "--trainer.max_steps", "100000", config=hourly_checkpoints(tmp_path))
    stopped = interrupt(hourly, tmp_path, signum)
    assert stopped.returncode == status, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and said in stopped.stderr
    step, command = resume_hint(stopped.stderr)
    assert f"({signal.Signals(signum).name}); resume with: " in stopped.stderr.splitlines()[-1]
    assert 2 <= step < int(STEPS)
    checkpoints = tmp_path / "runs" / "tiny" / "version_0" / "checkpoints"
    # the signal's save, off the hourly schedule: the resume point alone, no step checkpoint to keep or average
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.ckpt"]
    assert command[-2:] == ["--ckpt_path", str((checkpoints / "last.ckpt").relative_to(tmp_path))]
    saved = torch.load(checkpoints / "last.ckpt", weights_only=True)
    assert saved["global_step"] == step
    (clock,) = (state for key, state in saved["callbacks"].items() if key.startswith("PeriodicCheckpoint"))
    assert (
        clock["saved"] == [] and clock["seconds_since_save"] > 0
    )  # the hour goes on counting after a resume
    at = command.index("--trainer.max_steps")  # the printed command, run where it was printed, to STEPS
    run([*command[: at + 1], STEPS, *command[at + 2 :]], tmp_path)
    assert_same_weights(checkpoints / "last.ckpt", uninterrupted)  # the resumed run continued in its folder
    # as the uninterrupted hourly run: the end's checkpoint, alone kept and averaged
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "averaged.ckpt",
        "last.ckpt",
        f"step={STEPS}.ckpt",
    ]
    assert sorted(p.name for p in (tmp_path / "runs" / "tiny").iterdir()) == ["version_0"]


def test_sigterm_to_one_rank_of_ddp_stops_every_rank_at_one_saved_step(corpus: Path, tmp_path: Path) -> None:
    """Only rank 0 (the launching process) is signalled; rank 1 learns it at the next step and saves with it."""
    ddp = ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--trainer.max_steps", "100000"]
    stopped = interrupt(attnx_command(corpus, *ddp), tmp_path, signal.SIGTERM)
    assert stopped.returncode == 143 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert stopped.stderr.count("attnx fit: interrupted at step") == 1  # rank 0 alone says it
    step, _ = resume_hint(stopped.stderr)
    checkpoints = tmp_path / "runs" / "tiny" / "version_0" / "checkpoints"
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == step
    assert not list(tmp_path.glob("runs/tiny/version_1"))  # one run directory for both ranks


SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "attnx-fit",
    "SLURM_NTASKS": "1",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "127.0.0.1",
}
"""What Slurm sets for a one-task job: Lightning's SLURMEnvironment (auto_requeue) takes charge."""


def fake_scontrol(directory: Path) -> Path:
    """An ``scontrol`` that only records its arguments (no Slurm here): the log it writes to."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "scontrol.log"
    script = directory / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    script.chmod(0o755)
    return log


def test_slurm_sigusr1_saves_requeues_and_the_requeued_job_resumes_exactly(
    corpus: Path, tmp_path: Path, uninterrupted: Path
) -> None:
    calls = fake_scontrol(tmp_path / "bin")
    env = environment(**SLURM, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    work = tmp_path / "job"
    stopped = interrupt(attnx_command(corpus, "--trainer.max_steps", "100000"), work, signal.SIGUSR1, env)
    assert stopped.returncode == 128 + signal.SIGUSR1 and "Traceback" not in stopped.stderr, stopped.stderr[
        -3000:
    ]
    step, _ = resume_hint(stopped.stderr)
    assert "(SIGUSR1); requeued Slurm job 4242;" in stopped.stderr.splitlines()[-1]
    assert calls.read_text() == "requeue 4242\n"
    assert not list(work.rglob("hpc_ckpt_*.ckpt"))  # attnx saved, not Lightning's own SIGUSR1 handler
    assert 2 <= step < int(STEPS)
    # the requeued job runs the sbatch script again, which resumes with --ckpt_path last (docs/cluster.md)
    env["SLURM_RESTART_COUNT"] = "1"
    run(attnx_command(corpus, "--trainer.max_steps", STEPS, "--ckpt_path", "last"), work, env)
    assert_same_weights(work / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt", uninterrupted)
    assert sorted(p.name for p in (work / "runs" / "tiny").iterdir()) == ["version_0"]  # one run, one folder


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["Ctrl+C", "SIGTERM"]
)
def test_a_stop_signal_during_the_sanity_check_stops_at_once_with_one_line(
    corpus: Path, tmp_path: Path, signum: int, status: int
) -> None:
    """Before the first step there is nothing to save: the command ends at once (not after the check), in one line,
    and the new run's folder, which never trained, is not left behind."""
    from tests.conftest import REPO
    from tests.training.slow_sanity import BEGINS

    probe = [
        "--trainer.callbacks+=tests.training.slow_sanity.SlowSanityCheck",
        "--trainer.num_sanity_val_steps",
        "1",
    ]
    env = environment(PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    # the check alone takes 1,200 s: ending within 300 (a loaded machine's teardown included) is "at once"
    done = signal_when(attnx_command(corpus, *probe), tmp_path, BEGINS, [signum], env, timeout=300)
    stderr = done.stderr
    name = signal.Signals(signum).name
    assert done.returncode == status, stderr[-3000:]
    assert stderr.strip().splitlines() == [
        f"attnx fit: stopped by {name} before training began; nothing was saved"
    ]
    assert not list(tmp_path.glob("runs/tiny/version_*"))


def test_sigterm_to_the_process_group_with_data_loader_workers_saves_and_says_how_to_resume(
    corpus: Path, tmp_path: Path
) -> None:
    """Slurm's scancel signals every process of the job: the data loader's workers leave SIGTERM to the training
    process, which saves and says how to resume, instead of failing with "DataLoader worker is killed"."""
    hourly = attnx_command(corpus, "--trainer.max_steps", "100000", config=hourly_checkpoints(tmp_path))
    command = [*hourly, "--data.num_workers", "2", "--progress.every_n_steps", "1"]
    done = signal_when(command, tmp_path, "step 2/", [signal.SIGTERM], timeout=600, group=True)
    assert done.returncode == 143 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "(SIGTERM); resume with: " in done.stderr.strip().splitlines()[-1]
    assert (tmp_path / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt").is_file()


def test_two_ctrl_c_in_quick_succession_exit_130_with_one_line(corpus: Path, tmp_path: Path) -> None:
    hourly = attnx_command(corpus, "--trainer.max_steps", "100000", config=hourly_checkpoints(tmp_path))
    sigint = signal.SIGINT
    done = signal_when(
        [*hourly, "--progress.every_n_steps", "1"],
        tmp_path,
        "step 2/",
        [sigint, sigint],
        timeout=600,
        gap=0.03,
    )
    stderr = done.stderr
    assert done.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    lines = [
        line for line in stderr.strip().splitlines() if "Ctrl+C: saving a checkpoint" not in line and line
    ]
    assert len(lines) == 1, stderr[-3000:]
    # the second Ctrl+C came mid-step (stopped without saving) or while the first one's save ran (it completes)
    assert lines[0].startswith(
        (
            "attnx fit: stopped by a second Ctrl+C, at once and without saving",
            "attnx fit: interrupted at step ",
        )
    ), lines

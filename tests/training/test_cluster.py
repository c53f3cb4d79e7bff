"""Multi-node training as docs/cluster.md launches it: two torchrun "nodes" on this machine (gloo, 127.0.0.1),
static and c10d rendezvous, a resume on one node; and the paper's shape, 8 ranks with big.yaml's DDP settings."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import REPO, free_port
from tests.training.conftest import train_losses
from tests.training.ddp_probe import assert_ranks_agree, read_ranks
from tests.training.test_runs import checkpoint_files, every_two_steps

PAGE = REPO / "docs" / "cluster.md"
BIN = Path(sys.executable).parent  # where torchrun and attnx are installed


def page_commands(prefix: str) -> list[str]:
    """The commands of docs/cluster.md's bash blocks that start with ``prefix`` (continuation lines joined)."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [re.sub(r"\s+", " ", line).strip() for line in lines if line.strip().startswith(prefix)]


def environment() -> dict[str, str]:
    """Where torchrun does not set it, the port of Lightning's own launch (free_port: not an ephemeral one)."""
    path = f"{BIN}{os.pathsep}{os.environ['PATH']}"
    return {**os.environ, "OMP_NUM_THREADS": "1", "PATH": path, "MASTER_PORT": str(free_port())}


def probe_args(corpus: Path, probe: Path, steps: int) -> list[str]:
    """What a test adds to the page's commands: its corpus, a short run, and a probe that records each rank."""
    return [
        *(
            "--data.data_dir",
            str(corpus),
            "--trainer.max_steps",
            str(steps),
            "--evaluation.bleu_samples",
            "0",
        ),
        *(
            "--trainer.callbacks+=tests.training.ddp_probe.RankProbe",
            "--trainer.callbacks.output",
            str(probe),
        ),
    ]


def launch(commands: list[str], cwd: Path, extras: list[str]) -> list[subprocess.CompletedProcess]:
    """Run the commands at once (one per node) and wait for all of them."""
    env = {**environment(), "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    processes = [
        subprocess.Popen(
            [*shlex.split(command), *extras],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for command in commands
    ]
    try:
        outputs = [p.communicate(timeout=900)[0] for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    done = [
        subprocess.CompletedProcess(p.args, p.returncode, out, "")
        for p, out in zip(processes, outputs, strict=True)
    ]
    for d in done:
        assert d.returncode == 0, d.stdout[-4000:]
    return done


def assert_one_checkpoint_set(cwd: Path, steps: int, every: int = 1) -> Path:
    """One run folder holding the last 3 checkpoints (one every ``every`` steps), ``last`` and their average."""
    runs = sorted(p.name for p in (cwd / "runs" / "tiny").iterdir())
    assert runs == ["version_0"], runs  # one run directory, written by rank 0 alone
    checkpoints = cwd / "runs" / "tiny" / "version_0" / "checkpoints"
    names = sorted(p.name for p in checkpoints.iterdir())
    kept = [f"step={s}.ckpt" for s in range(steps, 0, -every)[:3]]
    assert names == sorted(["averaged.ckpt", "last.ckpt", *kept]), names
    return checkpoints


def static_nodes() -> list[str]:
    """The page's two static torchrun commands, node 0's and node 1's, on a free port."""
    port = free_port()
    return [
        c.replace("--master_port 29500", f"--master_port {port}")
        for c in page_commands("torchrun")
        if "--node_rank" in c
    ]


STEPS = 8  # of the two-node run below


def two_node_args(corpus: Path, work: Path) -> list[str]:
    """What the two-node runs add to the page's commands: a checkpoint every second step (the config first: what
    follows it overrides it), the corpus, 8 steps, no BLEU, a progress line every step."""
    return [
        "--config",
        str(every_two_steps(work)),
        *probe_args(corpus, work / "probe", STEPS)[:6],
        "--progress.every_n_steps",
        "1",
    ]


@pytest.fixture(scope="module")
def two_nodes(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of docs/cluster.md's two static torchrun nodes trained for 8 steps, never interrupted, with a
    probe recording each rank (in ``probe/``): the first test below checks it and resumes a copy of it on one
    node; the last one interrupts the same command and compares the run it ends with this one."""
    work = tmp_path_factory.mktemp("two_nodes")
    probe = probe_args(corpus, work / "probe", STEPS)[
        6:
    ]  # the callback alone: it records, never changes a run
    launch(static_nodes(), work, [*two_node_args(corpus, work), *probe])
    return work


def test_two_nodes_through_torchrun_then_a_resume_on_one(
    corpus: Path, two_nodes: Path, tmp_path: Path
) -> None:
    static = [c for c in page_commands("torchrun") if "--node_rank" in c]
    assert [c.split("--node_rank ")[1][0] for c in static] == ["0", "1"] and len(
        {c.split(" --node_rank")[1][2:] for c in static}
    ) == 1
    records = read_ranks(two_nodes / "probe", 2)
    assert all(r["num_nodes"] == 2 for r in records)
    assert_ranks_agree(records, STEPS)
    checkpoints = assert_one_checkpoint_set(two_nodes, STEPS, every=2)
    saved = torch.load(checkpoints / "last.ckpt", weights_only=True)
    assert saved["global_step"] == STEPS

    # one node, one process, on a copy of the run: continues from step 8, saying the batch order changes with
    # the world size
    shutil.copytree(two_nodes / "runs", tmp_path / "runs")
    resume = [BIN / "attnx", "fit", "--config", "tiny", "--data.data_dir", str(corpus), "--ckpt_path", "last"]
    done = subprocess.run(
        [*map(str, resume), "--trainer.max_steps", str(STEPS + 2), "--evaluation.bleu_samples", "0"],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the batch plan differs from the checkpoint's" in done.stderr and "world size" in done.stderr
    assert sorted(train_losses(tmp_path / "runs" / "tiny" / "version_0")) == list(
        range(STEPS + 2)
    )  # the same run


def test_two_nodes_through_a_c10d_rendezvous(corpus: Path, tmp_path: Path) -> None:
    port = free_port()
    (command,) = [c for c in page_commands("torchrun") if "--rdzv_backend c10d" in c]
    command = command.replace("127.0.0.1:29400", f"127.0.0.1:{port}")
    # The page's store process, which outlives both nodes' torchruns: with the store inside one of them, that
    # torchrun ending first fails the other's poll (RendezvousConnectionError) after training, on a loaded
    # machine often enough to fail this test. Both torchruns then connect to it as clients.
    (store_command,) = page_commands("python -c")
    argv = shlex.split(store_command.replace("29400", str(port)))
    store = subprocess.Popen([sys.executable, *argv[1:]])
    try:
        deadline = (
            time.monotonic() + 600
        )  # a cold torch import on a loaded machine; waited out only on failure
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert store.poll() is None, (
                f"the store process of docs/cluster.md exited with {store.returncode}"
            )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"the store process of docs/cluster.md did not listen on port {port} within 600 s"
                )
            time.sleep(0.1)
        launch([command, command], tmp_path, probe_args(corpus, tmp_path / "probe", 2))
    finally:
        store.terminate()
        store.wait(timeout=60)
    assert_ranks_agree(read_ranks(tmp_path / "probe", 2), 2)
    assert_one_checkpoint_set(tmp_path, 2)


def test_the_slurm_script_requeues_on_sigusr1_and_resumes_with_last() -> None:
    """The script's signal and resume lines are what tests/training/test_stopping.py runs under Slurm's variables."""
    script = PAGE.read_text(encoding="utf-8")
    assert "#SBATCH --signal=SIGUSR1@90" in script and "#SBATCH --requeue" in script
    assert 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then RESUME=(--ckpt_path last); fi' in script
    (srun,) = page_commands("srun")
    assert srun.startswith("srun attnx fit --config big ") and srun.endswith('"${RESUME[@]}"')


@pytest.mark.slow
def test_eight_ranks_with_the_big_configs_ddp_settings(corpus: Path, tmp_path: Path) -> None:
    """configs/big.yaml's trainer on the tiny model, 8 CPU processes instead of 8 GPUs: 2 steps."""
    big = yaml.safe_load((REPO / "configs" / "big.yaml").read_text())["trainer"]
    ddp = {key: big[key] for key in ("devices", "num_nodes", "strategy", "accumulate_grad_batches")}
    assert ddp == {"devices": 8, "num_nodes": 1, "strategy": "ddp", "accumulate_grad_batches": 1}
    args = [f"--trainer.{key}={value}" for key, value in ddp.items()] + ["--trainer.accelerator", "cpu"]
    command = [
        str(BIN / "attnx"),
        "fit",
        "--config",
        "tiny",
        *args,
        *probe_args(corpus, tmp_path / "probe", 2),
    ]
    env = {**environment(), "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    records = read_ranks(tmp_path / "probe", 8)
    assert_ranks_agree(records, 2)
    checkpoints = assert_one_checkpoint_set(tmp_path, 2)
    averaged = torch.load(checkpoints / "averaged.ckpt", weights_only=True)["state_dict"]
    states = [torch.load(checkpoints / f"step={s}.ckpt", weights_only=True)["state_dict"] for s in (1, 2)]
    for name in averaged:
        torch.testing.assert_close(averaged[name], (states[0][name] + states[1][name]) / 2)


def start_nodes(commands: list[str], cwd: Path, extras: list[str]) -> list[subprocess.Popen]:
    """Start one command per node, at once."""
    env = {**environment(), "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return [
        subprocess.Popen(
            [*shlex.split(command), *extras],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for command in commands
    ]


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants: torchrun starts its workers in sessions of their own."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def kill_tree(pid: int, signum: int) -> None:
    for member in reversed(process_tree(pid)):  # the workers first
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signum)


def signal_nodes_at(processes: list[subprocess.Popen], step: int, signum: int, nodes: int) -> list[str]:
    """Once node 0 prints its progress line of ``step``, send ``signum`` to the first ``nodes`` nodes (SIGKILL to
    every process of the node, another signal to torchrun, which passes it on to its workers); wait for all of them
    to end and return what each printed after that line."""
    try:
        for line in processes[0].stdout:
            if line.startswith(f"step {step}/"):
                break
        else:
            pytest.fail(f"node 0 ended before step {step}")
        for process in processes[:nodes]:
            if signum == signal.SIGKILL:
                kill_tree(process.pid, signum)
            else:
                process.send_signal(signum)
        return [process.communicate(timeout=900)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                kill_tree(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.slow
def test_two_nodes_killed_and_resumed_end_as_the_uninterrupted_run(
    corpus: Path, two_nodes: Path, tmp_path: Path
) -> None:
    """docs/cluster.md's two torchrun nodes: SIGKILL to both, a resume, SIGTERM to node 0, a resume; the run ends in
    one folder with the uninterrupted run's checkpoints and a byte-identical averaged checkpoint."""
    extras = two_node_args(corpus, tmp_path)
    signal_nodes_at(start_nodes(static_nodes(), tmp_path, extras), 3, signal.SIGKILL, nodes=2)
    resume = [*extras, "--ckpt_path", "last"]
    outputs = signal_nodes_at(start_nodes(static_nodes(), tmp_path, resume), 5, signal.SIGTERM, nodes=1)
    assert "attnx fit: interrupted at step" in outputs[0] and "(SIGTERM)" in outputs[0], outputs[0][-3000:]
    launch(static_nodes(), tmp_path, resume)

    whole, ours = (d / "runs" / "tiny" / "version_0" for d in (two_nodes, tmp_path))
    assert sorted(p.name for p in ours.parent.iterdir()) == ["version_0"]
    assert checkpoint_files(ours) == checkpoint_files(whole)
    assert f"step={STEPS}.ckpt" in checkpoint_files(ours)
    averaged = (ours / "checkpoints" / "averaged.ckpt").read_bytes()
    assert averaged == (whole / "checkpoints" / "averaged.ckpt").read_bytes()
    assert sorted(train_losses(ours)) == list(range(STEPS)) and train_losses(ours) == train_losses(whole)

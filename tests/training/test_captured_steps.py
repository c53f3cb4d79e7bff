"""`--cuda_graphs` inside `attnx fit`: when a run captures and the line that says so, the plan's shapes, DDP's
sync flag, and a whole fit replaying its batches (on a CPU, through the replaying backend of test_capture)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy

from attnx.cli import main as attnx
from attnx.components.alignment_loss import GuidedAlignmentLoss
from attnx.data.datamodule import TranslationDataModule
from attnx.training import captured_steps
from attnx.training.capture import MAX_GRAPHS
from attnx.training.captured_steps import capture_plan, planned_shapes, syncs_gradients
from tests.training.conftest import fit_args, read_metrics, train_losses
from tests.training.test_capture import FakeGraphs
from tests.training.test_host_syncs import count_read_backs


def trainer(strategy, accumulate: int = 1, buckets: int | None = 8) -> SimpleNamespace:
    datamodule = None if buckets is None else SimpleNamespace(resolved_shape_buckets=lambda: buckets)
    return SimpleNamespace(strategy=strategy, accumulate_grad_batches=accumulate, datamodule=datamodule)


MODULE = SimpleNamespace(automatic_optimization=True)
CPU = SingleDeviceStrategy(device=torch.device("cpu"))
GPU = SingleDeviceStrategy(device=torch.device("cuda", 0))


def test_on_a_cpu_capture_is_off_and_said_only_when_asked_for() -> None:
    assert capture_plan(None, trainer(CPU), MODULE) == (False, "")
    assert capture_plan(False, trainer(CPU), MODULE) == (False, "")
    assert capture_plan(True, trainer(CPU), MODULE) == (
        False,
        "--cuda_graphs: CUDA graphs need a CUDA device; this run trains on cpu, eagerly",
    )


def test_on_a_gpu_capture_is_on_by_default_where_batches_come_in_shape_buckets() -> None:
    on, line = capture_plan(None, trainer(GPU), MODULE)
    assert on and line.startswith("captured steps: on,") and "--cuda_graphs false" in line
    assert capture_plan(False, trainer(GPU), MODULE) == (False, "captured steps: off (--cuda_graphs false)")
    on, line = capture_plan(None, trainer(GPU, buckets=0), MODULE)
    assert not on and "data.shape_buckets 0" in line and f"up to {MAX_GRAPHS} shapes" in line
    assert capture_plan(True, trainer(GPU, buckets=0), MODULE)[0]  # asked for: captured anyway
    manual = SimpleNamespace(automatic_optimization=False)
    assert capture_plan(None, trainer(GPU), manual) == (
        False,
        "captured steps: off (the module optimizes manually)",
    )
    guided = SimpleNamespace(automatic_optimization=True, loss=GuidedAlignmentLoss())
    on, line = capture_plan(True, trainer(GPU), guided)
    assert not on and line.startswith("captured steps: off (loss GuidedAlignmentLoss:")


def test_activation_checkpointing_keeps_captured_steps_off_in_one_line() -> None:
    """A checkpoint's recomputation reads the CUDA generator's state, which a capture cannot: eager steps."""
    checkpointed = SimpleNamespace(automatic_optimization=True, model=SimpleNamespace(checkpoint_layers=True))
    for enabled in (None, True):
        on, line = capture_plan(enabled, trainer(GPU), checkpointed)
        assert not on and line.startswith("captured steps: off (model.transformer.activation_checkpointing:")


def test_under_ddp_capture_needs_gradient_accumulation_and_other_strategies_train_eagerly() -> None:
    ddp = DDPStrategy(parallel_devices=[torch.device("cuda", 0)])
    on, line = capture_plan(None, trainer(ddp, accumulate=1), MODULE)
    assert not on and "off under DDP without gradient accumulation" in line
    on, line = capture_plan(None, trainer(ddp, accumulate=4), MODULE)
    assert on and "under DDP 3 of every 4 batches replay" in line
    fsdp = FSDPStrategy(parallel_devices=[torch.device("cuda", 0)])
    on, line = capture_plan(True, trainer(fsdp, accumulate=4), MODULE)
    assert (
        not on and line == "captured steps: off (strategy FSDPStrategy: single-device and DDP runs capture)"
    )


def test_the_plans_shapes_come_most_frequent_first() -> None:
    shapes = np.array([[4, 8, 8], [2, 16, 16], [4, 8, 8], [8, 8, 16], [2, 16, 16], [4, 8, 8]])
    datamodule = SimpleNamespace(train_sampler=SimpleNamespace(shapes=shapes))
    assert planned_shapes(datamodule) == [(4, 8, 8), (2, 16, 16), (8, 8, 16)]
    assert planned_shapes(SimpleNamespace()) == []


def test_ddp_outside_no_sync_all_reduces_and_inside_does_not(tmp_path: Path) -> None:
    """The flag the training step reads to run the batch whose backward all-reduces eagerly (gloo, one process)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = DistributedDataParallel(torch.nn.Linear(2, 2))
        assert syncs_gradients(model)
        with model.no_sync():
            assert not syncs_gradients(model)
        assert not syncs_gradients(torch.nn.Linear(2, 2))
    finally:
        dist.destroy_process_group()


STEPS, ACCUMULATE = 3, 2
RUN = [
    "--trainer.max_steps",
    str(STEPS),
    "--trainer.accumulate_grad_batches",
    str(ACCUMULATE),
    "--data.shape_buckets",
    "8",
    "--trainer.limit_val_batches",
    "0",
    "--evaluation.bleu_samples",
    "0",
    "--trainer.enable_checkpointing",
    "false",
    "--trainer.callbacks",
    "null",
]


def test_a_fit_that_replays_its_batches_logs_the_eager_fits_losses(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dropout on, two batches a step: the eager fit (`--cuda_graphs true` on a CPU: one line, then eager) and
    the fit whose steps are captured before the first one and replayed (the replaying backend stands in for
    CUDA graphs) log the same losses; the captured fit reads back from the device only for the NaN check once
    a step (tests/training/test_host_syncs.py), says how many shapes, their memory and time, and at the end
    that every batch replayed."""
    for name in ("eager", "captured"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "eager")
    assert attnx(fit_args(corpus, *RUN, "--cuda_graphs", "true")) == 0
    out = capsys.readouterr().out
    assert out.count("--cuda_graphs: CUDA graphs need a CUDA device; this run trains on cpu, eagerly") == 1
    assert "captured steps" not in out

    monkeypatch.setattr(captured_steps, "BACKENDS", {"cpu": FakeGraphs})
    monkeypatch.chdir(tmp_path / "captured")
    sites = count_read_backs(monkeypatch)
    assert attnx(fit_args(corpus, *RUN)) == 0
    assert list(sites.values()) == [STEPS], sites  # the NaN check, once a step: the replays read nothing
    out = capsys.readouterr().out
    assert "captured steps: on, each batch shape captured once as a CUDA graph" in out
    first = re.search(
        r"captured steps: (\d+) shapes of the training batches captured before the first step", out
    )
    assert first and int(first.group(1)) > 1, out
    shapes = int(first.group(1))
    assert f"{3 * shapes} MiB of graph memory" in out  # FakeGraphs reports 3 MiB a capture
    assert f"captured steps: {shapes} shapes captured in" in out
    assert f"{STEPS * ACCUMULATE:,} batches replayed" in out and "eager:" not in out, out

    eager = train_losses(tmp_path / "eager" / "runs" / "tiny" / "version_0")
    captured = train_losses(tmp_path / "captured" / "runs" / "tiny" / "version_0")
    assert len(eager) == STEPS and eager.keys() == captured.keys()
    for step, loss in eager.items():
        assert captured[step] == pytest.approx(loss, rel=1e-5), (eager, captured)


# ------------------------------------------------------------- through Lightning's own paths, on a CPU

VALIDATED = [
    "--data.shape_buckets",
    "8",
    "--trainer.limit_val_batches",
    "2",
    "--evaluation.bleu_samples",
    "0",
]


def captured_fit(corpus: Path, work: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[str, Path]:
    """`attnx fit` in `work` with its steps captured by the replaying backend, validating as `extra` says;
    what it printed and its run folder."""
    work.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(captured_steps, "BACKENDS", {"cpu": FakeGraphs})
        mp.chdir(work)
        code = attnx(fit_args(corpus, *VALIDATED, *extra))
    assert code == 0
    return work / "runs" / "tiny" / "version_0"


def replayed_every_batch(out: str, batches: int) -> None:
    """The end-of-training line: every training batch replayed, none eager."""
    [last] = [line for line in out.splitlines() if "batches replayed" in line][-1:]
    assert f"; {batches:,} batches replayed" in last and "eager:" not in last, out


def validations(run: Path) -> list[int]:
    return [int(row["step"]) for row in read_metrics(run) if row.get("val/loss")]


def test_every_batch_after_a_validation_still_replays(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Validation every 2 batches: Lightning clears the gradients before each (`on_validation_model_zero_grad`,
    whose default sets them to None), and the graphs add into those very tensors."""
    run = captured_fit(
        corpus, tmp_path / "run", monkeypatch, "--trainer.max_steps", "6", "--trainer.val_check_interval", "2"
    )
    out = capsys.readouterr().out
    assert validations(run) == [1, 3, 5]
    replayed_every_batch(out, 6)


def test_with_gradient_accumulation_every_batch_after_a_validation_still_replays(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two batches a step, a validation every 4 batches (on the step boundary, where Lightning clears the
    gradients): the end of each accumulation window zeroes in place too."""
    run = captured_fit(
        corpus,
        tmp_path / "run",
        monkeypatch,
        *("--trainer.max_steps", "5", "--trainer.accumulate_grad_batches", "2"),
        *("--trainer.val_check_interval", "4"),
    )
    out = capsys.readouterr().out
    assert validations(run) == [1, 3]
    replayed_every_batch(out, 10)


class GradNorms(Callback):
    """The gradients' norm before each optimizer step, a line each in `grad_norms.txt` of the working folder."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad.norm() for p in pl_module.parameters() if p.grad is not None]
        with open("grad_norms.txt", "a", encoding="utf-8") as f:
            f.write(f"{float(torch.linalg.vector_norm(torch.stack(grads))):.9g}\n")


def test_captured_steps_follow_a_gradient_accumulation_schedule(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`GradientAccumulationScheduler` accumulates 2 batches a step from epoch 1 on: a replayed step's gradients
    are divided by the divisor of its own epoch, and equal the eager run's step for step."""
    datamodule = TranslationDataModule(str(corpus), max_tokens=512, shape_buckets=8)
    per_epoch = len(datamodule.train_sampler)
    schedule = [
        "--trainer.callbacks+=lightning.pytorch.callbacks.GradientAccumulationScheduler",
        '--trainer.callbacks.scheduling={"0": 1, "1": 2}',
        "--trainer.callbacks+=tests.training.test_captured_steps.GradNorms",
        *("--trainer.max_steps", str(per_epoch + 3), "--trainer.val_check_interval", "1000"),
    ]
    norms = {}
    for name, captured in (("eager", "false"), ("captured", "true")):
        captured_fit(corpus, tmp_path / name, monkeypatch, *schedule, "--cuda_graphs", captured)
        norms[name] = [float(v) for v in (tmp_path / name / "grad_norms.txt").read_text().split()]
    assert "captured steps: on" in capsys.readouterr().out
    assert len(norms["captured"]) == per_epoch + 3
    assert norms["captured"] == pytest.approx(norms["eager"], rel=1e-5)


def test_a_resumed_captured_run_replays_every_batch_and_repeats_the_uninterrupted_one(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dropout 0.3, a validation every 3 batches, stopped after step 4 and resumed from its checkpoint (the
    restore and the start of fit clear the gradients): both parts replay every batch, and together log the
    losses of the uninterrupted captured run."""
    dropout = ("--model.transformer.dropout", "0.3", "--trainer.val_check_interval", "3")
    whole = captured_fit(corpus, tmp_path / "whole", monkeypatch, *dropout, "--trainer.max_steps", "8")
    replayed_every_batch(capsys.readouterr().out, 8)
    first = captured_fit(corpus, tmp_path / "first", monkeypatch, *dropout, "--trainer.max_steps", "4")
    replayed_every_batch(capsys.readouterr().out, 4)
    ckpt = str(first / "checkpoints" / "last.ckpt")
    rest = captured_fit(
        corpus, tmp_path / "rest", monkeypatch, *dropout, "--trainer.max_steps", "8", "--ckpt_path", ckpt
    )
    replayed_every_batch(capsys.readouterr().out, 4)
    expected, before, after = train_losses(whole), train_losses(first), train_losses(rest)
    assert sorted(expected) == list(range(8)) and sorted(after) == list(range(4, 8))
    assert len(set(expected.values())) == 8  # dropout is on: equal losses are not a coincidence
    for step, loss in {**before, **after}.items():
        assert loss == pytest.approx(expected[step], rel=1e-6, abs=1e-6), f"step {step}"
    assert validations(rest) == [5]


def test_gradients_set_to_none_mid_run_stop_fit_with_one_line(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where something clears the gradients by setting them to None (here the module's zero_grad as
    nn.Module has it, before the first validation), fit stops with one line saying what and what to do."""
    from torch import nn

    from attnx.training.module import TranslationTask

    monkeypatch.setattr(TranslationTask, "zero_grad", nn.Module.zero_grad)
    (tmp_path / "run").mkdir()
    monkeypatch.setattr(captured_steps, "BACKENDS", {"cpu": FakeGraphs})
    monkeypatch.chdir(tmp_path / "run")
    args = [*VALIDATED, "--trainer.max_steps", "4", "--trainer.val_check_interval", "2"]
    assert attnx(fit_args(corpus, *args)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnx fit: error: captured steps: the gradient of "), err
    assert "is None since its graphs were captured" in err[0] and "--cuda_graphs false" in err[0]


def test_fused_kernels_under_captured_steps_replay_every_batch_after_a_validation(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """FusedKernels (its compiled tails traced by `aot_eager` on a CPU) compiled during the warm-up of each
    capture, then replayed: every batch after the validations too, the losses finite."""
    from attnx.training.fusion import FusedKernels

    monkeypatch.setattr(FusedKernels, "DEVICES", ("cpu",))
    monkeypatch.setattr(FusedKernels, "BACKEND", "aot_eager")
    run = captured_fit(
        corpus,
        tmp_path / "run",
        monkeypatch,
        *("--trainer.max_steps", "4", "--trainer.val_check_interval", "2"),
        *("--trainer.callbacks+=attnx.training.fusion.FusedKernels",),
    )
    out = capsys.readouterr().out
    assert "fused kernels: the pointwise tails of 14 residual connections" in out
    assert validations(run) == [1, 3]
    replayed_every_batch(out, 4)
    assert all(np.isfinite(list(train_losses(run).values())))


# ------------------------------------------------------------------------------------------------------ GPU

GPU_RUN = ["--trainer.accelerator", "gpu", "--trainer.devices", "1", "--data.shape_buckets", "8"]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


RESUME_TOLERANCE = 1e-2
"""How far a resumed captured run's losses may be from the uninterrupted one's (relative): the weights, Adam's
state and the dropout masks are restored exactly, but the memory-efficient attention backward adds in an
order that varies from run to run (atomics), and in bf16-mixed those last bits grow over the steps after the
resume; an error in what is restored (a step's masks, the learning rate, a moment) moves a loss by far more."""

EAGER_TOLERANCE = 2e-2
"""How far a captured fit's losses may be from the eager fit's (relative), dropout off: the captured loss sums
all `B·T` target positions (padding counted out) where the eager one selects the counted ones, so bf16 rounds
other partial sums."""


@pytest.mark.gpu
@cuda
def test_on_cuda_a_resumed_captured_run_continues_the_uninterrupted_one_within_tolerance(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bf16-mixed, dropout 0.3, two batches a step, a validation every 3 batches (Lightning clears the
    gradients before each): a captured run stopped after step 6 and resumed logs the losses of the
    uninterrupted captured run within `RESUME_TOLERANCE`, and all three replay every batch."""
    from tests.training.test_resume import fit

    gpu = [*GPU_RUN, "--trainer.precision", "bf16-mixed", "--trainer.accumulate_grad_batches", "2"]
    whole = fit(corpus, tmp_path, "whole", "--trainer.max_steps", "10", *gpu)
    out = capsys.readouterr().out
    assert "captured steps: on" in out
    replayed_every_batch(out, 20)
    first = fit(corpus, tmp_path, "first", "--trainer.max_steps", "6", *gpu)
    replayed_every_batch(capsys.readouterr().out, 12)
    ckpt = first / "checkpoints" / "last.ckpt"
    rest = fit(corpus, tmp_path, "rest", "--trainer.max_steps", "10", "--ckpt_path", str(ckpt), *gpu)
    replayed_every_batch(capsys.readouterr().out, 8)
    expected, before, after = train_losses(whole), train_losses(first), train_losses(rest)
    assert sorted(after) == list(range(6, 10)) and len(set(expected.values())) == 10
    assert validations(whole)  # the runs crossed validations
    for step, loss in {**before, **after}.items():
        assert loss == pytest.approx(expected[step], rel=RESUME_TOLERANCE), (step, expected, before, after)


VALIDATED_GPU = [
    *GPU_RUN,
    *VALIDATED[2:],
    "--trainer.val_check_interval",
    "2",
    "--model.transformer.dropout",
    "0.0",
]
"""A GPU fit, validating every 2 batches, dropout off."""


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_on_cuda_a_captured_fit_across_validations_logs_the_eager_fits_losses_within_tolerance(
    corpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    precision: str,
) -> None:
    """Two batches a step, a validation every 2 batches, 16-mixed's loss scaling included (the graph reads the
    scaler's scale at each replay): every batch of the captured fit replays, and its losses and validation
    losses are the eager fit's within `EAGER_TOLERANCE`."""
    runs = {}
    for name, enabled in (("eager", "false"), ("captured", "true")):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        args = [*VALIDATED_GPU, "--trainer.precision", precision, "--trainer.max_steps", str(STEPS)]
        args += ["--trainer.accumulate_grad_batches", str(ACCUMULATE), "--cuda_graphs", enabled]
        assert attnx(fit_args(corpus, *args)) == 0
        runs[name] = tmp_path / name / "runs" / "tiny" / "version_0"
    out = capsys.readouterr().out
    assert "captured steps: off (--cuda_graphs false)" in out
    replayed_every_batch(out, STEPS * ACCUMULATE)
    eager, captured = train_losses(runs["eager"]), train_losses(runs["captured"])
    assert eager.keys() == captured.keys() and len(eager) == STEPS
    for step, loss in eager.items():
        assert captured[step] == pytest.approx(loss, rel=EAGER_TOLERANCE), step
    val = {
        name: [float(r["val/loss"]) for r in read_metrics(run) if r.get("val/loss")]
        for name, run in runs.items()
    }
    assert len(val["eager"]) == len(val["captured"]) >= 1
    assert val["captured"] == pytest.approx(val["eager"], rel=EAGER_TOLERANCE)


@pytest.mark.gpu
@cuda
def test_on_cuda_fused_kernels_under_captured_steps_replay_and_train_as_eager_fused_kernels(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """FusedKernels (inductor) with captured steps across validations: its kernels compile in the warm-up
    of each capture, every batch replays, and the losses are those of the eager fused fit within
    `EAGER_TOLERANCE` (dropout off: compiled dropout draws from the compiler's own generator)."""
    fused = "--trainer.callbacks+=attnx.training.fusion.FusedKernels"
    losses = {}
    for name, enabled in (("eager", "false"), ("captured", "true")):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        args = [*VALIDATED_GPU, "--trainer.precision", "bf16-mixed", "--trainer.max_steps", "4"]
        assert attnx(fit_args(corpus, *args, fused, "--cuda_graphs", enabled)) == 0
        losses[name] = train_losses(tmp_path / name / "runs" / "tiny" / "version_0")
    out = capsys.readouterr().out
    assert out.count("fused kernels: the pointwise tails of 14 residual connections") == 2
    replayed_every_batch(out, 4)
    assert losses["eager"].keys() == losses["captured"].keys() and len(losses["eager"]) == 4
    for step, loss in losses["eager"].items():
        assert losses["captured"][step] == pytest.approx(loss, rel=EAGER_TOLERANCE), step


@pytest.mark.gpu
@cuda
def test_on_cuda_a_ddp_run_on_one_gpu_replays_all_but_the_batch_that_all_reduces(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    ddp = ["--trainer.strategy", "ddp", "--trainer.precision", "bf16-mixed"]
    assert attnx(fit_args(corpus, *RUN, *GPU_RUN, *ddp)) == 0
    out = capsys.readouterr().out
    assert f"under DDP {ACCUMULATE - 1} of every {ACCUMULATE} batches replay" in out
    replayed = STEPS * (ACCUMULATE - 1)
    assert f"{replayed:,} batches replayed, eager: {STEPS:,} all-reducing gradients" in out, out
    losses = train_losses(tmp_path / "runs" / "tiny" / "version_0")
    assert len(losses) == STEPS and all(np.isfinite(list(losses.values())))

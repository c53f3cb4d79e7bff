"""Estimates before a run: activation memory against what a real step uses, and the time arithmetic."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from attnx.model.builders import training_flops_per_token
from attnx.training import estimate
from attnx.training.capture import pool_bytes
from attnx.training.estimate import (
    CPU_MFU,
    DEFAULT_MFU,
    GPU_HOST_SECONDS_PER_LAYER,
    activation_bytes,
    cpu_mfu,
    estimate_run,
    larger_batches,
)
from tests.conftest import REPO, tiny_config

RSS_TOLERANCE = 0.2
"""The measured peak of a CPU step may differ from the estimate by this share (measured: 3-7% over it)."""

CUDA_TOLERANCE = 0.35
"""The same for `torch.cuda.max_memory_allocated` under bf16 autocast, whose kernels save other tensors."""

RSS_STEP = textwrap.dedent(
    """
    import json, sys, torch
    from attnx.data.batch import collate
    from attnx.model import TransformerConfig, build_transformer
    from attnx.components.loss import translation_loss

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    torch.set_num_threads(1)
    config = TransformerConfig.from_dict(json.loads(sys.argv[1]))
    batch_size, length = int(sys.argv[2]), int(sys.argv[3])
    model = build_transformer(config).train()
    generator = torch.Generator().manual_seed(0)
    words = lambda: torch.randint(4, config.vocab_size, (length - 1,), generator=generator).tolist()
    pairs = [(words(), words()) for _ in range(batch_size)]
    translation_loss(model, collate(pairs[:2]), 0.1).loss.backward()  # kernels and allocator warmed up
    model.zero_grad(set_to_none=True)
    batch = collate(pairs)
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident size, to the present one
    translation_loss(model, batch, 0.1).loss.backward()
    print(status("VmHWM") - before)
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc peak-RSS reset")
def test_activation_estimate_matches_the_peak_rss_of_a_cpu_training_step() -> None:
    """The forward and backward pass of a 2,000-token batch (a 3+3-layer, d_model 256 model), in a process of
    its own whose allocator returns freed blocks to the system at once (so its resident size follows what is
    live): the peak over the step's start is the activations, the loss's gradients and the weight gradients
    that appear as the backward pass frees the activations."""
    config = tiny_config(
        d_model=256, d_ff=1024, n_heads=4, encoder_layers=3, decoder_layers=3, vocab_size=8000
    )
    batch_size, length = 80, 25
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", RSS_STEP, _json(config), str(batch_size), str(length)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    measured = int(done.stdout.split()[-1])
    tokens = batch_size * length
    estimated = activation_bytes(config, tokens, tokens, "32-true", "cpu", length, length)
    assert abs(measured / estimated - 1) < RSS_TOLERANCE, (measured, estimated)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_activation_estimate_matches_cuda_max_memory_allocated() -> None:
    """The same step on a GPU in bf16 autocast, against the allocator's own peak."""
    from attnx.components.loss import translation_loss
    from attnx.data.batch import collate
    from attnx.model import build_transformer

    config = tiny_config(
        d_model=512, d_ff=2048, n_heads=8, encoder_layers=6, decoder_layers=6, vocab_size=8000
    )
    batch_size, length = 125, 25
    model = build_transformer(config).cuda().train()
    generator = torch.Generator().manual_seed(0)
    pairs = [
        tuple(
            torch.randint(4, config.vocab_size, (length - 1,), generator=generator).tolist() for _ in range(2)
        )
        for _ in range(batch_size)
    ]
    batch = collate(pairs).to("cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        sums = translation_loss(model, batch, 0.1)
    sums.loss.backward()
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - before
    tokens = batch_size * length
    estimated = activation_bytes(config, tokens, tokens, "bf16-mixed", "cuda", length, length)
    assert abs(measured / estimated - 1) < CUDA_TOLERANCE, (measured, estimated)


def test_time_and_memory_follow_from_the_peak_the_mfu_and_the_run_length() -> None:
    config = tiny_config(vocab_size=1000)
    per_token = training_flops_per_token(config, 20.0, 30.0)["per_token"]
    peak = (2e12, "a data sheet", "GPU X", 80.0)
    estimate = estimate_run(
        config, 1_000_000, 1000, "bf16-mixed", "h100", 4, 100, None, 0.5, 20.0, 30.0, peak, 0.0
    )
    step = per_token * 2 * 1000 * 4 / (2e12 * 0.5)  # 4 batches of 1,000 tokens a side, at half the peak
    assert estimate.step_seconds == pytest.approx(step)
    assert (estimate.steps, estimate.bounded_by) == (100, "max_steps")
    assert estimate.run_seconds == pytest.approx(100 * step)
    activations = activation_bytes(config, 1000, 1000, "bf16-mixed", "cuda", 20.0, 30.0)
    assert (
        estimate.memory_bytes == 16 * 1_000_000 + activations
    )  # fp32 weights, gradients, Adam's two moments
    timed = estimate_run(
        config, 1_000_000, 1000, "bf16-mixed", "h100", 4, 100, 10 * step, 0.5, 20, 30, peak, 0.0
    )
    assert (timed.steps, timed.bounded_by, timed.run_seconds) == (10, "max_time", pytest.approx(10 * step))
    memory, time = estimate.lines()
    assert memory.startswith("estimated memory per device: ") and "fits in 80 GiB" in memory
    assert (
        time.startswith("estimated time: ") and "at 50% MFU" in time and "for 100 steps (max_steps)" in time
    )


def test_captured_steps_hold_a_batch_s_memory_once_more_in_their_pool() -> None:
    config = tiny_config(vocab_size=1000)
    peak = (2e12, "a data sheet", "GPU X", 80.0)
    args = (config, 1_000_000, 1000, "bf16-mixed", "h100", 4, 100, None, 0.5, 20.0, 30.0, peak, 0.0)
    eager, captured = estimate_run(*args), estimate_run(*args, captured=True)
    activations = activation_bytes(config, 1000, 1000, "bf16-mixed", "cuda", 20.0, 30.0)
    assert eager.captured_bytes == 0 and captured.captured_bytes == pool_bytes(activations)
    assert captured.memory_bytes == eager.memory_bytes + pool_bytes(activations)
    assert "graph pool" not in eager.lines()[0]
    assert f"captured steps' graph pool {pool_bytes(activations) / 2**20:,.0f} MiB)" in captured.lines()[0]


def test_a_cpu_step_runs_at_the_measured_fp32_mfu_and_bf16_speeds_up_its_matrix_products_alone(
    monkeypatch,
) -> None:
    """The CPU's MFU: fp32 at what attnx's CPU runs measure; bf16 units several times faster at matrix
    products make the step faster by less (measured in training: 1.66x on AMX, 6.5x matrix products; 1.35x on
    Zen 4's AVX512-BF16, 2.2x), since norms, softmax, dropout and Adam do not speed up."""
    config = tiny_config(vocab_size=1000)
    fp32_peak = 1e11
    monkeypatch.setattr(estimate, "cpu_peak_flops", lambda dtype, threads: {torch.float32: fp32_peak}[dtype])

    def step(precision: str, peak: float, mfu: float | None = None) -> float:
        source = (peak, "measured now", "this CPU (2 threads)", None)
        return estimate_run(config, 10**6, 1000, precision, "cpu", mfu=mfu, peak=source).step_seconds

    fp32 = step("32-true", fp32_peak)
    assert fp32 == pytest.approx(
        training_flops_per_token(config, 25.0, 25.0)["per_token"] * 2 * 1000 / (fp32_peak * CPU_MFU)
    )
    assert cpu_mfu(fp32_peak, fp32_peak) == pytest.approx(CPU_MFU)
    for units in (6.5, 2.2):  # AMX, AVX512-BF16: their matrix products' speed-up over fp32
        speedup = fp32 / step("bf16-mixed", units * fp32_peak)
        assert 1 < speedup < units and speedup == pytest.approx((1 / CPU_MFU) / (1 / units + 1 / CPU_MFU - 1))
    assert step("32-true", fp32_peak, mfu=0.5) == pytest.approx(fp32 * CPU_MFU / 0.5)  # told: as told
    gpu = (fp32_peak, "a data sheet", "GPU X", 80.0)
    assert estimate_run(config, 10**6, 1000, "bf16-mixed", "h100", peak=gpu).mfu == DEFAULT_MFU


def test_half_precision_keeps_less_and_cpu_bf16_keeps_the_attention_weights() -> None:
    config = tiny_config(vocab_size=1000)
    fp32 = activation_bytes(config, 2000, 2000, "32-true", "cuda")
    bf16 = activation_bytes(config, 2000, 2000, "bf16-mixed", "cuda")
    assert bf16 < fp32
    heads = tiny_config(vocab_size=1000, n_heads=8)  # attention weights: kept by bf16 on CPU alone
    assert activation_bytes(heads, 2000, 2000, "bf16-mixed", "cuda") == bf16
    assert activation_bytes(heads, 2000, 2000, "bf16-mixed", "cpu") > activation_bytes(
        config, 2000, 2000, "bf16-mixed", "cpu"
    )
    assert activation_bytes(config, 4000, 4000, "32-true", "cpu") > 1.8 * activation_bytes(
        config, 2000, 2000, "32-true", "cpu"
    )


def _json(config) -> str:
    import json

    return json.dumps(config.to_dict())


def test_larger_batches_reach_a_busy_size_when_they_fit_and_keep_the_step_and_the_validation_interval() -> (
    None
):
    """On a GPU, 8 batches of 3,125 tokens a step become 2 of 12,500 (the size measured to keep an H200 busy),
    the validation interval divided alike; where memory is short, the largest batch that fits; none at all
    for a step of one batch, or where no larger batch fits."""
    from attnx.model import TransformerConfig

    big = TransformerConfig(d_model=1024, d_ff=4096, n_heads=16, vocab_size=37000)

    def hint(max_tokens: int, accumulate: int, memory_gib: float | None, **options) -> str | None:
        peak = (989e12, "a data sheet", "H200", memory_gib)
        estimate = estimate_run(big, 214_245_376, max_tokens, "bf16-mixed", "h200", accumulate, peak=peak)
        return larger_batches(estimate, big, max_tokens, **options)

    busy = hint(3125, 8, 141.0, val_check_interval=40000)
    assert busy is not None
    assert (
        "--data.max_tokens 12500 --trainer.accumulate_grad_batches 2 --trainer.val_check_interval 10000 "
        in busy
    )
    assert "the same 25,000 tokens per side a step" in busy and "docs/gpu.md" in busy
    # 16 GiB: 2 x 3,125 fits in 60% of it (about 8 GiB estimated), 4 x 3,125 does not
    small = hint(3125, 8, 16.0)
    assert small is not None and "--data.max_tokens 6250 --trainer.accumulate_grad_batches 4 " in small
    assert "val_check_interval" not in small  # none given (or a fraction of an epoch): nothing to divide
    assert hint(3125, 8, 8.0) is None
    assert hint(12500, 1, 141.0) is None
    assert hint(3125, 8, None) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fit_on_a_gpu_says_the_estimate_and_suggests_fewer_larger_batches(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnx.cli import main as attnx
    from tests.training.conftest import fit_args

    monkeypatch.chdir(tmp_path)
    gpu = ["--trainer.accelerator", "gpu", "--trainer.devices", "1", "--trainer.precision", "bf16-mixed"]
    steps = ["--trainer.max_steps", "1", "--trainer.accumulate_grad_batches", "4", "--data.max_tokens", "256"]
    assert attnx(fit_args(corpus, *gpu, *steps)) == 0
    out = capsys.readouterr().out
    if "estimated memory per device" not in out:  # a GPU without a data-sheet entry: nothing is estimated
        pytest.skip(f"no peak known for {torch.cuda.get_device_name()}")
    assert (
        "fewer, larger batches keep a GPU busier: --data.max_tokens 1024 --trainer.accumulate_grad_batches 1"
        in out
    )


def test_on_a_gpu_a_step_takes_no_less_than_its_batches_host_time() -> None:
    """Measured on an H200: ~50 ms of host time a batch for 12 layers whatever the batch's size, which set the
    pace where the arithmetic alone said 28-93 ms a step. The estimate says which of the two it is."""
    config = tiny_config(vocab_size=1000)  # 2 + 2 layers
    peak = (2e12, "a data sheet", "GPU X", 80.0)
    floor = estimate_run(config, 1_000_000, 1000, "bf16-mixed", "h100", 4, 100, None, 0.5, 20.0, 30.0, peak)
    assert floor.host_seconds == pytest.approx(4 * 4 * GPU_HOST_SECONDS_PER_LAYER)  # 4 batches x 4 layers
    assert floor.step_seconds == floor.host_seconds > floor.compute_seconds
    assert floor.run_seconds == pytest.approx(100 * floor.host_seconds)
    time = floor.lines()[1]
    assert "a step, the host's floor: 4 batches x 16.4 ms of kernel launches" in time
    assert "the arithmetic alone, " in time and "at 50% MFU" in time
    on_cpu = estimate_run(config, 1_000_000, 1000, "bf16-mixed", "cpu", 4, 100, None, 0.5, 20.0, 30.0, peak)
    assert on_cpu.host_seconds == 0 and on_cpu.step_seconds == on_cpu.compute_seconds
    slow = (1e9, "a data sheet", "GPU Y", 80.0)  # arithmetic slower than the floor: the floor says nothing
    bound = estimate_run(config, 1_000_000, 1000, "bf16-mixed", "h100", 4, 100, None, 0.5, 20.0, 30.0, slow)
    assert bound.step_seconds == bound.compute_seconds > bound.host_seconds
    assert "floor" not in bound.lines()[1]


def test_activation_checkpointing_estimate_keeps_less_and_says_both() -> None:
    from attnx.model import TransformerConfig

    plain, checked = TransformerConfig(), TransformerConfig(activation_checkpointing=True)
    for precision in ("32-true", "bf16-mixed"):
        without = estimate.activation_bytes(plain, 4096, 4096, precision)
        with_it = estimate.activation_bytes(checked, 4096, 4096, precision)
        # 12 layers' activations become 12 layer inputs and one layer's activations
        assert with_it < 0.7 * without
    peak = (1e15, "a data sheet", "a GPU", 80.0)
    run = estimate.estimate_run(checked, 63_000_000, 4096, "bf16-mixed", "h100", peak=peak)
    base = estimate.estimate_run(plain, 63_000_000, 4096, "bf16-mixed", "h100", peak=peak)
    assert run.unchecked_activation_bytes == base.activation_bytes > run.activation_bytes
    assert "with activation checkpointing" in run.lines()[0] and "without" in run.lines()[0]
    # the layers' forward runs twice, the vocabulary projection's once: less than 4/3 of the step
    again = training_flops_per_token(plain, 25, 25, recomputed=True)["per_token"]
    ratio = again / training_flops_per_token(plain, 25, 25)["per_token"]
    assert run.compute_seconds == pytest.approx(base.compute_seconds * ratio) and 1 < ratio < 4 / 3


def test_a_lora_estimate_counts_no_weight_gradients_of_the_frozen_matrices() -> None:
    from attnx.model import TransformerConfig

    config, peak = TransformerConfig(), (1e15, "a data sheet", "a GPU", 80.0)
    full = estimate.estimate_run(config, 63_000_000, 4096, "bf16-mixed", "h100", peak=peak)
    lora = estimate.estimate_run(config, 63_000_000, 4096, "bf16-mixed", "h100", peak=peak, trainable=400_000)
    frozen = training_flops_per_token(config, 25, 25, frozen=True)["per_token"]
    ratio = frozen / training_flops_per_token(config, 25, 25)["per_token"]
    assert lora.compute_seconds == pytest.approx(full.compute_seconds * ratio) and 2 / 3 < ratio < 0.7

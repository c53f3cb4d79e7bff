"""``bench_gpu.py --profile``: torch.profiler's top operators and kernels for three optimizer steps of the plain
row (by self CPU time, and on CUDA by self device time too: a step can wait on either), then the copies of one
step by the shape they write: a parameter's (the weights' casts and their gradients'), an activation's, a
scalar's."""

from __future__ import annotations

import torch
from gpu_training import TrainResult, train_plain

from attnx.data.batch import Batch
from attnx.model import Transformer, TransformerConfig, build_transformer


def profile_steps(
    config: TransformerConfig, batches: list[Batch], precision: str, accumulate: int, device: torch.device
) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    model = build_transformer(config).to(device)  # outside the profile: its copy to the device is no step's
    run = TrainResult("profile", precision, 0, accumulate, "plain")
    train_plain(config, batches[: accumulate * 2], run, device, 2, model=model)  # warm the kernels
    with profile(activities=activities) as prof:
        run = TrainResult("profile", precision, 0, accumulate, "plain")
        train_plain(config, batches[: accumulate * 3], run, device, 0, model=model)
    averages = prof.key_averages()
    by_host = averages.table(sort_by="self_cpu_time_total", row_limit=25)
    copies = copies_by_shape(config, model, batches[:accumulate], precision, accumulate, device)
    if device.type != "cuda":
        return f"{by_host}\n\n{copies}"
    # on CUDA both: what keeps the GPU busy, and what keeps the host from feeding it
    by_device = averages.table(sort_by="self_device_time_total", row_limit=25)
    return f"By time on the GPU:\n{by_device}\n\nBy time on the host:\n{by_host}\n\n{copies}"


def copies_by_shape(
    config: TransformerConfig,
    model: Transformer,
    batches: list[Batch],
    precision: str,
    accumulate: int,
    device: torch.device,
) -> str:
    """Which tensors one optimizer step copies (``aten::copy_``, where autocast's casts and ``.to`` land), by
    the destination's shape: a parameter's shape is a weight (its cast, or its gradient's cast back), any
    other an activation (a scalar: a loss or a step count). A profile of its own, recording shapes, so that
    the step's table above is not slowed by the recording; its times are the device's on CUDA, the host's on
    a CPU."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities, record_shapes=True) as prof:
        run = TrainResult("profile", precision, 0, accumulate, "plain")
        train_plain(config, batches, run, device, 0, model=model)
    weights = {tuple(p.shape) for p in model.parameters()}
    kinds: dict[str, list[float]] = {"weights": [0, 0.0], "activations": [0, 0.0], "scalar": [0, 0.0]}
    shapes: list[tuple[float, int, str, str]] = []
    for row in prof.key_averages(group_by_input_shape=True):
        if row.key != "aten::copy_" or not row.input_shapes:
            continue
        ms = (row.self_device_time_total if on_gpu else row.self_cpu_time_total) / 1e3
        shape = tuple(row.input_shapes[0])
        kind = "scalar" if not shape else "weights" if shape in weights else "activations"
        kinds[kind][0] += row.count
        kinds[kind][1] += ms
        shapes.append((ms, row.count, kind, "x".join(map(str, shape)) or "()"))
    total = sum(ms for _, ms in kinds.values()) or 1.0
    lines = [
        f"Copies in one optimizer step ({accumulate} batches, aten::copy_ by the destination's shape; "
        f"{'GPU' if on_gpu else 'host'} time):"
    ]
    for kind, (count, ms) in kinds.items():
        lines.append(f"  {kind}-shaped: {count:,} copies, {ms:.2f} ms ({ms / total:.0%})")
    for ms, count, kind, shape in sorted(shapes, reverse=True)[:10]:
        lines.append(f"    {shape:>18}  {count:5,} copies  {ms:8.2f} ms  {kind}")
    return "\n".join(lines)

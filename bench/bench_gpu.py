"""What the first GPU run of ``attnx fit --config configs/base.yaml`` (and big.yaml) will show: training speed,
MFU and memory of the paper's models in each precision, padding of token-budget batches, decoding speed.

    python bench/bench_gpu.py [--data data/news] [--model base|big|both|tiny] [--precision bf16-mixed ...]
        [--max_tokens 3125 12500] [--tokens_per_step 25000] [--steps 5] [--warmup 2] [--compile] [--fused]
        [--lightning] [--capture graphs compile] [--peers] [--profile] [--decode_sentences 500] [--checkpoint CKPT]
        [--json OUT]

It runs on CUDA when a GPU is present, else on the CPU at tiny sizes (a 2+2-layer d_model 64 model, 256-token
batches, two steps) so that it finishes in about a minute: a check that the script works, not a measurement
of the paper's models. Every table is printed under the device and CPU it ran on (``lscpu``'s model name).

Data: a corpus prepared by ``attnx.data.prepare`` (``--data``); with ``--prepare`` the WMT news-test sets
(``--news_raw``: 2008-2012 and 2015-2020 for training, ``--wmt14_raw``: newstest2013 as valid and the full
newstest2014 as test) are prepared there first with the paper's 37k joint vocabulary. Batches are the
training loader's own: token-budget batches of real text in the epoch's seeded order, pinned on CUDA and
copied to the device inside the timed loop, as ``attnx fit`` does.

Training: ``--max_tokens`` is per device and side, as in the configs (3,125 = 25,000 / 8 GPUs). One
optimizer step accumulates ``--tokens_per_step / max_tokens`` batches, so every row trains on the paper's
25k + 25k tokens per step on one GPU (3,125 × 8 or 12,500 × 2). The step is ``TranslationTask.training_step``'s
without Lightning: :func:`attnx.components.loss.translation_loss` (label smoothing 0.1) under autocast, the
NaN check, backward, fused AdamW (``GradScaler`` loss scaling for fp16). ``--lightning`` adds a row per
configuration that runs the real ``TranslationTask`` in a ``lightning.Trainer`` on the same data; ``--fused``
one with the residual merges and FFN hidden layers compiled into fused kernels (``fuse_pointwise``); ``--peers``
a table of attnx beside Hugging Face's ``MarianMTModel`` and ``torch.nn.Transformer`` with the same dimensions,
trained on the same batches in alternating rounds (``bench/peers.py``).
``--capture graphs`` adds the same loop with each batch shape's forward and backward replayed from a CUDA graph
(attnx's ``StepEngine``, what ``attnx fit`` runs; with ``--lightning`` also a Lightning row with captured
steps), ``--capture compile`` the loop with the loss ``torch.compile``'d in ``mode="reduce-overhead"`` (CUDA
graphs through CUDAGraph Trees, shapes marked dynamic after the second one): every shape of the timed batches is
captured or compiled before the timed steps, its time reported apart. On a CPU ``graphs`` replays by calling
the step again (a check of the script). Reported:

* tokens/s: real (non-padding) source + target tokens per second, and target tokens only (fairseq's ``wps``);
* MFU: model FLOPs (forward + backward of every matmul, attention included, per real token:
  ``training_flops_per_token``) per second over the device's dense bf16 peak, the same denominator for every
  precision: attnx's own ``device_peak_flops``, what ``train/mfu`` divides by (CUDA: the data-sheet table
  ``GPU_PEAKS`` by ``torch.cuda.get_device_name``, else Lightning's; CPU: the fp32 matmul rate measured at
  start, which this CPU reaches and bf16 does not); ``--peak_tflops`` overrides it;
* peak memory: ``torch.cuda.max_memory_allocated`` over the run (CUDA only);
* padding: the share of padded positions in the timed batches.

Decoding: beam 4, α 0.6 over the first ``--decode_sentences`` sentences of the test split, batched by length
within ``--eval_max_tokens``, with the paper's models' random weights unless ``--checkpoint`` names trained
ones. A random model hardly ever ends a sentence, so without a checkpoint the output length is set by
``--max_len_a 1.1 --max_len_b 0`` (German is about 1.1× the English tokens) instead of input + 50.

``--profile`` prints torch.profiler's top operators and kernels for three optimizer steps of the first
configuration: by self CPU time, and on CUDA by self device time too (a step can wait on either); then, from
a fourth step profiled with shapes recorded, the step's copies by the shape they write: a parameter's (the
weights' casts and their gradients'), an activation's, a scalar's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import REPO, batch_flops, data_root, machine_line, markdown_row, markdown_table, training_trainer
from harness import machine as host
from peers import run_peers

from attnx.components import attention
from attnx.components.loss import translation_loss
from attnx.data.batch import Batch
from attnx.data.batching import TokenBatchSampler, collate_indices, plan_batches
from attnx.data.corpus import PreparedCorpus
from attnx.data.datamodule import TranslationDataModule
from attnx.data.prepare import Inputs, Settings, prepare, report
from attnx.inference.config import SearchConfig
from attnx.inference.search import translate_batch
from attnx.model import Transformer, TransformerConfig, build_transformer
from attnx.training.throughput import device_peak_flops, gpu_peak

LABEL_SMOOTHING = 0.1
PAPER_TOKENS_PER_STEP = 25_000
NAN_CHECK = "step"
"""When the plain loop reads the loss back to check it is finite: once per optimizer step (``TranslationTask``'s
check) or at every batch (``--nan_check batch``, what attnx fit did before: the host waits for the GPU at each
batch)."""
PRECISIONS = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16, "fp32": None}
LIGHTNING_PRECISION = {"bf16-mixed": "bf16-mixed", "fp16-mixed": "16-mixed", "fp32": "32-true"}

NEWS_TRAIN = [
    "newstest2008",
    "newssyscomb2009",
    "newstest2009",
    "newstest2010",
    "newstest2011",
    "newstest2012",
    "newstest2015",
    "newstest2016",
    "newstest2017",
    "newstest2018",
    "newstest2019.en-de",
    "newstest2019.de-en",
    "newstest2020.en-de",
    "newstest2020.de-en",
]
"""Every set of wmt_newstest_deen_other except newstestB2020 (the same sources as newstest2020 again)."""

# --- the machine ------------------------------------------------------------------------------------------


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": device.type, "device_name": "cpu", **host()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {
            "device_name": torch.cuda.get_device_name(device),
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    return info


def describe(info: dict[str, Any]) -> str:
    text = f"device: {info['device_name']}"
    if info["device"] == "cuda":
        text += f" (sm {info['capability']}, {info['memory_gib']} GiB, CUDA {info['cuda']}, cuDNN {info['cudnn']})"
    return f"{text}; {machine_line(info)}"


def peak_flops(device: torch.device, override_tflops: float | None) -> tuple[float, str]:
    """The MFU denominator and where it comes from: attnx's ``device_peak_flops`` in bf16 on GPUs, in fp32 on
    the CPU."""
    if override_tflops:
        return override_tflops * 1e12, "--peak_tflops"
    if device.type != "cuda":
        source = f"fp32 matmul measured at start on {torch.get_num_threads()} threads"
        return float(device_peak_flops(device, "32-true")), source
    peak = gpu_peak(torch.cuda.get_device_name(device))  # attnx's table, the one train/mfu divides by
    source = (
        f"dense bf16 data-sheet figure for '{peak.key}' ({peak.source})"
        if peak is not None
        else "no GPU_PEAKS entry for this GPU: Lightning's bf16 table (check: it may be a sparse figure), "
        "else a bf16 matmul measured now"
    )
    return float(device_peak_flops(device, "bf16-mixed")), source


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- data -------------------------------------------------------------------------------------------------


def prepare_news(out: Path, news_raw: Path, wmt14_raw: Path, vocab_size: int = 37000) -> dict[str, Any]:
    """The news-test corpus: ~31k training pairs, valid = newstest2013, newstest2014 = the full test set."""
    inputs = Inputs.from_prefixes(
        {
            "train": [news_raw / name for name in NEWS_TRAIN],
            "valid": [wmt14_raw / "newstest2013"],
            "newstest2014": [wmt14_raw / "newstest2014"],
        },
        "en",
        "de",
    )
    return prepare(inputs, out, Settings("en", "de", vocab_size=vocab_size))


def training_batches(data: Path, max_tokens: int, count: int, pin: bool) -> list[Batch]:
    """The first ``count`` batches of the training loader, epoch after epoch (pinned when ``pin``)."""
    dm = TranslationDataModule(str(data), max_tokens=max_tokens, seed=1, pin_memory=pin)
    loader = dm.train_dataloader()
    batches: list[Batch] = []
    epoch = 0
    while len(batches) < count:
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            batches.append(batch)
            if len(batches) == count:
                break
        epoch += 1
    return batches


def padding_rows(data: Path, budgets: list[int]) -> list[dict[str, Any]]:
    """Padding of every training batch of an epoch at each per-device budget (host only, no model)."""
    dataset = PreparedCorpus(str(data)).dataset("train")
    src = np.asarray(dataset.src_lengths, dtype=np.int64) + 1  # + EOS
    tgt = np.asarray(dataset.tgt_lengths, dtype=np.int64) + 1  # + BOS or EOS
    rows = []
    for budget in budgets:
        sampler = TokenBatchSampler(dataset.src_lengths, dataset.tgt_lengths, budget, seed=1)
        real = padded = real_tgt = padded_tgt = unpadded_src = 0
        sizes = []
        for k in range(sampler.num_batches):
            pairs = sampler.order[sampler.bounds[k] : sampler.bounds[k + 1]]
            s, t = src[pairs], tgt[pairs]
            real += int(s.sum()) + int(t.sum())
            padded += len(pairs) * int(s.max() + t.max())
            real_tgt += int(t.sum())
            padded_tgt += len(pairs) * int(t.max())
            unpadded_src += bool(s.min() == s.max())
            sizes.append(len(pairs))
        rows.append(
            {
                "max_tokens": budget,
                "batches": sampler.num_batches,
                "pairs_per_batch": float(np.mean(sizes)),
                "padding": 1 - real / padded,
                "padding_target": 1 - real_tgt / padded_tgt,
                "budget_used": padded / 2 / sampler.num_batches / budget,
                "batches_without_source_padding": unpadded_src / sampler.num_batches,
            }
        )
    return rows


# --- training ---------------------------------------------------------------------------------------------


@dataclass
class TrainResult:
    model: str
    precision: str
    max_tokens: int
    accumulate: int
    variant: str
    steps: int = 0
    seconds: float = math.nan
    tokens: int = 0
    target_tokens: int = 0
    padded_tokens: int = 0
    flops: float = 0.0
    peak_memory_gib: float | None = None
    warmup_seconds: float = math.nan
    losses: list[float] = field(default_factory=list)
    graphs_compiled_while_timed: int | None = None
    capture_seconds: float | None = None  # --capture: capturing or compiling every shape, before timing
    error: str | None = None

    def rates(self, peak: float) -> dict[str, float]:
        return {
            "tokens_per_s": self.tokens / self.seconds,
            "target_tokens_per_s": self.target_tokens / self.seconds,
            "ms_per_step": 1000 * self.seconds / max(self.steps, 1),
            "mfu": self.flops / self.seconds / peak,
            "padding": 1 - self.tokens / max(self.padded_tokens, 1),
        }


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def compile_layers(model: Transformer) -> None:
    """torch.compile each encoder and decoder layer in place (the loss stays eager: it is its own kernel)."""
    for layer in [*model.encoder_layers, *model.decoder_layers]:
        layer.compile(dynamic=True)  # every batch has other lengths: one graph for all


def fused_model(config: TransformerConfig, device: torch.device) -> Transformer:
    """A new model whose residual merges and FFN hidden layers run as compiled kernels (``fuse_pointwise``;
    compiled during the warm-up steps)."""
    from attnx.training.fusion import fuse_pointwise

    torch.manual_seed(0)
    model = build_transformer(config).to(device)
    fuse_pointwise(model)
    return model


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def train_plain(
    config: TransformerConfig,
    batches: list[Batch],
    result: TrainResult,
    device: torch.device,
    warmup: int,
    compiled: bool,
    model: Transformer | None = None,
) -> TrainResult:
    """``warmup`` untimed, then timed optimizer steps of ``result.accumulate`` batches each (of ``model``, else
    of a new one)."""
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    if model is None:
        model = build_transformer(config).to(device)
    model.train()
    if compiled:
        compile_layers(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    scaler = torch.amp.GradScaler(device.type) if result.precision == "fp16-mixed" else None
    acc = result.accumulate
    steps = len(batches) // acc
    start = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            sync(device)
            result.warmup_seconds = time.perf_counter() - start
            graphs = compiled_graphs()
            start = time.perf_counter()
        total = 0.0
        for batch in batches[step * acc : (step + 1) * acc]:
            batch = batch.to(device)
            with autocast(device, result.precision):
                sums = translation_loss(model, batch, LABEL_SMOOTHING)
            loss = sums.loss / batch.n_tgt_tokens
            if NAN_CHECK == "batch" and not torch.isfinite(loss):  # a sync per batch
                raise FloatingPointError(f"loss {loss.item()} at step {step}")
            total += loss.detach()
            loss = loss / acc
            (scaler.scale(loss) if scaler else loss).backward()
            if step >= warmup:
                result.tokens += batch.n_src_tokens + batch.n_tgt_tokens
                result.target_tokens += batch.n_tgt_tokens
                result.padded_tokens += batch.src.numel() + batch.tgt_out.numel()
                result.flops += batch_flops(config, batch)
        # TranslationTask's check: one sync per optimizer step
        if NAN_CHECK == "step" and not torch.isfinite(total):
            raise FloatingPointError(f"loss {float(total) / acc} at step {step}")
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        result.losses.append(float(total) / acc)
    sync(device)
    result.seconds = time.perf_counter() - start
    result.steps = steps - warmup
    if compiled:  # a new batch shape the guards reject recompiles inside the timed steps
        result.graphs_compiled_while_timed = compiled_graphs() - graphs
    if device.type == "cuda":
        result.peak_memory_gib = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def train_lightning(
    config: TransformerConfig,
    data: Path,
    result: TrainResult,
    device: torch.device,
    warmup: int,
    steps: int,
    captured: bool = False,
) -> TrainResult:
    """The real ``TranslationTask`` in a ``lightning.Trainer`` (no logger, checkpoints or validation); with
    ``captured``, its steps captured as ``attnx fit`` captures them (``CapturedSteps``)."""
    import lightning.pytorch as pl

    from attnx.training.module import TranslationTask

    class Clock(pl.Callback):
        """The end time of each batch and what it held (counts only: batches on the device are let go)."""

        def __init__(self) -> None:
            self.marks: list[tuple[float, int, int, int, float]] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            sync(device)
            real = batch.n_src_tokens + batch.n_tgt_tokens
            padded = batch.src.numel() + batch.tgt_out.numel()
            self.marks.append(
                (time.perf_counter(), real, batch.n_tgt_tokens, padded, batch_flops(config, batch))
            )

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    clock = Clock()
    task = TranslationTask(
        transformer=config, label_smoothing=LABEL_SMOOTHING, lr_factor=1.0, warmup_steps=4000
    )
    warmup = max(warmup, 1)  # timing starts at the end of a batch
    trainer = training_trainer(
        clock,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        precision=LIGHTNING_PRECISION[result.precision],
        max_steps=warmup + steps,
        accumulate_grad_batches=result.accumulate,
    )
    if captured:
        from attnx.training.captured_steps import CapturedSteps

        trainer.callbacks.append(CapturedSteps(True))
    dm = TranslationDataModule(str(data), max_tokens=result.max_tokens, seed=1)
    trainer.fit(task, datamodule=dm)
    first = warmup * result.accumulate - 1  # the last warm-up batch ends where timing starts
    timed = clock.marks[first + 1 :]
    result.seconds = clock.marks[-1][0] - clock.marks[first][0]
    result.steps = len(timed) // result.accumulate
    for _, real, target, padded, flops in timed:
        result.tokens += real
        result.target_tokens += target
        result.padded_tokens += padded
        result.flops += flops
    if device.type == "cuda":
        result.peak_memory_gib = torch.cuda.max_memory_allocated(device) / 2**30
    return result


CAPTURED = {"graphs": "captured (CUDA graphs)", "compile": "compiled (reduce-overhead)"}
"""``--capture`` choices and their rows' variant."""


class CallAgain:
    """A CPU stand-in for CUDA graphs (smoke runs): a capture keeps the function, a replay calls it again."""

    def warm_up(self, fn, times: int) -> None:
        for _ in range(times):
            fn()

    def capture(self, fn):
        from types import SimpleNamespace

        return SimpleNamespace(replay=fn), 0

    def rng_state(self) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)


def every_position(batch: Batch) -> Batch:
    """``batch`` with all ``B·T`` target positions passed to the loss (padding counted out by its target): its
    shapes then depend on its padded lengths alone, as a graph needs."""
    return Batch(
        src=batch.src,
        tgt_in=batch.tgt_in,
        tgt_out=batch.tgt_out,
        src_mask=batch.src_mask,
        tgt_mask=batch.tgt_mask,
        n_src_tokens=batch.n_src_tokens,
        n_tgt_tokens=batch.n_tgt_tokens,
        tgt_positions=torch.arange(batch.tgt_out.numel(), device=batch.tgt_out.device),
    )


def per_token_loss(model: Transformer, src, tgt_in, tgt_out, src_mask, tgt_mask, positions):
    """The loss per counted target token and the (loss, NLL) sums, from tensors alone (what is compiled)."""
    batch = Batch(src, tgt_in, tgt_out, src_mask, tgt_mask, 0, 0, None, positions)
    sums = translation_loss(model, batch, LABEL_SMOOTHING)
    return sums.loss / sums.tokens, torch.stack([sums.loss, sums.nll]).detach()


def train_captured(
    config: TransformerConfig,
    batches: list[Batch],
    result: TrainResult,
    device: torch.device,
    warmup: int,
    how: str,
) -> TrainResult:
    """``train_plain``'s loop with each micro-batch's forward and backward captured (``how``: ``graphs``,
    attnx's ``StepEngine``; ``compile``, ``torch.compile(mode="reduce-overhead")``), every shape of ``batches``
    captured or compiled first (``result.capture_seconds``)."""
    from attnx.components.loss import LabelSmoothedLoss
    from attnx.training.capture import CudaGraphs, StepEngine

    torch.manual_seed(0)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model = build_transformer(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    scaler = torch.amp.GradScaler(device.type) if result.precision == "fp16-mixed" else None
    acc = result.accumulate
    firsts = {(b.src.shape[0], b.src.shape[1], b.tgt_in.shape[1]): b for b in reversed(batches)}
    start = time.perf_counter()
    if how == "graphs":
        backend = CudaGraphs(device) if device.type == "cuda" else CallAgain()
        engine = StepEngine(model, LabelSmoothedLoss(LABEL_SMOOTHING), backend, divisor=acc, scaler=scaler)
        with autocast(device, result.precision):
            engine.prepare(sorted(firsts))

        def micro(batch: Batch) -> torch.Tensor:
            return engine.run(batch)

    else:
        step = torch.compile(per_token_loss, mode="reduce-overhead")

        def micro(batch: Batch) -> torch.Tensor:
            torch.compiler.cudagraph_mark_step_begin()
            b = every_position(batch)
            loss, sums = step(model, b.src, b.tgt_in, b.tgt_out, b.src_mask, b.tgt_mask, b.tgt_positions)
            loss = loss / acc
            (scaler.scale(loss) if scaler else loss).backward()
            return sums.clone()

        for batch in firsts.values():  # compile and record every shape before timing
            with autocast(device, result.precision):
                micro(batch.to(device))
    optimizer.zero_grad(set_to_none=False)
    sync(device)
    result.capture_seconds = time.perf_counter() - start
    graphs = compiled_graphs()
    steps = len(batches) // acc
    start = time.perf_counter()
    for step_index in range(steps):
        if step_index == warmup:
            sync(device)
            result.warmup_seconds = time.perf_counter() - start
            graphs = compiled_graphs()
            start = time.perf_counter()
        total = 0.0
        for batch in batches[step_index * acc : (step_index + 1) * acc]:
            batch = batch.to(device)
            with autocast(device, result.precision):
                sums = micro(batch)
            total += sums[0] / batch.n_tgt_tokens
            if step_index >= warmup:
                result.tokens += batch.n_src_tokens + batch.n_tgt_tokens
                result.target_tokens += batch.n_tgt_tokens
                result.padded_tokens += batch.src.numel() + batch.tgt_out.numel()
                result.flops += batch_flops(config, batch)
        if not torch.isfinite(total):  # TranslationTask's check: one sync per optimizer step
            raise FloatingPointError(f"loss {float(total) / acc} at step {step_index}")
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the graphs add into these very tensors
        result.losses.append(float(total) / acc)
    sync(device)
    result.seconds = time.perf_counter() - start
    result.steps = steps - warmup
    if how == "compile":
        result.graphs_compiled_while_timed = compiled_graphs() - graphs
    if device.type == "cuda":
        result.peak_memory_gib = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def profile_steps(
    config: TransformerConfig, batches: list[Batch], precision: str, accumulate: int, device: torch.device
) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    model = build_transformer(config).to(device)  # outside the profile: its copy to the device is no step's
    run = TrainResult("profile", precision, 0, accumulate, "plain")
    train_plain(config, batches[: accumulate * 2], run, device, 2, False, model)  # warm the kernels
    with profile(activities=activities) as prof:
        run = TrainResult("profile", precision, 0, accumulate, "plain")
        train_plain(config, batches[: accumulate * 3], run, device, 0, False, model)
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
        train_plain(config, batches, run, device, 0, False, model)
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


# --- decoding ---------------------------------------------------------------------------------------------


def decode_batches(data: Path, split: str, sentences: int, max_tokens: int) -> list[Batch]:
    dataset = PreparedCorpus(str(data)).dataset(split)
    chosen = np.arange(min(sentences, len(dataset)))
    order, bounds = plan_batches(dataset.src_lengths[chosen], dataset.tgt_lengths[chosen], max_tokens)
    return [
        collate_indices(dataset, chosen[order[a:b]]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]


def decode(
    model: Transformer, batches: list[Batch], search: SearchConfig, precision: str, device: torch.device
) -> dict[str, float]:
    model = model.to(device).eval()
    with autocast(device, precision):
        translate_batch(model, batches[0].src.to(device), batches[0].src_mask.to(device), search)  # warm-up
        sync(device)
        start = time.perf_counter()
        outputs = 0
        for batch in batches:
            b = batch.to(device)
            hyps = translate_batch(model, b.src, b.src_mask, search)
            outputs += sum(len(h) + 1 for h in hyps)  # + </s>
        sync(device)
    seconds = time.perf_counter() - start
    n = sum(b.size for b in batches)
    return {
        "sentences": n,
        "sentences_per_s": n / seconds,
        "output_tokens_per_s": outputs / seconds,
        "mean_output_tokens": outputs / n,
        "seconds": seconds,
    }


# --- the command ------------------------------------------------------------------------------------------


def model_configs(names: str, vocab_size: int) -> dict[str, TransformerConfig]:
    presets = {
        "base": TransformerConfig.base(vocab_size=vocab_size),
        "big": TransformerConfig.big(vocab_size=vocab_size),
        "tiny": TransformerConfig(
            vocab_size=vocab_size, d_model=64, n_heads=4, d_ff=256, encoder_layers=2, decoder_layers=2
        ),
    }
    chosen = ["base", "big"] if names == "both" else [names]
    return {name: presets[name] for name in chosen}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / "data" / "news", help="prepared corpus")
    parser.add_argument("--prepare", action="store_true", help="prepare --data from the raw news sets first")
    parser.add_argument("--news_raw", type=Path, default=data_root() / "wmt_newstest_deen_other")
    parser.add_argument("--wmt14_raw", type=Path, default=data_root() / "wmt14_ende_test")
    parser.add_argument("--test_split", default="newstest2014", help="split decoded for sentences/s")
    parser.add_argument("--model", choices=["base", "big", "both", "tiny"], default=None,
                        help="default: both on CUDA, tiny on CPU")  # fmt: skip
    parser.add_argument("--vocab_size", type=int, default=37000, help="model vocabulary (>= the corpus's)")
    parser.add_argument("--precision", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    parser.add_argument("--max_tokens", type=int, nargs="+", default=None,
                        help="per-device budgets; default 3125 12500 on CUDA, 256 on CPU")  # fmt: skip
    parser.add_argument("--tokens_per_step", type=int, default=None,
                        help="tokens per side and optimizer step; default 25000 on CUDA, 2 batches on CPU")  # fmt: skip
    parser.add_argument("--steps", type=int, default=None, help="timed optimizer steps (default 5; CPU 2)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed optimizer steps first (default 2; CPU 1)"
    )
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd layers")
    parser.add_argument("--fused", action="store_true",
                        help="also time fused pointwise kernels (attnx.training.fusion.fuse_pointwise)")  # fmt: skip
    parser.add_argument(
        "--lightning", action="store_true", help="also time TranslationTask in lightning.Trainer"
    )
    parser.add_argument("--peers", action="store_true",
                        help="also train HF MarianMTModel and torch.nn.Transformer on the same batches (bench/peers.py)")  # fmt: skip
    parser.add_argument(
        "--peer_rounds", type=int, default=2, help="--peers: rounds, order reversed each round"
    )
    parser.add_argument(
        "--capture",
        nargs="*",
        choices=list(CAPTURED),
        default=[],
        help="also time the step captured: graphs (CUDA graphs, attnx fit's StepEngine), compile "
        "(torch.compile mode=reduce-overhead)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="print the top kernels of the first configuration"
    )
    parser.add_argument(
        "--peak_tflops", type=float, default=None, help="MFU denominator (default: looked up)"
    )
    parser.add_argument(
        "--nan_check",
        choices=["batch", "step"],
        default="step",
        help="read the loss back once per optimizer step (as attnx fit does; default) or every batch",
    )
    parser.add_argument(
        "--cudnn_attention",
        action="store_true",
        help="let CUDA run cuDNN's attention kernel (attnx leaves it out: attention.CUDNN_ATTENTION)",
    )
    parser.add_argument("--decode_sentences", type=int, default=None, help="default 500; CPU 8; 0: skip")
    parser.add_argument("--eval_max_tokens", type=int, default=None, help="decoding budget (8000; CPU 1000)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--checkpoint", type=Path, default=None, help="trained weights for decoding")
    parser.add_argument("--max_len_a", type=float, default=None, help="default 1.1 (random weights) or 1.0")
    parser.add_argument("--max_len_b", type=int, default=None, help="default 0 (random weights) or 50")
    parser.add_argument("--json", type=Path, default=None, help="write every result here")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available()
    defaults = {
        "model": "both" if on_gpu else "tiny",
        "max_tokens": [3125, 12500] if on_gpu else [256],
        "steps": 5 if on_gpu else 2,
        "warmup": 2 if on_gpu else 1,
        "decode_sentences": 500 if on_gpu else 8,
        "eval_max_tokens": 8000 if on_gpu else 1000,
        "max_len_a": 1.1 if args.checkpoint is None else 1.0,
        "max_len_b": 0 if args.checkpoint is None else 50,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def accumulation(args: argparse.Namespace, max_tokens: int, on_gpu: bool) -> int:
    if args.tokens_per_step is None:
        return math.ceil(PAPER_TOKENS_PER_STEP / max_tokens) if on_gpu else 2
    return max(1, math.ceil(args.tokens_per_step / max_tokens))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    attention.CUDNN_ATTENTION = args.cudnn_attention
    global NAN_CHECK
    NAN_CHECK = args.nan_check
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    if args.prepare:
        print(report(prepare_news(args.data, args.news_raw, args.wmt14_raw, args.vocab_size)), flush=True)
    if not (args.data / "meta.json").is_file():
        sys.exit(
            f"{args.data} is not a prepared corpus: run with --prepare (raw sets from --news_raw, --wmt14_raw)"
        )
    corpus = PreparedCorpus(str(args.data))
    if args.vocab_size < corpus.vocab_size:
        sys.exit(f"--vocab_size {args.vocab_size} is below the corpus's vocabulary ({corpus.vocab_size})")
    info = machine(device)
    peak, peak_source = peak_flops(device, args.peak_tflops)
    where = describe(info)
    scale = "" if on_gpu else " — CPU, tiny sizes: checks the script, does not measure the paper's models"
    print(f"# bench_gpu{scale}\n{where}")
    print(f"MFU denominator: {peak / 1e12:.3g} TFLOP/s ({peak_source})")
    kernels = (
        "PyTorch's choice, cuDNN included" if args.cudnn_attention else "cuDNN's left out (attnx's default)"
    )
    print(f"attention kernels on CUDA: {kernels}; the loss is read back every {args.nan_check}")
    print(f"corpus: {args.data} (vocabulary {corpus.vocab_size}; models use {args.vocab_size})\n", flush=True)
    results: dict[str, Any] = {
        "machine": info,
        "peak_flops": peak,
        "peak_source": peak_source,
        "cudnn_attention": args.cudnn_attention,
        "nan_check": args.nan_check,
        "argv": sys.argv,
    }

    budgets = sorted({*args.max_tokens, 3125, 6250, 12500, 25000})
    padding = padding_rows(args.data, budgets)
    results["padding"] = padding
    print(f"## Padding of token-budget batches (training split, one epoch)\n{where}\n")
    print(
        markdown_table(
            [
                "max_tokens",
                "batches",
                "pairs/batch",
                "padding (both sides)",
                "padding (target)",
                "budget used",
                "batches w/o source padding",
            ],  # fmt: skip
            [
                [
                    r["max_tokens"],
                    r["batches"],
                    f"{r['pairs_per_batch']:.0f}",
                    f"{r['padding']:.1%}",
                    f"{r['padding_target']:.1%}",
                    f"{r['budget_used']:.1%}",
                    f"{r['batches_without_source_padding']:.0%}",
                ]
                for r in padding
            ],  # fmt: skip
        )
    )
    print(flush=True)

    configs = model_configs(args.model, args.vocab_size)
    variants = ["plain"] + ["fused"] * args.fused + ["compiled"] * args.compile
    variants += [CAPTURED[how] for how in args.capture]
    variants += ["lightning"] * args.lightning + ["lightning, captured"] * (
        args.lightning and "graphs" in args.capture
    )
    rows, records = [], []
    header = ["device", "model", "precision", "max_tokens × acc", "variant", "tokens/s (src+tgt)",
              "tgt tokens/s", "ms/step", "MFU", "peak mem GiB", "padding", "loss first → last"]  # fmt: skip
    print(
        f"## Training (optimizer steps of max_tokens × accumulation batches per side)\n{where}\n", flush=True
    )
    profiled = False
    for max_tokens in args.max_tokens:
        acc = accumulation(args, max_tokens, on_gpu)
        batches = training_batches(args.data, max_tokens, (args.warmup + args.steps) * acc, pin=on_gpu)
        for name, config in configs.items():
            for precision in args.precision:
                if args.profile and not profiled:
                    print(f"### Profile: {name}, {precision}, {max_tokens} × {acc}, 3 steps\n{where}\n")
                    print(profile_steps(config, batches, precision, acc, device), flush=True)
                    profiled = True
                for variant in variants:
                    result = TrainResult(name, precision, max_tokens, acc, variant)
                    try:
                        captured = {v: how for how, v in CAPTURED.items()}
                        if variant.startswith("lightning"):
                            train_lightning(
                                config,
                                args.data,
                                result,
                                device,
                                args.warmup,
                                args.steps,
                                variant != "lightning",
                            )
                        elif variant in captured:
                            train_captured(config, batches, result, device, args.warmup, captured[variant])
                        else:
                            model = fused_model(config, device) if variant == "fused" else None
                            train_plain(
                                config, batches, result, device, args.warmup, variant == "compiled", model
                            )
                    except torch.OutOfMemoryError as e:
                        result.error = f"out of memory: {str(e).splitlines()[0]}"
                    except Exception as e:  # a precision or kernel the device lacks: report it, go on
                        result.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    record = asdict(result) | ({} if result.error else result.rates(peak)) | {"machine": info}
                    records.append(record)
                    if result.error:
                        row = [
                            info["device_name"],
                            name,
                            precision,
                            f"{max_tokens} × {acc}",
                            variant,
                            result.error,
                        ]
                        rows.append(row + [""] * (len(header) - len(row)))
                    else:
                        r = result.rates(peak)
                        memory = (
                            "n/a (CPU)" if result.peak_memory_gib is None else f"{result.peak_memory_gib:.1f}"
                        )
                        losses = f"{result.losses[0]:.2f} → {result.losses[-1]:.2f}" if result.losses else ""
                        rows.append([info["device_name"], name, precision, f"{max_tokens} × {acc}", variant,
                                     f"{r['tokens_per_s']:,.0f}", f"{r['target_tokens_per_s']:,.0f}",
                                     f"{r['ms_per_step']:,.0f}", f"{r['mfu']:.1%}", memory, f"{r['padding']:.1%}",
                                     losses])  # fmt: skip
                    if result.graphs_compiled_while_timed:
                        rows[-1][4] += f" ({result.graphs_compiled_while_timed} graphs compiled while timed)"
                    if result.capture_seconds is not None:
                        rows[-1][4] += f" ({result.capture_seconds:.1f} s capturing its shapes first)"
                    print(markdown_row(rows[-1]), flush=True)
        del batches
    results["training"] = records
    print(f"\n{markdown_table(header, rows)}\n", flush=True)
    if args.peers:
        results["peers"] = run_peers(args, configs, PRECISIONS, lambda budget, n: training_batches(
            args.data, budget, n, pin=on_gpu), lambda budget: accumulation(args, budget, on_gpu), device, peak,
            info, where)  # fmt: skip

    decoding = []
    if args.decode_sentences > 0:
        batches = decode_batches(args.data, args.test_split, args.decode_sentences, args.eval_max_tokens)
        search = SearchConfig(beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
        drows = []
        for name, config in configs.items():
            if args.checkpoint is not None:
                from attnx.checkpoint import load_model

                loaded = load_model(args.checkpoint, "cpu")
                model, config, name = loaded.model, loaded.config, args.checkpoint.name
            else:
                torch.manual_seed(0)
                model = build_transformer(config)
            search.max_positions = config.max_len
            for precision in args.precision:
                r = decode(model, batches, search, precision, device) | {
                    "model": name,
                    "precision": precision,
                }
                decoding.append(r | {"machine": info, "search": asdict(search)})
                drows.append([info["device_name"], name, precision, r["sentences"], f"{r['sentences_per_s']:,.1f}",
                              f"{r['output_tokens_per_s']:,.0f}", f"{r['mean_output_tokens']:.1f}"])  # fmt: skip
            if args.checkpoint is not None:
                break
        weights = "trained" if args.checkpoint else "random"
        print(f"## Decoding: beam {args.beam}, α {search.alpha}, max length {args.max_len_a} × input + "
              f"{args.max_len_b}, {weights} weights, budget {args.eval_max_tokens} tokens\n{where}\n")  # fmt: skip
        print(markdown_table(["device", "model", "precision", "sentences", "sentences/s", "output tokens/s",
                        "mean output tokens"], drows))  # fmt: skip
    results["decoding"] = decoding
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"\nresults written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

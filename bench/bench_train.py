"""Training throughput of the Transformer of configs/multi30k_cpu.yaml on Multi30k batches, fp32 on CPU.

    python bench/bench_train.py [--data data/multi30k] [--config configs/multi30k_cpu.yaml]
        [--max_tokens 2500] [--steps 30] [--warmup 3] [--threads 1 2] [--repeats 2] [--profile]

The model is the ``model.transformer`` section of ``--config`` (3+3 layers, d_model 256, 4 heads, d_ff 1024)
over the prepared corpus's vocabulary (``attnx prepare ... --vocab_size 8000 --output data/multi30k``). Each
variant runs the same ``--steps`` training batches (forward, loss, backward, optimizer step) after
``--warmup`` untimed ones; the best of ``--repeats`` runs is reported:

* ``attnx``: what ``TranslationTask.training_step`` runs: ``attnx.components.loss.translation_loss``
  (only real target positions projected onto the vocabulary, one-pass label-smoothed loss) and fused AdamW.
* ``naive``: the textbook step: logits for every position, ``F.cross_entropy(label_smoothing=0.1,
  ignore_index=pad)`` and the per-tensor AdamW loop; the same model, batches and numbers up to rounding.
* ``lightning``: ``attnx``'s step inside a Lightning ``Trainer`` (``TranslationTask`` and the
  ``TranslationDataModule``, no logger or checkpoints), timed from the first to the last timed batch.

Throughput counts real (non-padding) source + target tokens (fairseq's ``wps`` counts target tokens only;
``bench_fairseq_side_by_side.py`` prints both). Model FLOPs use ``attnx.model.builders.training_flops_per_token``
on each batch's mean lengths; MFU divides the achieved FLOP/s by the fp32 matmul rate measured at the start of
the run with the same thread count. The 1-minute load average before and after each measurement is printed: on a
shared machine every number is a lower bound.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from harness import (
    MULTI30K_CPU,
    REPO,
    batch_flops,
    load_average,
    machine_line,
    model_config,
    training_trainer,
)

from attnx.components.loss import translation_loss
from attnx.data.batch import Batch
from attnx.data.datamodule import TranslationDataModule
from attnx.model import TransformerConfig, build_transformer
from attnx.training.module import TranslationTask
from attnx.training.throughput import measure_matmul_flops

EPSILON = 0.1


@dataclass
class TrainingData:
    """What the CPU training benchmarks (this one, bench_precision.py, bench_fairseq_side_by_side.py) time on:
    a prepared corpus's training batches in the loader's order, and the model and batch budget of a config."""

    section: dict[str, Any]  # the whole config file
    max_tokens: int
    datamodule: TranslationDataModule
    config: TransformerConfig
    batches: list[Batch]


def add_training_data_options(parser: argparse.ArgumentParser) -> None:
    """``--data`` (the prepared Multi30k) and ``--config`` (the model and batch budget): what the CPU training
    benchmarks read."""
    parser.add_argument("--data", type=Path, default=REPO / "data" / "multi30k", help="prepared Multi30k")
    parser.add_argument("--config", type=Path, default=MULTI30K_CPU)


def require_prepared(data: Path) -> None:
    """Exit with the ``attnx prepare`` command of Multi30k when ``data`` is not a prepared corpus."""
    if not (data / "meta.json").is_file():
        sys.exit(
            f"{data} is not a prepared corpus: attnx prepare --src_lang en --tgt_lang de "
            "--train ../shared/data/multi30k/train --valid ../shared/data/multi30k/val "
            f"--test ../shared/data/multi30k/test_2016_flickr --vocab_size 8000 --output {data}"
        )


def training_data(data: Path, config: Path, max_tokens: int | None, count: int) -> TrainingData:
    """The first ``count`` training batches of the prepared corpus ``data`` at ``max_tokens`` (default the
    config's ``data.max_tokens``), and the config's model over the corpus's vocabulary."""
    require_prepared(data)
    section = yaml.safe_load(config.read_text())
    max_tokens = max_tokens or section["data"]["max_tokens"]
    datamodule = TranslationDataModule(str(data), max_tokens=max_tokens, seed=1)
    loader = iter(datamodule.train_dataloader())
    batches = [next(loader) for _ in range(count)]
    return TrainingData(section, max_tokens, datamodule, model_config(datamodule.vocab_size, config), batches)


def manual(
    config: TransformerConfig, batches: list[Batch], warmup: int, naive: bool, bf16: bool = False
) -> float:
    """Seconds for ``batches[warmup:]`` in a plain loop (under bf16 autocast with ``bf16``, as bf16-mixed)."""
    torch.manual_seed(0)
    model = build_transformer(config).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=not naive
    )
    start = 0.0
    for i, batch in enumerate(batches):
        if i == warmup:
            start = time.perf_counter()
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
        if naive:
            logits = model(batch.src, batch.tgt_in, batch.src_mask)  # (B, T, V), padding included
            loss = F.cross_entropy(
                logits.flatten(0, 1),
                batch.tgt_out.flatten(),
                ignore_index=config.pad_id,
                label_smoothing=EPSILON,
                reduction="sum",
            )
        else:
            with autocast:
                loss = translation_loss(model, batch, EPSILON).loss
        (loss / batch.n_tgt_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def lightning(
    config: TransformerConfig,
    datamodule: TranslationDataModule,
    steps: int,
    warmup: int,
    precision: str = "32-true",
) -> float:
    """Seconds for ``steps`` training batches after ``warmup`` ones, through Trainer.fit."""
    import lightning.pytorch as pl

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_end(self, *args) -> None:
            self.times.append(time.perf_counter())

    clock = Clock()
    task = TranslationTask(transformer=config, label_smoothing=EPSILON, warmup_steps=500)
    trainer = training_trainer(clock, accelerator="cpu", precision=precision, max_steps=warmup + steps)
    task.tokenizer = datamodule.tokenizer
    trainer.fit(task, datamodule=datamodule)
    return clock.times[-1] - clock.times[warmup - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_data_options(parser)
    parser.add_argument("--max_tokens", type=int, default=None, help="default: the config's data.max_tokens")
    parser.add_argument("--steps", type=int, default=30, help="timed training batches")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch.set_num_threads values")
    parser.add_argument("--repeats", type=int, default=2, help="report the best of this many runs")
    parser.add_argument("--variants", nargs="+", default=["attnx", "naive", "lightning"])
    parser.add_argument(
        "--profile", action="store_true", help="print torch.profiler's top ops of attnx's step"
    )
    parser.add_argument(
        "--bf16", action="store_true", help="profile the step under bf16 autocast (bf16-mixed)"
    )
    args = parser.parse_args(argv)
    setup = training_data(args.data, args.config, args.max_tokens, args.warmup + args.steps)
    config, datamodule, batches, max_tokens = setup.config, setup.datamodule, setup.batches, setup.max_tokens
    measured = batches[args.warmup :]
    tokens = sum(b.n_src_tokens + b.n_tgt_tokens for b in measured)
    flops = sum(batch_flops(config, b) for b in measured)
    padded = sum(b.src.numel() + b.tgt_out.numel() for b in measured)

    print(
        f"{machine_line()}; "
        f"model {config.encoder_layers}+{config.decoder_layers} layers, d_model {config.d_model}, "
        f"{config.n_heads} heads, d_ff {config.d_ff}, vocab {config.vocab_size}; max_tokens {max_tokens}; "
        f"{args.steps} timed batches of {tokens / args.steps:,.0f} real tokens ({tokens / padded:.1%} of "
        f"padded), {flops / tokens / 1e6:.1f} MFLOP per token"
    )
    print()
    peaks = {n: (torch.set_num_threads(n), measure_matmul_flops(seconds=1.0))[1] for n in args.threads}
    print(
        "fp32 matmul peak measured now: "
        + ", ".join(f"{n} thread(s) {p / 1e9:.0f} GFLOP/s" for n, p in peaks.items())
    )
    print("| variant | threads | tokens/s | ms/step | GFLOP/s | MFU | load before → after |")
    print("|---|---|---|---|---|---|---|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for variant in args.variants:
            before = load_average()
            best = float("inf")
            for _ in range(args.repeats):
                if variant == "lightning":
                    seconds = lightning(config, datamodule, args.steps, args.warmup)
                else:
                    seconds = manual(config, batches, args.warmup, naive=variant == "naive")
                best = min(best, seconds)
            rate = flops / best
            print(
                f"| {variant} | {threads} | {tokens / best:,.0f} | {best / args.steps * 1000:.0f} | "
                f"{rate / 1e9:.0f} | {rate / peaks[threads]:.0%} | {before} → {load_average()} |",
                flush=True,
            )
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            manual(config, batches[: args.warmup + 5], args.warmup, naive=False, bf16=args.bf16)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    return 0


if __name__ == "__main__":
    sys.exit(main())

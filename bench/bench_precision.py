"""fp32 against bf16-mixed training on this CPU, in one run: tokens/s side by side, and the loss after N steps.

    python bench/bench_precision.py [--data data/multi30k] [--config configs/multi30k_cpu.yaml]
        [--steps 10] [--warmup 3] [--repeats 3] [--threads 2] [--curve_steps 100] [--seeds 1 2]

Speed: the model of ``--config`` (3+3 layers, d_model 256, 4 heads, d_ff 1024, the 8k vocabulary) trains
``--steps`` timed batches after ``--warmup`` untimed ones, in fp32 and in bf16-mixed (``torch.autocast`` on
CPU, weights and optimizer in fp32, as Lightning's ``bf16-mixed`` does), alternating, ``--repeats`` rounds,
both as a plain step loop (``bench/bench_train.py``'s ``attnx``) and through ``Trainer.fit``. Best and median
are printed, with the ratio of the medians: on a shared machine only the ratio of runs taken side by side means
anything.

Loss: ``--curve_steps`` optimizer steps with the config's schedule (Eq. 3, its warm-up and lr_factor) from the
same initialization, in fp32 for each of ``--seeds`` (weights and dropout) and in bf16-mixed with the first
seed; then the training loss of the last 20 steps and the validation loss (fp32, no dropout) are printed. bf16
keeps the fp32 curve if its gap to fp32 is within the gap between the two fp32 seeds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml
from machine import cpu_model

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_train import lightning, manual  # noqa: E402

from attnx.data.datamodule import TranslationDataModule  # noqa: E402
from attnx.model import TransformerConfig, build_transformer  # noqa: E402
from attnx.training.loss import translation_loss  # noqa: E402
from attnx.training.precision import cpu_flags  # noqa: E402
from attnx.training.schedule import lr_lambda  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EPSILON = 0.1


def curve(config, model_section, datamodule, steps: int, seed: int, bf16: bool) -> tuple[float, float]:
    """(mean training loss of the last 20 steps, validation loss) after ``steps`` updates."""
    torch.manual_seed(seed)
    model = build_transformer(config).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=True
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lr_lambda(config.d_model, model_section["warmup_steps"], model_section.get("lr_factor", 1.0)),
    )
    losses = []
    loader = iter(datamodule.train_dataloader())
    for _ in range(steps):
        batch = next(loader)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            sums = translation_loss(model, batch, EPSILON)
        loss = sums.loss / batch.n_tgt_tokens
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        losses.append(loss.item())
    model.eval()
    total = tokens = 0.0
    with torch.no_grad():
        for batch in datamodule.val_dataloader():
            sums = translation_loss(model, batch, EPSILON)
            total += sums.loss.item()
            tokens += sums.tokens.item()
    return statistics.mean(losses[-20:]), total / tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / "data" / "multi30k", help="prepared Multi30k")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "multi30k_cpu.yaml")
    parser.add_argument("--steps", type=int, default=10, help="timed training batches")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of fp32 then bf16-mixed")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--curve_steps", type=int, default=100, help="steps of the loss comparison; 0: none")
    parser.add_argument("--seeds", type=int, nargs=2, default=[1, 2], help="the two fp32 seeds")
    args = parser.parse_args(argv)
    if not (args.data / "meta.json").is_file():
        sys.exit(f"{args.data} is not a prepared corpus: see bench/bench_train.py")
    torch.set_num_threads(args.threads)
    section = yaml.safe_load(args.config.read_text())
    max_tokens = section["data"]["max_tokens"]
    datamodule = TranslationDataModule(str(args.data), max_tokens=max_tokens, seed=1)
    config = TransformerConfig.from_dict(
        section["model"]["transformer"] | {"vocab_size": datamodule.vocab_size}
    )
    loader = iter(datamodule.train_dataloader())
    batches = [next(loader) for _ in range(args.warmup + args.steps)]
    tokens = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches[args.warmup :])
    bf16_flags = sorted(f for f in cpu_flags() if "bf16" in f or f.startswith("amx"))
    print(
        f"CPU: {cpu_model()}, {os.cpu_count()} cores, bf16 flags: {' '.join(bf16_flags) or 'none'}; "
        f"torch {torch.__version__}, {args.threads} thread(s); {args.steps} timed batches of "
        f"{tokens / args.steps:,.0f} source+target tokens; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rates: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for precision in ("32-true", "bf16-mixed"):
            bf16 = precision == "bf16-mixed"
            seconds = manual(config, batches, args.warmup, naive=False, bf16=bf16)
            rates.setdefault(("step", precision), []).append(tokens / seconds)
            seconds = lightning(config, datamodule, args.steps, args.warmup, precision=precision)
            rates.setdefault(("Trainer.fit", precision), []).append(tokens / seconds)
        print(f"  round done, load {os.getloadavg()[0]:.1f}", flush=True)
    print("\n| loop | precision | source+target tokens/s, best | median | bf16 / fp32 (medians) |")
    print("|---|---|---:|---:|---:|")
    for loop in ("step", "Trainer.fit") if args.repeats else ():
        fp32 = statistics.median(rates[(loop, "32-true")])
        for precision in ("32-true", "bf16-mixed"):
            runs = rates[(loop, precision)]
            ratio = f"{statistics.median(runs) / fp32:.2f}" if precision != "32-true" else ""
            print(f"| {loop} | {precision} | {max(runs):,.0f} | {statistics.median(runs):,.0f} | {ratio} |")
    if args.curve_steps:
        model_section = section["model"]
        runs = [(f"fp32, seed {s}", s, False) for s in args.seeds] + [
            (f"bf16-mixed, seed {args.seeds[0]}", args.seeds[0], True)
        ]
        print(f"\nafter {args.curve_steps} steps (load {os.getloadavg()[0]:.1f}):")
        print("| run | train loss, last 20 steps | valid loss |\n|---|---:|---:|")
        for name, seed, bf16 in runs:
            train, valid = curve(config, model_section, datamodule, args.curve_steps, seed, bf16)
            print(f"| {name} | {train:.3f} | {valid:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    start = time.perf_counter()
    code = main()
    print(f"\n({time.perf_counter() - start:.0f} s)")
    sys.exit(code)

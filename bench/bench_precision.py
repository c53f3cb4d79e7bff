"""fp32 against bf16-mixed training on this CPU, in one run: tokens/s side by side, and the loss after N steps.

    python bench/bench_precision.py [--data data/multi30k] [--config configs/multi30k_cpu.yaml]
        [--steps 10] [--warmup 3] [--repeats 3] [--threads 2] [--curve_steps 100] [--seeds 1 2]
    python bench/bench_precision.py --whole_run 400 [--window 50] [--precisions 32-true bf16-mixed]
        [--shape_buckets default 0 8] [--python main=/path/to/main/.venv/bin/python] [--repeats 1]

Whole run (``--whole_run STEPS``): ``attnx fit --config CONFIG`` itself, in a subprocess, for STEPS optimizer
steps without validation or logger (the config's checkpoints and thread probing kept), as a user runs it; its
progress lines every ``--window`` steps give the source+target tokens/s of each window (``--throughput.window``
is set to the same count), and its first line the batches of an epoch, their distinct shapes and padding.
10-step windows miss what a run shows later (kernels rebuilt as new batch shapes keep coming). Each
``--precisions`` × ``--shape_buckets`` pair runs once per round (``default`` passes no
``--data.shape_buckets``: what the config chooses, and what a checkout without the option runs); with
``--python LABEL=PATH`` the same runs also go through another checkout's interpreter (e.g. main's), alternating
with this one, and the mean rate after step ``STEPS / 2`` is compared with the first interpreter's.

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
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from bench_train import EPSILON, add_training_data_options, lightning, manual, require_prepared, training_data
from harness import load_average, machine, machine_line, run_timed

from attnx.components.loss import translation_loss
from attnx.model import build_transformer
from attnx.training.precision import cpu_flags
from attnx.training.schedule import lr_lambda


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


WINDOW_LINE = re.compile(r"^step (\d+)/\d+ .*\| ([\d,]+) tok/s src\+tgt")
BATCHES_LINE = re.compile(
    r"^batches: ([\d,]+) an epoch in ([\d,]+) shapes .*?, ([\d.]+)% of their tokens padding"
)


def fit_run(python: str, args, precision: str, shape_buckets: str) -> dict:
    """One ``attnx fit`` of ``args.whole_run`` steps: per-window tokens/s, shapes and padding, wall time."""
    command = [python, "-m", "attnx", "fit", "--config", str(args.config.resolve()), "--data.data_dir"]
    command += [str(args.data.resolve()), "--trainer.precision", precision, "--trainer.max_time", "null"]
    command += ["--trainer.max_steps", str(args.whole_run), "--trainer.val_check_interval", "100000"]
    command += ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
    command += ["--progress.every_n_steps", str(args.window), "--throughput.window", str(args.window)]
    command += ["--torch_threads", str(args.threads)]
    if shape_buckets != "default":
        command += ["--data.shape_buckets", shape_buckets]
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        done = subprocess.run(command, cwd=work, capture_output=True, text=True)
        wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"attnx fit failed ({done.returncode}): {done.stderr[-2000:]}")
    windows = {
        int(m[1]): float(m[2].replace(",", "")) for m in map(WINDOW_LINE.match, done.stdout.splitlines()) if m
    }
    plan = next((m for m in map(BATCHES_LINE.match, done.stdout.splitlines()) if m), None)
    return {
        "windows": windows,
        "shapes": plan[2] if plan else "n/a",
        "padding": f"{plan[3]}%" if plan else "n/a",
        "wall": wall,
    }


def whole_run(args) -> int:
    pythons = dict(item.split("=", 1) for item in args.python) or {"this": sys.executable}
    if args.python and "this" not in pythons:
        pythons = {"this": sys.executable, **pythons}
    print(
        f"{machine_line(machine(with_torch=False))}; {args.whole_run} steps of attnx fit --config "
        f"{args.config.name}, windows of {args.window} steps, {args.threads} thread(s)",
        flush=True,
    )
    runs: dict[tuple[str, str, str], list[dict]] = {}
    for _ in range(args.repeats):
        for precision in args.precisions:
            for buckets in args.shape_buckets:
                for label, python in pythons.items():
                    runs.setdefault((label, precision, buckets), []).append(
                        fit_run(python, args, precision, buckets)
                    )
        print(f"  round done, load {load_average()}", flush=True)
    later = args.whole_run // 2
    print(
        "\n| checkout | precision | shape_buckets | shapes an epoch | padding | tok/s per window | mean after step "
        f"{later} | wall s |"
    )
    print("|---|---|---|---:|---:|---|---:|---:|")
    means: dict[tuple[str, str, str], float] = {}
    for (label, precision, buckets), results in runs.items():
        for result in results:
            rates = [result["windows"][step] for step in sorted(result["windows"])]
            after = [rate for step, rate in result["windows"].items() if step > later]
            means.setdefault((label, precision, buckets), statistics.mean(after) if after else float("nan"))
            print(
                f"| {label} | {precision} | {buckets} | {result['shapes']} | {result['padding']} | "
                f"{' · '.join(f'{r:,.0f}' for r in rates)} | {statistics.mean(after) if after else float('nan'):,.0f} | "
                f"{result['wall']:.0f} |"
            )
    first = next(iter(pythons))
    for (label, precision, buckets), mean in means.items():
        if label != first and (first, precision, buckets) in means:
            print(
                f"{label} / {first}, {precision}, shape_buckets {buckets}: {mean / means[(first, precision, buckets)]:.3f}"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_data_options(parser)
    parser.add_argument("--steps", type=int, default=10, help="timed training batches")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of fp32 then bf16-mixed")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--curve_steps", type=int, default=100, help="steps of the loss comparison; 0: none")
    parser.add_argument("--seeds", type=int, nargs=2, default=[1, 2], help="the two fp32 seeds")
    parser.add_argument("--whole_run", type=int, default=0, help="steps of a whole attnx fit run; 0: none")
    parser.add_argument("--window", type=int, default=50, help="whole run: steps per reported window")
    parser.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"], help="whole run")
    parser.add_argument(
        "--shape_buckets", nargs="+", default=["default"], help="whole run: default, 0, 8, ..."
    )
    parser.add_argument(
        "--python", nargs="*", default=[], help="whole run: LABEL=PATH of other checkouts' python"
    )
    args = parser.parse_args(argv)
    require_prepared(args.data)
    if args.whole_run:
        return whole_run(args)
    torch.set_num_threads(args.threads)
    setup = training_data(args.data, args.config, None, args.warmup + args.steps)
    config, datamodule, batches = setup.config, setup.datamodule, setup.batches
    tokens = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches[args.warmup :])
    bf16_flags = sorted(f for f in cpu_flags() if "bf16" in f or f.startswith("amx"))
    print(
        f"{machine_line()}; bf16 flags: {' '.join(bf16_flags) or 'none'}; {args.steps} timed batches of "
        f"{tokens / args.steps:,.0f} source+target tokens",
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
        print(f"  round done, load {load_average()}", flush=True)
    print("\n| loop | precision | source+target tokens/s, best | median | bf16 / fp32 (medians) |")
    print("|---|---|---:|---:|---:|")
    for loop in ("step", "Trainer.fit") if args.repeats else ():
        fp32 = statistics.median(rates[(loop, "32-true")])
        for precision in ("32-true", "bf16-mixed"):
            runs = rates[(loop, precision)]
            ratio = f"{statistics.median(runs) / fp32:.2f}" if precision != "32-true" else ""
            print(f"| {loop} | {precision} | {max(runs):,.0f} | {statistics.median(runs):,.0f} | {ratio} |")
    if args.curve_steps:
        model_section = setup.section["model"]
        runs = [(f"fp32, seed {s}", s, False) for s in args.seeds] + [
            (f"bf16-mixed, seed {args.seeds[0]}", args.seeds[0], True)
        ]
        print(f"\nafter {args.curve_steps} steps (load {load_average()}):")
        print("| run | train loss, last 20 steps | valid loss |\n|---|---:|---:|")
        for name, seed, bf16 in runs:
            train, valid = curve(config, model_section, datamodule, args.curve_steps, seed, bf16)
            print(f"| {name} | {train:.3f} | {valid:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    run_timed(main)

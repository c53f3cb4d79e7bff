"""The training toolbox on Multi30k: the README's run against the same run with an EMA of the weights, with subword
sampling, and with both, each trained for the same budget on one machine (docs/training.md, "Measuring the
options on your machine").

    python bench/bench_toolbox.py --work toolbox_runs [--data DIR] [--minutes 30 | --steps N]
        [--ema_decay 0.999] [--alpha 0.1] [--arms readme,ema,...] [--seed N] [--threads 2]
        [--output table.md] [--figure curves.png]

Every arm is the README's `attnx fit --config configs/multi30k_cpu.yaml` with its options (ARMS below), trained
for the same `--minutes` of wall-clock time (30 by default, the README's; or the same `--steps` optimizer
updates), its last checkpoints averaged (`averaged.ckpt`, as the README's run), then scored on
test_2016_flickr with beam 4 (α 0.6) by `attnx translate` and `attnx score` (sacreBLEU BLEU and chrF2), as
bench/bench_components.py scores. From each run's CSV log (`runs/ARM/version_*/metrics.csv`) it takes the
validation curve (`val/bleu` and `val/loss` at every validation), drawn for all arms in one PNG, and the
median training tokens/s (`train/tokens_per_s`, source + target, and `train/tgt_tokens_per_s`, target only):
the throughput cost of each option against the README's run. The averaged checkpoint also translates the whole
validation set (Multi30k val, 1,014 sentences, the same beam): the variant to make the default is the one whose
averaged checkpoint scores the best validation BLEU (the lower last validation loss breaking a tie), the same
model the test scores and read off the same search, but chosen by validation, never by the test scores beside
it. (The curves' `val/bleu` is the run's greedy BLEU on 200 validation sentences of its live weights, or
of its EMA weights with `--ema.decay`: too few sentences to choose by.)

Arms run one after another, so a time budget gives each the same machine only on a machine nothing else loads
(expected wall time: `--minutes` of training per arm plus ~2 minutes of preparing once and decoding each);
`--steps` gives each the same number of updates whatever the load. Every step is an `attnx` command (logged in
WORK/logs); a step already done is not repeated, so running the same command again continues an interrupted
study. `--seed N` trains every arm with `--seed_everything N --data.seed N` instead of the README config's seeds
(its runs named `toolbox_ARM_seedN`): run the study again with another seed to see how far two runs of the same
config differ. `--train_lines` and `--test_lines` cut the corpora, for a smoke test of the script only: its numbers
mean nothing.
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
from pathlib import Path
from typing import Any

import yaml
from attnx_steps import (
    MODEL_CONFIG,
    PAPER_BEAM,
    Steps,
    add_budget_options,
    add_step_options,
    budget,
    logged_rows,
    updates,
)
from harness import cpu_model, publish

ARMS = ("readme", "ema", "subword sampling", "ema + subword sampling")
"""The README's run, with each option, with both."""

COLUMNS = [
    "run",
    "updates",
    "valid BLEU (averaged, beam 4)",
    "test BLEU",
    "test chrF2",
    "last val BLEU",
    "best val BLEU",
    "last val loss",
    "train tokens/s (src+tgt)",
    "train tokens/s (tgt)",
    "throughput vs readme",
]


def arm_options(arm: str, ema_decay: float, alpha: float) -> dict[str, Any]:
    """The config sections an arm adds to the README's run (what its `--ema.decay` and
    `--data.subword_sampling.alpha` options set)."""
    sections: dict[str, Any] = {}
    if "ema" in arm:
        sections["ema"] = {"decay": ema_decay}
    if "subword" in arm:
        sections["data"] = {"subword_sampling": {"alpha": alpha}}
    return sections


def user_command(arm: str, ema_decay: float, alpha: float, seed: int | None = None) -> str:
    """The README command an arm stands for (`seed`: instead of the config's)."""
    options = [] if seed is None else ["--seed_everything", str(seed), "--data.seed", str(seed)]
    if "ema" in arm:
        options += ["--ema.decay", f"{ema_decay:g}"]
    if "subword" in arm:
        options += ["--data.subword_sampling.alpha", f"{alpha:g}"]
    return shlex.join(["attnx", "fit", "--config", f"configs/{MODEL_CONFIG}.yaml", *options])


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, mappings merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def series(rows: list[dict[str, str]], metric: str) -> list[tuple[int, float]]:
    """`(step, value)` of every row that logged `metric`, by step."""
    points = [(int(float(r["step"])), float(r[metric])) for r in rows if r.get(metric) not in (None, "")]
    return sorted(p for p in points if math.isfinite(p[1]))


def median(rows: list[dict[str, str]], metric: str) -> float:
    values = [value for _, value in series(rows, metric)]
    return statistics.median(values) if values else float("nan")  # nan: none logged


def validation_pick(
    valid_bleu: dict[str, float], curves: dict[str, dict[str, list[tuple[int, float]]]]
) -> str | None:
    """The arm whose averaged checkpoint scored the best BLEU on the validation set (the lower last
    validation loss of its run breaks a tie); None when no arm has a score."""
    scored = {
        arm: (bleu, -curves[arm]["val/loss"][-1][1] if curves[arm]["val/loss"] else 0.0)
        for arm, bleu in valid_bleu.items()
        if math.isfinite(bleu)
    }
    return max(scored, key=lambda arm: scored[arm]) if scored else None


def figure(curves: dict[str, dict[str, list[tuple[int, float]]]], path: Path, title: str) -> None:
    """Validation BLEU and validation loss of every arm over the optimizer steps, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, metric, label in zip(
        axes, ("val/bleu", "val/loss"), ("validation BLEU", "validation loss"), strict=True
    ):
        for arm, curve in curves.items():
            if curve[metric]:
                steps, values = zip(*curve[metric], strict=True)
                ax.plot(steps, values, marker="o", markersize=3, label=arm)
        ax.set_title(label)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def number(value: float, form: str) -> str:
    return "n/a" if math.isnan(value) else format(value, form)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_options(parser)
    add_budget_options(parser)
    parser.add_argument("--ema_decay", type=float, default=0.999, help="--ema.decay of the EMA arms")
    parser.add_argument(
        "--alpha", type=float, default=0.1, help="--data.subword_sampling.alpha of the sampling arms"
    )
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    parser.add_argument(
        "--seed", type=int, help="seed_everything and data.seed of every arm (default: the README config's)"
    )
    parser.add_argument("--figure", type=Path, help="also draw every arm's validation curve here (PNG)")
    parser.add_argument(
        "--val_check_interval", type=int, help="validate every N batches (default the README's)"
    )
    parser.add_argument(
        "--bleu_samples",
        type=int,
        help="validation sentences each validation scores (default the README's 200)",
    )
    parser.add_argument("--train_lines", type=int, help="smoke test only: train on the first N pairs")
    parser.add_argument("--test_lines", type=int, help="smoke test only: score the first N test sentences")
    args = parser.parse_args(argv)
    arms = [arm.strip() for arm in args.arms.split(",")]
    if unknown := [arm for arm in arms if arm not in ARMS]:
        parser.error(f"--arms: unknown {unknown}; choose among {', '.join(ARMS)}")
    steps = Steps.from_args(args)
    work = steps.work
    data, source, reference = steps.multi30k(args.train_lines, args.test_lines)
    valid_source, valid_reference = steps.multi30k_valid(args.test_lines)
    limits, budget_text = budget(args)
    rows, curves, commands, speeds, valid_bleu = [], {}, [], {}, {}
    seeded = "" if args.seed is None else f"_seed{args.seed}"
    for arm in arms:
        name = "toolbox_" + arm.replace(" + ", "_").replace(" ", "_") + seeded
        config = steps.arm_config(name, data, **limits)
        values = merged(
            yaml.safe_load(config.read_text(encoding="utf-8")), arm_options(arm, args.ema_decay, args.alpha)
        )
        if args.seed is not None:
            values["seed_everything"] = args.seed
            values["data"]["seed"] = args.seed
        if args.val_check_interval:
            values["trainer"]["val_check_interval"] = args.val_check_interval
        if args.bleu_samples is not None:
            values["evaluation"] = {"bleu_samples": args.bleu_samples}
        config.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
        commands.append(f"{arm}: {user_command(arm, args.ema_decay, args.alpha, args.seed)}  "
                        f"(run as: attnx fit --config {MODEL_CONFIG} --config {config})")  # fmt: skip
        averaged = steps.fit(name, config)
        hypotheses, _ = steps.translate(name, averaged, source, *PAPER_BEAM)
        score = steps.score(name, hypotheses, reference)
        valid_hypotheses, _ = steps.translate(f"{name}_valid", averaged, valid_source, *PAPER_BEAM)
        valid_bleu[arm] = steps.score(f"{name}_valid", valid_hypotheses, valid_reference)["bleu"]
        logged = logged_rows(work / "runs" / name)
        curves[arm] = {metric: series(logged, metric) for metric in ("val/bleu", "val/loss")}
        speeds[arm] = median(logged, "train/tokens_per_s")
        last_bleu = curves[arm]["val/bleu"][-1][1] if curves[arm]["val/bleu"] else float("nan")
        best_bleu = max((v for _, v in curves[arm]["val/bleu"]), default=float("nan"))
        last_loss = curves[arm]["val/loss"][-1][1] if curves[arm]["val/loss"] else float("nan")
        rows.append([arm, f"{updates(work / 'runs' / name):,}", f"{valid_bleu[arm]:.2f}", f"{score['bleu']:.2f}",
                     f"{score['chrf']:.2f}", number(last_bleu, ".2f"), number(best_bleu, ".2f"),
                     number(last_loss, ".3f"), number(speeds[arm], ",.0f"),
                     number(median(logged, "train/tgt_tokens_per_s"), ",.0f")])  # fmt: skip
    reference_speed = speeds.get("readme", float("nan"))
    for row, arm in zip(rows, arms, strict=True):
        row.append(
            number(speeds[arm] / reference_speed, ".2f") + "x" if not math.isnan(reference_speed) else "n/a"
        )
    title = f"The training toolbox on Multi30k en-de, {budget_text} of training each"
    title += "" if args.seed is None else f", seed {args.seed}"
    publish(title, COLUMNS, rows, args.output)
    pick = validation_pick(valid_bleu, curves)
    lines = [
        f"chosen by validation (best valid BLEU of the averaged checkpoint): {pick or 'none: no run scored'}",
        "",
        "commands:",
    ]
    lines += [f"    {command}" for command in commands]
    lines += ["", f"then: attnx translate --model runs/ARM/version_N/checkpoints/averaged.ckpt {shlex.join(PAPER_BEAM)}"
              " of test_2016_flickr.en and of val.en, attnx score against their .de (sacreBLEU)"]  # fmt: skip
    print("\n".join(lines))
    if args.output:
        with open(args.output, "a", encoding="utf-8") as f:
            f.write("\n" + "\n".join(lines) + "\n")
    if args.figure:
        figure(curves, args.figure, f"{title} ({cpu_model()})")
        print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

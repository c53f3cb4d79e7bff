"""Today's components against the paper's model on Multi30k, each trained for the same budget on one machine
(in the spirit of the paper's Table 3): the table and figure of docs/components.md.

    python bench/bench_components.py --work comp_runs [--data DIR] [--minutes 30 | --steps N]
        [--arms paper,modern,...] [--threads 2] [--output table.md] [--figure components.png]

Every arm is `configs/multi30k_cpu.yaml` (3+3 layers, d_model 256, 4 heads) with one change of
`model.transformer` (ARMS below; `modern` is configs/modern_multi30k.yaml's five at once), trained for the
same `--minutes` of wall-clock time (or the same `--steps` optimizer updates), its last checkpoints averaged,
then scored on test_2016_flickr with beam 4 (α 0.6) by `attnx score` (sacreBLEU BLEU and chrF2). The table
gives, per arm: BLEU, chrF2, the BLEU of the last checkpoint alone (what averaging gave or cost), trainable
parameters, training tokens/s (the median of the run's logged `train/tokens_per_s`, source + target tokens),
the updates made and decoding sentences/s (`attnx translate` of the test set, the whole command's time).
Arms run one after another, so a time budget gives each the same machine only on a machine nothing else
loads; `--steps` gives each the same number of updates whatever the load.

Expected wall time: per arm, its `--minutes` of training (30 by default) plus its averaging and its beam
search over the 1,000 test sentences, after one `attnx prepare` of Multi30k; the ten arms at the default take
over five hours. `--arms` runs only the arms named (`--arms paper,rotary`); the arms already done in WORK are
not run again, so a study can be run a few arms at a time.
`alibi` needs the out-of-tree plugin installed (`pip install -e plugins/alibi`).

Every step is an `attnx` command (logged in WORK/logs); a step already done is not repeated, so running the
same command again continues an interrupted study. `--train_lines` and `--test_lines` cut the corpora, for a
smoke test of the script only: their numbers mean nothing.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import yaml
from attnx_steps import PAPER_BEAM, Steps, add_budget_options, add_step_options, budget, tokens_per_s, updates
from harness import publish

MODERN = {
    "d_ff": 688,
    "norm_position": "pre",
    "norm": {"name": "rmsnorm"},
    "feedforward": {"name": "swiglu"},
    "positional": {"name": "rotary"},
    "self_attention": {"name": "multihead", "args": {"kv_heads": 2}},
}
"""configs/modern_multi30k.yaml's model changes (checked against the file when the study starts)."""

ARMS: dict[str, dict[str, Any]] = {
    "paper": {},
    "pre-norm + rmsnorm": {"norm_position": "pre", "norm": {"name": "rmsnorm"}},
    "swiglu (d_ff 688)": {"d_ff": 688, "feedforward": {"name": "swiglu"}},
    "geglu (d_ff 688)": {"d_ff": 688, "feedforward": {"name": "geglu"}},
    "gqa (2 kv heads)": {"self_attention": {"name": "multihead", "args": {"kv_heads": 2}}},
    "mqa (1 kv head)": {
        "self_attention": {"name": "multihead", "args": {"kv_heads": 1}},
        "cross_attention": {"name": "multihead", "args": {"kv_heads": 1}},
    },
    "rotary": {"positional": {"name": "rotary"}},
    "t5_relative": {"positional": {"name": "t5_relative"}},
    "alibi": {"positional": {"name": "alibi"}},
    "modern": MODERN,
}
"""Each arm's change of multi30k_cpu.yaml's `model.transformer`."""

COLUMNS = [
    "model",
    "BLEU",
    "chrF2",
    "BLEU, last checkpoint",
    "parameters",
    "train tokens/s",
    "updates",
    "decode sentences/s (beam 4)",
]
"""BLEU and chrF2 are the averaged model's (the paper's evaluation); the last checkpoint's BLEU beside them shows
what averaging gave or cost: with a short budget the averaged checkpoints span most of the run."""


def run_name(arm: str) -> str:
    """The folder name of an arm's run, config, translation and score (`runs/NAME`, ...): its own, whichever
    arms a study names, so that a study run a few arms at a time finds each arm's run again."""
    return "arm_" + re.sub(r"[^a-z0-9]+", "_", arm.lower()).strip("_")


def check_modern() -> None:
    from importlib import resources

    text = resources.files("attnx.configs").joinpath("modern_multi30k.yaml").read_text(encoding="utf-8")
    preset = yaml.safe_load(text)["model"]["transformer"]
    drifted = {key: value for key, value in MODERN.items() if preset.get(key) != value}
    if drifted:
        raise SystemExit(f"bench_components.MODERN differs from configs/modern_multi30k.yaml in {drifted}")


def parameters(checkpoint: Path) -> int:
    from attnx.checkpoint import load_model
    from attnx.model.builders import count_parameters

    return count_parameters(load_model(checkpoint).model)


def figure(rows: list[list[str]], path: Path) -> None:
    """BLEU of each arm beside its training tokens/s: what each component gives for the same budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def column(name: str) -> list[float]:
        return [float(row[COLUMNS.index(name)].replace(",", "")) for row in rows][::-1]

    fig, (bleu, speed) = plt.subplots(1, 2, figsize=(10, 0.55 * len(rows) + 1.5), sharey=True)
    at = list(range(len(rows)))
    bleu.barh([y + 0.2 for y in at], column("BLEU"), height=0.4, color="#4c72b0", label="last 5 averaged")
    bleu.barh(
        [y - 0.2 for y in at],
        column("BLEU, last checkpoint"),
        height=0.4,
        color="#a1c9f4",
        label="last checkpoint",
    )
    bleu.set_yticks(at, [row[0] for row in rows][::-1])
    bleu.set_xlabel("BLEU, test_2016_flickr (beam 4)")
    bleu.legend(loc="lower right", fontsize="small")
    speed.barh(at, column("train tokens/s"), color="#dd8452")
    speed.set_xlabel("training tokens/s (source + target)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_options(parser)
    add_budget_options(parser)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    parser.add_argument(
        "--warmup_steps",
        type=int,
        help="every arm's model.warmup_steps (default: the config's 800, for 30 minutes; scale it with the budget)",
    )
    parser.add_argument(
        "--precision", help="every arm's --trainer.precision (default: the config's, chosen from the CPU)"
    )
    parser.add_argument("--figure", type=Path, help="also draw BLEU and training speed per arm here (PNG)")
    parser.add_argument("--train_lines", type=int, help="smoke test only: train on the first N pairs")
    parser.add_argument("--test_lines", type=int, help="smoke test only: score the first N test sentences")
    args = parser.parse_args(argv)
    arms = [arm.strip() for arm in args.arms.split(",")]
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; choose among {', '.join(ARMS)}")
    check_modern()
    steps = Steps.from_args(args)
    work = steps.work
    data, source, reference = steps.multi30k(args.train_lines, args.test_lines)
    sentences = len(source.read_text(encoding="utf-8").splitlines())
    rows = []
    limits, budget_text = budget(args)
    for arm in arms:
        name = run_name(arm)
        model = {"transformer": ARMS[arm]}
        config = steps.arm_config(
            name, data, warmup_steps=args.warmup_steps, precision=args.precision, model=model, **limits
        )
        averaged = steps.fit(name, config)
        hypotheses, seconds = steps.translate(name, averaged, source, *PAPER_BEAM)
        score = steps.score(name, hypotheses, reference)
        last, _ = steps.translate(f"{name}_last", averaged.with_name("last.ckpt"), source, *PAPER_BEAM)
        last_score = steps.score(f"{name}_last", last, reference)
        run = work / "runs" / name
        rows.append([arm, f"{score['bleu']:.2f}", f"{score['chrf']:.2f}", f"{last_score['bleu']:.2f}",
                     f"{parameters(averaged):,}", f"{tokens_per_s(run):,.0f}", f"{updates(run):,}",
                     f"{sentences / seconds:.1f}"])  # fmt: skip
    publish(f"Components on Multi30k en-de, {budget_text} of training each", COLUMNS, rows, args.output)
    if args.figure:
        figure(rows, args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Back-translation on Multi30k halves (docs/backtranslation.md's recipe, measured): the table of
docs/benchmarks.md.

    python bench/bench_backtranslation.py --work bt_runs [--data DIR] [--minutes 30] [--finetune_minutes 5]
        [--steps N --finetune_steps M [--warmup_steps W]] [--jobs 1] [--real_repeat 1] [--threads 2]
        [--output table.md]

Multi30k's training set (29,000 pairs) is split in two halves by line: the first half is the parallel text,
the German side of the second half the monolingual text. Every arm trains the README's model
(`configs/multi30k_cpu.yaml`: 3+3 layers, d_model 256) for the same `--minutes` (or the same `--steps`
optimizer updates: a budget a busy machine cannot change, it only takes longer) and is scored on
test_2016_flickr (beam 4, α 0.6) with `attnx score` (sacreBLEU BLEU and chrF2):

- full: the whole parallel training set (the upper bound);
- (a) the parallel half alone;
- (b) + the monolingual half back-translated by beam search (beam 4) with a reverse model trained on the
  parallel half for `--minutes`;
- (c) + back-translated by sampling (`--search.sampling true --search.seed 1`);
- (d) + the sampled back-translations tagged `<BT>`;
- (e) (d)'s model fine-tuned on the parallel half alone for `--finetune_minutes` (`--init_from`).

The real pairs are used `--real_repeat` times in (b)-(d) (the halves are the same size: 1 by default).
Every step is an `attnx` command (logged in WORK/logs); a step already done is not repeated, so running the
same command again continues an interrupted benchmark. It takes about 6 × `--minutes` + `--finetune_minutes`
of training plus two translations of 14,500 sentences (some 3.5 hours with the defaults on 2 cores).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from attnx_steps import Steps, add_step_options
from harness import publish, read_lines


def halves(data: Path, raw: Path) -> None:
    """raw/par.{en,de} (first half), raw/mono.de (German of the second half), raw/full.{en,de}."""
    if (raw / "mono.de").is_file():
        return
    raw.mkdir(parents=True, exist_ok=True)
    sides = {lang: read_lines(data / f"train.{lang}.gz") for lang in ("en", "de")}
    n = len(sides["en"]) // 2
    for lang, lines in sides.items():
        (raw / f"full.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (raw / f"par.{lang}").write_text("\n".join(lines[:n]) + "\n", encoding="utf-8")
    (raw / "mono.de").write_text("\n".join(sides["de"][n:]) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_options(parser)
    parser.add_argument("--minutes", type=float, default=30, help="training budget of every arm")
    parser.add_argument("--finetune_minutes", type=float, default=5)
    parser.add_argument(
        "--steps", type=int, help="training budget of every arm in optimizer updates, instead of --minutes"
    )
    parser.add_argument(
        "--finetune_steps", type=int, help="with --steps: the fine-tuning budget (default steps/6)"
    )
    parser.add_argument(
        "--warmup_steps", type=int, help="the schedule's warmup of every arm (default the config's, 800)"
    )
    parser.add_argument("--real_repeat", type=int, default=1, help="times the real pairs are used in (b)-(d)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="trainings side by side, each with cores/jobs threads (with --steps the table does not change)",
    )
    args = parser.parse_args()
    if args.jobs > 1 and not args.steps:
        parser.error("--jobs needs --steps: side by side, a time budget would give every arm fewer updates")
    steps = Steps.from_args(args)
    work = steps.work
    raw = work / "raw"
    halves(steps.data, raw)
    budget = {"steps": args.steps} if args.steps else {"minutes": args.minutes}
    finetune_budget = (
        {"steps": args.finetune_steps or max(1, args.steps // 6)}
        if args.steps
        else {"minutes": args.finetune_minutes}
    )
    warmup = {"warmup_steps": args.warmup_steps} if args.warmup_steps else {}
    said = f"{args.steps} updates" if args.steps else f"{args.minutes:g} minutes"
    if args.warmup_steps:
        said += f" (warmup {args.warmup_steps})"

    def train_and_score(arm: str, corpus: Path, extra_fit: tuple[str, ...] = (), arm_budget: dict = budget,
                        **data_options: str) -> dict[str, float]:  # fmt: skip
        config = steps.arm_config(arm, corpus, **arm_budget, **warmup, **data_options)
        ckpt = steps.fit(arm, config, *extra_fit)
        hyp, _ = steps.translate(f"test_{arm}", ckpt, corpus / "test.en")
        return steps.score(arm, hyp, corpus / "test.de")

    def back_translations() -> None:
        """The reverse model, and the monolingual half translated by it with beam search and with sampling."""
        reverse_data = steps.prepare("reverse", "de", "en", [str(raw / "par")])
        reverse = steps.fit("reverse", steps.arm_config("reverse", reverse_data, **budget, **warmup))
        mono = {
            "beam": ("--search.beam", "4"),
            "sample": ("--search.sampling", "true", "--search.seed", "1"),
        }
        for kind, search in mono.items():
            out, _ = steps.translate(f"mono_{kind}", reverse, raw / "mono.de", *search)
            prefix = raw / f"bt_{kind}"
            if not Path(f"{prefix}.en").is_file():
                Path(f"{prefix}.en").write_bytes(out.read_bytes())
                Path(f"{prefix}.de").write_bytes((raw / "mono.de").read_bytes())

    def side_by_side(tasks: list[Callable[[], Any]]) -> list[Any]:
        """Run `tasks` `--jobs` at a time (each command with cores/jobs threads); their results in order."""
        if args.jobs == 1:
            return [task() for task in tasks]
        threads = steps.env.get("OMP_NUM_THREADS")
        if not args.threads:
            steps.env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.jobs))
        try:
            with ThreadPoolExecutor(args.jobs) as pool:
                return [future.result() for future in [pool.submit(task) for task in tasks]]
        finally:
            steps.env.pop("OMP_NUM_THREADS", None)
            if threads is not None:
                steps.env["OMP_NUM_THREADS"] = threads

    full = steps.prepare("full", "en", "de", [str(raw / "full")])
    half = steps.prepare("half", "en", "de", [str(raw / "par")])
    full_score, half_score, _ = side_by_side(
        [lambda: train_and_score("full", full), lambda: train_and_score("half", half), back_translations]
    )
    rows: list[tuple[str, dict[str, float]]] = [
        ("full parallel set (upper bound)", full_score),
        ("(a) parallel half alone", half_score),
    ]

    repeat = ("--train_repeat", f"[{args.real_repeat}, 1]")
    beam = steps.prepare("bt_beam", "en", "de", [str(raw / "par"), str(raw / "bt_beam")], *repeat)
    sample = steps.prepare("bt_sample", "en", "de", [str(raw / "par"), str(raw / "bt_sample")], *repeat)
    tagged = steps.prepare(
        "bt_tagged", "en", "de", [str(raw / "par"), str(raw / "bt_sample")], *repeat,
        "--train_tag", '["", "<BT>"]', tests=(f"real={raw / 'par'}",),
    )  # fmt: skip
    arms = [
        ("(b) + back-translation, beam 4", "bt_beam", beam),
        ("(c) + back-translation, sampling", "bt_sample", sample),
        ("(d) + back-translation, sampling, tagged <BT>", "bt_tagged", tagged),
    ]
    scores = side_by_side([partial(train_and_score, arm, corpus) for _, arm, corpus in arms])
    rows += [(name, score) for (name, _, _), score in zip(arms, scores, strict=True)]
    init = (  # as configs/backtranslation/finetune.yaml: a fresh, shorter schedule with a lower peak
        "--init_from", str(work / "runs" / "bt_tagged" / "version_0" / "checkpoints" / "averaged.ckpt"),
        "--model.lr_factor", "0.4", "--model.warmup_steps", "100",
    )  # fmt: skip
    finetuned = train_and_score("bt_finetune", tagged, init, arm_budget=finetune_budget, train_split="real")
    fine = f"{finetune_budget['steps']} updates" if args.steps else f"{args.finetune_minutes:g} min"
    rows.append((f"(e) (d) fine-tuned on the parallel half, {fine}", finetuned))

    publish(
        f"Multi30k en→de, training set in halves; every arm `configs/multi30k_cpu.yaml` for {said}, "
        "test_2016_flickr, beam 4",
        ["arm", "sacreBLEU", "chrF2"],
        [[name, f"{score['bleu']:.2f}", f"{score['chrf']:.2f}"] for name, score in rows],
        args.output,
    )


if __name__ == "__main__":
    main()

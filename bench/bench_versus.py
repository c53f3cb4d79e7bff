"""This checkout against another commit, side by side in one run on one machine: training tokens/s of
``attnx fit`` and beam-4 sentences/s of ``attnx translate``, through each version's own commands.

    python bench/bench_versus.py --rev 4ef65f5 --ckpt_path CKPT [--rounds 3] [--steps 300]

The other commit is checked out into a temporary git worktree (or, with ``--other DIR``, taken from a copy of
it already there, e.g. ``git archive 4ef65f5 | tar -x -C DIR``) and run with its ``src/`` first on
PYTHONPATH; both versions read one corpus prepared by this checkout. Runs alternate (this, other, this, ...)
so that a change in the machine's load hits both alike; the best of ``--rounds`` is reported for each.
Training: ``configs/multi30k_cpu.yaml`` (3+3 layers, d_model 256, fp32, 2 threads) for ``--steps`` optimizer
steps without validation; tokens/s is the run's own ``train/tokens_per_s`` (source + target real tokens,
the median of the logged values after the first 50 steps) and, for the target-only figure, the same times
the training corpus's target share. Decoding: ``attnx translate`` of all 1,000 sentences of Multi30k
test_2016_flickr with beam 4, wall time of the whole command (model loading included).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import REPO, add_data_option, machine, machine_line, multi30k


def run(src: Path, argv: list[str], cwd: Path, stdin: Path | None = None) -> float:
    # each version with the plugin of its own tree (the installed one is this checkout's)
    paths = [src, *src.parent.glob("plugins/*/src")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths)), "OMP_NUM_THREADS": "2"}
    start = time.perf_counter()
    with open(stdin or os.devnull, "rb") as f:
        done = subprocess.run(
            [sys.executable, "-m", "attnx", *argv], cwd=cwd, env=env, stdin=f, capture_output=True, text=True
        )
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed in {src}:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def fit_tokens_per_s(src: Path, new_cli: bool, data: Path, steps: int, work: Path) -> float:
    """Median ``train/tokens_per_s`` of an ``attnx fit`` run of ``steps`` steps, after the first 50."""
    run_dir = Path(tempfile.mkdtemp(dir=work))
    evaluation = ["--evaluation.bleu_samples", "0"] if new_cli else ["--model.val_bleu_samples", "0"]
    config = src.parent / "configs" / "multi30k_cpu.yaml"  # each version reads its own config
    argv = ["fit", "--config", str(config), "--data.data_dir", str(data)]
    argv += ["--trainer.max_steps", str(steps), "--trainer.max_time", "null", "--trainer.val_check_interval",
             "100000", "--trainer.log_every_n_steps", "10", "--trainer.callbacks", "[]", *evaluation]  # fmt: skip
    run(src, argv, run_dir)
    with open(next(run_dir.rglob("metrics.csv")), newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/tokens_per_s") and int(r["step"]) >= 50]
    return statistics.median(float(r["train/tokens_per_s"]) for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rev", default="HEAD~1", help="the commit to compare with")
    parser.add_argument("--ckpt_path", type=Path, required=True, help="a trained checkpoint for decoding")
    add_data_option(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--skip", choices=("fit", "translate"), action="append", default=[])
    parser.add_argument(
        "--other", type=Path, help="a copy of the --rev commit's files, instead of a worktree"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="attnx-versus-"))
    other = args.other.resolve() if args.other else work / "other"
    if not args.other:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(other), args.rev],
                       check=True, capture_output=True)  # fmt: skip
    try:
        rev = args.rev if args.other else subprocess.run(
            ["git", "-C", str(other), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()  # fmt: skip
        this = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        # the one command system (attnx translate --model, --evaluation.*) came with src/attnx/commands/
        other_new_cli = (other / "src" / "attnx" / "commands").is_dir()
        versions = {f"this ({this})": (REPO / "src", True), f"other ({rev})": (other / "src", other_new_cli)}
        raw = args.data / "multi30k"
        prepared = work / "multi30k"
        if "fit" not in args.skip:  # decoding reads the checkpoint's own tokenizer, not a corpus
            run(REPO / "src", ["prepare", "--src_lang", "en", "--tgt_lang", "de", "--train", str(raw / "train"),
                               "--valid", str(raw / "val"), "--test", str(raw / "test_2016_flickr"),
                               "--vocab_size", "8000", "--output", str(prepared)], work)  # fmt: skip
        source = work / "test.en"
        sentences = multi30k(args.data, "test_2016_flickr", "en")
        source.write_text("".join(f"{line}\n" for line in sentences), encoding="utf-8")
        lines = len(sentences)
        tgt_share = 18_555 / (17_457 + 18_555)  # test split; the train split's share is printed by prepare
        results: dict[str, dict[str, list[float]]] = {name: {"fit": [], "translate": []} for name in versions}
        for _ in range(args.rounds):
            for name, (src, new_cli) in versions.items():
                if "fit" not in args.skip:
                    results[name]["fit"].append(fit_tokens_per_s(src, new_cli, prepared, args.steps, work))
                if "translate" not in args.skip:
                    model = ["--model"] if new_cli else ["--ckpt_path"]
                    (work / "hyp").unlink(missing_ok=True)  # its own file: translate keeps what exists
                    seconds = run(src, ["translate", *model, str(args.ckpt_path), "--input", str(source),
                                        "--output", str(work / "hyp")], work)  # fmt: skip
                    results[name]["translate"].append(lines / seconds)
        print(
            f"{machine_line(machine(with_torch=False))}; torch threads 2; {args.rounds} alternating rounds, best"
        )
        print(
            "| version | fit tokens/s (src+tgt) | fit tokens/s (tgt, approx.) | translate beam 4 sentences/s |"
        )
        print("|---|---|---|---|")
        for name, r in results.items():
            fit = (
                f"{max(r['fit']):,.0f} | {max(r['fit']) * tgt_share:,.0f}"
                if r["fit"]
                else "skipped | skipped"
            )
            tr = f"{max(r['translate']):.1f}" if r["translate"] else "skipped"
            print(f"| {name} | {fit} | {tr} |")
        names = list(results)
        for key in ("fit", "translate"):
            if results[names[0]][key]:
                ratio = max(results[names[0]][key]) / max(results[names[1]][key])
                print(f"{key}: this / other = {ratio:.3f}")
    finally:
        if not args.other:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(other)], capture_output=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""MBR decoding against beam search on Multi30k test_2016_flickr with the README's model: the table of
docs/benchmarks.md (sacreBLEU BLEU, chrF2 and sentences/s of each decoding).

    python bench/bench_mbr_decode.py --work mbr_runs [--ckpt_path CKPT] [--minutes 30] [--n 8 16 32]
        [--utility chrf] [--candidates sample] [--threads 2] [--output table.md]

Without ``--ckpt_path`` the model is trained first: ``attnx prepare`` of Multi30k (8k BPE) and ``attnx fit
--config multi30k_cpu`` for ``--minutes``, its averaged checkpoint decoded. Then, with the same checkpoint,
``attnx translate`` of test_2016_flickr's 1,000 sentences with beam 4 (α 0.6) and with MBR over ``N``
candidates for each ``--n`` (``--search.mbr N --search.mbr_utility UTILITY --search.mbr_candidates
CANDIDATES --search.seed 1``; epsilon candidates use ``--search.epsilon 0.02``), each scored with
``attnx score``. sentences/s is 1,000 over the whole ``attnx translate`` command's wall time (model loading
included, the same for every row). Every step is an ``attnx`` command (logged in WORK/logs) and is not
repeated when its result exists, so the same command continues an interrupted run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnx_steps import Steps, add_step_options
from harness import publish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_options(parser)
    parser.add_argument("--ckpt_path", type=Path, help="the model to decode (default: train one)")
    parser.add_argument("--minutes", type=float, default=30, help="training budget when no --ckpt_path")
    parser.add_argument("--n", type=int, nargs="+", default=[8, 16, 32], help="MBR candidates")
    parser.add_argument("--utility", choices=["chrf", "bleu"], default="chrf")
    parser.add_argument("--candidates", choices=["sample", "epsilon", "nbest"], default="sample")
    args = parser.parse_args()
    steps = Steps.from_args(args)
    corpus = steps.prepare("multi30k", "en", "de", [str(steps.data / "train")])
    # the commands run in --work: a relative checkpoint path is taken from here
    ckpt = (
        args.ckpt_path.resolve()
        if args.ckpt_path
        else steps.fit("model", steps.arm_config("model", corpus, args.minutes))
    )
    source, reference = corpus / "test.en", corpus / "test.de"

    arms: list[tuple[str, tuple[str, ...]]] = [("beam 4", ("--search.beam", "4"))]
    for n in args.n:
        search = ("--search.mbr", str(n), "--search.mbr_utility", args.utility, "--search.seed", "1")
        search += ("--search.mbr_candidates", args.candidates)
        if args.candidates == "epsilon":
            search += ("--search.epsilon", "0.02")
        if args.candidates == "nbest":
            search += ("--search.beam", str(n))
        arms.append((f"MBR {args.utility}, {n} {args.candidates} candidates", search))
    rows = steps.decoding_rows([(name, ckpt, search) for name, search in arms], source, reference)
    publish(
        f"Multi30k en→de test_2016_flickr, `{ckpt}`",
        ["decoding", "sacreBLEU", "chrF2", "sentences/s"],
        rows,
        args.output,
    )


if __name__ == "__main__":
    main()

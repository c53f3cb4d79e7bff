"""A checkpoint ensemble against each of its members on Multi30k test_2016_flickr: the table of
docs/benchmarks.md (sacreBLEU BLEU, chrF2 and sentences/s of each decoding).

    python bench/bench_ensemble.py --work ens_runs --ckpt_paths A.ckpt B.ckpt [--weights 0.5 0.5]
        [--beam 4] [--threads 2] [--output table.md]

Each checkpoint alone, then all of them as one ensemble (`attnx translate --model "[A,B]"`: one beam search
over the models' averaged next-token probabilities, each model with its own key/value cache), decode the
1,000 sentences of test_2016_flickr with beam 4 (α 0.6), each scored with `attnx score`. The checkpoints are
the README's model trained with different seeds (e.g. `--seed_everything 2 --data.seed 2`); they must share
their SentencePiece model, so they are trained on one prepared corpus, which `attnx prepare` builds here
from the same raw text with the same settings (so the same SentencePiece model). sentences/s is 1,000 over
the whole `attnx translate` command's wall time (model loading included). Every step is an `attnx` command
(logged in WORK/logs) and is not repeated when its result exists.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnx_steps import Steps, add_step_options
from harness import publish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_options(parser)
    parser.add_argument(
        "--ckpt_paths", type=Path, nargs="+", required=True, help="the members (two or more checkpoints)"
    )
    parser.add_argument("--weights", type=float, nargs="+", help="one weight a member (default equal)")
    parser.add_argument("--beam", type=int, default=4, help="beam size of every decoding (default 4)")
    args = parser.parse_args()
    if len(args.ckpt_paths) < 2:
        parser.error("--ckpt_paths needs two or more checkpoints")
    if args.weights and len(args.weights) != len(args.ckpt_paths):
        parser.error(f"--weights needs one weight for each of the {len(args.ckpt_paths)} checkpoints")
    steps = Steps.from_args(args)
    corpus = steps.prepare("multi30k", "en", "de", [str(steps.data / "train")])
    source, reference = corpus / "test.en", corpus / "test.de"

    members = [path.resolve() for path in args.ckpt_paths]
    search = ("--search.beam", str(args.beam))
    arms: list[tuple[str, str, tuple[str, ...]]] = [
        (f"`{path.parent.parent.name}/{path.name}` alone", str(path), search) for path in members
    ]
    weights = ("--weights", f"[{','.join(map(str, args.weights))}]") if args.weights else ()
    ensemble = f"[{','.join(map(str, members))}]"
    arms.append((f"ensemble of the {len(members)}", ensemble, search + weights))
    rows = steps.decoding_rows(arms, source, reference)
    publish(
        f"Multi30k en→de test_2016_flickr, beam {args.beam}",
        ["decoding", "sacreBLEU", "chrF2", "sentences/s"],
        rows,
        args.output,
    )


if __name__ == "__main__":
    main()

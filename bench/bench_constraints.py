"""Lexically constrained decoding measured: the share of constraints met, sacreBLEU without and with them,
and sentences/s of a constrained beam against the unconstrained one, in one run; beside it fairseq 0.12.2's
``fairseq-interactive --constraints unordered`` (vectorized dynamic beam allocation, Hu et al. 2019) on a
fairseq model of the same shape trained on the same pieces.

    python bench/bench_constraints_draw.py --references ../shared/data/multi30k/test_2016_flickr.de.gz \
        --phrases 1 --output /tmp/c1.jsonl
    python bench/bench_constraints.py --model averaged.ckpt \
        --source ../shared/data/multi30k/test_2016_flickr.en.gz \
        --references ../shared/data/multi30k/test_2016_flickr.de.gz --constraints /tmp/c1.jsonl \
        [--beam 4] [--threads 1] [--limit N] [--precision 32-true bf16-mixed] [--repeats 2] \
        [--fairseq_python FAIRSEQ_VENV/bin/python --data data/multi30k --config configs/multi30k_cpu.yaml \
         --fairseq_steps 3000 | --fairseq_checkpoint checkpoint_last.pt]

Each decoder runs as its command (``attnx translate``, ``fairseq-interactive``) over the whole input and over
its first line alone; the difference is the decoding time, without loading the model. A constraint is met
when its phrase appears in the detokenized output. fairseq reads the same SentencePiece pieces as attnx
(``bench/bench_fairseq_side_by_side.py`` binarizes the corpus; ``--fairseq_steps`` trains a model of
``--config``'s shape on it with ``fairseq-train``, or give ``--fairseq_checkpoint``), and its constraints are
the phrases encoded by the same SentencePiece model, one tab-separated field each after the source. The
figures depend on the machine and its load: compare rows of one run, never across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_constraints_draw import read_lines

import attnx
from attnx.evaluation.bleu import score

FAIRSEQ_INTERACTIVE = """
import fairseq.modules.transformer_layer as layer
# fairseq 0.12.2's inference fast path (nested tensors, torch._transformer_encoder_layer_fwd) calls torch as
# 1.12 took it; later torch fails there ("Mask Type should be defined"): keep the encoder on its ordinary forward
layer.TransformerEncoderLayerBase.load_to_BT = property(lambda self: False, lambda self, value: None)
from fairseq_cli.interactive import cli_main
cli_main()
"""
"""`fairseq-interactive`, its encoder layers kept off the fast path that torch >= 2.x no longer accepts."""


REPEATS = 2
"""Runs of every command (`--repeats`); the fastest counts, the whole set's and the first line's alike."""


def timed(command: list[str], stdin: Path, env: dict[str, str], repeats: int = 1) -> tuple[float, str]:
    """Seconds (the fastest of `repeats` runs) and standard output of `command` reading `stdin`; exits with its
    error when it fails."""
    best, out = float("inf"), ""
    for _ in range(repeats):
        start = time.perf_counter()
        with open(stdin, "rb") as f:
            done = subprocess.run(command, stdin=f, capture_output=True, env=env)
        best = min(best, time.perf_counter() - start)
        if done.returncode != 0:
            sys.exit(f"{' '.join(command[:4])} ... failed:\n{done.stderr.decode()[-3000:]}")
        out = done.stdout.decode("utf-8")
    return best, out


def decoding_rate(
    command: list[str], inputs: list[str], work: Path, env: dict[str, str], repeats: int = REPEATS
) -> tuple[float, str]:
    """Sentences/s of `command` over `inputs` (the run over the first line alone taken off: loading, and
    attnx's precision probe) and the full run's output, each the fastest of `repeats` runs."""
    full, first = work / "all.in", work / "first.in"
    full.write_text("".join(line + "\n" for line in inputs), encoding="utf-8")
    first.write_text(inputs[0] + "\n", encoding="utf-8")
    seconds, out = timed(command, full, env, repeats)
    load, _ = timed(command, first, env, repeats)
    return (len(inputs) - 1) / max(seconds - load, 1e-9), out


def met_share(outputs: list[str], constraints: list[dict]) -> tuple[int, int]:
    """(constraints met, constraints): a phrase is met when it appears in the output."""
    phrases = [(out, p) for out, c in zip(outputs, constraints, strict=True) for p in c.get("include", [])]
    return sum(p in out for out, p in phrases), len(phrases)


def attnx_rows(
    args: argparse.Namespace,
    precision: str,
    sources: list[str],
    refs: list[str],
    cons: list[dict],
    work: Path,
    env: dict[str, str],
) -> dict:
    base = [sys.executable, "-m", "attnx", "translate", "--model", str(args.model), "--device", "cpu"]
    base += ["--search.beam", str(args.beam), "--search.length_penalty", "fairseq", "--search.alpha", "1.0"]
    base += ["--precision", precision]
    constraint_file = work / "constraints.jsonl"
    constraint_file.write_text("".join(json.dumps(c) + "\n" for c in cons), encoding="utf-8")
    first_constraint = work / "first.jsonl"
    first_constraint.write_text(json.dumps(cons[0]) + "\n", encoding="utf-8")
    plain_rate, plain = decoding_rate(base, sources, work, env, args.repeats)
    full, first = work / "all.in", work / "first.in"
    seconds, constrained = timed([*base, "--constraints", str(constraint_file)], full, env, args.repeats)
    load, _ = timed([*base, "--constraints", str(first_constraint)], first, env, args.repeats)
    rate = (len(sources) - 1) / max(seconds - load, 1e-9)
    name = f"attnx ({precision})"
    return report(name, plain.splitlines(), constrained.splitlines(), plain_rate, rate, refs, cons)


def report(name, plain, constrained, plain_rate, rate, refs, cons) -> dict:
    met, total = met_share(constrained, cons)
    return {
        "toolkit": name,
        "constraints met": f"{met}/{total} ({100 * met / max(total, 1):.1f}%)",
        "BLEU unconstrained": round(score(plain, refs).bleu, 2),
        "BLEU constrained": round(score(constrained, refs).bleu, 2),
        "sent/s unconstrained": round(plain_rate, 2),
        "sent/s constrained": round(rate, 2),
        "slowdown": round(plain_rate / rate, 2),
    }


def fairseq_checkpoint(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    """The fairseq model (trained here with `--fairseq_steps`, or `--fairseq_checkpoint`) and its data dir."""
    from bench_fairseq_side_by_side import export_for_fairseq, fairseq_argv
    from bench_train import require_prepared

    from attnx.data.corpus import PreparedCorpus
    from attnx.model import TransformerConfig

    require_prepared(args.data)
    corpus = PreparedCorpus(args.data)
    bin_dir = export_for_fairseq(corpus, args.work, args.fairseq_python)
    if args.fairseq_checkpoint is not None:
        return args.fairseq_checkpoint, bin_dir
    import yaml

    section = yaml.safe_load(args.config.read_text())
    fields = {**section["model"]["transformer"], "vocab_size": corpus.vocab_size}
    config = TransformerConfig.from_dict(fields)
    argv = fairseq_argv(bin_dir, config, section, section["data"]["max_tokens"])
    argv = [a for a in argv if a != "--no-save"]
    save = args.work / "fairseq_checkpoints"
    argv += ["--max-update", str(args.fairseq_steps), "--save-dir", str(save), "--no-epoch-checkpoints"]
    done = subprocess.run(
        [args.fairseq_python, "-m", "fairseq_cli.train", *argv], capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"fairseq-train failed:\n{done.stderr[-3000:]}")
    return save / "checkpoint_last.pt", bin_dir


def fairseq_rows(args, sources: list[str], refs: list[str], cons: list[dict], work: Path, env) -> dict:
    checkpoint, bin_dir = fairseq_checkpoint(args, work)
    tokenizer = attnx.load(args.model).tokenizer
    sp = tokenizer.sp
    pieces = [" ".join(sp.encode_as_pieces(line)) for line in sources]
    with_phrases = [
        "\t".join([src, *(" ".join(sp.encode_as_pieces(p)) for p in c.get("include", []))])
        for src, c in zip(pieces, cons, strict=True)
    ]
    base = [args.fairseq_python, "-c", FAIRSEQ_INTERACTIVE, str(bin_dir), "--path", str(checkpoint)]
    base += [
        "--cpu",
        "--beam",
        str(args.beam),
        "--lenpen",
        "1.0",
        "--buffer-size",
        "64",
        "--batch-size",
        "64",
    ]
    base += ["-s", "en", "-t", "de"]

    def texts(out: str) -> list[str]:
        hyps = {}
        for line in out.splitlines():
            if line.startswith("H-"):
                key, _, text = line.split("\t")
                hyps[int(key[2:])] = sp.decode_pieces(text.split())
        return [hyps[i] for i in sorted(hyps)]

    # fairseq 0.12.2 pickles its options into checkpoints: torch >= 2.6 loads them only with weights_only off
    env = env | {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    plain_rate, plain = decoding_rate(base, pieces, work, env, args.repeats)
    rate, constrained = decoding_rate(
        [*base, "--constraints", "unordered"], with_phrases, work, env, args.repeats
    )
    return report("fairseq 0.12.2", texts(plain), texts(constrained), plain_rate, rate, refs, cons)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="attnx checkpoint")
    parser.add_argument("--source", type=Path, required=True, help="source sentences (plain or .gz)")
    parser.add_argument("--references", type=Path, required=True, help="reference translations")
    parser.add_argument("--constraints", type=Path, required=True, help="bench_constraints_draw.py's output")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every decoder")
    parser.add_argument(
        "--precision",
        nargs="+",
        default=["auto"],
        help="attnx translate --precision, a row for each (32-true: fairseq's arithmetic on CPU)",
    )
    parser.add_argument(
        "--repeats", type=int, default=REPEATS, help="runs of each command; the fastest counts"
    )
    parser.add_argument("--limit", type=int, default=None, help="the first N sentences only")
    parser.add_argument("--fairseq_python", default=None, help="python of a virtual environment with fairseq")
    parser.add_argument(
        "--fairseq_checkpoint", type=Path, default=None, help="a fairseq model of these pieces"
    )
    parser.add_argument("--fairseq_steps", type=int, default=3000, help="fairseq-train updates otherwise")
    parser.add_argument("--data", type=Path, default=Path("data/multi30k"), help="the prepared corpus")
    parser.add_argument("--config", type=Path, default=Path("configs/multi30k_cpu.yaml"), help="model shape")
    parser.add_argument(
        "--work", type=Path, default=Path("/tmp/attnx_constraints_bench"), help="fairseq's data"
    )
    args = parser.parse_args(argv)
    sources, refs = read_lines(args.source), read_lines(args.references)
    cons = [json.loads(line) if line.strip() else {} for line in read_lines(args.constraints)]
    if not len(sources) == len(refs) == len(cons):
        sys.exit(
            f"{len(sources)} sources, {len(refs)} references, {len(cons)} constraint lines: they must pair up"
        )
    if args.limit:
        sources, refs, cons = sources[: args.limit], refs[: args.limit], cons[: args.limit]
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    print(
        f"{len(sources)} sentences, beam {args.beam}, {args.threads} thread(s), load {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory() as tmp:  # each row printed when measured: a later failure keeps it
        for precision in args.precision:
            row = attnx_rows(args, precision, sources, refs, cons, Path(tmp), env)
            print(json.dumps(row, ensure_ascii=False), flush=True)
        if args.fairseq_python:
            args.work.mkdir(parents=True, exist_ok=True)
            row = fairseq_rows(args, sources, refs, cons, Path(tmp), env)
            print(json.dumps(row, ensure_ascii=False), flush=True)
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decoding speed: beam search over Multi30k test_2016_flickr, with and without the key/value cache; then
greedy search, an n-best list as wide as the beam, sampling one candidate per input, and forced scoring of
the beam's outputs (one teacher-forced pass per batch).

    python bench/bench_decode.py [--data DIR] [--ckpt_path CKPT] [--sentences 1000] [--beam 4]
        [--batch_size 64 | --max_tokens 4096] [--batch_sizes 1 16 64 128 256] [--repeats 5] [--threads 2]

Without ``--ckpt_path`` the model is the README's (``configs/multi30k_cpu.yaml``: 3+3 layers, d_model 256,
4 heads, d_ff 1024) with random weights over a joint 8k SentencePiece BPE vocabulary trained on Multi30k train (cached in
``--cache_dir``). A random model hardly ever ends a sentence, so its output length is set by the maximum-length
rule: the default for random weights is ``--max_len_a 1.1 --max_len_b 0`` (German is about 1.1× the English
token count here), which gives output lengths like a trained model's. With a trained checkpoint the
defaults are the paper's (input length + 50) and the model decides. Output tokens count every generated
token, ``</s>`` included.

The no-cache reference re-runs the decoder over the whole prefix at every step (what decoding costs without
:class:`DecoderState`'s cached keys/values); it decodes the same hypotheses, which the benchmark checks.
Each measurement runs ``--repeats`` times and the best time is reported beside the median: on a shared
machine other processes steal cores, and two torch threads that must wait for each other suffer badly from
it, so the best run is the closest to the machine's real speed. Results go to stdout as Markdown;
docs/benchmarks.md records them with the machine they ran on.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from harness import add_data_option, machine_line, model_config, multi30k, multi30k_tokenizer, timed
from torch import Tensor, nn

from attnx.checkpoint import load_model
from attnx.data.batch import collate
from attnx.inference.config import SearchConfig
from attnx.inference.eager import DECODING_PRECISIONS, autocast_dtype, token_batches
from attnx.inference.scoring import force_decode
from attnx.inference.search import translate_batch
from attnx.model import Transformer, build_transformer
from attnx.model.transformer import DecoderState

VOCAB_SIZE = 8000
"""Pieces of the joint BPE of the random-weights model."""


class PrefixState(DecoderState):
    """Decoder state without a cache: just the prefix decoded so far, reordered like the cache would be."""

    prefix: Tensor

    def reorder(self, index: Tensor, same_sources: bool = False) -> None:
        super().reorder(index, same_sources)
        self.prefix = self.prefix.index_select(0, index)


class NoCache(nn.Module):
    """The same model decoding step by step by re-running :meth:`Transformer.decode` over the whole prefix."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model
        self.vocab_size = model.vocab_size

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return self.model.encode(src, src_mask)

    def start_decoding(self, memory: Tensor, src_mask: Tensor) -> PrefixState:
        state = PrefixState(memory=memory, src_mask=src_mask)
        state.prefix = torch.empty(memory.shape[0], 0, dtype=torch.long, device=memory.device)
        return state

    def decode_step(self, tokens: Tensor, state: PrefixState) -> Tensor:
        state.prefix = torch.cat([state.prefix, tokens.unsqueeze(1)], dim=1)
        state.offset += 1
        return self.model.decode(state.prefix, state.memory, state.src_mask)[:, -1]  # (B, V)


@dataclass
class Run:
    name: str
    batch_size: int | str
    sentences: int
    times: list[float]  # seconds of each repeat
    out_tokens: int
    outputs: list[list[int]]

    @property
    def best(self) -> float:
        return min(self.times)

    def row(self) -> str:
        return (
            f"| {self.name} | {self.batch_size} | {self.sentences} | {self.best:.1f} | "
            f"{statistics.median(self.times):.1f} | {self.sentences / self.best:.1f} | "
            f"{self.out_tokens / self.best:.0f} | {self.out_tokens / self.sentences:.1f} |"
        )


HEADER = (
    "| run | batch | sentences | best s | median s | sentences/s (best) | output tokens/s (best) "
    "| output tokens/sentence |\n|---|---:|---:|---:|---:|---:|---:|---:|"
)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def by_length(ids: list[list[int]], batch_size: int) -> list[list[int]]:
    """Indices of ``ids`` sorted by length, in batches of ``batch_size`` sentences."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    return [order[first : first + batch_size] for first in range(0, len(order), batch_size)]


def batches(
    ids: list[list[int]], batch_size: int, max_tokens: int | None, targets: list[list[int]] | None = None
) -> tuple[list[list[int]], int | str]:
    """The batches of ``ids`` and their label: ``batch_size`` sentences, or with ``max_tokens`` the batches
    ``attnx translate`` makes (sorted by length, rows × longest ≤ max_tokens; with ``targets``, forced scoring's
    longer of source and target)."""
    if not max_tokens:
        return by_length(ids, batch_size), batch_size
    if targets is None:
        lengths = [len(x) + 1 for x in ids]
    else:
        lengths = [max(len(x), len(y)) + 1 for x, y in zip(ids, targets, strict=True)]
    return list(token_batches(lengths, max_tokens)), f"{max_tokens} tokens"


def score_all(
    model: nn.Module,
    ids: list[list[int]],
    targets: list[list[int]],
    batch_size: int,
    config: SearchConfig,
    repeats: int,
    max_tokens: int | None = None,
) -> Run:
    """Forced scoring of ``targets`` (the beam's outputs) as translations of ``ids``: one teacher-forced pass per batch."""
    groups, label = batches(ids, batch_size, max_tokens, targets)

    device = model_device(model)

    def run() -> None:
        for rows in groups:
            batch = collate([(ids[i], []) for i in rows]).to(device)
            force_decode(model, batch.src, batch.src_mask, [targets[i] for i in rows], config)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return Run(
        name="forced scoring of the beam outputs",
        batch_size=label,
        sentences=len(ids),
        times=timed(run, repeats).times,
        out_tokens=sum(len(y) + 1 for y in targets),
        outputs=targets,
    )


def compare_precisions(args: argparse.Namespace, tokenizer, reference: Run, mixed: Run) -> None:
    """What a mixed precision changes: speed, outputs equal to fp32's and, for a trained model, BLEU."""
    same = sum(x == y for x, y in zip(reference.outputs, mixed.outputs, strict=True))
    speed = (mixed.sentences / mixed.best) / (reference.sentences / reference.best)
    line = (
        f"\n{args.precision}: {speed:.2f}x the sentences/s of 32-true; outputs equal to 32-true's: "
        f"{same}/{len(mixed.outputs)} ({100 * same / len(mixed.outputs):.1f}%)"
    )
    if args.ckpt_path:
        import sacrebleu

        refs = multi30k(args.data, "test_2016_flickr", "de", len(mixed.outputs))
        bleu = [
            sacrebleu.corpus_bleu([tokenizer.decode(y) for y in run.outputs], [refs]).score
            for run in (reference, mixed)
        ]
        line += f"; BLEU 32-true {bleu[0]:.2f}, {args.precision} {bleu[1]:.2f}"
    print(line, flush=True)


def decode_all(
    model: nn.Module,
    ids: list[list[int]],
    batch_size: int,
    config: SearchConfig,
    name: str,
    repeats: int = 1,
    max_tokens: int | None = None,
) -> Run:
    """Decode ``ids`` sorted by length in batches of ``batch_size`` sentences (or ``max_tokens``), ``repeats`` times."""
    groups, label = batches(ids, batch_size, max_tokens)
    device = model_device(model)

    def run() -> list[list[int]]:
        outputs: list[list[int]] = [[] for _ in ids]
        for rows in groups:
            batch = collate([(ids[i], []) for i in rows]).to(device)
            for i, out in zip(rows, translate_batch(model, batch.src, batch.src_mask, config), strict=True):
                outputs[i] = out
        return outputs

    timing = timed(run, repeats)
    return Run(
        name=name,
        batch_size=label,
        sentences=len(ids),
        times=timing.times,
        out_tokens=sum(len(y) + 1 for y in timing.result),
        outputs=timing.result,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_data_option(parser)
    parser.add_argument("--ckpt_path", type=Path, help="a trained checkpoint (default: random weights)")
    parser.add_argument(
        "--cache_dir", type=Path, default=Path("/tmp/attnx-bench"), help="where the 8k BPE model is cached"
    )
    parser.add_argument("--sentences", type=int, default=1000, help="test sentences to decode (default all)")
    parser.add_argument("--beam", type=int, default=4, help="beam size (default 4)")
    parser.add_argument(
        "--batch_size", type=int, default=64, help="sentences per batch, main runs (default 64)"
    )
    parser.add_argument(
        "--max_tokens",
        type=int,
        default=None,
        help="batch the main runs by tokens as attnx translate does (its default: 4096) instead of --batch_size",
    )
    parser.add_argument(
        "--batch_sizes", type=int, nargs="*", default=[1, 16, 64, 128, 256], help="batch sizes to sweep"
    )
    parser.add_argument(
        "--sweep_sentences", type=int, default=400, help="sentences per batch-size point (default 400)"
    )
    parser.add_argument(
        "--no_cache_sentences", type=int, default=1000, help="sentences for the no-cache run (default 1000)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="runs of each cached measurement; the best is reported (default 5)",
    )
    parser.add_argument(
        "--no_cache_repeats", type=int, default=2, help="runs of the (slow) no-cache measurement (default 2)"
    )
    parser.add_argument("--max_len_a", type=float, default=None, help="default 1.1 (random) or 1.0 (trained)")
    parser.add_argument("--max_len_b", type=int, default=None, help="default 0 (random) or 50 (trained)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--device", default="cpu", help="where to decode: cpu (default), cuda, cuda:1, ...")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--precision",
        choices=list(DECODING_PRECISIONS),
        default="32-true",
        help="decode under autocast in bf16 or fp16, as attnx translate --precision; a mixed precision also "
        "decodes beam in fp32 first, for the speed ratio, the outputs that agree and (--ckpt_path) BLEU both ways",
    )
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.ckpt_path:
        loaded = load_model(args.ckpt_path)
        model, tokenizer, label = loaded.model, loaded.tokenizer, f"checkpoint {args.ckpt_path}"
        a, b = 1.0, 50
    else:
        cache = args.cache_dir / f"multi30k_bpe{VOCAB_SIZE}"
        tokenizer = multi30k_tokenizer(args.data, VOCAB_SIZE, cache=cache)
        config = model_config(tokenizer.vocab_size)
        model, label = build_transformer(config).eval(), "random weights"
        a, b = 1.1, 0
    a = a if args.max_len_a is None else args.max_len_a
    b = b if args.max_len_b is None else args.max_len_b
    search = SearchConfig(beam=args.beam, max_len_a=a, max_len_b=b)
    model = model.to(args.device)
    where = torch.cuda.get_device_name(args.device) if model_device(model).type == "cuda" else args.device
    params = sum(p.numel() for p in model.parameters())
    src = multi30k(args.data, "test_2016_flickr", "en", args.sentences)
    ids = tokenizer.encode_batch(src)
    print(
        f"model: {label}, {params / 1e6:.1f}M parameters, vocabulary {tokenizer.vocab_size}, on {where}",
        file=sys.stderr,
    )
    print(f"search: {search}", file=sys.stderr)

    print(HEADER)
    r = args.repeats
    t = args.max_tokens
    reference = None
    dtype = autocast_dtype(args.precision, model_device(model))
    if dtype is not None:
        decode_all(model, ids[:64], 64, search, "warm-up")
        reference = decode_all(model, ids, args.batch_size, search, f"beam {args.beam}, cache, 32-true", r, t)
        print(reference.row(), flush=True)
    with torch.autocast(model_device(model).type, dtype=dtype, enabled=dtype is not None):
        return decode_and_report(args, model, tokenizer, ids, search, reference, (a, b))


def decode_and_report(args, model, tokenizer, ids, search, reference, lengths) -> int:
    """Every run of the benchmark, in the precision the caller set up."""
    r, t, (a, b) = args.repeats, args.max_tokens, lengths
    decode_all(model, ids[:64], 64, search, "warm-up")
    precision = "" if reference is None else f", {args.precision}"
    cached = decode_all(model, ids, args.batch_size, search, f"beam {args.beam}, cache{precision}", r, t)
    print(cached.row(), flush=True)
    if reference is not None:
        compare_precisions(args, tokenizer, reference, cached)
    n = min(args.no_cache_sentences, len(ids))
    if n > 0:
        no_cache = decode_all(
            NoCache(model),
            ids[:n],
            args.batch_size,
            search,
            f"beam {args.beam}, no cache",
            args.no_cache_repeats,
        )
        print(no_cache.row(), flush=True)
    greedy_config = SearchConfig(beam=1, max_len_a=a, max_len_b=b)
    print(decode_all(model, ids, args.batch_size, greedy_config, "greedy, cache", r, t).row(), flush=True)
    nbest = dataclasses.replace(search, nbest=args.beam)
    print(decode_all(model, ids, args.batch_size, nbest, f"beam {args.beam}, {args.beam}-best", r, t).row())
    sample = SearchConfig(sampling=True, nbest=1, seed=args.seed, max_len_a=a, max_len_b=b)
    print(decode_all(model, ids, args.batch_size, sample, "sampling, 1 per input", r, t).row(), flush=True)
    print(score_all(model, ids, cached.outputs, args.batch_size, search, r, t).row(), flush=True)
    if n > 0:
        same = sum(x == y for x, y in zip(no_cache.outputs, cached.outputs[:n], strict=True))
        speedup = (cached.sentences / cached.best) / (no_cache.sentences / no_cache.best)
        print(f"\ncache speed-up {speedup:.1f}x; no-cache outputs equal to cached ones: {same}/{n}")

    print(
        f"\nbatch size sweep, beam {args.beam}, cache, the first min({args.sweep_sentences}, 100 × batch) sentences"
    )
    print(f"\n{HEADER}")
    for size in args.batch_sizes:
        m = min(args.sweep_sentences, 100 * size, len(ids))
        print(decode_all(model, ids[:m], size, search, f"beam {args.beam}, cache", r).row(), flush=True)
    print(f"\nmachine at the end: {machine_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

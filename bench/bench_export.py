"""Decoding with attnx's eager beam search against the same checkpoint exported to CTranslate2 (fp32, int8).

    python bench/bench_export.py --ckpt_path CKPT [--data_dir raw/multi30k] [--sentences 1000]
        [--beam 4] [--alpha 0.6] [--threads 2] [--repeats 3] [--out_dir DIR]

Every system translates the raw English of Multi30k test_2016_flickr (text in, text out: tokenization and
detokenization are timed too) with beam 4 and the ``|Y|^α`` length penalty, the one form CTranslate2 has
(``length_penalty="fairseq"`` in attnx), and maximum length input + 50; attnx is also run with the paper's
GNMT penalty, for reference. attnx decodes in batches of at most 4,096 padded source tokens, shortest
sentences first; CTranslate2 gets the same budget (``batch_type="tokens"``). Each system runs
``--repeats`` times; the best time is reported beside the median (on a shared machine other processes
steal cores). Target tokens count every generated token, ``</s>`` included, and no source token. BLEU is
sacreBLEU's default (13a) against the raw German references. ``same`` is the share of outputs identical to
attnx's with the same search. CTranslate2 fp32 runs with beam ``patience`` 1 (its default) and 2; after the
table, each sentence where CTranslate2 fp32 (patience 1) and attnx disagree is explained by scoring both
hypotheses with attnx. Results go to stdout as Markdown.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from harness import data_root, machine_line, read_lines, timed

from attnx.checkpoint import LoadedModel, load_model
from attnx.data.batch import collate
from attnx.evaluation.bleu import score
from attnx.export import export_ctranslate2
from attnx.inference.config import SearchConfig
from attnx.inference.ctranslate2 import CTranslate2Translator
from attnx.inference.eager import EagerTranslator
from attnx.inference.lengths import length_penalty
from attnx.inference.translator import Translator

Output = tuple[list[str], int]
"""Translations and the number of target tokens generated (``</s>`` included)."""


def translate_counted(translator: Translator, lines: list[str]) -> Output:
    """What ``translator.translate`` does (either engine), keeping the ids to count them."""
    out = translator.translate_ids(translator.encode(lines))
    return [translator.decode(x) for x in out], sum(len(x) + 1 for x in out)


def explain(
    loaded: LoadedModel,
    translator: CTranslate2Translator,
    lines: list[str],
    search: SearchConfig,
    max_tokens: int,
) -> None:
    """Why CTranslate2's outputs differ from attnx's with the same search: each differing sentence's two
    hypotheses scored by attnx (teacher forcing, ``log P / |Y|^α``)."""
    ids = translator.truncate(translator.encode(lines))
    ours = translator.translate_ids(ids)
    reference = EagerTranslator(loaded.model, loaded.tokenizer, search, max_tokens).translate_ids(ids)

    def attnx_score(source: list[int], hyp: list[int]) -> float:
        b = collate([(source, hyp)])
        with torch.inference_mode():
            lprobs = torch.log_softmax(loaded.model(b.src, b.tgt_in, b.src_mask), dim=-1)
        log_p = float(lprobs[0].gather(-1, b.tgt_out[0].unsqueeze(-1)).sum())
        return log_p / length_penalty(len(hyp) + 1, search.alpha, search.length_penalty)

    reasons: dict[str, int] = {}
    for i, (a, b) in enumerate(zip(ours, reference, strict=True)):
        if a == b:
            continue
        limit = translator.max_output_length(len(ids[i]))
        ours_score, ref_score = attnx_score(ids[i], a), attnx_score(ids[i], b)
        if limit in (len(a), len(b)):
            why = "an output reached the maximum length"
        elif abs(ours_score - ref_score) < 1e-5:
            why = "tie"
        elif ours_score > ref_score:
            why = "CTranslate2's hypothesis scores better (it keeps 4 live hypotheses after one finished)"
        else:
            why = "attnx's hypothesis scores better (CTranslate2 stopped at 4 finished hypotheses)"
        reasons[why] = reasons.get(why, 0) + 1
    differ = sum(reasons.values())
    print(
        f"\nCTranslate2 fp32 vs attnx, same search: {len(ids) - differ} of {len(ids)} outputs identical (ids)"
    )
    for why, n in sorted(reasons.items(), key=lambda item: -item[1]):
        print(f"- {n}: {why}")


def dir_size(path: Path) -> float:
    return sum(p.stat().st_size for p in path.iterdir()) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ckpt_path", type=Path, required=True, help="checkpoint of attnx fit/average")
    parser.add_argument(
        "--data_dir",
        type=Path,
        default=data_root() / "multi30k",
        help="folder with test_2016_flickr.{en,de}.gz (default $ATTNX_DATA_DIR/multi30k or ../shared/data/multi30k)",
    )
    parser.add_argument("--sentences", type=int, default=1000, help="first N test sentences (default 1000)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent (default 0.6)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads = CTranslate2 intra_threads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--max_tokens", type=int, default=4096, help="source tokens per batch, padding included"
    )
    parser.add_argument(
        "--out_dir", type=Path, default=None, help="where the exports go (default: a temp dir)"
    )
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    sources = read_lines(args.data_dir / "test_2016_flickr.en.gz", args.sentences)
    references = read_lines(args.data_dir / "test_2016_flickr.de.gz", args.sentences)
    loaded = load_model(args.ckpt_path)
    max_positions = loaded.config.max_len
    fairseq = SearchConfig(
        beam=args.beam,
        alpha=args.alpha,
        length_penalty="fairseq",
        max_len_a=1.0,
        max_len_b=50,
        max_positions=max_positions,
    )
    gnmt = SearchConfig(beam=args.beam, alpha=args.alpha, length_penalty="gnmt", max_positions=max_positions)

    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="bench_export."))
    exports = {}
    for quantization in (None, "int8"):
        start = time.perf_counter()
        path = export_ctranslate2(
            args.ckpt_path, out_dir / (quantization or "fp32"), quantization, force=True
        )
        exports[quantization] = (path, time.perf_counter() - start)

    systems: list[tuple[str, Callable[[], Output]]] = [
        (
            f"attnx eager, GNMT penalty α {args.alpha} (paper)",
            lambda: translate_counted(
                EagerTranslator(loaded.model, loaded.tokenizer, gnmt, args.max_tokens), sources
            ),
        ),
        (
            f"attnx eager, len^{args.alpha} penalty",
            lambda: translate_counted(
                EagerTranslator(loaded.model, loaded.tokenizer, fairseq, args.max_tokens), sources
            ),
        ),
    ]
    for quantization, patience in ((None, 1.0), (None, 2.0), ("int8", 1.0)):
        path = exports[quantization][0]
        translator = CTranslate2Translator.load(
            path,
            threads=args.threads,
            max_tokens=args.max_tokens,
            patience=patience,
            beam=args.beam,
            alpha=args.alpha,
        )
        systems.append(
            (
                f"CTranslate2 {quantization or 'fp32'}, len^{args.alpha} penalty, patience {patience:g}",
                lambda t=translator: translate_counted(t, sources),
            )
        )

    print(
        f"Multi30k test_2016_flickr, first {len(sources)} sentences, en→de, beam {args.beam}, max length input + 50"
    )
    print(
        f"{machine_line()}; ctranslate2 {__import__('ctranslate2').__version__}, intra_threads {args.threads}; "
        f"best of {args.repeats} (median)"
    )
    for quantization, (path, seconds) in exports.items():
        print(f"export {quantization or 'fp32'}: {seconds:.1f} s, {dir_size(path):.1f} MiB")
    print()
    print("| system | sentences/s | target tokens/s | sacreBLEU | same as attnx len^α |")
    print("|---|---:|---:|---:|---:|")
    same_search: list[str] | None = None
    for name, run in systems:
        timing = timed(run, args.repeats)
        (out, tokens), best, median = timing.result, timing.best, timing.median
        bleu = score(out, references).bleu
        if name.startswith("attnx eager, len"):
            same_search = out
        same = (
            ""
            if same_search is None
            else f"{sum(a == b for a, b in zip(out, same_search, strict=True)) / len(out):.1%}"
        )
        print(
            f"| {name} | {len(out) / best:.1f} ({len(out) / median:.1f}) | {tokens / best:.0f} ({tokens / median:.0f}) "
            f"| {bleu:.2f} | {same} |",
            flush=True,
        )
    print(f"\nload average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    fp32 = CTranslate2Translator.load(
        exports[None][0], threads=args.threads, beam=args.beam, alpha=args.alpha
    )
    explain(loaded, fp32, sources, fairseq, args.max_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Decoding precision: a trained checkpoint translating Multi30k test_2016_flickr in fp32, in what ``auto``
chooses on this machine, and exported to CTranslate2 in each compute type it supports here (and in the one its
``auto`` probe picks); speed with start-up apart, and quality against the references and against fp32.

    python bench/bench_decode_precision.py --ckpt_path CKPT [--export CT2_DIR] [--data DIR]
        [--sentences 1000] [--times 5] [--beam 4] [--repeats 3] [--threads 2] [--output table.md]

Every row decodes the same lines with the same search: beam ``--beam``, α 0.6 with the ``|Y|^α`` length
penalty (the one form CTranslate2 has), at most input length + 50 tokens. ``--times`` repeats the
``--sentences`` lines (the issue's "test_2016_flickr ×5"), so a run lasts long enough to time. Per row:

* start-up: seconds to load the model and make the translator, a probe that ``auto`` runs included;
* decode: the best of ``--repeats`` runs over every line (other processes slow a shared machine down; the best
  run is the closest to its real speed), as sentences/s and target tokens/s (``</s>`` counted);
* sacreBLEU BLEU and chrF of one copy of the lines against the references, and against attnx fp32's own
  translations: the share of identical lines and whether the row stays within
  [`MAX_SCORE_DROP`][attnx.evaluation.agreement.MAX_SCORE_DROP] points of fp32's BLEU and chrF.

The CPU model, threads and load are printed above the table; figures from different machines never compare.
Without ``--export`` the checkpoint is exported (float32 weights) to a temporary folder first (not timed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from harness import add_data_option, machine_line, multi30k, publish, run_timed, timed

from attnx.evaluation.agreement import agreement
from attnx.evaluation.bleu import score
from attnx.inference.config import SearchConfig
from attnx.inference.translator import Translator

COLUMNS = [
    "how",
    "runs in",
    "start-up s",
    "decode s",
    "sentences/s",
    "target tokens/s",
    "× attnx fp32",
    "BLEU",
    "chrF",
    "identical to fp32",
    "quality",
]


@dataclass
class Row:
    """One way to decode, measured."""

    how: str
    runs_in: str
    startup: float
    seconds: float
    sentences: int
    tokens: int
    translations: list[str]

    def cells(self, fp32: Row, references: list[str], lines: int) -> list[str]:
        ours = self.translations[:lines]
        report = score(ours, references)
        agree = agreement(self.runs_in, ours, fp32.translations[:lines], references)
        return [
            self.how,
            self.runs_in,
            f"{self.startup:.2f}",
            f"{self.seconds:.2f}",
            f"{self.sentences / self.seconds:.1f}",
            f"{self.tokens / self.seconds:.0f}",
            f"{fp32.seconds / self.seconds:.2f}",
            f"{report.bleu:.2f}",
            f"{report.chrf:.2f}",
            f"{agree.identical:.1%}",
            "within bounds" if agree.holds else "DEGRADED: use fp32",
        ]


def measure(
    how: str, make: Callable[[], Translator], runs_in: Callable[[Translator], str], ids, repeats
) -> Row:
    """Start-up (`make()`), then the best of `repeats` decodes of every source in `ids`."""
    start = time.perf_counter()
    translator = make()
    startup = time.perf_counter() - start
    timing = timed(lambda: translator.translate_ids(ids), repeats)
    outputs = timing.result
    row = Row(
        how=how,
        runs_in=runs_in(translator),
        startup=startup,
        seconds=timing.best,
        sentences=len(ids),
        tokens=sum(len(out) + 1 for out in outputs),
        translations=[translator.decode(out) for out in outputs],
    )
    print(f"  {how}: {row.runs_in}, {row.seconds:.2f} s", file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt_path", type=Path, required=True, help="trained checkpoint (English→German)")
    parser.add_argument("--export", type=Path, help="its CTranslate2 export (default: exported here first)")
    add_data_option(parser)
    parser.add_argument("--split", default="test_2016_flickr", help="Multi30k split to translate")
    parser.add_argument("--sentences", type=int, default=1000, help="first N lines of the split")
    parser.add_argument("--times", type=int, default=5, help="the lines repeated this many times per decode")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="decodes per row; the best is reported")
    parser.add_argument("--threads", type=int, default=0, help="torch and CTranslate2 threads (0: defaults)")
    parser.add_argument("--no_ctranslate2", action="store_true", help="attnx's own engine only")
    parser.add_argument("--output", type=Path, help="also write the table here")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    import attnx
    from attnx.inference.compute_type import auto_compute_type
    from attnx.inference.ctranslate2 import CTranslate2Translator

    sources = multi30k(args.data, args.split, "en", args.sentences)
    references = multi30k(args.data, args.split, "de", args.sentences)
    search = SearchConfig(beam=args.beam, alpha=0.6, length_penalty="fairseq", max_len_a=1.0, max_len_b=50)
    print(machine_line(), file=sys.stderr)
    encoder = attnx.load(args.ckpt_path, search=search, precision="32-true")
    ids = encoder.truncate(encoder.encode(sources)) * max(1, args.times)

    def checkpoint(precision: str) -> Callable[[], Translator]:
        return lambda: attnx.load(args.ckpt_path, search=search, precision=precision)

    rows = [
        measure("attnx fp32", checkpoint("32-true"), lambda t: t.precision, ids, args.repeats),
        measure("attnx auto", checkpoint("auto"), lambda t: t.precision, ids, args.repeats),
    ]
    if not args.no_ctranslate2:
        with tempfile.TemporaryDirectory() as scratch:
            export = args.export or export_checkpoint(args.ckpt_path, Path(scratch) / "ct2")
            import ctranslate2

            for compute_type in sorted(ctranslate2.get_supported_compute_types("cpu")):
                make = lambda t=compute_type: CTranslate2Translator.load(  # noqa: E731
                    export, search=search, compute_type=t, threads=args.threads
                )
                rows.append(
                    measure(f"CTranslate2 {compute_type}", make, lambda t: t.compute_type, ids, args.repeats)
                )
            auto = lambda: CTranslate2Translator.load(  # noqa: E731
                export,
                search=search,
                compute_type=auto_compute_type(export, "cpu", args.threads).compute_type,
                threads=args.threads,
            )
            rows.append(measure("CTranslate2 auto", auto, lambda t: t.compute_type, ids, args.repeats))
    lines = len(sources)
    title = (
        f"Decoding precision: {lines} lines of Multi30k {args.split} ×{max(1, args.times)}, beam {args.beam}, "
        f"{torch.get_num_threads()} thread(s)"
    )
    publish(title, COLUMNS, [row.cells(rows[0], references, lines) for row in rows], args.output)
    return 0


def export_checkpoint(ckpt_path: Path, directory: Path) -> Path:
    from attnx.export.ctranslate2 import export_ctranslate2

    return export_ctranslate2(ckpt_path, directory)


if __name__ == "__main__":
    run_timed(main)

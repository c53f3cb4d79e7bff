"""`attnx prepare`: raw parallel text → joint SentencePiece BPE model → memory-mapped binarized corpus.

[`prepare`][attnx.data.prepare.pipeline.prepare] runs the steps, one pass per step over each split, a module a
step:

0. [`reuse`][attnx.data.prepare.reuse]: a re-run with the same input files (path and SHA-256 of their bytes) and
   settings ([`settings`][attnx.data.prepare.settings]) reuses the directory; a changed input or setting rebuilds
   it (and retrains SentencePiece only if its own inputs or settings changed);
1. [`read`][attnx.data.prepare.read]: read every split (plain or gzip, strict UTF-8), normalize whitespace, check
   that the two sides align; [`clean`][attnx.data.prepare.clean]: training pairs with a blank side, copied,
   duplicate or in another language are dropped and counted, any other split must be complete;
2. [`vocabulary`][attnx.data.prepare.vocabulary]: train one SentencePiece BPE model on the source and target
   training text together (§5.1, shared vocabulary), with attnx's fixed special ids (pad 0, unk 1, bos 2, eos 3);
3. [`encode`][attnx.data.prepare.encode]: encode every split on all cores, drop training pairs over
   `--max_sentence_tokens` tokens or the `--max_ratio` length ratio (counted, never validation or test pairs),
   and write the flat id arrays, offsets and lengths;
4. [`publish`][attnx.data.prepare.publish]: move the files into place and write `meta.json` last: a directory
   without it is incomplete, whatever else is there.

Whose files are whose ([`publish`][attnx.data.prepare.publish]): prepare writes only into a scratch directory of
its own and deletes only files an earlier run listed in `meta.json`, so it never deletes, truncates or overwrites
a file it did not write; an interrupted run leaves the previous corpus as it was
([`interrupt`][attnx.data.prepare.interrupt]). [`reports`][attnx.data.prepare.reports] says what it did. The
`attnx prepare` command around it (options, printing, stop signals) is `attnx.commands.prepare`.
"""

from __future__ import annotations

from attnx.data.prepare.pipeline import prepare
from attnx.data.prepare.reports import report, report_markdown, write_report
from attnx.data.prepare.settings import Inputs, Settings
from attnx.data.prepare.vocabulary import train_sentencepiece

__all__ = [
    "Inputs",
    "Settings",
    "prepare",
    "report",
    "report_markdown",
    "train_sentencepiece",
    "write_report",
]

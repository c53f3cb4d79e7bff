"""The whole pipeline on a real corpus: Multi30k prepared once, read back split by split."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from attnx.data.corpus import PreparedCorpus
from attnx.data.errors import DataError
from attnx.data.text import normalize


def test_multi30k(multi30k: Path, shared_data: Path) -> None:
    corpus = PreparedCorpus(multi30k)
    assert (corpus.src_lang, corpus.tgt_lang, corpus.vocab_size) == ("en", "de", 8000)
    assert corpus.splits == ["train", "valid", "test"]
    meta = corpus.meta["splits"]
    assert (
        meta["train"]["read"] == 29_000 and meta["valid"]["pairs"] == 1_014 and meta["test"]["pairs"] == 1_000
    )
    assert meta["train"]["pairs"] + sum(meta["train"]["dropped"].values()) == 29_000
    assert corpus.tokenizer.vocab_size == 8000 and corpus.meta["dtype"] == "uint16"

    with gzip.open(shared_data / "multi30k" / "val.de.gz", "rt", encoding="utf-8") as f:
        raw = f.read().splitlines()
    refs = corpus.references("valid")
    assert refs == [normalize(line) for line in raw]
    valid = corpus.dataset("valid")
    assert len(valid) == len(refs) == len(corpus.sources("valid"))
    src, tgt = valid[7]
    assert corpus.tokenizer.decode(tgt.tolist()) == refs[7]
    assert corpus.tokenizer.decode(src.tolist()) == corpus.sources("valid")[7]
    assert int(valid.tgt_lengths[7]) == len(tgt)
    with pytest.raises(DataError, match="training text is not kept"):
        corpus.references("train")
    with pytest.raises(DataError, match="no split 'newstest'"):
        corpus.dataset("newstest")

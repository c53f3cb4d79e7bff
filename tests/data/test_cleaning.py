"""Cleaning the training text, on real lines: Multi30k (clean captions) and the OpenNMT WMT sample (web-crawled)."""

from __future__ import annotations

import gzip
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnx.data.cleaning import SeenPairs, copies, identifier, pair_keys, wrong_language
from attnx.data.corpus import PreparedCorpus

from .conftest import write_pair


def lines(path: Path, n: int | None = None, start: int = 0) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, start, None if n is None else start + n)]


def real(shared_data: Path, corpus: str, split: str, n: int | None = None, start: int = 0):
    return tuple(lines(shared_data / corpus / f"{split}.{lang}.gz", n, start) for lang in ("en", "de"))


def prepare_cli(*argv: object) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "attnx", "prepare", "--src_lang", "en", "--tgt_lang", "de"]
    result = subprocess.run(command + list(map(str, argv)), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result


def test_language_identifier_agrees_with_py3langid_line_by_line(shared_data: Path) -> None:
    import py3langid

    en, de = real(shared_data, "multi30k", "val", 300)
    web_en, web_de = real(shared_data, "opennmt_wmt_ende_10k", "train", 300)
    sample = en + de + web_en + web_de + ["", "ALL CAPS HEADLINE HERE", "Ce moment restera à jamais gravé"]
    ours = identifier().classify(sample)
    theirs = [py3langid.classify(line)[0] for line in sample]
    differ = [(line, a) for line, a, b in zip(sample, ours, theirs, strict=True) if a != b]
    assert differ and all(a == "und" and not line.strip() for line, a in differ)  # blank lines only
    assert ours[-1] == "fr" and {"en", "de"} <= set(ours)


def test_filters_keep_everything_that_should_stay(shared_data: Path) -> None:
    en, de = real(shared_data, "multi30k", "train", 200)
    assert not copies(en, de).any()
    assert SeenPairs().first_seen(pair_keys(en, de)).all()
    assert not wrong_language(identifier().classify(en), identifier().classify(de), "en", "de").any()


def test_seen_pairs_remember_across_chunks_and_within_one() -> None:
    seen = SeenPairs()
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**63, 5000, dtype=np.int64).astype(np.uint64)
    kept = [seen.first_seen(chunk) for chunk in np.array_split(np.concatenate([keys, keys[::7]]), 13)]
    assert np.concatenate(kept).sum() == 5000 and len(seen) == 5000
    assert seen.first_seen(keys[:3].repeat(2)).tolist() == [False] * 6
    assert seen.first_seen(np.array([1, 1, 2], np.uint64)).tolist() == [True, False, True]


def test_prepare_drops_the_duplicate_the_copy_and_the_wrong_language_pair_and_nothing_else(
    shared_data: Path, tmp_path: Path
) -> None:
    en, de = (list(side) for side in real(shared_data, "multi30k", "train", 300))
    web_en, web_de = real(shared_data, "opennmt_wmt_ende_10k", "train", 400)
    # real faults of web-crawled text: line 387 of the OpenNMT sample has a French "German" side,
    # line 1225 an English side in French; a pair repeated; an untranslated copy
    faults = {
        "language": (web_en[386], web_de[386]),
        "duplicate": (en[10], de[10]),
        "copy": (en[20], en[20]),
    }
    assert "Janinet" in web_en[386] and web_de[386].startswith("Il est exploité")
    for s, t in faults.values():
        en.append(s)
        de.append(t)
    write_pair(tmp_path / "raw" / "train", en, de)
    out, report = tmp_path / "out", tmp_path / "report.md"
    printed = prepare_cli("--train", tmp_path / "raw" / "train", "--vocab_size", 1000, "--output", out,
                          "--report", report).stdout  # fmt: skip
    assert (
        "dropped 3 of 303: 1 with the target a copy of the source, 1 duplicating an earlier pair, "
        "1 in another language" in printed
    )
    corpus = PreparedCorpus(out)
    train = corpus.meta["splits"]["train"]
    assert train["pairs"] == 300 and len(corpus.dataset("train")) == 300
    (stats,) = train["corpora"].values()
    for reason, (s, t) in faults.items():
        (example,) = stats["examples"][reason]
        assert (example["src"], example["tgt"]) == (s, t)
    assert stats["examples"]["language"][0]["line"] == 301
    assert stats["examples"]["language"][0]["found"] == "en-fr"
    text = report.read_text()
    assert "| 303 | 300 | 0 | 1 | 1 | 1 |" in text and "identified as en-fr" in text and "Janinet" in text

    # each filter can be switched off: then the pair it dropped stays (a copy is English on the German side,
    # so with copies kept, language identification drops it instead)
    expected = {"--drop_duplicates": (301, "duplicate", 0), "--drop_wrong_language": (301, "language", 0),
                "--drop_copies": (300, "language", 2)}  # fmt: skip
    for option, (pairs, reason, count) in expected.items():
        prepare_cli(
            "--train", tmp_path / "raw" / "train", "--vocab_size", 1000, "--output", out, option, "false"
        )
        meta = PreparedCorpus(out).meta["splits"]["train"]
        assert len(PreparedCorpus(out).dataset("train")) == meta["pairs"] == pairs, option
        assert meta["dropped"].get(reason, 0) == count, option


def test_language_id_drops_at_most_half_a_percent_of_clean_multi30k(
    shared_data: Path, tmp_path: Path
) -> None:
    en, de = real(shared_data, "multi30k", "test_2016_flickr")
    assert len(en) == 1000
    write_pair(tmp_path / "raw" / "train", en, de)
    report = tmp_path / "report.md"
    out = tmp_path / "out"
    prepare_cli(
        "--train", tmp_path / "raw" / "train", "--vocab_size", 1000, "--output", out, "--report", report
    )
    dropped = PreparedCorpus(out).meta["splits"]["train"]["dropped"]
    assert dropped.get("language", 0) <= 5, dropped
    (stats,) = PreparedCorpus(out).meta["splits"]["train"]["corpora"].values()
    for example in stats["examples"].get("language", []):  # the report names each one
        assert f"line {example['line']} (identified as {example['found']})" in report.read_text()


def test_several_corpora_are_counted_each(shared_data: Path, tmp_path: Path) -> None:
    m_en, m_de = real(shared_data, "multi30k", "train", 200)
    w_en, w_de = real(shared_data, "opennmt_wmt_ende_10k", "train", 400)
    write_pair(tmp_path / "raw" / "captions", m_en, m_de, gz=True)
    write_pair(tmp_path / "raw" / "web", list(w_en) + m_en[:5], list(w_de) + m_de[:5])  # 5 pairs seen before
    out = tmp_path / "out"
    train = f"[{tmp_path / 'raw' / 'captions'}, {tmp_path / 'raw' / 'web'}]"
    printed = prepare_cli("--train", train, "--vocab_size", 1000, "--output", out).stdout
    meta = json.loads((out / "meta.json").read_text())["splits"]["train"]
    captions, web = (
        meta["corpora"][str(tmp_path / "raw" / "captions")],
        meta["corpora"][str(tmp_path / "raw" / "web")],
    )
    assert (captions["read"], captions["pairs"], captions["dropped"]) == (200, 200, {})
    assert web["read"] == 405 and web["dropped"]["duplicate"] == 5 and web["dropped"]["language"] > 0
    assert meta["pairs"] == captions["pairs"] + web["pairs"] == len(PreparedCorpus(out).dataset("train"))
    assert meta["read"] == 605 and sum(meta["dropped"].values()) == 605 - meta["pairs"]
    assert f"    {tmp_path / 'raw' / 'web'}: {web['pairs']:,} pairs; dropped" in printed


def test_report_never_overwrites_a_file_it_did_not_write(shared_data: Path, tmp_path: Path) -> None:
    en, de = real(shared_data, "multi30k", "val", 200)
    write_pair(tmp_path / "raw" / "train", en, de)
    notes = tmp_path / "notes.md"
    notes.write_text("my notes\n")
    command = [sys.executable, "-m", "attnx", "prepare", "--src_lang", "en", "--tgt_lang", "de", "--train",
               str(tmp_path / "raw" / "train"), "--vocab_size", "500", "--output", str(tmp_path / "out")]  # fmt: skip
    result = subprocess.run(command + ["--report", str(notes)], capture_output=True, text=True)
    assert result.returncode == 1 and "is not a report attnx wrote" in result.stderr
    assert notes.read_text() == "my notes\n"
    report = tmp_path / "report.md"
    for _ in range(2):  # its own report it replaces, also when the corpus is reused
        assert subprocess.run(command + ["--report", str(report)], capture_output=True).returncode == 0
    assert report.read_text().startswith("# attnx prepare: what cleaning dropped")


@pytest.mark.parametrize("lang", ["xx"])
def test_language_id_is_off_for_a_language_it_does_not_know(
    tmp_path: Path, shared_data: Path, lang: str
) -> None:
    en, de = real(shared_data, "multi30k", "val", 200)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / f"train.{lang}").write_text("\n".join(de) + "\n")
    (tmp_path / "raw" / "train.en").write_text("\n".join(en) + "\n")
    command = [sys.executable, "-m", "attnx", "prepare", "--src_lang", "en", "--tgt_lang", lang, "--train",
               str(tmp_path / "raw" / "train"), "--vocab_size", "500", "--output", str(tmp_path / "out")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "language identification off: the language identifier does not know 'xx'" in result.stdout
    assert len(PreparedCorpus(tmp_path / "out").dataset("train")) == 200

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from attnx.cli import main as attnx
from attnx.data.corpus import PreparedCorpus, ids_dtype
from attnx.data.errors import DataError
from attnx.data.text import normalize

from .conftest import sentences, translate, write_pair


def main(argv: list[str]) -> int:
    return attnx(["prepare", *argv])


def run(raw: Path, out: Path, *extra: str) -> int:
    """Prepare ``raw/train`` (or the `--train` in `extra`: a repeated list option collects its values) with a
    60-piece vocabulary; language identification is off: the toy corpora's word salad is no language (the
    cleaning tests below use real lines)."""
    train = [] if "--train" in extra else ["--train", str(raw / "train")]
    return main(
        [
            "--src_lang",
            "en",
            "--tgt_lang",
            "de",
            *train,
            "--output",
            str(out),
            "--vocab_size",
            "60",
            "--drop_wrong_language",
            "false",
        ]
        + list(extra)
    )


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


def test_cli_prepare_reports_and_reuses(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["--valid", str(toy / "valid"), "--test", f"[{toy / 'test'}, other={toy / 'valid'}]"]
    assert run(toy, out, *args) == 0
    printed = capsys.readouterr().out
    assert "prepared en-de corpus" in printed and "train: 300 pairs" in printed
    corpus = PreparedCorpus(out)
    assert corpus.splits == ["train", "valid", "test", "other"]
    assert corpus.references("other") == corpus.references("valid")
    assert not (out / "tmp").exists() and not (out / "train.en").exists()

    stamp = (out / "train.en.bin").stat().st_mtime_ns
    assert run(toy, out, *args) == 0
    assert "reused" in capsys.readouterr().out
    assert (out / "train.en.bin").stat().st_mtime_ns == stamp


def test_changed_input_or_setting_rebuilds(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert run(toy, out) == 0
    spm_stamp = (out / "spm.model").stat().st_mtime_ns

    assert (
        run(toy, out, "--max_sentence_tokens", "8") == 0
    )  # encoding setting: rebuild, same SentencePiece model
    assert "prepared" in capsys.readouterr().out
    assert (out / "spm.model").stat().st_mtime_ns == spm_stamp
    assert PreparedCorpus(out).meta["splits"]["train"]["dropped"]["too_long"] > 0

    write_pair(toy / "train", sentences(200, 7), translate(sentences(200, 7)))  # new training text: retrain
    assert run(toy, out, "--max_sentence_tokens", "8") == 0
    assert (out / "spm.model").stat().st_mtime_ns != spm_stamp
    assert PreparedCorpus(out).meta["splits"]["train"]["read"] == 200

    assert run(toy, out, "--max_sentence_tokens", "8", "--test", str(toy / "test")) == 0
    assert "test" in PreparedCorpus(out).splits
    assert (
        run(toy, out, "--max_sentence_tokens", "8") == 0
    )  # the test set is gone again, and so are its files
    assert "test" not in PreparedCorpus(out).splits and not (out / "test.en.bin").exists()


def test_long_and_unbalanced_training_pairs_are_dropped_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = sentences(100, 1)
    tgt = translate(src)
    src[10] = " ".join(["dog"] * 50_000)  # one enormous line
    tgt[10] = " ".join(["cat"] * 50_000)
    src[20], tgt[20] = "the", "the man runs in the park with a big red ball under the house"
    src[30], tgt[30] = "", "blank source"
    write_pair(tmp_path / "raw" / "train", src, tgt)
    write_pair(tmp_path / "raw" / "valid", [src[10], "a dog"], [tgt[10], "a cat"])
    assert run(tmp_path / "raw", tmp_path / "out", "--valid", str(tmp_path / "raw" / "valid")) == 0
    printed = capsys.readouterr().out
    assert "dropped 3 of 100: 1 with a blank side, 1 over 250 tokens, 1 over length ratio 3.0" in printed
    corpus = PreparedCorpus(tmp_path / "out")
    assert len(corpus.dataset("train")) == 97
    kept = [i for i in range(100) if i not in (10, 20, 30)]  # the ids of every pair left are its own text's
    train = corpus.dataset("train")
    for j, i in enumerate(kept):
        assert [corpus.tokenizer.decode(x.tolist()) for x in train[j]] == [src[i], tgt[i]]
    valid = corpus.dataset("valid")  # never filtered
    assert len(valid) == 2 and int(valid.src_lengths[0]) > 250


def error_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line a bad input prints on stderr; the exit status is 1 (bad data) or 2 (bad options)."""
    assert main(argv) in (1, 2)
    err = capsys.readouterr().err
    assert err.startswith("attnx prepare: error: ") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


def base(raw: Path, out: Path) -> list[str]:
    return ["--src_lang", "en", "--tgt_lang", "de", "--train", str(raw / "train"), "--output", str(out)]


@pytest.mark.parametrize(
    ("src", "tgt", "message"),
    [
        (["a b"] * 5, ["c d"] * 4, r"train\.en has 5 lines but .*train\.de has 4"),
        (b"", b"", "are empty"),
        (b"caf\xe9 au lait\n" * 3, b"x\n" * 3, r"train\.en:1: invalid UTF-8"),
        (["", " "], ["a", "b"], "every training pair has a blank side"),
    ],
    ids=["line-counts", "empty", "utf8", "all-blank"],
)
def test_bad_training_files_exit_1_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], src, tgt, message: str
) -> None:
    write_pair(tmp_path / "train", src, tgt)
    err = error_of(capsys, base(tmp_path, tmp_path / "out") + ["--vocab_size", "20"])
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out" / "meta.json").exists()


def test_blank_validation_line_is_an_error(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pair(toy / "valid", ["a", "b", "c"], ["A", "", "C"])
    err = error_of(
        capsys, base(toy, tmp_path / "out") + ["--valid", str(toy / "valid"), "--vocab_size", "60"]
    )
    assert "valid.de:2: blank line" in err


def test_vocab_too_large_says_what_to_use(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--vocab_size", "5000"])
    assert "--vocab_size 5000 is more than this training text supports; use --vocab_size" in err
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--vocab_size", "10"])
    assert "less than the" in err


def test_missing_files_and_bad_names(toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--valid", str(toy / "nope")])
    assert "no en file for" in err
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--test", f"train={toy / 'test'}"])
    assert "bad split name 'train'" in err
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--test", f"[{toy / 'test'}, {toy / 'valid'}]"])
    assert "split 'test' is given twice" in err


def test_corpus_reader_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a prepared corpus"):
        PreparedCorpus(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"format_version": 0}))
    with pytest.raises(DataError, match="run `attnx prepare` again"):
        PreparedCorpus(tmp_path)


def test_ids_dtype() -> None:
    assert ids_dtype(8000) == np.uint16 and ids_dtype(65_535) == np.uint16 and ids_dtype(65_536) == np.int32


def test_console_script_has_help_for_every_option() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "attnx", "prepare", "--help"], capture_output=True, text=True, env=os.environ
    )
    assert result.returncode == 0
    for option in ("--src_lang", "--train", "--valid", "--test", "--vocab_size", "--max_sentence_tokens", "--max_ratio",
                   "--sample_size", "--character_coverage", "--workers", "--output"):  # fmt: skip
        assert option in result.stdout


def test_gzip_and_plain_inputs_agree(tmp_path: Path) -> None:
    src = sentences(200, 1)
    tgt = translate(src)
    write_pair(tmp_path / "a" / "train", src, tgt)
    write_pair(tmp_path / "b" / "train", src, [line.replace(" ", "  ") + "\r" for line in tgt], gz=True)
    assert run(tmp_path / "a", tmp_path / "out_a") == 0
    assert run(tmp_path / "b", tmp_path / "out_b") == 0
    for name in ("train.en.bin", "train.de.bin", "train.de.len.npy", "spm.vocab"):
        assert (tmp_path / "out_a" / name).read_bytes() == (tmp_path / "out_b" / name).read_bytes(), name


def test_several_training_corpora_are_concatenated(toy: Path, tmp_path: Path) -> None:
    extra = sentences(50, 9)
    write_pair(tmp_path / "more" / "train", extra, translate(extra), gz=True)
    argv = ["--train", f"[{toy / 'train'}, {tmp_path / 'more' / 'train'}]", "--valid", f"dev={toy / 'valid'}"]
    assert run(toy, tmp_path / "out", *argv) == 0
    corpus = PreparedCorpus(tmp_path / "out")
    assert corpus.splits == ["train", "dev"] and len(corpus.dataset("train")) == 350
    assert corpus.meta["splits"]["train"]["inputs"]["src"][1].endswith("more/train.en.gz")


def test_a_corpus_repeated_and_a_corpus_tagged_go_into_training_as_asked(toy: Path, tmp_path: Path) -> None:
    extra = sentences(50, 9)
    write_pair(tmp_path / "bt" / "train", extra, translate(extra))
    argv = ["--train", f"[{toy / 'train'}, {tmp_path / 'bt' / 'train'}]", "--train_repeat", "[3, 1]"]
    argv += ["--train_tag", '["", "<BT>"]', "--vocab_size", "70"]
    assert run(toy, tmp_path / "out", *argv) == 0
    corpus = PreparedCorpus(tmp_path / "out")
    train = corpus.dataset("train")
    assert len(train) == 3 * 300 + 50  # the real pairs three times, each copy a row of its own
    sp = corpus.tokenizer.sp
    tag = sp.piece_to_id("<BT>")
    assert tag > 3 and sp.id_to_piece(tag) == "<BT>"
    assert tag in sp.encode("<BT> a dog runs") and sp.encode("<BT>") == [sp.piece_to_id("▁"), tag]
    rows = [tuple(train[i][0].tolist()) for i in range(len(train))]
    assert sum(tag in row for row in rows) == 50  # every synthetic source, no real one
    real = Counter(row for row in rows if tag not in row)
    assert all(n % 3 == 0 for n in real.values()) and rows[0] == rows[1] == rows[2]
    meta = corpus.meta["splits"]["train"]["corpora"]
    assert [c.get("repeat") for c in meta.values()] == [3, 1] and [c.get("tag") for c in meta.values()] == [
        None,
        "<BT>",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--train_repeat", "[2, 1]"], "--train_repeat has 2 values for 1 --train corpora"),
        (["--train_repeat", "[0]"], "--train_repeat counts must be at least 1"),
        (["--train_tag", "[<B T>]"], "cannot be a tag or a user-defined symbol"),
        (["--user_defined_symbols", "[</s>]"], "cannot be a tag or a user-defined symbol"),
    ],
)
def test_bad_repeat_counts_and_tags_are_one_line(toy: Path, tmp_path: Path, capsys, argv, message) -> None:
    err = error_of(capsys, base(toy, tmp_path / "out") + argv)
    assert message in err and not (tmp_path / "out").exists()


def test_unwritable_output_is_an_error_not_a_traceback(toy: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    err = error_of(capsys, base(toy, tmp_path / "file" / "out") + ["--vocab_size", "60"])
    assert "file" in err


# --- prepare writes only its own files (the real command, in a subprocess) ------------------------------


def attnx_prepare(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "attnx", "prepare", "--src_lang", "en", "--tgt_lang", "de"]
    command += ["--drop_wrong_language", "false"]
    return subprocess.run(command + list(map(str, argv)), capture_output=True, text=True, env=os.environ)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr


def test_output_holding_the_users_files_is_refused_and_left_alone(toy: Path, tmp_path: Path) -> None:
    mydir = tmp_path / "mydir"
    (mydir / "tmp").mkdir(parents=True)
    (mydir / "tmp" / "notes.txt").write_text("my notes\n")
    (mydir / "firmware.bin").write_bytes(b"\x7fELF firmware")
    err = one_error_line(attnx_prepare("--train", toy / "train", "--vocab_size", 60, "--output", mydir))
    assert "did not write (firmware.bin, tmp/)" in err and "pass a new or empty directory" in err
    assert sorted(p.name for p in mydir.rglob("*")) == ["firmware.bin", "notes.txt", "tmp"]
    assert (mydir / "tmp" / "notes.txt").read_text() == "my notes\n"
    assert (mydir / "firmware.bin").read_bytes() == b"\x7fELF firmware"

    # a file the user adds to a prepared corpus later is just as safe: the rebuild is refused, the file kept
    out = tmp_path / "out"
    assert attnx_prepare("--train", toy / "train", "--vocab_size", 60, "--output", out).returncode == 0
    (out / "tmp").mkdir()
    (out / "tmp" / "notes.txt").write_text("mine")
    err = one_error_line(attnx_prepare("--train", toy / "train", "--vocab_size", 61, "--output", out))
    assert "tmp/" in err and (out / "tmp" / "notes.txt").read_text() == "mine"
    assert PreparedCorpus(out).vocab_size == 60


def test_output_holding_an_input_is_refused_and_the_input_untouched(toy: Path, tmp_path: Path) -> None:
    before = {p.name: p.read_bytes() for p in toy.iterdir()}
    for output in (toy, toy.parent):  # the input directory itself, and one that contains it
        err = one_error_line(
            attnx_prepare(
                "--train", toy / "train", "--valid", toy / "valid", "--vocab_size", 60, "--output", output
            )
        )
        assert "holds the input" in err and "pass a directory apart from the raw text" in err
        assert {p.name: p.read_bytes() for p in toy.iterdir()} == before


def test_reuse_is_decided_on_content_not_size_and_time(toy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ("--train", toy / "train", "--vocab_size", 60, "--output", out)
    assert "prepared" in attnx_prepare(*argv).stdout
    assert "reused" in attnx_prepare(*argv).stdout
    first = PreparedCorpus(out).dataset("train")[0][0].tolist()

    path = toy / "train.en"
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[0] = ord("X") if data[0] != ord("X") else ord("Y")  # one byte, same size, same modification time
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns

    result = attnx_prepare(*argv)
    assert result.returncode == 0 and "prepared" in result.stdout and "reused" not in result.stdout
    assert PreparedCorpus(out).dataset("train")[0][0].tolist() != first


def test_sigterm_keeps_the_previous_corpus_and_exits_non_zero(
    toy: Path, tmp_path: Path, shared_data: Path
) -> None:
    import signal
    import time

    out = tmp_path / "out"
    assert run(toy, out) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    m30k = shared_data / "multi30k"
    command = [sys.executable, "-m", "attnx", "prepare", "--src_lang", "en", "--tgt_lang", "de"]
    command += ["--train", str(m30k / "train"), "--vocab_size", "8000", "--output", str(out)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(out.glob(".attnx-prepare-*")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 128 + signal.SIGTERM, err
    assert "interrupted by SIGTERM" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == sorted(before), err  # no scratch directory left
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing changed
    assert len(PreparedCorpus(out).dataset("train")) == 300


def test_what_a_killed_run_left_is_cleaned_up_and_nothing_else(toy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run(toy, out, "--test", str(toy / "test")) == 0
    files = json.loads((out / "meta.json").read_text())["files"]
    assert set(files) | {"meta.json"} == {p.name for p in out.iterdir()}
    # SIGKILL while moving files into place: a scratch directory and a meta.json that says "incomplete"
    scratch = out / ".attnx-prepare-killed"
    scratch.mkdir()
    (scratch / "SCRATCH-OF-ATTNX-PREPARE").write_text("")
    (scratch / "train.en.bin").write_bytes(b"partial")
    meta = {"format_version": 1, "incomplete": True, "files": files}
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="incomplete: an `attnx prepare` into it was interrupted"):
        PreparedCorpus(out)
    # a look-alike directory the user made is not prepare's: refused, kept
    (out / ".attnx-prepare-mine").mkdir()
    with pytest.raises(DataError, match=r"did not write \(\.attnx-prepare-mine/\)"):
        run_in_process(toy, out)
    (out / ".attnx-prepare-mine").rmdir()
    assert run(toy, out) == 0  # the test split is gone: its files go, the scratch directory too
    assert {p.name for p in out.iterdir()} == set(PreparedCorpus(out).meta["files"]) | {"meta.json"}
    assert not (out / "test.en.bin").exists() and len(PreparedCorpus(out).dataset("train")) == 300


def run_in_process(raw: Path, out: Path) -> None:
    from attnx.data.prepare import Inputs, Settings, prepare

    settings = Settings("en", "de", 60, drop_wrong_language=False)
    prepare(Inputs.from_prefixes({"train": [raw / "train"]}, "en", "de"), out, settings)


def test_a_report_inside_the_output_is_prepares_own(toy: Path, tmp_path: Path) -> None:
    """`--report OUT/report.md`, then the same command: the corpus is reused and the report rewritten (it was
    refused as a file prepare did not write); a rebuild keeps it too, and a user's file beside it is refused."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnx", "prepare", "--src_lang", "en", "--tgt_lang", "de", "--train",
               str(toy / "train"), "--vocab_size", "60", "--drop_wrong_language", "false", "--output", str(out),
               "--report", str(out / "report.md")]  # fmt: skip
    for word in ("prepared", "reused"):
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0 and word in result.stdout, result.stderr
        assert (out / "report.md").read_text().startswith("# attnx prepare: what cleaning dropped")
    rebuilt = subprocess.run([*command[:-2], "--vocab_size", "61"], capture_output=True, text=True)
    assert rebuilt.returncode == 0 and (out / "report.md").is_file(), rebuilt.stderr
    (out / "notes.md").write_text("# my notes\n")
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode == 1 and "did not write (notes.md)" in refused.stderr


# --- a damaged corpus is one error when it is opened ----------------------------------------------------


@pytest.mark.parametrize("damage", ["out-of-vocabulary", "changed", "truncated"])
def test_damaged_bin_is_named_when_the_corpus_is_opened(toy: Path, tmp_path: Path, damage: str) -> None:
    from attnx.data.datamodule import TranslationDataModule

    out = tmp_path / "out"
    assert run(toy, out) == 0
    path = out / "train.de.bin"
    ids = np.fromfile(path, np.uint16)
    recorded = PreparedCorpus(out).meta["splits"]["train"]["max_id"]["de"]
    assert recorded == ids.max() < 60
    if damage == "out-of-vocabulary":
        ids[len(ids) // 2] = 60_000
        unchecked = r"train\.de\.bin holds token id 60000, outside the vocabulary of 60 pieces"
    elif damage == "changed":
        ids[ids == recorded] = 4  # still inside the vocabulary, but not what was written
        unchecked = r"train\.de\.bin changed after it was prepared \(largest id"
    else:
        ids = ids[:-5]
        unchecked = r"train\.de\.bin holds .* ids but its index train\.de\.idx\.npy covers"
    message = {  # the size, else the SHA-256 that meta.json records, names it first
        "truncated": r"train\.de\.bin has [\d,]+ bytes, meta\.json records [\d,]+"
    }.get(
        damage,
        r"train\.de\.bin is not the file prepare wrote \(its SHA-256 is not the one meta\.json records\)",
    )
    path.write_bytes(ids.tobytes())
    with pytest.raises(DataError, match=message):
        PreparedCorpus(out).dataset("train")
    with pytest.raises(DataError, match=rf"{message}.*run `attnx prepare` again into"):
        TranslationDataModule(str(out)).train_dataloader()
    # without the checksums (a corpus of an earlier attnx) the ids themselves are still checked
    meta = json.loads((out / "meta.json").read_text())
    del meta["checksums"]
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=unchecked):
        PreparedCorpus(out).dataset("train")


@pytest.mark.slow
def test_sigterm_at_every_moment_is_one_line_and_a_consistent_corpus(tmp_path: Path) -> None:
    """SIGTERM at 16 moments from the start of the build to the end of the process, the last moments included
    (the corpus already moved into place, the report being printed, Python shutting down; there it killed
    prepare with 143 and no message): each ends with the previous corpus kept and one line saying so, or the
    new corpus complete and one line saying so (status 143), or the whole report and status 0."""
    import signal
    import time

    src = sentences(3000, 7)
    write_pair(tmp_path / "raw" / "train", src, translate(src))
    out = tmp_path / "out"
    assert run(tmp_path / "raw", out) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    command = [sys.executable, "-m", "attnx", "prepare", "--src_lang", "en", "--tgt_lang", "de", "--train",
               str(tmp_path / "raw" / "train"), "--vocab_size", "61", "--drop_wrong_language", "false",
               "--workers", "1", "--output", str(out)]  # fmt: skip

    def attempt(delay: float | None) -> tuple[subprocess.Popen[str], float, str, str]:
        shutil.rmtree(out)
        out.mkdir()
        for name, data in before.items():
            (out / name).write_bytes(data)
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not list(out.glob(".attnx-prepare-*")) and child.poll() is None:
            time.sleep(0.002)  # the build has started: prepare's handlers are installed
        started = time.monotonic()
        if delay is not None:
            time.sleep(delay)
            child.send_signal(signal.SIGTERM)
        stdout, stderr = child.communicate(timeout=120)
        return child, time.monotonic() - started, stdout, stderr

    import shutil

    durations = []
    for _ in range(3):  # from the start of the build to the end of the process, undisturbed
        child, duration, stdout, _ = attempt(None)
        assert child.returncode == 0 and stdout.endswith(f"corpus: {out}\n")
        durations.append(duration)
    outcomes = set()
    for k in range(16):
        child, _, stdout, stderr = attempt(sorted(durations)[1] * 1.15 * k / 15)
        lines = stderr.strip().splitlines()
        assert "Traceback" not in stderr, stderr
        if child.returncode == 0 or child.returncode == -signal.SIGTERM:  # after the last line was printed
            assert stdout.endswith(f"corpus: {out}\n") and stderr == "", (child.returncode, stdout, stderr)
            outcome = "new"
        else:
            assert child.returncode == 143 and len(lines) == 1, (child.returncode, stderr)
            assert lines[0].startswith("attnx prepare: interrupted by SIGTERM; "), lines
            outcome = "new" if "holds the complete corpus" in lines[0] else "kept"
            assert outcome == "new" or "keeps what it held before" in lines[0], lines
        if outcome == "kept":
            assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        else:
            assert PreparedCorpus(out).vocab_size == 61 and {p.name for p in out.iterdir()} == set(
                PreparedCorpus(out).meta["files"]
            ) | {"meta.json"}
            PreparedCorpus(out).verify_split("train")
        outcomes.add((child.returncode, outcome))
    assert (143, "kept") in outcomes and any(outcome == "new" for _, outcome in outcomes), outcomes

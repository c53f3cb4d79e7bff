"""`attnx prepare` as a command: its option checks, its help, and Ctrl-C or SIGTERM at any moment ending in one
line, a consistent corpus and status 143."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnx.data.corpus import PreparedCorpus
from tests.data.conftest import run, sentences, translate, write_pair
from tests.data.prepare.conftest import base, error_of


def test_missing_files_and_bad_names(toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--valid", str(toy / "nope")])
    assert "no en file for" in err
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--test", f"train={toy / 'test'}"])
    assert "bad split name 'train'" in err
    err = error_of(capsys, base(toy, tmp_path / "out") + ["--test", f"[{toy / 'test'}, {toy / 'valid'}]"])
    assert "split 'test' is given twice" in err


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


def test_console_script_has_help_for_every_option() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "attnx", "prepare", "--help"], capture_output=True, text=True, env=os.environ
    )
    assert result.returncode == 0
    for option in ("--src_lang", "--train", "--valid", "--test", "--vocab_size", "--max_sentence_tokens", "--max_ratio",
                   "--sample_size", "--character_coverage", "--workers", "--output"):  # fmt: skip
        assert option in result.stdout


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
    deadline = time.monotonic() + 600  # a cold start on a loaded machine; waited out only on failure
    while not list(out.glob(".attnx-prepare-*")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    # a signal before the build began would meet Python's default handler, not prepare's
    assert list(out.glob(".attnx-prepare-*")), f"prepare's build did not begin: {child.poll()}"
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=600)
    assert child.returncode == 128 + signal.SIGTERM, err
    assert "interrupted by SIGTERM" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == sorted(before), err  # no scratch directory left
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing changed
    assert len(PreparedCorpus(out).dataset("train")) == 300


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
        stdout, stderr = child.communicate(timeout=600)
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


def test_named_corpora_record_their_rows_and_share_one_vocabulary(toy: Path, tmp_path: Path) -> None:
    extra = sentences(50, 9)  # the back-translated corpus alone has the letters j, q and z
    write_pair(
        tmp_path / "bt" / "train", [f"{s} jazz quiz" for s in extra], [f"{t} Jazz" for t in translate(extra)]
    )
    argv = ["--train", f"real={toy / 'train'}", "--train", f"bt={tmp_path / 'bt' / 'train'}"]
    argv += ["--train_repeat", "[2, 1]", "--train_tag", '["", "<BT>"]', "--vocab_size", "70"]
    assert run(toy, tmp_path / "out", *argv) == 0
    corpus = PreparedCorpus(tmp_path / "out")
    corpora = corpus.meta["splits"]["train"]["corpora"]
    assert list(corpora) == ["real", "bt"]
    assert corpora["real"]["rows"] == [0, 600] and corpora["bt"]["rows"] == [600, 650]  # real pairs twice
    train, tag = corpus.dataset("train"), corpus.tokenizer.sp.piece_to_id("<BT>")
    assert [tag in train[i][0] for i in range(len(train))] == [False] * 600 + [True] * 50
    # one SentencePiece model trained on both: letters only the back-translated corpus has are pieces of it
    assert corpus.tokenizer.sp.unk_id() not in corpus.tokenizer.sp.encode("jazz quiz")

    renamed = ["--train", f"europarl={toy / 'train'}", "--train", f"bt={tmp_path / 'bt' / 'train'}"]
    assert run(toy, tmp_path / "out", *renamed, *argv[4:]) == 0  # a new name is not an old corpus reused
    assert list(PreparedCorpus(tmp_path / "out").meta["splits"]["train"]["corpora"]) == ["europarl", "bt"]


def test_unnamed_corpora_keep_their_prefixes_as_names(toy: Path, tmp_path: Path) -> None:
    assert run(toy, tmp_path / "out") == 0
    corpora = PreparedCorpus(tmp_path / "out").meta["splits"]["train"]["corpora"]
    assert list(corpora) == [str(toy / "train")] and corpora[str(toy / "train")]["rows"] == [0, 300]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (
            ["a", "a"],
            "the training corpus name 'a' is given twice in --train: give each corpus a name of its own",
        ),
        (["a b", "c"], "bad corpus name 'a b' in --train"),
    ],
)
def test_a_corpus_name_given_twice_or_malformed_is_one_line(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], names: list[str], message: str
) -> None:
    extra = sentences(50, 9)
    write_pair(tmp_path / "bt" / "train", extra, translate(extra))
    argv = ["--src_lang", "en", "--tgt_lang", "de", "--output", str(tmp_path / "out")]
    for name, prefix in zip(names, [toy / "train", tmp_path / "bt" / "train"], strict=True):
        argv += ["--train", f"{name}={prefix}"]
    err = error_of(capsys, argv)
    assert message in err and not (tmp_path / "out").exists()

"""Step 1, cleaning the training split: what each filter drops and counts per corpus, the line records of what is
left, the errors when nothing is, language identification on one worker or several, and a pool that always ends.
"""

from __future__ import annotations

import gzip
import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from attnx.data import cleaning
from attnx.data.errors import DataError
from attnx.data.prepare import clean
from attnx.data.prepare.clean import clean_training_split, language_id_note
from attnx.data.prepare.read import CorpusStats
from attnx.data.prepare.settings import Settings
from tests.data.conftest import write_pair

Pairs = tuple[list[str], list[str]]

NO_LANGUAGE_ID = Settings("en", "de", drop_wrong_language=False)  # hand-written word lists are no language


def cleaned(
    tmp_path: Path, corpora: list[Pairs], settings: Settings = NO_LANGUAGE_ID, workers: int = 1
) -> tuple[list[CorpusStats], str | None, Pairs, list[tuple[int, int]]]:
    """Clean `corpora` (each written as `tmp_path/cK.en`, `.de`): (stats, note, text left, (corpus, line) of
    each pair left)."""
    prefixes = [write_pair(tmp_path / f"c{k}", src, tgt) for k, (src, tgt) in enumerate(corpora)]
    srcs, tgts = [Path(f"{p}.en") for p in prefixes], [Path(f"{p}.de") for p in prefixes]
    out = tmp_path / f"out{workers}"
    out.mkdir()
    stats, note = clean_training_split(
        srcs, tgts, out / "train.en", out / "train.de", out / clean.LINES, settings, workers
    )
    src, tgt = ((out / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de"))
    records = np.fromfile(out / clean.LINES, np.int64)
    return stats, note, (src, tgt), [(int(r >> 32), int(r & 0xFFFFFFFF)) for r in records]


def test_blank_copied_and_duplicate_pairs_are_dropped_and_counted_per_corpus(tmp_path: Path) -> None:
    first = (
        ["a man runs", "", "the dog", "a man runs", "red ball", "a cat"],
        ["ein Mann läuft", "leer", "der Hund", "ein Mann läuft", "red ball", " "],
    )
    second = (  # a pair of the first corpus again is a duplicate too; so is a repeat within one chunk
        ["the dog", "the house", "the house", "blue"],
        ["der Hund", "das Haus", "das Haus", ""],
    )
    stats, note, text, records = cleaned(tmp_path, [first, second])
    assert note == "off (--drop_wrong_language false)"
    assert [c.read for c in stats] == [6, 4]
    assert stats[0].dropped == {"blank": 2, "duplicate": 1, "copy": 1}
    assert stats[1].dropped == {"duplicate": 2, "blank": 1}
    assert [e["line"] for e in stats[0].examples["blank"]] == [2, 6]
    assert stats[0].examples["copy"] == [{"line": 5, "src": "red ball", "tgt": "red ball"}]
    assert [e["line"] for e in stats[1].examples["duplicate"]] == [1, 3]
    assert text == (["a man runs", "the dog", "the house"], ["ein Mann läuft", "der Hund", "das Haus"])
    assert records == [(0, 1), (0, 3), (1, 2)]  # corpus << 32 | line: what the encoding step counts by


def test_switched_off_filters_keep_copies_and_duplicates_but_never_blank_pairs(tmp_path: Path) -> None:
    pairs = (["a b", "a b", "c d", "e"], ["A B", "A B", "c d", ""])
    settings = Settings("en", "de", drop_wrong_language=False, drop_copies=False, drop_duplicates=False)
    stats, _, text, records = cleaned(tmp_path, [pairs], settings)
    assert stats[0].dropped == {"blank": 1}
    assert text == (["a b", "a b", "c d"], ["A B", "A B", "c d"]) and records == [(0, 1), (0, 2), (0, 3)]


def test_nothing_left_is_an_error_that_says_why(tmp_path: Path) -> None:
    with pytest.raises(
        DataError, match=r"^every training pair has a blank side \(.*c0\.en, .*c1\.en, .*c0\.de"
    ):
        cleaned(tmp_path / "blank", [(["", "x"], ["y", " "]), ([""], [""])])
    with pytest.raises(DataError, match=r"^no training pair is left after cleaning \(dropped: ") as raised:
        cleaned(tmp_path / "copies", [(["", "x", "y"], ["a", "x", "y"])])
    assert "'blank': 1" in str(raised.value) and "'copy': 2" in str(raised.value)


def real(shared_data: Path, n: int, start: int) -> Pairs:
    """Multi30k validation pairs `start` to `start + n`: clean English and German captions."""
    sides = []
    for lang in ("en", "de"):
        with gzip.open(shared_data / "multi30k" / f"val.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append([line.rstrip("\n") for line in itertools.islice(f, start, start + n)])
    return sides[0], sides[1]


@pytest.fixture
def some_french(shared_data: Path) -> list[Pairs]:
    """Three corpora of 20 real English-German pairs, each with one pair that has a French side."""
    corpora = [real(shared_data, 20, start) for start in (0, 20, 40)]
    french = [
        (
            "Un homme en chemise rouge joue de la guitare dans la rue.",
            "Ein Mann spielt auf der Straße Gitarre.",
        ),
        ("Two children play ball in the park.", "Deux enfants jouent au ballon dans le parc."),
        ("A woman reads a book on a bench.", "Une femme lit un livre sur un banc."),
    ]
    for (src, tgt), (s, t), at in zip(corpora, french, (5, 20, 0), strict=True):
        src.insert(at, s)
        tgt.insert(at, t)
    return corpora


def test_language_identification_drops_the_french_pairs_alike_on_one_worker_and_two(
    tmp_path: Path, some_french: list[Pairs]
) -> None:
    settings = Settings("en", "de")
    one = cleaned(tmp_path, some_french, settings, workers=1)
    two = cleaned(tmp_path, some_french, settings, workers=2)
    stats, note, text, records = one
    assert note is None
    assert [c.dropped for c in stats] == [{"language": 1}] * 3
    found = [(e["line"], e["found"]) for c in stats for e in c.examples["language"]]
    assert found == [(6, "fr-de"), (21, "en-fr"), (1, "en-fr")]
    assert records == [(k, line) for k, at in enumerate((6, 21, 1)) for line in range(1, 22) if line != at]
    assert len(text[0]) == len(text[1]) == 60
    assert [c.as_dict() for c in two[0]] == [c.as_dict() for c in stats] and two[1:] == one[1:]


def test_language_id_note_says_why_it_is_off(tmp_path: Path, some_french: list[Pairs]) -> None:
    switched_off, note = (
        "off (--drop_wrong_language false)",
        "off: the language identifier does not know 'xx'",
    )
    assert language_id_note(Settings("en", "de")) is None
    assert language_id_note(Settings("en", "de", drop_wrong_language=False)) == switched_off
    assert language_id_note(Settings("en", "xx")) == note
    assert language_id_note(Settings("yy", "xx")) == "off: the language identifier does not know 'yy', 'xx'"
    assert language_id_note(Settings("en", "xx", drop_wrong_language=False)) == switched_off
    stats, said, text, _ = cleaned(tmp_path, some_french, Settings("en", "xx"), workers=2)
    assert said == note and not any(c.dropped for c in stats) and len(text[0]) == 63  # the French pairs stay


def late_start_worker(token: Path) -> Callable[[], None]:
    """`start_worker` made slow in every worker but the first: it waits for the SIGTERM of the pool's
    `terminate()` (pending while blocked; at most 5 s) before resetting its signal handlers. The first worker
    takes the only chunk, so the pool is terminated while the others wait: the window in which a worker still
    has the handlers it inherited, which is a few milliseconds and rarely hit in a real run, held open."""

    def start() -> None:
        try:
            os.close(os.open(token, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            deadline = time.monotonic() + 5
            while signal.SIGTERM not in signal.sigpending() and time.monotonic() < deadline:
                time.sleep(0.01)
        cleaning.start_worker()

    return start


@pytest.mark.parametrize(
    ("pairs", "error"),
    [
        ((["", "a"], ["b", ""]), "every training pair has a blank side"),
        ((["a", "a", ""], ["a", "a", "b"]), "no training pair is left after cleaning"),
    ],
    ids=["all-blank", "all-dropped"],
)
def test_the_language_id_pool_ends_when_there_is_nothing_to_identify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pairs: Pairs, error: str
) -> None:
    """A worker that got the pool's SIGTERM before it reset its handlers used to run the handler it inherited
    from the parent; one that returns (here, one that ignores SIGTERM) swallowed it, and the parent waited for
    that worker forever. Workers are forked with the stop signals blocked, so the cleaning ends."""
    monkeypatch.setattr(clean, "start_worker", late_start_worker(tmp_path / "first"))
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            cleaned(tmp_path, [pairs], Settings("en", "de"), workers=2)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            outcome.append(e)

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout=300)
        hung = worker.is_alive()
        if hung:  # end the worker that swallowed its SIGTERM, so that the thread and the pool end too
            for process in multiprocessing.active_children():
                process.kill()
            worker.join(timeout=300)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not hung, "the language-ID pool was terminated but a worker never ended: cleaning hung"
    assert len(outcome) == 1 and isinstance(outcome[0], DataError) and error in str(outcome[0])

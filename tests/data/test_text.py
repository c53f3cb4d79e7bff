from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from attnx.data.errors import DataError
from attnx.data.text import normalize, read_chunks, read_lines, read_pairs, resolve

from .conftest import write


def test_normalize_collapses_every_kind_of_whitespace() -> None:
    assert normalize("  a\t\tb  c\r") == "a b c"
    assert normalize("a\u2028b\u00a0c\x0bd") == "a b c d"  # line separators must not survive into text files
    assert normalize(" \t\r") == ""


def test_crlf_bom_and_gzip_read_the_same(tmp_path: Path) -> None:
    plain = write(tmp_path / "plain.en", b"\xef\xbb\xbfone  two\r\nthree\r\n")
    gz = write(tmp_path / "gz.en", ["one two", "three"], gz=True)
    assert list(read_chunks(plain)) == list(read_chunks(gz)) == [["one two", "three"]]


def test_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    path = write(tmp_path / "x.en", b"a\nb")
    assert list(read_chunks(path)) == [["a", "b"]]


def test_chunks_cover_every_line(tmp_path: Path) -> None:
    path = write(tmp_path / "x.en", [str(i) for i in range(25)])
    chunks = list(read_chunks(path, chunk_lines=10))
    assert [len(c) for c in chunks] == [10, 10, 5]
    assert sum(chunks, []) == [str(i) for i in range(25)]


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "x.en", b"good\nstill good\n" + b"caf\xe9\n" + b"x\n")
    with pytest.raises(DataError, match=r"x\.en:3: invalid UTF-8"):
        list(read_chunks(path, chunk_lines=2))


def test_resolve_prefers_plain_then_gz(tmp_path: Path) -> None:
    write(tmp_path / "a.en", ["x"], gz=True)
    assert resolve(tmp_path / "a", "en") == tmp_path / "a.en.gz"
    with pytest.raises(DataError, match="neither .*b.de nor .*b.de.gz"):
        resolve(tmp_path / "b", "de")


def test_line_count_mismatch_names_both_files_and_counts(tmp_path: Path) -> None:
    src = write(tmp_path / "x.en", ["a"] * 25)
    tgt = write(tmp_path / "x.de", ["b"] * 23)
    with pytest.raises(DataError, match=r"x\.en has 25 lines but .*x\.de has 23"):
        list(read_pairs(src, tgt, Counter(), chunk_lines=10))


def test_empty_files_are_an_error(tmp_path: Path) -> None:
    src, tgt = write(tmp_path / "x.en", b""), write(tmp_path / "x.de", b"")
    with pytest.raises(DataError, match="empty"):
        list(read_pairs(src, tgt, Counter()))


def test_blank_training_pairs_are_dropped_and_counted(tmp_path: Path) -> None:
    src = write(tmp_path / "x.en", ["a", "  ", "c", "d"])
    tgt = write(tmp_path / "x.de", ["A", "B", "C", "\t"])
    dropped: Counter[str] = Counter()
    pairs = list(read_pairs(src, tgt, dropped))
    assert pairs == [(["a", "c"], ["A", "C"])]
    assert dropped["blank"] == 2


def test_blank_evaluation_line_is_an_error_with_its_line(tmp_path: Path) -> None:
    src = write(tmp_path / "x.en", ["a", "b", "c"])
    tgt = write(tmp_path / "x.de", ["A", "B", " "])
    with pytest.raises(DataError, match=r"x\.de:3: blank line"):
        list(read_pairs(src, tgt))


def test_corrupt_gzip_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "x.en.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"x\.en\.gz"):
        list(read_chunks(path))


def test_read_lines_ends_a_line_at_newline_only(tmp_path: Path) -> None:
    """Every Unicode line separator but `\\n` stays inside its line (`str.splitlines` splits on each of them),
    a `\\r` before the `\\n` is dropped, and a last line without one counts."""
    path = tmp_path / "lines.txt"
    inside = "a\u2028b\u2029c\u0085d\x0be\x0cf\x1cg\x1dh\x1ei\rj"
    path.write_bytes(f"{inside}\r\n\nlast".encode())
    assert read_lines(path) == [inside, "", "last"]
    path.write_bytes(b"one\n")
    assert read_lines(path) == ["one"]
    path.write_bytes(b"")
    assert read_lines(path) == []

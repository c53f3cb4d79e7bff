"""Text input read line by line: files in full chunks, pipes as lines arrive, bytes that are not UTF-8 counted."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import threading

import pytest

from attnx.commands.text_input import TextInput
from attnx.data.errors import DataError


def test_a_file_fills_each_chunk_and_keeps_every_kind_of_line_end(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"one\r\ntwo\n\nthree\nno newline")
    with TextInput(path) as text:
        assert text.regular and text.count_lines() == 5
        assert text.read(2) == ["one", "two"]
        assert text.count_lines() == 3  # from where reading stands
        assert text.read(10) == ["", "three", "no newline"]
        assert text.read(10) == []
        assert text.lines == 5 and text.consumed == path.stat().st_size
        assert text.digest() == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_pipe_hands_out_what_has_arrived_without_waiting_for_more():
    read_end, write_end = os.pipe()
    os.write(write_end, b"A\nB\npartial")
    with TextInput(f"/dev/fd/{read_end}") as text:
        assert not text.regular and text.count_lines() is None
        assert text.read(100) == ["A", "B"]  # returns although 98 more lines could follow
        later = threading.Timer(0.2, lambda: (os.write(write_end, b" line\nC\n"), os.close(write_end)))
        later.start()
        assert text.read(100) == ["partial line", "C"]  # waits for the first whole line
        later.join()
        assert text.read(100) == []
    os.close(read_end)


def test_lines_that_are_not_utf8_are_counted_with_the_first(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"ok\nbad \xff\nok\n\xc3(\n")
    with TextInput(path, "--target") as text:
        assert text.read(10) == ["ok", "bad \ufffd", "ok", "\ufffd("]
        assert (text.not_utf8, text.first_not_utf8) == (2, 2)
        assert text.warning() == (
            f"2 line(s) of --target {path} are not valid UTF-8 (the first: line 2); their invalid bytes were "
            "read as U+FFFD"
        )


def test_skip_passes_over_a_matching_start_only(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"a\nb\nc\nd")
    start = hashlib.sha256(b"a\nb\n").hexdigest()
    with TextInput(path) as text:
        assert not text.skip(4, hashlib.sha256(b"x\ny\n").hexdigest())
        assert text.consumed == 0 and text.read(1) == ["a"]
        text.rewind()
        assert text.skip(4, start) and text.lines == 2
        assert text.read(10) == ["c", "d"] and text.digest() == hashlib.sha256(b"a\nb\nc\nd").hexdigest()
    with TextInput(path) as text:  # a finished part that ends with the last line, which has no newline
        assert (
            text.skip(7, hashlib.sha256(b"a\nb\nc\nd").hexdigest()) and text.lines == 4 and text.read(5) == []
        )


def test_a_missing_path_or_a_directory_is_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--input .*nope.txt does not exist"):
        TextInput(tmp_path / "nope.txt")
    with pytest.raises(IsADirectoryError, match="is a directory; give a text file"):
        TextInput(tmp_path)


def test_a_gzip_file_reads_as_the_text_it_holds_and_resumes_by_its_text(tmp_path):
    text_bytes = b"one\ntwo \xff\nthree\nno newline"
    path = tmp_path / "in.de.gz"
    path.write_bytes(gzip.compress(text_bytes))
    with TextInput(path) as text:
        assert text.count_lines() == 4
        assert text.read(1) == ["one"] and text.count_lines() == 3  # from where reading stands
        assert text.read(10) == ["two \ufffd", "three", "no newline"] and text.not_utf8 == 1
        assert (
            text.digest() == hashlib.sha256(text_bytes).hexdigest()
        )  # of the text, not the compressed bytes
        text.rewind()
        assert text.read(10)[0] == "one"
    with TextInput(path) as text:  # an interrupted run's finished lines are recognised by their text
        assert text.skip(4, hashlib.sha256(b"one\n").hexdigest()) and text.lines == 1
        assert text.read(10) == ["two \ufffd", "three", "no newline"]


def test_a_truncated_gzip_file_is_one_line_naming_it(tmp_path):
    lines = b"".join(hashlib.sha256(str(i).encode()).hexdigest().encode() + b"\n" for i in range(20_000))
    packed = gzip.compress(lines)
    path = tmp_path / "cut.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with TextInput(path, "--references") as text, pytest.raises(DataError) as err:
        text.read_all()
    assert re.fullmatch(
        r"--references .*cut\.gz cannot be read past line \d+: it is a truncated or corrupt gzip file \(.*\)",
        str(err.value),
    )

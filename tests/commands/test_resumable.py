"""The partial output of attnx translate and its record: continued when it is attnx's and matches, never touched
otherwise."""

from __future__ import annotations

import errno
import json
import signal
import sys
import threading
from pathlib import Path

import pytest

from attnx.commands.resumable import ResumableOutput, StreamOutput, changed_options, signals_held
from attnx.commands.text_input import TextInput
from attnx.files import WriteError

OPTIONS = {"search": {"beam": 4}, "format": "text"}


def write_run(tmp_path, lines: int, options=OPTIONS) -> tuple[ResumableOutput, TextInput]:
    """A run that wrote `lines` lines of in.txt, then stopped (its partial file and record left)."""
    src = tmp_path / "in.txt"
    src.write_text("a\nb\nc\nd\n", encoding="utf-8")
    out = ResumableOutput(tmp_path / "out.txt", options)
    out.prepare()
    text = TextInput(src)
    out.start({"input": text})
    for line in text.read(lines):
        out.write(f"<{line}>\n".encode(), {"input": text})
    out.file.close()
    text.close()
    return out, text


class Killed(BaseException):
    pass


def kill_after_the_write(out: ResumableOutput, text: TextInput, data: bytes) -> None:
    """A chunk written and flushed, the run killed before its record counts it."""

    def killed(inputs) -> None:
        raise Killed

    out._save = killed
    with pytest.raises(Killed):
        out.write(data, {"input": text})
    out.file.close()


def test_a_run_continues_after_the_lines_its_record_counts(tmp_path):
    out, _ = write_run(tmp_path, 2)
    partial = tmp_path / "out.txt.attnx-partial"
    with TextInput(tmp_path / "in.txt") as text:
        text.read(3)
        out.file = open(partial, "r+b", buffering=0)  # noqa: SIM115
        out.file.seek(out.size)
        kill_after_the_write(out, text, b"<c>\n")  # written after the last record: the chunk it names
    assert partial.read_bytes() == b"<a>\n<b>\n<c>\n"
    again = ResumableOutput(tmp_path / "out.txt", OPTIONS)
    again.prepare()
    with TextInput(tmp_path / "in.txt") as text:
        assert again.start({"input": text}) == (
            f"continuing after the 2 line(s) already in {partial} (same input and options)"
        )
        assert text.read(10) == ["c", "d"] and again.resumed == again.lines == 2
        again.write(b"<c>\n<d>\n", {"input": text})
    again.finish()
    assert (tmp_path / "out.txt").read_bytes() == b"<a>\n<b>\n<c>\n<d>\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]


@pytest.mark.parametrize("killed_mid_chunk", [False, True])
def test_text_added_past_what_the_record_counts_is_refused_and_kept(tmp_path, killed_mid_chunk):
    """Bytes after the recorded length are a change like an edit inside it, unless they are exactly the chunk
    the record names as being written (a kill between a chunk's write and its record)."""
    out, _ = write_run(tmp_path, 2)
    partial = tmp_path / "out.txt.attnx-partial"
    if killed_mid_chunk:
        with TextInput(tmp_path / "in.txt") as text:
            text.read(3)
            out.file = open(partial, "r+b", buffering=0)  # noqa: SIM115
            out.file.seek(out.size)
            kill_after_the_write(out, text, b"<c>\n")
    before = partial.read_bytes()
    partial.write_bytes(before + b"my own note\n")
    with pytest.raises(FileExistsError) as raised:
        ResumableOutput(tmp_path / "out.txt", OPTIONS).prepare()
    assert str(raised.value) == (
        f"{partial} was changed since attnx wrote it, so it cannot be continued and is left as it is: remove it "
        f"and {tmp_path / 'out.txt.attnx-partial.json'}, or choose another --output"
    )
    assert partial.read_bytes() == before + b"my own note\n"


class FillsUp:
    """A file on a disk that fills up after `room` more bytes."""

    def __init__(self, file, room: int) -> None:
        self.file, self.room = file, room

    def write(self, data) -> int:
        if not self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        written = self.file.write(data[: self.room])
        self.room -= written
        return written

    def __getattr__(self, name):
        return getattr(self.file, name)


def test_a_failed_write_takes_its_bytes_back_and_names_the_file_and_the_space(tmp_path):
    out, _ = write_run(tmp_path, 2)
    partial = tmp_path / "out.txt.attnx-partial"
    out.file = FillsUp(open(partial, "r+b", buffering=0), room=2)  # noqa: SIM115
    out.file.seek(out.size)
    with TextInput(tmp_path / "in.txt") as text, pytest.raises(WriteError) as raised:
        text.read(3)
        out.write(b"<c>\n", {"input": text})
    out.file.close()
    message = str(raised.value)
    assert message.startswith(f"cannot write partial output {partial}: the disk is full (")
    assert "MiB free in" in message and "the partial output needs about 0.0 MiB" in message
    assert message.endswith(
        "the 2 line(s) done so far are kept there. Free disk space (or write elsewhere) and run the same command "
        "again to continue"
    )
    assert partial.read_bytes() == b"<a>\n<b>\n"  # what the record counts: the 2 bytes written taken back
    again = ResumableOutput(tmp_path / "out.txt", OPTIONS)
    again.prepare()
    with TextInput(tmp_path / "in.txt") as text:
        assert again.start({"input": text}).startswith("continuing after the 2 line(s)")


def test_other_options_or_another_input_start_over_and_say_why(tmp_path):
    write_run(tmp_path, 2)
    other = ResumableOutput(tmp_path / "out.txt", {"search": {"beam": 5}, "format": "text"})
    other.prepare()
    with TextInput(tmp_path / "in.txt") as text:
        message = other.start({"input": text})
    assert message.startswith("starting over:") and "search.beam 4 -> 5" in message
    assert (tmp_path / "out.txt.attnx-partial").read_bytes() == b""
    write_run(tmp_path, 2)
    (tmp_path / "in.txt").write_text("x\nb\nc\n", encoding="utf-8")
    changed = ResumableOutput(tmp_path / "out.txt", OPTIONS)
    changed.prepare()
    with TextInput(tmp_path / "in.txt") as text:
        assert "whose input differs" in changed.start({"input": text})
        assert text.read(1) == ["x"]


def test_a_partial_file_without_a_record_or_changed_since_is_never_touched(tmp_path):
    partial, record = tmp_path / "out.txt.attnx-partial", tmp_path / "out.txt.attnx-partial.json"
    partial.write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="has no record of writing it"):
        ResumableOutput(tmp_path / "out.txt", OPTIONS).prepare()
    partial.unlink()
    write_run(tmp_path, 2)
    partial.write_bytes(b"<A>\n<b>\n")
    with pytest.raises(FileExistsError, match="was changed since attnx wrote it"):
        ResumableOutput(tmp_path / "out.txt", OPTIONS).prepare()
    assert partial.read_bytes() == b"<A>\n<b>\n"
    record.write_text(json.dumps({"someone": "else"}), encoding="utf-8")
    with pytest.raises(FileExistsError, match="is not a record attnx translate wrote"):
        ResumableOutput(tmp_path / "out.txt", OPTIONS).prepare()


def test_changed_options_names_each_difference():
    assert (
        changed_options({"a": {"b": 1}, "c": "x"}, {"a": {"b": 2}, "c": "x", "d": True})
        == "a.b 1 -> 2, d null -> true"
    )


class Stopped(Exception):
    pass


def test_a_sigterm_that_reaches_another_thread_still_waits_for_the_block(monkeypatch):
    """The kernel hands a signal sent to the process to any thread that does not block it (torch's threads
    block nothing); Python then runs the handler in the main thread. A record written with 50 lines while the
    run said 40 was this: the handler ran between the record and the count."""

    def on_term(signum, frame):
        raise Stopped

    previous = signal.signal(signal.SIGTERM, on_term)
    go = threading.Event()
    other = threading.Thread(
        target=lambda: go.wait() and signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    )
    other.start()
    steps = []
    try:
        with pytest.raises(Stopped), signals_held():
            go.set()
            other.join()
            for step in range(10_000):  # many bytecodes: time for a handler to run if it is going to
                steps.append(step)
        assert len(steps) == 10_000
        assert signal.getsignal(signal.SIGTERM) is on_term
    finally:
        other.join()
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (every write fails with ENOSPC)")
def test_a_full_disk_under_standard_output_is_one_line_naming_it_and_the_space(tmp_path, monkeypatch):
    """`attnx translate ... > FILE` on a full disk: the file standard output goes to, and its disk's space."""
    src = tmp_path / "in.txt"
    src.write_text("a\nb\nc\n", encoding="utf-8")
    for done, kept in ((0, "no line of it is there in full"), (2, "the first 2 line(s) are there in full")):
        full = open("/dev/full", "w")  # noqa: SIM115 (closed below)
        monkeypatch.setattr(sys, "stdout", full)
        out = StreamOutput()
        out.lines = done  # handed to standard output before
        with TextInput(src) as text, pytest.raises(WriteError) as raised:
            text.read(3)
            out.write(b"A\nB\nC\n", {"input": text})
        full.close()  # what was left unwritten was dropped: closing does not fail again
        message = str(raised.value)
        assert message.startswith("cannot write standard output /dev/full: the disk is full (")
        assert "MiB free in /dev)" in message and "\n" not in message
        assert message.endswith(f"; {kept}. Free disk space (or write elsewhere) and run the command again")


def test_a_temporary_of_the_record_left_by_a_killed_run_is_removed_when_the_run_goes_on(tmp_path):
    """SIGKILL while the record was being replaced leaves its temporary file; the next run removes it (and only
    it: another file's temporary stays)."""
    out, _ = write_run(tmp_path, 3)
    record_left = tmp_path / ".out.txt.attnx-partial.json.abcd1234.attnx.tmp"
    other = tmp_path / ".notes.txt.abcd1234.attnx.tmp"
    for path in (record_left, other):
        path.write_text("{}")
    ResumableOutput(tmp_path / "out.txt", OPTIONS).prepare()
    assert not record_left.exists() and other.exists()

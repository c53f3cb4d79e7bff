"""The partial output of attnx translate and its record: continued when it is attnx's and matches, never touched
otherwise."""

from __future__ import annotations

import json
import signal
import threading

import pytest

from attnx.commands.resumable import ResumableOutput, changed_options, signals_held
from attnx.commands.text_input import TextInput

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


def test_a_run_continues_after_the_lines_its_record_counts(tmp_path):
    write_run(tmp_path, 2)
    partial = tmp_path / "out.txt.attnx-partial"
    partial.write_bytes(partial.read_bytes() + b"<c")  # written after the last record: dropped
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

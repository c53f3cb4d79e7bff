"""Where `attnx translate` writes its output, chunk by chunk: standard output as each chunk is done
([`StreamOutput`][attnx.commands.resumable.StreamOutput]), or a file that an interrupted run continues
([`ResumableOutput`][attnx.commands.resumable.ResumableOutput]).

A file output `OUT` grows as `OUT.attnx-partial`, beside a small record, `OUT.attnx-partial.json`, of what it
holds: how many input lines are done, the SHA-256 of the partial file's bytes and of the input bytes those
lines came from, and the options that decide the output. Before a chunk is written the record names it (its
size and SHA-256, `pending`); once it is flushed to disk the record counts it. So every byte of the partial
file is accounted for: what a kill left between a chunk's write and its record is known to be that chunk, and
anything else (text appended by hand, an edit) is a change attnx refuses. Once every line is done the partial
file is renamed to `OUT` and the record removed, so `OUT` appears only complete (and an input named as its
own output is replaced only after it was read whole).

Run again after an interruption (SIGKILL, SIGTERM, Ctrl+C, a full disk), the same command continues after
the finished lines when the record, the partial file, the options and the start of the input all match; it
starts over, saying why in one line, when the options or the input differ. The options include what the model
decoded in (its precision, or an export's CTranslate2 compute type): `--precision auto` continues in the one
recorded ([`interrupted_run`][attnx.commands.resumable.interrupted_run]), another precision given starts over. A partial file attnx has no
record of, or one changed since attnx wrote it, is never touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from attnx.commands.text_input import TextInput
from attnx.files import WriteError, atomic_write, move_into_place, remove_stale_temporaries, write_failure

PARTIAL = ".attnx-partial"
"""Suffix of the file a run writes before it is complete."""
RECORD = ".attnx-partial.json"
"""Suffix of the record of what the partial file holds."""
WRITTEN_BY = "attnx translate"
PRECISION = "precision"
"""The option of what a run decoded in: a checkpoint's precision, or an export's CTranslate2 compute type."""
UNRECORDED_PRECISION = "32-true"
"""What a record without a [`PRECISION`][attnx.commands.resumable.PRECISION] decoded in: 32-true, as every run did
before the option existed (so their records continue)."""


def decoded_in(options: Mapping[str, Any]) -> str:
    """The precision (or compute type) the run of `options` decodes in."""
    return str(options.get(PRECISION, UNRECORDED_PRECISION))


def with_precision(options: Mapping[str, Any], label: str) -> dict[str, Any]:
    """`options` with what the run decodes in, `label` (recorded unless it is the unrecorded 32-true)."""
    rest = {k: v for k, v in options.items() if k != PRECISION}
    return rest if label == UNRECORDED_PRECISION else {**rest, PRECISION: label}


def interrupted_run(output: str | Path) -> dict[str, Any] | None:
    """The record of the interrupted run an `output` file would continue: one that attnx wrote, with lines
    done in a partial file that is there; None otherwise (a record attnx did not write is refused when the run
    prepares its output, [`ResumableOutput.prepare`][attnx.commands.resumable.ResumableOutput.prepare])."""
    sink = ResumableOutput(output, {})
    try:
        record = sink.read_record()
    except FileExistsError:
        return None
    if not record or not sink.partial.exists() or not isinstance(record.get("options"), dict):
        return None
    try:
        return record if int(record.get("lines") or 0) > 0 else None
    except (TypeError, ValueError):
        return None


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends, so that a chunk and its record are written together.

    The wait is kept by the handlers, not by a signal mask: a mask holds a signal back from one thread only, and
    the kernel hands a signal sent to the process to any thread that does not block it (torch's own threads
    block nothing), after which Python runs the handler in the main thread wherever it is. A signal that came
    during the block is raised again as it ends, so its own handler runs then.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread runs signal handlers, and only it can set them
        return
    pending: list[int] = []

    def hold(signum: int, frame: object) -> None:
        pending.append(signum)

    previous = {signum: signal.signal(signum, hold) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:
            signal.raise_signal(pending[0])


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"search": {"beam": 4}}` as `{"search.beam": 4}`."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def changed_options(before: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """`search.beam 4 -> 2, format text -> jsonl`: the options that differ."""
    a, b = flatten(before), flatten(now)
    keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
    return ", ".join(f"{k} {json.dumps(a.get(k))} -> {json.dumps(b.get(k))}" for k in keys[:5]) + (
        ", ..." if len(keys) > 5 else ""
    )


def _digest(f: BinaryIO, size: int) -> hashlib._Hash | None:
    """SHA-256 of the next `size` bytes of `f`; None when the file ends before."""
    digest, left = hashlib.sha256(), size
    while left > 0:
        block = f.read(min(1 << 20, left))
        if not block:
            return None
        digest.update(block)
        left -= len(block)
    return digest


class StreamOutput:
    """Standard output, written and flushed chunk by chunk (no resume: a pipe cannot be continued)."""

    where = "standard output"
    resumed = 0
    lines = 0
    """Input lines whose output is handed to standard output."""

    def prepare(self) -> None:
        pass

    def start(self, inputs: Mapping[str, TextInput]) -> str | None:
        return None

    def write(self, data: bytes, inputs: Mapping[str, TextInput]) -> None:
        # Counted before the write: a signal landing between the flush and a count after it would lose the
        # chunk the reader already has; one landing in a write blocked by a stalled reader counts it early.
        done, self.lines = self.lines, next(iter(inputs.values())).lines
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            raise  # the reader went away: `attnx.cli` ends quietly
        except OSError as err:
            raise WriteError(self.failure(err, done)) from err

    @staticmethod
    def failure(err: OSError, done: int) -> str:
        """The line of a failed write to standard output (a full disk under `> file`), naming the file it goes
        to where the system says; what is left unwritten is dropped, so that exiting does not try again."""
        try:
            fd = sys.stdout.fileno()
            target: Path | None = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except (OSError, ValueError):
            fd, target = -1, None
        if fd >= 0:  # the buffer still holds the chunk: flushed at exit, it would fail again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        if target is None or not target.is_absolute() or not target.parent.is_dir():
            target = None  # a pipe, a socket: no file to name
        return write_failure(
            target or "",
            err,
            what="standard output",
            kept=f"the first {done} line(s) are there in full" if done else "no line of it is there in full",
            free_in=None if target is None else target.parent,
        )

    def finish(self) -> None:
        pass

    def abandon(self) -> None:
        pass

    def stopped(self, lines: int) -> str:
        return f"{lines} line(s) done were handed to standard output"


class ResumableOutput:
    """The file `output`, written through `output.attnx-partial` and continued after an interruption.

    Args:
        output: The file the command was asked to write.
        options: Everything that decides the output besides the input (model identity, search, format),
            JSON-serializable; a run continues another only if they are equal.
    """

    def __init__(self, output: str | Path, options: Mapping[str, Any]) -> None:
        self.output = Path(output)
        self.partial = self.output.with_name(self.output.name + PARTIAL)
        self.record = self.output.with_name(self.output.name + RECORD)
        self.where = str(self.partial)
        self.options = json.loads(json.dumps(options))  # as it reads back from the record
        self.previous: dict[str, Any] | None = None
        self.saved: dict[str, Any] = {}
        """The record as last written: what the partial file holds, whatever chunk is being written."""
        self.file: BinaryIO | None = None
        self.hash = hashlib.sha256()
        self.size = 0
        self.resumed = 0
        """Input lines an earlier run had finished, continued after."""
        self.lines = 0
        """Input lines whose output is written (and recorded)."""

    # ------------------------------------------------------------------------------------------ before

    def read_record(self) -> dict[str, Any] | None:
        if not self.record.exists():
            return None
        try:
            record = json.loads(self.record.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if not isinstance(record, dict) or record.get("written_by") != WRITTEN_BY:
            raise FileExistsError(
                f"{self.record} exists but is not a record attnx translate wrote; it is left as it is: remove "
                "it or choose another --output"
            )
        return record

    def prepare(self) -> None:
        """Refuse, before any work, a partial file attnx did not write or that changed since it wrote it: a byte
        edited, removed, or added past what the record counts (unless it is the chunk the record names as
        being written when the run was stopped). A temporary of the record that a killed run left is removed."""
        remove_stale_temporaries(self.record.parent, of=self.record.name)
        record = self.read_record()
        if record is None:
            if self.partial.exists() or self.partial.is_symlink():
                raise FileExistsError(
                    f"{self.partial} exists and attnx has no record of writing it; it is left as it is: remove "
                    "it or choose another --output"
                )
            return
        if not self.partial.exists():
            return  # the record of a run that had written nothing, or whose partial file was removed
        size = int(record["bytes"])
        with open(self.partial, "rb") as f:
            digest = _digest(f, size)
            tail = os.fstat(f.fileno()).st_size - size
            pending = record.get("pending") or {}
            ours = tail == 0 or (
                tail == pending.get("bytes")
                and (written := _digest(f, tail)) is not None
                and written.hexdigest() == pending.get("sha256")
            )
        if digest is None or digest.hexdigest() != record["sha256"] or not ours:
            raise FileExistsError(
                f"{self.partial} was changed since attnx wrote it, so it cannot be continued and is left as it "
                f"is: remove it and {self.record}, or choose another --output"
            )
        self.previous = record
        self.hash = digest

    def start(self, inputs: Mapping[str, TextInput]) -> str | None:
        """Continue the earlier run when it is this one's, else start afresh; a line saying which, if any."""
        previous, message = self.previous, None
        lines = int(previous["lines"]) if previous else 0
        if previous and lines:
            held = f"{self.partial} holds {lines} line(s) of an interrupted run"
            if previous["options"] != self.options:
                was, now = decoded_in(previous["options"]), decoded_in(self.options)
                both = ({PRECISION: was, **previous["options"]}, {PRECISION: now, **self.options})
                message = f"starting over: {held} with other options ({changed_options(*both)})"
                if was != now:  # one output is decoded in one precision
                    message += f"; --precision auto continues a run in the precision it started in ({was})"
            elif set(previous["inputs"]) != set(inputs):
                message = f"starting over: {held} with other inputs ({', '.join(previous['inputs'])})"
            elif not all(text.regular for text in inputs.values()):
                message = f"starting over: {held}, and a stream cannot be checked against the input it read"
            elif self._skip(previous, inputs):
                self.resumed = lines
                message = (
                    f"continuing after the {lines} line(s) already in {self.partial} (same input and options)"
                )
            else:
                message = f"starting over: {held}, whose input differs from this one"
        self.lines = self.resumed
        if self.resumed:
            self.size = int(previous["bytes"])  # type: ignore[index]
            self.saved = {k: v for k, v in previous.items() if k != "pending"}  # type: ignore[union-attr]
            # unbuffered: a failed write leaves no bytes in a buffer, to be written at close
            self.file = open(self.partial, "r+b", buffering=0)  # noqa: SIM115 (closed by finish/abandon)
            self.file.truncate(self.size)  # the chunk a killed run wrote after its last record
            self.file.seek(self.size)
        else:
            self.hash, self.size = hashlib.sha256(), 0
            self._save(inputs)  # the record first: a partial file always has one
            self.file = open(self.partial, "wb", buffering=0)  # noqa: SIM115
        return message

    @staticmethod
    def _skip(previous: Mapping[str, Any], inputs: Mapping[str, TextInput]) -> bool:
        skipped: list[TextInput] = []
        for name, text in inputs.items():
            done = previous["inputs"][name]
            if not text.skip(int(done["bytes"]), done["sha256"]):
                for other in skipped:
                    other.rewind()
                return False
            skipped.append(text)
        return True

    # -------------------------------------------------------------------------------------------- during

    def _save(self, inputs: Mapping[str, TextInput]) -> None:
        """Record what the partial file holds now, and the input it came from."""
        from attnx import __version__

        first = next(iter(inputs.values()))
        self._store(
            {
                "written_by": WRITTEN_BY,
                "attnx": __version__,
                "output": str(self.output),
                "options": self.options,
                "lines": first.lines,
                "bytes": self.size,
                "sha256": self.hash.hexdigest(),
                "inputs": {
                    name: {"bytes": text.consumed, "sha256": text.digest()} for name, text in inputs.items()
                },
            }
        )

    def _store(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, indent=1) + "\n").encode("utf-8")
        with atomic_write(self.record, needed=len(data), what="record of the partial output") as f:
            f.write(data)
        self.saved = record

    def write(self, data: bytes, inputs: Mapping[str, TextInput]) -> None:
        """Name the chunk in the record, append it, flush it to disk, then count it in the record (signals wait
        meanwhile). A failed write (a full disk) takes back what it wrote of the chunk."""
        assert self.file is not None
        with signals_held():
            pending = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            self._store({**self.saved, "pending": pending})
            try:
                view = memoryview(data)
                while view:
                    view = view[self.file.write(view) or 0 :]
                os.fsync(self.file.fileno())
            except OSError as err:
                with contextlib.suppress(OSError):
                    self.file.truncate(self.size)
                    self.file.seek(self.size)
                raise WriteError(
                    write_failure(
                        self.partial,
                        err,
                        needed=len(data),
                        what="partial output",
                        kept=f"the {self.lines} line(s) done so far are kept there",
                        then="run the same command again to continue",
                    )
                ) from err
            self.size += len(data)
            self.hash.update(data)
            self._save(inputs)
            self.lines = next(iter(inputs.values())).lines

    # ----------------------------------------------------------------------------------------------- after

    def finish(self) -> None:
        """Rename the complete output into place and remove the record."""
        assert self.file is not None
        with signals_held():
            self.file.close()
            move_into_place(self.partial, self.output)
            self.record.unlink(missing_ok=True)

    def abandon(self) -> None:
        """Remove what this run wrote (a usage error found midway: nothing is written)."""
        if self.file is not None:
            self.file.close()
        self.partial.unlink(missing_ok=True)
        self.record.unlink(missing_ok=True)

    def stopped(self, lines: int) -> str:
        return f"the {lines} line(s) done are kept in {self.partial}: run the same command again to continue"

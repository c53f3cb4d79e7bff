"""Text input for the commands: a file, a named pipe, process substitution (`<(...)`) or standard input, read
line by line as it arrives, in bounded memory.

A line ends at `\\n` (a final line without one counts; a `\\r` before the `\\n` is dropped). Bytes that are not
UTF-8 become U+FFFD, and the reader counts the lines where that happened, so the command can say so once. A
gzip-compressed file (what `attnx download` writes, `*.gz`) is read as the text it holds, as `attnx prepare`
reads it; it is recognised by its first bytes, whatever its name.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import select
import stat
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attnx.data.errors import DataError

BLOCK = 1 << 16
"""Bytes read from the input at a time."""

GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of every gzip file (RFC 1952)."""


class TextInput:
    """The lines of `source` (a path, or `-` for standard input), handed out in chunks of at most `limit`.

    A regular file fills each chunk. A pipe, a FIFO or a terminal hands out what has arrived as soon as one
    whole line is there, so `(echo A; sleep 60; echo B) | attnx translate` answers A at once. Memory holds
    one chunk and one read block, whatever the size of the input.

    `consumed` and `digest()` describe the bytes of the lines handed out so far (their SHA-256), so that an
    interrupted run can recognise the same input when it is run again (`skip`).

    Args:
        source: Path of a file, FIFO or `/dev/fd/N`, or `-` for standard input.
        option: The option that named it, for messages (`--input`, `--target`).
    """

    def __init__(self, source: str | Path, option: str = "--input") -> None:
        self.option = option
        if str(source) == "-":
            self.name = "standard input"
            self.fd = sys.stdin.fileno()
            self.owned = False
        else:
            path = Path(source)
            self.name = str(source)
            if not path.exists():
                raise FileNotFoundError(f"{option} {source} does not exist")
            if path.is_dir():
                raise IsADirectoryError(
                    f"{option} {source} is a directory; give a text file, one segment a line"
                )
            self.fd = os.open(path, os.O_RDONLY)
            self.owned = True
        self.regular = stat.S_ISREG(os.fstat(self.fd).st_mode)
        self.path = Path(source) if self.owned else None
        self.gzip: gzip.GzipFile | None = None
        """The decompressing reader of a gzip file (None for any other input)."""
        if self.regular and os.pread(self.fd, 2, 0) == GZIP_MAGIC:
            self.gzip = gzip.GzipFile(fileobj=os.fdopen(os.dup(self.fd), "rb"), mode="rb")
        self.buffer = b""
        self.pos = 0
        self.ended = False
        self.lines = 0
        """Lines handed out so far (including those `skip` passed over)."""
        self.consumed = 0
        """Bytes of those lines."""
        self.hash = hashlib.sha256()
        self.not_utf8 = 0
        """Lines whose bytes were not all UTF-8."""
        self.first_not_utf8: int | None = None
        """The 1-based number of the first of them."""

    def close(self) -> None:
        if self.gzip is not None:
            self.gzip.fileobj.close()  # type: ignore[union-attr] (its own descriptor, a copy of `fd`)
            self.gzip.close()
            self.gzip = None
        if self.owned:
            os.close(self.fd)
            self.owned = False

    def __enter__(self) -> TextInput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def digest(self) -> str:
        """SHA-256 of the bytes handed out so far."""
        return self.hash.hexdigest()

    # ----------------------------------------------------------------------------------------------- reading

    def _arrived(self) -> bool:
        """Whether more bytes can be read without waiting (always, for a regular file)."""
        if self.regular:
            return True
        ready, _, _ = select.select([self.fd], [], [], 0)
        return bool(ready)

    def _fill(self) -> None:
        block = self._unpack(self.gzip.read1, BLOCK) if self.gzip else os.read(self.fd, BLOCK)
        if not block:
            self.ended = True
        self.buffer = self.buffer[self.pos :] + block
        self.pos = 0

    def _take(self, end: int) -> str:
        raw = self.buffer[self.pos : end]
        self.pos = end
        self.lines += 1
        self.consumed += len(raw)
        self.hash.update(raw)
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.not_utf8 += 1
            if self.first_not_utf8 is None:
                self.first_not_utf8 = self.lines
            return raw.decode("utf-8", errors="replace")

    def read(self, limit: int, wait_for_all: bool = False) -> list[str]:
        """Up to `limit` lines; `[]` only at the end of the input. On a pipe, whatever whole lines have
        arrived once there is one (all `limit` with `wait_for_all`, or up to the end)."""
        lines: list[str] = []
        while len(lines) < limit:
            end = self.buffer.find(b"\n", self.pos)
            if end >= 0:
                lines.append(self._take(end + 1))
            elif self.ended:
                if self.pos < len(self.buffer):
                    lines.append(self._take(len(self.buffer)))
                break
            elif lines and not wait_for_all and not self._arrived():
                break
            else:
                self._fill()
        return lines

    def read_all(self) -> list[str]:
        """Every line to the end of the input (for inputs held whole anyway, such as `attnx score`'s)."""
        lines: list[str] = []
        while chunk := self.read(1 << 16, wait_for_all=True):
            lines += chunk
        return lines

    # ------------------------------------------------------------------------------------- whole-file facts

    def count_lines(self) -> int | None:
        """Lines of a regular file from where reading stands (without moving it); None for a stream."""
        if not self.regular:
            return None
        count, last = 0, b"\n"
        for block in self._blocks(self.consumed):
            count += block.count(b"\n")
            last = block[-1:]
        return count + (last != b"\n")

    def _blocks(self, offset: int, end: int | None = None) -> Iterator[bytes]:
        """The bytes of a regular file (decompressed, for gzip) from `offset` to `end` (default: its end), a
        block at a time, without moving where reading stands."""
        if self.gzip is None:
            while end is None or offset < end:
                block = os.pread(self.fd, 1 << 20 if end is None else min(1 << 20, end - offset), offset)
                if not block:
                    return
                offset += len(block)
                yield block
            return
        # a reader of its own (opened anew: a duplicate descriptor would share the position of `self.gzip`'s)
        with gzip.open(self.path or f"/dev/fd/{self.fd}", "rb") as text:
            self._unpack(text.seek, offset)
            while end is None or offset < end:
                block = self._unpack(text.read, 1 << 20 if end is None else min(1 << 20, end - offset))
                if not block:
                    return
                offset += len(block)
                yield block

    def _unpack(self, read: Callable[[int], Any], size: int) -> Any:
        """`read(size)` of the gzip reader, its failures on a truncated or corrupt file said in one line."""
        try:
            return read(size)
        except (OSError, EOFError, zlib.error) as err:
            where = f" past line {self.lines}" if self.lines else ""
            raise DataError(
                f"{self.option} {self.name} cannot be read{where}: it is a truncated or corrupt gzip file ({err})"
            ) from None

    def skip(self, size: int, sha256: str) -> bool:
        """Pass over the first `size` bytes if their SHA-256 is `sha256` (the lines an interrupted run
        finished); otherwise leave the input where it was and return False. Regular files only."""
        if not self.regular or self.consumed or (self.gzip is None and size > os.fstat(self.fd).st_size):
            return False
        digest, offset, lines, last = hashlib.sha256(), 0, 0, b"\n"
        for block in self._blocks(0, size):
            digest.update(block)
            lines += block.count(b"\n")
            offset += len(block)
            last = block[-1:]
        if offset < size or digest.hexdigest() != sha256:
            return False
        if last != b"\n":
            lines += 1  # the finished part ended with the file's last line, which has no newline
        if self.gzip is not None:
            self._unpack(self.gzip.seek, size)
        else:
            os.lseek(self.fd, size, os.SEEK_SET)
        self.hash, self.consumed, self.lines = digest, size, lines
        return True

    def rewind(self) -> None:
        """Back to the start of a regular file, as if nothing had been read."""
        if self.gzip is not None:
            self.gzip.seek(0)
        else:
            os.lseek(self.fd, 0, os.SEEK_SET)
        self.buffer, self.pos, self.ended = b"", 0, False
        self.hash, self.consumed, self.lines = hashlib.sha256(), 0, 0

    def warning(self) -> str | None:
        """One line saying how many lines were not UTF-8, or None."""
        if not self.not_utf8:
            return None
        where = f"{self.option} {self.name}" if self.path else self.name
        return (
            f"{self.not_utf8} line(s) of {where} are not valid UTF-8 (the first: line "
            f"{self.first_not_utf8}); their invalid bytes were read as U+FFFD"
        )

"""Text input for the commands: a file, a named pipe, process substitution (`<(...)`) or standard input, read
line by line as it arrives, in bounded memory.

A line ends at `\\n` (a final line without one counts; a `\\r` before the `\\n` is dropped). Bytes that are not
UTF-8 become U+FFFD, and the reader counts the lines where that happened, so the command can say so once.
"""

from __future__ import annotations

import hashlib
import os
import select
import stat
import sys
from pathlib import Path

BLOCK = 1 << 16
"""Bytes read from the input at a time."""


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
        block = os.read(self.fd, BLOCK)
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
        count, offset, last = 0, self.consumed, b"\n"
        while True:
            block = os.pread(self.fd, 1 << 20, offset)
            if not block:
                break
            count += block.count(b"\n")
            offset += len(block)
            last = block[-1:]
        return count + (last != b"\n")

    def skip(self, size: int, sha256: str) -> bool:
        """Pass over the first `size` bytes if their SHA-256 is `sha256` (the lines an interrupted run
        finished); otherwise leave the input where it was and return False. Regular files only."""
        if not self.regular or self.consumed or size > os.fstat(self.fd).st_size:
            return False
        digest, offset, lines = hashlib.sha256(), 0, 0
        while offset < size:
            block = os.pread(self.fd, min(1 << 20, size - offset), offset)
            if not block:
                return False
            digest.update(block)
            lines += block.count(b"\n")
            offset += len(block)
        if digest.hexdigest() != sha256:
            return False
        if size and os.pread(self.fd, 1, size - 1) != b"\n":
            lines += 1  # the finished part ended with the file's last line, which has no newline
        os.lseek(self.fd, size, os.SEEK_SET)
        self.hash, self.consumed, self.lines = digest, size, lines
        return True

    def rewind(self) -> None:
        """Back to the start of a regular file, as if nothing had been read."""
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

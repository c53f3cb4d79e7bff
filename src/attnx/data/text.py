"""Reading parallel text: plain or gzipped files, strict UTF-8, normalized whitespace, aligned pairs.

Line `i` of the source file translates line `i` of the target file, so every check here speaks of
both files at once: a pair is kept or dropped whole, and misalignment is an error, never a guess.
"""

from __future__ import annotations

import gzip
import itertools
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from attnx.data.errors import DataError

CHUNK_LINES = 100_000
"""Lines read, checked and encoded together: large enough to amortize Python, small enough for memory."""


def normalize(line: str) -> str:
    """Strip and collapse every run of Unicode whitespace (spaces, tabs, CR, U+2028, NBSP …) to one space.

    Line separators inside a segment must go: the normalized text files are read back one segment a line.
    """
    return " ".join(line.split())


def resolve(prefix: str | Path, lang: str) -> Path:
    """The file of one side of a split: `{prefix}.{lang}` or `{prefix}.{lang}.gz`."""
    candidates = [Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")]
    for path in candidates:
        if path.is_file():
            return path
    raise DataError(f"no {lang} file for {prefix}: neither {candidates[0]} nor {candidates[1]} exists")


def _open(path: Path) -> BinaryIO:
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115
    except OSError as e:
        raise DataError(f"cannot open {path}: {e.strerror or e}") from e


def _decode(raw: list[bytes], path: Path, first_line: int) -> list[str]:
    """Decode a chunk in one call; on bad bytes, find and name the first bad line."""
    try:
        text = b"".join(raw).decode("utf-8")
    except UnicodeDecodeError:
        for number, line in enumerate(raw, start=first_line):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}:{number}: invalid UTF-8 ({e.reason} at byte {e.start} of the line); "
                    "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None
        raise  # unreachable: some line failed above
    lines = text.split("\n")
    if raw[-1].endswith(b"\n"):
        lines.pop()
    return lines


def read_chunks(path: Path, chunk_lines: int = CHUNK_LINES) -> Iterator[list[str]]:
    """Normalized lines of `path` (plain or gzip, UTF-8, optional BOM), `chunk_lines` at a time."""
    with _open(path) as f:
        number = 1
        try:
            while raw := list(itertools.islice(f, chunk_lines)):
                lines = _decode(raw, path, number)
                if number == 1 and lines[0].startswith("\ufeff"):
                    lines[0] = lines[0][1:]
                yield [normalize(line) for line in lines]
                number += len(raw)
        except (OSError, EOFError) as e:  # truncated or corrupt gzip
            raise DataError(f"{path}: cannot read past line {number - 1}: {e}") from e


def read_lines(path: str | Path) -> list[str]:
    """Every line of a UTF-8 text file, as attnx reads any file of lines (sources, references, constraints):
    a line ends at `\\n` only (a `\\r` before it is dropped), so U+2028, U+0085, a form feed or any other
    Unicode line separator stays inside its line; a last line without `\\n` counts. `OSError` and
    `UnicodeDecodeError` are the caller's to name."""
    lines = Path(path).read_bytes().decode("utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def count_lines(path: Path) -> int:
    with _open(path) as f:
        try:
            return sum(1 for _ in f)
        except (OSError, EOFError) as e:
            raise DataError(f"{path}: cannot read: {e}") from e


def read_aligned(
    src: Path, tgt: Path, chunk_lines: int = CHUNK_LINES
) -> Iterator[tuple[list[str], list[str]]]:
    """Aligned chunks of normalized `(source lines, target lines)`, blank lines included.

    Files with different line counts, or an empty file, are errors naming both files.
    """
    n = 0
    src_chunks, tgt_chunks = read_chunks(src, chunk_lines), read_chunks(tgt, chunk_lines)
    for s, t in itertools.zip_longest(src_chunks, tgt_chunks):
        if s is None or t is None or len(s) != len(t):
            n_src = n + (0 if s is None else len(s)) + sum(map(len, src_chunks))
            n_tgt = n + (0 if t is None else len(t)) + sum(map(len, tgt_chunks))
            raise DataError(
                f"{src} has {n_src} lines but {tgt} has {n_tgt}: line i of one must translate line i of the other"
            )
        n += len(s)
        yield s, t
    if n == 0:
        raise DataError(f"{src} and {tgt} are empty: a split needs at least one sentence pair")


def read_pairs(
    src: Path, tgt: Path, dropped: Counter[str] | None = None, chunk_lines: int = CHUNK_LINES
) -> Iterator[tuple[list[str], list[str]]]:
    """Aligned chunks of normalized `(source lines, target lines)`.

    A pair with a blank side is dropped and counted in `dropped["blank"]` when `dropped` is given
    (training data); otherwise it is an error naming the file and line (references must stay aligned).
    Files with different line counts, or an empty file, are errors naming both files.
    """
    n = 0
    for s, t in read_aligned(src, tgt, chunk_lines):
        blank = [i for i, (x, y) in enumerate(zip(s, t, strict=True)) if not x or not y]
        if blank and dropped is None:
            i = blank[0]
            path = src if not s[i] else tgt
            raise DataError(
                f"{path}:{n + i + 1}: blank line; every segment of a validation or test set needs a "
                f"translation to score against (both files must have text on line {n + i + 1})"
            )
        n += len(s)
        if blank:
            dropped["blank"] += len(blank)
            keep = set(range(len(s))).difference(blank)
            s = [x for i, x in enumerate(s) if i in keep]
            t = [y for i, y in enumerate(t) if i in keep]
        yield s, t

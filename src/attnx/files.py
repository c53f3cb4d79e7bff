"""Files that appear whole or not at all: written elsewhere first, then renamed into place.

Every file attnx writes for a user goes through one of three ways, all on the target's own file system so
that the last step is one `rename`:

* [`atomic_write`][attnx.files.atomic_write]: one file, streamed to a locked temporary file beside the target,
  fsynced and renamed (checkpoints, logs, records). [`remove_stale_temporaries`][attnx.files.remove_stale_temporaries]
  removes what killed writers left, and nothing else.
* [`scratch_directory`][attnx.files.scratch_directory] and [`move_into_place`][attnx.files.move_into_place]:
  several files written in a private directory inside the output, each moved into place once finished
  (`attnx download`, `attnx prepare`).
* [`staged_directory`][attnx.files.staged_directory]: a whole directory, written beside the output and renamed
  onto it once complete (`attnx export`).

A failed write is one line naming the file, and on a full disk the free space
([`write_failure`][attnx.files.write_failure]); where several files are written in turn,
[`open_for_writing`][attnx.files.open_for_writing] makes the error say which one.

What lands in place has the permissions an ordinary `open()` would have given it under the process's umask,
even where the temporary was created private to its owner (`mkstemp`, `mkdtemp`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal, overload


class WriteError(OSError):
    """A file could not be written (a full disk, a lost mount); the message names the file, and on a full
    disk the free space, and says that the previous file is kept."""


TEMPORARY_SUFFIX = ".attnx.tmp"
"""Ends the name of every file attnx is still writing: `.<target name>.<8 random characters>.attnx.tmp`."""

_TEMPORARY = re.compile(r"^\.(?P<target>.+)\.[a-z0-9_]{8}" + re.escape(TEMPORARY_SUFFIX) + "$")

CLEANER_WAIT = 10.0
"""Seconds the cleaner waits for writers to lock the temporary files they are creating (a writer holds the
directory's lock for the microseconds between creating and locking its file)."""


# --- permissions --------------------------------------------------------------------------------------


def _umask() -> int:
    """The process's umask (read by setting it, then setting it back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _file_mode() -> int:
    """The mode `open()` gives a new file under the umask, e.g. `0o644` under umask 022."""
    return 0o666 & ~_umask()


def _directory_mode() -> int:
    """The mode `mkdir` gives a new directory under the umask, e.g. `0o755` under umask 022."""
    return 0o777 & ~_umask()


# --- one file, written beside its target --------------------------------------------------------------


@contextlib.contextmanager
def atomic_write(
    path: str | Path, needed: int = 0, what: str = "file", then: str = "run the command again"
) -> Iterator[BinaryIO]:
    """A binary file to write `path` through: a temporary file beside it, fsynced and renamed into place.

    A crash mid-write leaves the previous `path` intact, never a truncated one; the writer holds an
    exclusive lock on its temporary file, so [`remove_stale_temporaries`][attnx.files.remove_stale_temporaries]
    removes it only once the writer is gone. A failed write (a full disk, a lost mount) raises
    [`WriteError`][attnx.files.WriteError] in one line: `cannot write {what} {path}: {reason}; the previous
    file is kept. Free disk space (or write elsewhere) and {then}`, the reason naming, on a full disk, the free
    space and the `needed` bytes.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the temporary file appears and is locked under a shared lock of its directory, which the cleaner
        # takes exclusively: it never sees a file whose writer has not locked it yet (remove_stale_temporaries).
        # A filesystem without locks (Lustre mounted without flock) refuses them; the write goes on, and the
        # cleaner, refused as well, keeps what it cannot tell apart.
        with _directory_lock(path.parent, fcntl.LOCK_SH):
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX, dir=path.parent)
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as err:
        raise WriteError(f"cannot write {what} {path}: {err.strerror or err}") from err
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode())  # mkstemp's file is private to its owner; a written file is not
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        cause = _write_failure_of(err)
        if cause is not None:
            raise WriteError(write_failure(path, cause, needed, what, then)) from err
        raise


@contextlib.contextmanager
def _directory_lock(directory: Path, kind: int, wait: float | None = None) -> Iterator[bool]:
    """Hold a `flock` of `kind` on `directory`; yields whether it is held (False: no locks on this
    filesystem, or, with `wait` seconds, not granted in time)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield False
        return
    try:
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, kind | (0 if deadline is None else fcntl.LOCK_NB))
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:  # type: ignore[operator]
                    held = False
                    break
                time.sleep(0.01)
            except OSError:
                held = False
                break
        yield held
    finally:
        os.close(fd)  # releases the lock


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
"""The errors of a write that found no room: a full disk, a quota reached."""

_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def disk_full(err: BaseException) -> OSError | None:
    """The full disk behind `err` (an `OSError` of [`DISK_FULL`][attnx.files.DISK_FULL] in its chain, or a
    library's own error quoting one, as Rust's `(os error 28)`), or None when it is something else."""
    seen: set[int] = set()
    link: BaseException | None = err
    while link is not None and id(link) not in seen:
        if isinstance(link, OSError) and link.errno in DISK_FULL:
            return link
        found = _OS_ERROR.search(str(link))
        if found and int(found[1]) in DISK_FULL:
            return OSError(int(found[1]), os.strerror(int(found[1])))
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return None


class NamedFile(io.FileIO):
    """A file opened for writing whose failed writes name it (`OSError.filename`), as a failed open does: where
    several files are written in turn, a full disk says which one it stopped."""

    def write(self, data: Any) -> int | None:
        try:
            return super().write(data)
        except OSError as err:
            if err.filename is None:
                err.filename = self.name
            raise


@overload
def open_for_writing(path: str | Path, text: Literal[True]) -> io.TextIOWrapper: ...
@overload
def open_for_writing(path: str | Path, text: Literal[False] = False) -> io.BufferedWriter: ...
def open_for_writing(path: str | Path, text: bool = False) -> io.TextIOWrapper | io.BufferedWriter:
    """`open(path, "w", encoding="utf-8")` (`text`) or `open(path, "wb")`, through a
    [`NamedFile`][attnx.files.NamedFile]."""
    buffered = io.BufferedWriter(NamedFile(path, "w"))
    return io.TextIOWrapper(buffered, encoding="utf-8") if text else buffered


def _write_failure_of(err: BaseException) -> BaseException | None:
    """The failed write behind `err`, or None when `err` is not one.

    An `OSError` is one. torch.save reports a failed write in two ways: `RuntimeError: [enforce fail ...] file
    write failed` from its own writer, or, when the `OSError` of the Python file it writes to (ENOSPC after part
    of a record went out) makes it close the archive at the wrong offset, `RuntimeError: [enforce fail ...]
    unexpected pos N vs M` with that `OSError` as its context: the `OSError` is then what failed.
    """
    seen: set[int] = set()
    link: BaseException | None = err
    while link is not None and id(link) not in seen:
        if isinstance(link, OSError):
            return link
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    if isinstance(err, RuntimeError) and "write failed" in str(err):
        return err
    return None


def write_failure(
    path: str | Path,
    err: BaseException,
    needed: int = 0,
    what: str = "file",
    then: str = "run the command again",
    kept: str = "the previous file is kept",
    free_in: str | Path | None = None,
) -> str:
    """The one line of a failed write: `cannot write {what} {path}: {reason}; {kept}. Free disk space (or write
    elsewhere) and {then}`, the reason, on a full disk, saying the free space of `free_in` (default: the
    directory of `path`; none where `path` is "", unknown) and the `needed` bytes (when known)."""
    place = Path(free_in) if free_in is not None else Path(path).parent if str(path) else None
    free: int | None = None
    if place is not None:
        with contextlib.suppress(OSError):
            free = shutil.disk_usage(place).free
    full = getattr(err, "errno", None) in DISK_FULL or (needed and free is not None and free < needed)
    if full:
        space = "" if free is None else f"{_size(free)} free in {place}"
        need = f"the {what} needs about {_size(needed)}" if needed else ""
        reason = f"the disk is full ({', '.join(x for x in (space, need) if x) or 'no space left'})"
    else:
        reason = getattr(err, "strerror", None) or str(err).splitlines()[0][:200]
    name = " ".join(x for x in (what, str(path)) if x)
    return f"cannot write {name}: {reason}; {kept}. Free disk space (or write elsewhere) and {then}"


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def remove_stale_temporaries(directory: str | Path, of: str | None = None) -> list[Path]:
    """Remove the temporary files that writes through [`atomic_write`][attnx.files.atomic_write] left when
    their process was killed (only those of the file named `of`, where given); returns them.

    Only files named as `atomic_write` names them are considered, and only those no process holds a lock on
    (a live writer keeps its lock until it renames the file). Writers create and lock their file under a shared
    lock of the directory, which this takes exclusively, so an unlocked file is a dead writer's even when it is
    empty (killed as the file appeared). Where the directory cannot be locked (a filesystem without locks, or
    writers still creating files after [`CLEANER_WAIT`][attnx.files.CLEANER_WAIT] seconds) empty files are
    left alone: their writer may not have locked them yet.
    """
    directory = Path(directory)
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    with _directory_lock(directory, fcntl.LOCK_EX, wait=CLEANER_WAIT) as no_writer_between_create_and_lock:
        for path in sorted(directory.iterdir()):
            match = _TEMPORARY.match(path.name)
            if (
                not match
                or (of is not None and match["target"] != of)
                or not path.is_file()
                or path.is_symlink()
            ):
                continue
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:  # removed meanwhile, or not ours to open
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if no_writer_between_create_and_lock or os.fstat(fd).st_size > 0:
                    path.unlink()
                    removed.append(path)
            except OSError:  # locked: a writer is still at work
                pass
            finally:
                os.close(fd)
    return removed


# --- files written in a scratch directory inside the output -------------------------------------------


def make_scratch_directory(parent: str | Path, prefix: str) -> Path:
    """Create `parent` if needed and a private directory `parent/{prefix}XXXXXXXX` in it (same file system:
    what is written there moves into `parent` with a rename). The caller removes it
    ([`scratch_directory`][attnx.files.scratch_directory] does)."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


@contextlib.contextmanager
def scratch_directory(parent: str | Path, prefix: str) -> Iterator[Path]:
    """A [private directory][attnx.files.make_scratch_directory] inside `parent`, removed with whatever is
    left in it when the block ends, however it ends."""
    work = make_scratch_directory(parent, prefix)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def move_into_place(written: str | Path, target: str | Path) -> Path:
    """Rename the finished file `written` (in a scratch directory on `target`'s file system) onto `target`,
    in one step, with the permissions a file created under the umask has; returns `target`.

    A symbolic link is moved as it is (its mode is its target's). Nothing is fsynced: a crash may lose the
    file, never leave a part of it in place.
    """
    written, target = Path(written), Path(target)
    if not written.is_symlink():
        os.chmod(written, _file_mode())  # writers in a private directory may create private files
    os.replace(written, target)
    return target


# --- a whole directory, renamed onto its output -------------------------------------------------------


@contextlib.contextmanager
def staged_directory(output: str | Path) -> Iterator[Path]:
    """A fresh directory beside `output` to write into; it replaces `output` (a file or a directory, removed
    first) only once the block ends without an error.

    An interrupted or failed block leaves no half-written directory behind, and the previous `output` as it
    was. What is renamed into place has the umask's permissions, however its writers created it.
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        yield work
        _give_umask_permissions(work)
        if output.is_dir():
            shutil.rmtree(output)
        elif output.exists():
            output.unlink()
        work.rename(output)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _give_umask_permissions(top: Path) -> None:
    """`top` and the directories under it get the umask's directory mode, the files its file mode; links are
    left as they are."""
    files, directories = _file_mode(), _directory_mode()
    top.chmod(directories)  # mkdtemp's directory (and some writers' files) are private to the owner
    for root, dirs, names in os.walk(top):
        for name in dirs:
            path = Path(root, name)
            if not path.is_symlink():
                path.chmod(directories)
        for name in names:
            path = Path(root, name)
            if not path.is_symlink():
                path.chmod(files)

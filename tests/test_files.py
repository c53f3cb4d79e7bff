"""Files that appear whole or not at all: writes renamed into place with the umask's permissions, a failed
write that names the file and keeps the previous one, leftovers of killed writes removed and nothing else,
scratch and staged directories that leave nothing half-written behind."""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from attnx.files import (
    WriteError,
    atomic_write,
    disk_full,
    move_into_place,
    open_for_writing,
    remove_stale_temporaries,
    scratch_directory,
    staged_directory,
)
from tests.training.conftest import TINY


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_written_file_replaces_the_old_one_with_the_umasks_permissions(tmp_path: Path, umask_022) -> None:
    target = tmp_path / "deep" / "log.csv"
    for text in (b"first", b"second"):
        with atomic_write(target, what="log") as f:
            f.write(text)
    assert target.read_bytes() == b"second" and mode(target) == 0o644  # mkstemp's file was 0o600
    assert [p.name for p in target.parent.iterdir()] == ["log.csv"]


def test_a_failed_write_is_one_line_naming_the_file_and_keeps_the_previous_one(
    tmp_path: Path, monkeypatch
) -> None:
    target = tmp_path / "record.json"
    target.write_bytes(b"previous")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("attnx.files.os.fsync", full)
    with pytest.raises(WriteError) as caught, atomic_write(target, needed=3 << 20, what="record") as f:
        f.write(b"new")
    message = str(caught.value)
    assert message.startswith(f"cannot write record {target}: the disk is full (") and "\n" not in message
    assert "MiB free in" in message and "the record needs about 3.0 MiB" in message, message
    assert message.endswith(
        "the previous file is kept. Free disk space (or write elsewhere) and run the command again"
    )
    assert target.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_an_error_of_the_writer_itself_passes_unchanged_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(KeyError), atomic_write(tmp_path / "x") as f:
        f.write(b"part")
        raise KeyError("not a write failure")
    assert list(tmp_path.iterdir()) == []


HOLDER = """
import sys, time
from attnx.files import atomic_write
with atomic_write(sys.argv[1]) as f:
    f.write(b"partial checkpoint")
    f.flush()
    print("writing", flush=True)
    time.sleep(600)
"""


def killed_write(path: Path) -> Path:
    """Start a write of ``path``, kill its process mid-write, return the temporary file it left."""
    before = set(path.parent.iterdir())
    writer = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
        (left,) = set(path.parent.iterdir()) - before
        assert remove_stale_temporaries(path.parent) == [] and left.exists()  # a live writer's file stays
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    return left


def test_leftovers_of_killed_writes_are_removed_and_nothing_else(tmp_path: Path) -> None:
    theirs = [".last.ckpt.abcdefgh.tmp", "notes.tmp", ".step=3.ckpt.tmp", "x.attnx.tmp", "last.ckpt"]
    for name in theirs:
        (tmp_path / name).write_text("the user's")
    left = killed_write(tmp_path / "last.ckpt")
    assert remove_stale_temporaries(tmp_path, of="out.txt.attnx-partial.json") == [] and left.exists()
    assert remove_stale_temporaries(tmp_path, of="last.ckpt") == [left]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(theirs)


BORN = """
import sys, time
from attnx.files import atomic_write
with atomic_write(sys.argv[1]) as f:
    print("created", flush=True)
    time.sleep(600)
"""

BETWEEN = """
import fcntl, os, sys, time
directory, name = sys.argv[1:3]
fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_SH)  # what atomic_write holds between creating its temporary file and locking it
open(os.path.join(directory, name), "wb").close()
print("created", flush=True)
sys.stdin.readline()
file = os.open(os.path.join(directory, name), os.O_RDWR)
fcntl.flock(file, fcntl.LOCK_EX)
os.close(fd)
print("locked", flush=True)
time.sleep(600)
"""


def test_an_empty_temporary_of_a_killed_write_is_removed_by_the_next_fit(
    corpus: Path, tmp_path: Path
) -> None:
    """A write killed as its file appeared leaves an empty temporary: the next `attnx fit` removes it (it
    survived every later fit); a file a writer is creating but has not locked yet is kept."""
    checkpoints = tmp_path / "runs" / "tiny" / "version_0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    writer = subprocess.Popen(
        [sys.executable, "-c", BORN, str(checkpoints / "last.ckpt")], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout.readline().strip() == "created"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    (left,) = checkpoints.iterdir()
    assert left.stat().st_size == 0 and left.name.startswith(".last.ckpt.")
    fit = [sys.executable, "-m", "attnx", "fit", "--config", str(TINY), "--data.data_dir", str(corpus),
           "--trainer.max_steps", "1", "--evaluation.bleu_samples", "0"]  # fmt: skip
    done = subprocess.run(
        fit, cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        f"attnx fit: removed {left.relative_to(tmp_path)}, left by a checkpoint write that was killed"
        in done.stderr
    )
    assert not left.exists()


def test_an_empty_temporary_whose_writer_has_not_locked_it_yet_is_kept(tmp_path: Path, monkeypatch) -> None:
    import attnx.files

    monkeypatch.setattr(attnx.files, "CLEANER_WAIT", 0.2)
    name = ".last.ckpt.abcd1234.attnx.tmp"
    writer = subprocess.Popen([sys.executable, "-c", BETWEEN, str(tmp_path), name], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert writer.stdout.readline().strip() == "created"
        assert remove_stale_temporaries(tmp_path) == [] and (tmp_path / name).exists()  # its writer is alive
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "locked"
        assert remove_stale_temporaries(tmp_path) == [] and (tmp_path / name).exists()  # still writing
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert remove_stale_temporaries(tmp_path) == [tmp_path / name]  # its writer is gone


def test_scratch_files_move_into_place_with_the_umasks_permissions(tmp_path: Path, umask_022) -> None:
    with scratch_directory(tmp_path / "out", ".scratch-") as work:
        assert work.parent == tmp_path / "out" and work.name.startswith(".scratch-") and mode(work) == 0o700
        private = work / "model.bin"
        private.write_bytes(b"weights")
        private.chmod(0o600)  # as a writer using mkstemp leaves it
        (tmp_path / "out" / "model.bin").write_bytes(b"old")
        (work / "link").symlink_to(tmp_path / "elsewhere")
        assert move_into_place(private, tmp_path / "out" / "model.bin") == tmp_path / "out" / "model.bin"
        move_into_place(work / "link", tmp_path / "out" / "link")  # a link moves as it is
    out = tmp_path / "out"
    assert (out / "model.bin").read_bytes() == b"weights" and mode(out / "model.bin") == 0o644
    assert os.readlink(out / "link") == str(tmp_path / "elsewhere")
    assert sorted(p.name for p in out.iterdir()) == ["link", "model.bin"]  # the scratch directory is gone


def test_a_scratch_directory_is_removed_when_its_block_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), scratch_directory(tmp_path, ".scratch-") as work:
        (work / "half").write_bytes(b"written")
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_a_staged_directory_replaces_the_output_only_when_complete(tmp_path: Path, umask_022) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.bin").write_bytes(b"old")
    with pytest.raises(RuntimeError), staged_directory(out) as work:
        (work / "half.bin").write_bytes(b"half")
        raise RuntimeError("interrupted")
    assert [p.name for p in tmp_path.iterdir()] == ["model"] and [p.name for p in out.iterdir()] == [
        "old.bin"
    ]
    with staged_directory(out) as work:
        assert work.parent == tmp_path and work.name.startswith(".model.")
        (work / "sub").mkdir(mode=0o700)
        (work / "sub" / "vocab.txt").write_text("a\n")
        (work / "model.bin").write_bytes(b"new")
        (work / "model.bin").chmod(0o600)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "model.bin",
        "sub",
        "sub/vocab.txt",
    ]
    assert mode(out) == 0o755 and mode(out / "sub") == 0o755
    assert mode(out / "model.bin") == 0o644 and mode(out / "sub" / "vocab.txt") == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (every write fails with ENOSPC)")
def test_a_file_opened_for_writing_is_named_by_its_failed_write() -> None:
    """Several files written in turn: the one the disk filled on is the one the error names."""
    for text, data in ((True, "x" * 10_000), (False, b"x" * 10_000)):
        with pytest.raises(OSError) as raised, open_for_writing("/dev/full", text=text) as f:
            f.write(data)
        assert raised.value.errno == errno.ENOSPC and raised.value.filename == "/dev/full"
        assert disk_full(raised.value) is raised.value


def test_a_full_disk_is_found_in_a_chain_or_in_a_library_s_own_error() -> None:
    class SafetensorError(Exception):
        pass

    rust = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert disk_full(rust).errno == errno.ENOSPC
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as quota:
            raise RuntimeError("file write failed") from quota
    except RuntimeError as wrapped:
        assert disk_full(wrapped).errno == errno.EDQUOT
    assert disk_full(OSError(errno.EACCES, "Permission denied")) is None
    assert disk_full(SafetensorError("I/O error: Permission denied (os error 13)")) is None

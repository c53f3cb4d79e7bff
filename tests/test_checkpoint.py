"""The checkpoint file: one reader that refuses every unreadable file in one line and never runs a payload;
writes that are whole or absent; leftovers of killed writes removed, and nothing else."""

from __future__ import annotations

import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from attnx.checkpoint import CheckpointError, atomic_save, read_checkpoint, remove_stale_temporaries
from tests.training.conftest import TINY


class Payload:
    """Unpickling this runs a shell command that creates a file: it must never run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def unreadable_files(directory: Path) -> dict[str, Path]:
    """A random file, a truncated checkpoint, a pickle payload (inside a torch archive and bare) and a text
    file; the payload's marker file is ``directory / "ran"``."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / "ran"
    files = {
        name: directory / f"{name}.ckpt" for name in ("random", "truncated", "payload", "pickle", "text")
    }
    files["random"].write_bytes(random.Random(0).randbytes(5000))
    atomic_save({"attnx": {"format_version": 1}, "state_dict": {"w": torch.ones(1000)}}, directory / "whole")
    whole = (directory / "whole").read_bytes()
    files["truncated"].write_bytes(whole[: len(whole) // 2])
    torch.save({"state_dict": {}, "attnx": Payload(marker)}, files["payload"])
    files["pickle"].write_bytes(pickle.dumps(Payload(marker)))
    files["text"].write_text(
        "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
    )
    return files


def test_unreadable_files_are_one_line_and_a_payload_never_runs(tmp_path: Path) -> None:
    for kind, path in unreadable_files(tmp_path).items():
        with pytest.raises(CheckpointError) as caught:
            read_checkpoint(path)
        message = str(caught.value)
        assert str(path) in message and "\n" not in message, kind
        assert "weights_only" not in message, kind  # never torch's advice to load unsafely
        expected = {
            "truncated": "truncated or corrupt",
            "payload": "never loads",
            "pickle": "not a checkpoint",
        }
        assert expected.get(kind, "not a checkpoint") in message, (kind, message)
    assert not (tmp_path / "ran").exists()


HOLDER = """
import sys, time
from attnx.checkpoint import atomic_write
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
    assert remove_stale_temporaries(tmp_path) == [left]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(theirs)


def test_a_full_disk_during_fit_is_one_line_naming_the_file_and_the_space(
    corpus: Path, tmp_path: Path
) -> None:
    """A real full filesystem: a 1.6 MiB tmpfs (checkpoints of the tiny model are about 1.05 MiB) mounted in a
    user and mount namespace, holding the checkpoint directory."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip(
            "mounting a small tmpfs needs `unshare -rm` (user namespaces), which this machine refuses"
        )
    config = yaml.safe_load(TINY.read_text())
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    config["trainer"]["callbacks"][0]["init_args"]["dirpath"] = str(checkpoints)
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(config))
    fit = f"{sys.executable} -m attnx fit --config full.yaml --data.data_dir {corpus} --trainer.max_steps 3"
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1600k tmpfs {checkpoints} && {fit}"],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[-1].startswith("attnx fit: error: cannot write checkpoint "), lines[-1]
    assert str(checkpoints) in lines[-1] and "the disk is full" in lines[-1], lines[-1]
    assert "MiB free in" in lines[-1] and "the checkpoint needs about 1.0 MiB" in lines[-1], lines[-1]


FILL = """
import os, resource, signal, subprocess, sys, torch
from attnx.checkpoint import CheckpointError, atomic_save
directory, how = sys.argv[1], sys.argv[2]
checkpoint = {"state_dict": {f"w{i}": torch.randn(64, 256) for i in range(12)}, "attnx": {"n": 1}}  # 0.8 MiB
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over RLIMIT_FSIZE, write() fails with EFBIG instead
for kib in [4, 8, 12, 60, 64, 68, 100, 200, 333, 400, 500, 512, 600, 700, 768, 777, 800, 812, 820, 824]:
    if how == "tmpfs":
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", directory], check=True)
    else:
        resource.setrlimit(resource.RLIMIT_FSIZE, (kib * 1024, resource.RLIM_INFINITY))
    try:
        atomic_save(checkpoint, os.path.join(directory, "step=1.ckpt"))
        print(kib, "saved")
    except CheckpointError as err:
        print(kib, "one line:", str(err).replace(chr(10), " / "))
    except BaseException as err:
        print(kib, "escaped:", type(err).__name__, str(err).replace(chr(10), " / "))
    print(kib, "left:", sorted(os.listdir(directory)), flush=True)
    if how == "tmpfs":
        subprocess.run(["umount", directory], check=True)
    else:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
"""


def test_a_full_disk_is_one_line_at_every_free_space(tmp_path: Path) -> None:
    """A full disk at 20 sizes between 4 KiB and the checkpoint's own: torch.save fails in several ways (its
    writer's "file write failed", or an "unexpected pos" of an archive closed after a partial write), each one
    line naming the file. A tmpfs of that size where `unshare -rm` may mount one, else a file size limit
    (RLIMIT_FSIZE: the write fails with EFBIG at that size, as it does with ENOSPC on a full disk)."""
    tmpfs = shutil.which("unshare") is not None and subprocess.run(["unshare", "-rm", "true"]).returncode == 0
    command = [sys.executable, "-c", FILL, str(tmp_path), "tmpfs" if tmpfs else "rlimit"]
    done = subprocess.run(
        ["unshare", "-rm", *command] if tmpfs else command, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [line.split(" ", 1) for line in done.stdout.splitlines()]
    outcomes = [rest for _, rest in results if not rest.startswith("left:")]
    assert len(outcomes) == 20 and not [o for o in outcomes if o.startswith("escaped")], done.stdout
    failed = [o for o in outcomes if o.startswith("one line")]
    assert len(failed) >= 15, done.stdout  # the last sizes may hold the whole checkpoint
    for outcome in failed:
        assert f"cannot write checkpoint {tmp_path}/step=1.ckpt: " in outcome, outcome
        assert "the previous file is kept" in outcome, outcome
        if tmpfs:
            assert "the disk is full" in outcome and "the checkpoint needs about 0.8 MiB" in outcome, outcome
    for kib, rest in results:  # no temporary is ever left behind; a failed write leaves no file at all
        if rest.startswith("left:"):
            assert rest in ("left: []", "left: ['step=1.ckpt']"), (kib, rest)


BORN = """
import sys, time
from attnx.checkpoint import atomic_write
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
    import attnx.checkpoint

    monkeypatch.setattr(attnx.checkpoint, "CLEANER_WAIT", 0.2)
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

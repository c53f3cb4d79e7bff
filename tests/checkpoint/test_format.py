"""The checkpoint file: one reader that refuses every unreadable or damaged file in one line and never runs a
payload, in every command that reads one; a write that fails on a full disk is one line naming the file and the
space (the writing itself: tests/test_files.py)."""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from attnx.checkpoint import CheckpointError, atomic_save, check_tokenizer, load_model, read_checkpoint
from attnx.checkpoint.format import damaged_member
from attnx.cli import main as attnx
from attnx.data.sentencepiece_proto import parse
from attnx.data.tokenizer import Tokenizer
from tests.checkpoints import flip_bytes, reader_commands, tiny_checkpoint
from tests.training.conftest import TINY, fit_args


class Payload:
    """Unpickling this runs a shell command that creates a file: it must never run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def unreadable_files(directory: Path) -> dict[str, Path]:
    """A random file, a truncated checkpoint, a pickle payload (inside a torch archive and bare), a text
    file, an empty zip archive and a zip archive of something else; the payload's marker file is
    ``directory / "ran"``."""
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
    files["empty zip"] = directory / "empty_zip.ckpt"
    zipfile.ZipFile(files["empty zip"], "w").close()
    files["other zip"] = directory / "other_zip.ckpt"
    with zipfile.ZipFile(files["other zip"], "w") as archive:
        archive.writestr("notes.txt", "not a model")
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
        if kind.endswith("zip"):  # what the zip is, not "Python objects" nor "truncated"
            assert "zip archive" in message and "data.pkl" in message, message
    assert not (tmp_path / "ran").exists()


def damaged_copy(path: Path, name: str) -> tuple[Path, str]:
    """A copy of `path` with 570 bytes changed inside its largest tensor, and that tensor's archive member."""
    copy = path.with_name(name)
    shutil.copy(path, copy)
    return copy, flip_bytes(copy)


def test_a_damaged_checkpoint_is_one_line_and_an_older_one_is_checked_alike(
    corpus: Path, tmp_path: Path
) -> None:
    """570 bytes changed inside the embeddings: torch.load takes the file as it is; attnx compares every member
    with the CRC-32 its archive records and names the file. A checkpoint of an attnx that recorded no SHA-256
    of its SentencePiece model is checked by the same CRCs."""
    good = tiny_checkpoint(corpus, tmp_path / "good.ckpt")
    older = tmp_path / "older.ckpt"
    state = torch.load(good, weights_only=True)
    del state["attnx"]["tokenizer_sha256"]
    torch.save(state, older)
    for path in (good, older):
        assert damaged_member(path) is None and load_model(path).model is not None
        damaged, member = damaged_copy(path, f"damaged-{path.name}")
        assert member.endswith(tuple(f"data/{i}" for i in range(100)))  # a tensor's bytes
        assert torch.load(damaged, weights_only=True)["state_dict"]  # torch itself never notices
        assert damaged_member(damaged) == member
        with pytest.raises(CheckpointError) as caught:
            load_model(damaged)
        assert str(caught.value) == (
            f"checkpoint {damaged} is damaged: the bytes of its member {member} do not match the CRC-32 recorded "
            "for them (changed on disk or in a copy). Use another checkpoint (e.g. an earlier one from the same "
            "run directory), or copy it again from where it was written."
        )
    deflated = tmp_path / "deflated.ckpt"  # not what torch.save writes: never inflated
    with zipfile.ZipFile(good) as archive, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as out:
        for info in archive.infolist():
            out.writestr(info.filename, archive.read(info))
    with pytest.raises(CheckpointError, match="is truncated or corrupt"):
        read_checkpoint(deflated)
    # a file checked once, then replaced by a damaged one, is checked again
    os.replace(tmp_path / "damaged-good.ckpt", good)
    with pytest.raises(CheckpointError, match="is damaged"):
        read_checkpoint(good)


def test_every_command_refuses_a_damaged_checkpoint_in_one_line(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each command that reads a checkpoint, given one with bytes changed inside a tensor (all of them took it
    with exit status 0: garbage translations, an average containing it, an export of it): one line naming the
    file and what to do, exit status 1, no output written."""
    good = tiny_checkpoint(corpus, tmp_path / "good.ckpt")
    damaged, member = damaged_copy(good, "damaged.ckpt")
    (tmp_path / "input.en").write_text("A dog runs.\n")
    monkeypatch.chdir(tmp_path)
    commands = reader_commands(corpus, good, damaged)
    for argv in commands:
        capsys.readouterr()
        rc = attnx(argv)
        said = capsys.readouterr()
        assert rc == 1 and "Traceback" not in said.err and said.out == "", (argv, said.err[-2000:])
        line = said.err.strip().splitlines()[-1]
        expected = (
            f"attnx {argv[0]}: error: checkpoint {damaged} is damaged: the bytes of its member {member} "
        )
        assert line.startswith(expected), (argv, said.err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged.ckpt", "good.ckpt", "input.en"]


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
        timeout=900,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert lines[-1].startswith("attnx fit: error: cannot write checkpoint "), lines[-1]
    assert str(checkpoints) in lines[-1] and "the disk is full" in lines[-1], lines[-1]
    needs = re.search(r"MiB free in .*, the checkpoint needs about (\d+\.\d) MiB\)", lines[-1])
    assert needs and 1.0 <= float(needs[1]) <= 1.2, lines[-1]  # the tiny model's checkpoint: about 1.05 MiB


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


def as_written_before(proto: bytes, folder: str) -> bytes:
    """`proto` as `attnx prepare` wrote it before it kept paths out of the model: the scratch folder's paths
    and the threads recorded in the trainer spec (other bytes, the same model)."""
    model = parse(proto)
    model.trainer_spec.input.extend([f"{folder}/.attnx-prepare-k2j4x0a1/train.en", f"{folder}/x/train.de"])
    model.trainer_spec.model_prefix = f"{folder}/.attnx-prepare-k2j4x0a1/spm"
    model.trainer_spec.num_threads = 16
    return model.SerializeToString()


def carrying(good: Path, path: Path, proto: bytes) -> Path:
    """A copy of the checkpoint `good` carrying the SentencePiece model `proto` (and its SHA-256, as recorded)."""
    checkpoint = torch.load(good, weights_only=True)
    checkpoint["attnx"]["tokenizer"] = proto
    checkpoint["attnx"]["tokenizer_sha256"] = hashlib.sha256(proto).hexdigest()
    torch.save(checkpoint, path)
    return path


def test_a_checkpoint_is_checked_against_what_decides_the_segmentation(corpus: Path, tmp_path: Path) -> None:
    """A checkpoint carrying the corpus's model in other bytes (its training folder recorded, as every prepare
    did before) pairs with it; one carrying another model is one line saying how they differ and how to get the
    checkpoint's own model, and the command it gives writes exactly that model."""
    tokenizer = Tokenizer.load(corpus / "spm.model")
    good = tiny_checkpoint(corpus, tmp_path / "good.ckpt")
    older = carrying(good, tmp_path / "older.ckpt", as_written_before(tokenizer.to_bytes(), "/home/a/data"))
    assert read_checkpoint(older)["attnx"]["tokenizer"] != tokenizer.to_bytes()
    check_tokenizer(
        read_checkpoint(older), older, tokenizer
    )  # refused until now: another SHA-256 of the bytes

    model = parse(tokenizer.to_bytes())
    model.pieces[40].score -= 0.5
    other = carrying(good, tmp_path / "other.ckpt", model.SerializeToString())
    with pytest.raises(CheckpointError) as caught:
        check_tokenizer(read_checkpoint(other), other, tokenizer)
    message = str(caught.value)
    assert message.startswith(
        f"checkpoint {other} was trained with another SentencePiece model than {corpus / 'spm.model'} (piece 40 "
        "score: "
    ), message
    assert message.endswith("then attnx prepare ... --spm_model other.spm.model") and "\n" not in message
    command = re.search(r'python -c "([^"]+)"', message).group(1)
    subprocess.run([sys.executable, "-c", command], cwd=tmp_path, check=True, env=os.environ)
    assert (tmp_path / "other.spm.model").read_bytes() == model.SerializeToString()
    with pytest.raises(CheckpointError) as caught:  # handed over in Python, without a file
        check_tokenizer(read_checkpoint(other), None, tokenizer)
    assert str(caught.value).startswith(
        "checkpoint (given) was trained with another SentencePiece model than "
    )
    assert str(caught.value).endswith(
        "(the bytes of checkpoint['attnx']['tokenizer']) with attnx prepare --spm_model"
    )


def test_a_checkpoint_tests_against_the_same_corpus_prepared_elsewhere(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commonest move in MT: train on one machine, evaluate on another. A checkpoint of the corpus prepared in
    one folder, tested on the same text prepared again in another (another scratch folder, other threads), was
    refused for another SentencePiece model; both preparations now write the same model, and the test runs. So
    does it with a checkpoint whose model recorded its training folder (as every prepare did before)."""
    raw = corpus.parent
    again = tmp_path / "second" / "clone" / "data"
    argv = ["prepare", "--src_lang", "en", "--tgt_lang", "de", "--vocab_size", "300", "--workers", "2"]
    argv += [
        "--train",
        str(raw / "train"),
        "--valid",
        str(raw / "val"),
        "--test",
        str(raw / "test_2016_flickr"),
    ]
    assert attnx([*argv, "--output", str(again)]) == 0
    assert (again / "spm.model").read_bytes() == (corpus / "spm.model").read_bytes()
    monkeypatch.chdir(tmp_path)
    one_step = ("--trainer.max_steps", "1", "--evaluation.bleu_samples", "0")
    assert attnx(fit_args(corpus, *one_step)) == 0
    checkpoint = tmp_path / "runs" / "tiny" / "version_0" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    extra = ("--evaluation.search.max_len_b", "2", "--evaluation.search.beam", "1")
    older = carrying(  # trained where prepare still recorded its scratch folder in spm.model
        checkpoint,
        tmp_path / "older.ckpt",
        as_written_before((corpus / "spm.model").read_bytes(), "/gpu-box/data"),
    )
    for path in (checkpoint, older):
        assert attnx(fit_args(again, "--ckpt_path", str(path), *extra, subcommand="test")) == 0, (
            capsys.readouterr().err[-2000:]
        )

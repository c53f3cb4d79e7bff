"""The SHA-256 of each file an export writes: recorded in its attnx.json, checked where attnx loads the export."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from attnx.checkpoint import CheckpointError
from attnx.checkpoint.digests import RECORD, check_digests, file_digests
from attnx.cli import main as attnx
from tests.inference.conftest import checkpoint, tokenizer  # noqa: F401


def flip_bytes_of(path: Path, within: bytes | None = None, count: int = 570) -> None:
    """Change `count` bytes of a file in place, spread over the span that holds `within` (the whole file
    without it)."""
    data = bytearray(path.read_bytes())
    start = data.find(within) if within is not None else 0
    assert start >= 0, "the bytes to change are not in the file"
    span = len(within) if within is not None else len(data)
    for i in range(count):
        data[start + i * span // count] ^= 0x5A
    path.write_bytes(bytes(data))


def test_a_changed_missing_or_unrecorded_file_is_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    export = tmp_path / "export"
    export.mkdir()
    (export / "model.bin").write_bytes(bytes(range(256)) * 64)
    (export / "config.json").write_text("{}\n")
    meta = {RECORD: file_digests(export)}
    assert sorted(meta[RECORD]) == ["config.json", "model.bin"]
    check_digests(export, meta, "attnx.json")

    flip_bytes_of(export / "model.bin")
    with pytest.raises(CheckpointError) as caught:
        check_digests(export, meta, "attnx.json")
    assert str(caught.value) == (
        f"{export / 'model.bin'} is damaged: its SHA-256 is not the one attnx.json records (changed on disk or "
        "in a copy); copy the export again, or export the checkpoint again"
    )
    (export / "config.json").unlink()
    with pytest.raises(
        CheckpointError, match=r"config\.json is missing from the export \(attnx\.json records"
    ):
        check_digests(export, meta, "attnx.json")
    for damaged in ("0123", {"../../etc/passwd": "0123"}, {"model.bin": 7}):
        with pytest.raises(CheckpointError, match=f"attnx.json has a damaged '{RECORD}' entry"):
            check_digests(export, {RECORD: damaged}, "attnx.json")

    with caplog.at_level(logging.WARNING):  # an export of an attnx that recorded nothing: loads, said once
        for _ in range(2):
            check_digests(export, {}, "attnx.json")
    assert [r.getMessage() for r in caplog.records] == [
        f"attnx: {export} was exported before attnx recorded the SHA-256 of its files, so damage to them cannot "
        "be detected; export the checkpoint again to record them"
    ]


def test_translate_refuses_a_ctranslate2_export_with_damaged_weights(
    checkpoint: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """570 bytes of the embeddings in model.bin changed: CTranslate2 loads whatever it holds (attnx translated
    with it, exit 0); attnx checks the SHA-256 its export recorded and names the file."""
    pytest.importorskip(
        "ctranslate2", reason="CTranslate2 export needs the ct2 extra: pip install 'attnx[ct2]'"
    )
    from attnx.checkpoint import load_model
    from attnx.export import export_ctranslate2
    from attnx.inference.ctranslate2 import METADATA, CTranslate2Translator

    export = export_ctranslate2(checkpoint, tmp_path / "ct2")
    recorded = json.loads((export / METADATA).read_text())[RECORD]
    assert {"model.bin", "config.json"} <= set(recorded) and "sentencepiece.model" not in recorded
    assert CTranslate2Translator.load(export, threads=1).translate(["A dog runs."])

    damaged = shutil.copytree(export, tmp_path / "damaged")
    embeddings = load_model(checkpoint).model.src_embedding.weight.detach().numpy().tobytes()
    flip_bytes_of(damaged / "model.bin", within=embeddings)  # inside the weights: CTranslate2 loads them
    (tmp_path / "input.en").write_text("A dog runs.\n")
    capsys.readouterr()
    assert attnx(["translate", "--model", str(damaged), "--input", str(tmp_path / "input.en")]) == 1
    said = capsys.readouterr()
    assert said.out == "" and said.err.splitlines() == [
        f"attnx translate: error: {damaged / 'model.bin'} is damaged: its SHA-256 is not the one attnx.json "
        "records (changed on disk or in a copy); copy the export again, or export the checkpoint again"
    ]

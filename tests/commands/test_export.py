"""``attnx export`` as a user runs it, and what reads its output: ``attnx translate --model DIR``, ``attnx.load``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import attnx
from attnx.cli import main

pytest.importorskip("ctranslate2")


def test_ctranslate2_export_translates_through_the_cli_and_the_api(
    checkpoint, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "ct2"
    assert (
        main(["export", "--ckpt_path", str(checkpoint), "--format", "ctranslate2", "--output", str(out)]) == 0
    )
    assert f"attnx translate --model {out}" in capsys.readouterr().out
    translator = attnx.load(out, search=attnx.SearchConfig(beam=1, max_len_b=6))
    assert type(translator).__name__ == "CTranslate2Translator"
    lines = ["A dog runs.", "", "Two men are talking."]
    expected = translator.translate(lines)
    done = subprocess.run(
        [sys.executable, "-m", "attnx", "translate", "--model", str(out), "--search.beam", "1", "--search.max_len_b", "6"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.split("\n")[:-1] == expected and expected[1] == ""
    assert attnx.load(out).search.length_penalty == "fairseq"  # the stored default: CTranslate2's only form


def test_existing_output_and_wrong_options_are_one_line(checkpoint, tmp_path: Path, capsys) -> None:
    out = tmp_path / "ct2"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    argv = ["export", "--ckpt_path", str(checkpoint), "--format", "ctranslate2", "--output", str(out)]
    assert main(argv) == 1
    assert "--force" in capsys.readouterr().err and (out / "keep.txt").is_file()
    assert main([*argv, "--format", "onnx"]) == 2
    assert "onnx" in capsys.readouterr().err
    argv = [
        "export",
        "--ckpt_path",
        str(checkpoint),
        "--format",
        "huggingface",
        "--output",
        str(tmp_path / "hf"),
    ]
    assert main([*argv, "--quantization", "int8"]) == 1
    assert "ctranslate2 only" in capsys.readouterr().err


def test_huggingface_export_writes_a_marian_directory(checkpoint, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "hf"
    assert (
        main(["export", "--ckpt_path", str(checkpoint), "--format", "huggingface", "--output", str(out)]) == 0
    )
    assert {"config.json", "model.safetensors", "source.spm", "target.spm", "vocab.json"} <= {
        p.name for p in out.iterdir()
    }


def test_quantization_none_keeps_the_trained_weights(checkpoint, tmp_path: Path) -> None:
    """The help offers `none`; `attnx export --quantization none` is the float32 export, not a type error."""
    argv = [sys.executable, "-m", "attnx", "export", "--ckpt_path", str(checkpoint)]
    done = subprocess.run(
        [*argv, "--quantization", "none", "--format", "ctranslate2", "--output", str(tmp_path / "ct2")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "CTranslate2 model (float32)" in done.stdout
    assert type(attnx.load(tmp_path / "ct2")).__name__ == "CTranslate2Translator"
    done = subprocess.run([*argv, "--quantization", "int4"], capture_output=True, text=True)
    assert done.returncode == 2 and "none" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_search_options_change_the_default_a_ctranslate2_export_stores(
    checkpoint, tmp_path: Path, capsys
) -> None:
    """`attnx export --format ctranslate2 --beam 5 --search.max_len_b 8` stores CTranslate2's default search
    (|Y|^0.6) with those changed (refused before: the options were laid over SearchConfig's GNMT default), and
    `attnx translate --model OUT --nbest 5` takes the stored beam of 5 (checked once layered over it)."""
    out = tmp_path / "ct2"
    argv = ["export", "--ckpt_path", str(checkpoint), "--format", "ctranslate2", "--output", str(out)]
    assert main([*argv, "--beam", "5", "--search.max_len_b", "8"]) == 0, capsys.readouterr().err
    stored = attnx.load(out, precision="32-true")
    assert (stored.search.beam, stored.search.max_len_b, stored.search.length_penalty) == (5, 8, "fairseq")
    lines = ["A dog runs.", "", "Two men are talking."]
    src, result = tmp_path / "in.txt", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    translate = ["translate", "--model", str(out), "--input", str(src), "--output", str(result)]
    translate += ["--device", "cpu", "--precision", "32-true", "--format", "jsonl"]
    assert main([*translate, "--nbest", "5"]) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in result.read_text(encoding="utf-8").splitlines()]
    expected = stored.with_search(nbest=5).generate(lines)
    assert [[h["text"] for h in row["hypotheses"]] for row in rows] == [
        [h.text for h in hyps] for hyps in expected
    ]
    capsys.readouterr()
    assert main([*argv, "--force", "--search.length_penalty", "gnmt"]) == 1  # what CTranslate2 cannot do
    err = capsys.readouterr().err
    assert "CTranslate2 has only the |Y|^alpha length penalty" in err and len(err.strip().splitlines()) == 1

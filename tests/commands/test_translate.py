"""``attnx translate``, ``attnx attention`` and ``attnx score`` as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import matplotlib.image

import attnx
from attnx.cli import main as attnx_main
from attnx.inference.config import SearchConfig
from tests.inference.test_translator import LINES

FAST = ["--search.beam", "2", "--search.max_len_b", "6"]


def test_translate_file_keeps_line_count_and_order(checkpoint, tmp_path, capsys):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    assert (
        attnx_main(
            ["translate", "--model", str(checkpoint), "--input", str(src), "--output", str(out), *FAST]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "input 7" in err and "truncated" in err  # the long line, with a warning on stderr
    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and len(got) - 1 == len(LINES)
    expected = attnx.load(checkpoint, search=SearchConfig(beam=2, max_len_b=6)).translate(LINES)
    assert got[:-1] == expected  # the command is the Python API


def test_translate_reads_stdin_and_writes_stdout(checkpoint):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    text = "A girl is jumping.\n\nZwei Hunde.\nlast line without newline"
    result = subprocess.run(
        [sys.executable, "-m", "attnx", "translate", "--model", str(checkpoint), *FAST, "--search.beam", "1"],
        input=text.encode("utf-8"),
        capture_output=True,
        env=env,
        check=True,
    )
    out = result.stdout.decode("utf-8").split("\n")
    assert len(out) == 5 and out[-1] == "" and out[1] == ""


def test_bad_checkpoint_is_one_line_exit_1(tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    src = tmp_path / "in.txt"
    src.write_text("hello\n", encoding="utf-8")
    assert attnx_main(["translate", "--model", str(bad), "--input", str(src)]) == 1
    err = capsys.readouterr().err
    assert "bad.ckpt" in err and "is not a checkpoint" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert attnx_main(["translate", "--model", str(tmp_path / "missing.ckpt"), "--input", str(src)]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_missing_input_and_unknown_device_are_one_line(checkpoint, tmp_path: Path, capsys):
    assert attnx_main(["translate", "--model", str(checkpoint), "--input", str(tmp_path / "nope.txt")]) == 1
    assert "nope.txt does not exist" in capsys.readouterr().err
    assert attnx_main(["translate", "--model", str(checkpoint), "--device", "cuda:99"]) == 2
    assert "--device cuda:99" in capsys.readouterr().err


def test_every_option_has_help():
    result = subprocess.run(
        [sys.executable, "-m", "attnx", "translate", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    for option in ("--model", "--input", "--output", "--search.help", "--max_tokens", "--device"):
        assert option in result.stdout
    search = subprocess.run(
        [sys.executable, "-m", "attnx", "translate", "--search.help", "SearchConfig"],
        capture_output=True,
        text=True,
    )
    assert "--search.beam" in search.stdout and "--search.alpha" in search.stdout
    assert "Beam size; 1 = greedy search." in search.stdout  # the dataclass's own field documentation


def test_attention_command_writes_a_png_of_every_head(checkpoint, tmp_path, capsys):
    out = tmp_path / "attn.png"
    argv = [
        "attention",
        "--model",
        str(checkpoint),
        "--text",
        "A man in an orange hat.",
        "--output",
        str(out),
    ]
    assert attnx_main([*argv, "--search.beam", "2"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(out).shape
    assert width > 600 and height > 400
    assert f"wrote {out}" in capsys.readouterr().out
    assert attnx_main([*argv[:-2], "--layer", "9"]) == 2
    assert "layer 9 does not exist" in capsys.readouterr().err


def test_an_existing_output_is_kept_unless_force(checkpoint, tmp_path, capsys):
    """The output file is the user's until --force: a translation run never truncates it, not even when it is
    the input file itself; with --force the input is read whole before it is replaced."""
    src = tmp_path / "in.txt"
    src.write_text("A dog runs.\nTwo men.\n", encoding="utf-8")
    mine = tmp_path / "figure.png"
    mine.write_bytes(b"the user's figure")
    translate = ["translate", "--model", str(checkpoint), "--input", str(src), "--output", str(src), *FAST]
    assert attnx_main(translate) == 1
    assert "--output " + str(src) + " already exists" in capsys.readouterr().err
    assert src.read_text(encoding="utf-8") == "A dog runs.\nTwo men.\n"
    attention = ["attention", "--model", str(checkpoint), "--text", "A dog.", "--output", str(mine), *FAST]
    assert attnx_main(attention) == 1
    assert mine.read_bytes() == b"the user's figure"

    assert attnx_main([*translate, "--force"]) == 0
    assert len(src.read_text(encoding="utf-8").splitlines()) == 2
    umask = os.umask(0)
    os.umask(umask)
    assert src.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() would create it, not private
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".attnx.tmp")]
    assert attnx_main([*attention, "--force"]) == 0
    assert mine.read_bytes().startswith(b"\x89PNG")

"""``attnx translate``: one line out per line in, same order, whatever the input looks like."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnx.inference.search import SearchConfig
from attnx.inference.translate import main, split_segments, token_batches, translate_lines

LONG = " ".join(["A man in a blue shirt is standing on a ladder cleaning windows."] * 30)
LINES = [
    "A man rides a bike.",
    "",
    "   \t ",
    "Ένας άντρας οδηγεί ποδήλατο.",
    "一个男人在骑自行车。",
    "🚲🚲 on the street 🎉",
    LONG,
    "Two dogs play in the snow.",
    "",
]
FAST = ["--beam", "2", "--max_len_b", "6"]


def test_token_batches_respect_the_budget_and_cover_every_line_once():
    lengths = [5, 30, 2, 9, 9, 50, 1, 70]
    batches = list(token_batches(lengths, max_tokens=60))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 60
    assert [len(b) for b in batches] == [5, 1, 1, 1]  # shortest first; a line over budget goes alone


def test_split_segments_counts_lines_like_wc_plus_a_final_unterminated_one():
    assert split_segments("") == []
    assert split_segments("a\n\nb\n") == ["a", "", "b"]
    assert split_segments("a\r\nb") == ["a", "b"]
    assert split_segments("a\u2028b\x0cc\n") == ["a\u2028b\x0cc"]  # only \n ends a line


def test_translate_file_keeps_line_count_and_order(checkpoint, loaded, tmp_path, capsys):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    assert main(["--ckpt_path", str(checkpoint), "--input", str(src), "--output", str(out), *FAST]) == 0
    err = capsys.readouterr().err
    assert "line 7" in err and "truncated" in err  # the long line, with a warning on stderr

    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and len(got) - 1 == len(LINES)
    got = got[:-1]
    for line, translation in zip(LINES, got, strict=True):
        assert (translation == "") == (line.strip() == "")
    # order: each line translated on its own gives the same output at the same position
    config = SearchConfig(beam=2, max_len_b=6)
    alone = [translate_lines(loaded, [line], config)[0] for line in LINES]
    assert got == alone
    assert len(set(got) - {""}) > 1


def test_small_token_budget_gives_the_same_translations(loaded):
    config = SearchConfig(beam=2, max_len_b=6)
    assert translate_lines(loaded, LINES, config, max_tokens=8) == translate_lines(loaded, LINES, config)


def test_translate_command_reads_stdin_and_writes_stdout(checkpoint):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    text = "A girl is jumping.\n\nZwei Hunde.\nlast line without newline"
    result = subprocess.run(
        [sys.executable, "-m", "attnx", "translate", "--ckpt_path", str(checkpoint), *FAST, "--beam", "1"],
        input=text.encode("utf-8"),
        capture_output=True,
        env=env,
        check=True,
    )
    out = result.stdout.decode("utf-8").split("\n")
    assert len(out) == 5 and out[-1] == "" and out[1] == ""


def test_bad_checkpoint_exits_2_with_the_reason_and_no_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    src = tmp_path / "in.txt"
    src.write_text("hello\n", encoding="utf-8")
    assert main(["--ckpt_path", str(bad), "--input", str(src)]) == 2
    err = capsys.readouterr().err
    assert "bad.ckpt" in err and "cannot be read" in err and "Traceback" not in err
    assert main(["--ckpt_path", str(tmp_path / "missing.ckpt"), "--input", str(src)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_every_option_has_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for option in ("--ckpt_path", "--input", "--output", "--beam", "--alpha", "--max_tokens", "--device"):
        assert option in text
    assert text.count("(default") >= 7


def test_missing_input_file_is_a_usage_error(checkpoint, tmp_path: Path):
    with pytest.raises(SystemExit) as exit_info:
        main(["--ckpt_path", str(checkpoint), "--input", str(tmp_path / "nope.txt")])
    assert exit_info.value.code == 2

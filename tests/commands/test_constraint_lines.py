"""`attnx translate --constraints FILE` and `--constraint TEXT`: each line's phrases met and banned, the
CTranslate2 hand-over, and every bad input refused in one line naming the file and line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from attnx.cli import main as attnx_main
from attnx.commands.constraint_lines import ConstraintLines
from attnx.errors import ConfigError
from attnx.inference.phrases import PhraseConstraints

LINES = ["A man is walking a dog in the park.", "Two children play with a ball.", "", "A woman reads a book."]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_lines_are_json_objects_or_tab_separated_phrases_and_inline_repeats_one():
    terms = ConstraintLines("c.txt", None)
    parsed = terms.parse(['{"include": ["Hund"], "ordered": true}', "Ball\tKinder", ""], 3, 3)
    assert parsed == [
        PhraseConstraints(("Hund",), (), True),
        PhraseConstraints(("Ball", "Kinder")),
        PhraseConstraints(),
    ]
    inline = ConstraintLines(None, '{"exclude": ["Frau"]}')
    assert inline.parse(None, 1, 2) == [PhraseConstraints((), ("Frau",))] * 2
    with pytest.raises(ConfigError, match=r"^--constraints c.txt line 4: not a JSON object"):
        terms.parse(['{"include": ["a"]}', '{"include": ["Hund"'], 3, 2)
    with pytest.raises(ConfigError, match=r'^--constraints c.txt line 1: an empty phrase in "include"'):
        terms.parse(['{"include": [" "]}'], 1, 1)
    with pytest.raises(ConfigError, match="unknown constraint key 'includes'"):
        terms.parse(['{"includes": ["a"]}'], 1, 1)
    with pytest.raises(ConfigError, match="give one"):
        ConstraintLines("c.txt", "Hund")


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    return write(tmp_path / "in.en", LINES)


def translate(trained: Path, inputs: Path, out: Path, *argv: str) -> int:
    return attnx_main(
        [
            "translate",
            "--model",
            str(trained),
            "--input",
            str(inputs),
            "--output",
            str(out),
            "--device",
            "cpu",
            *argv,
        ]
    )


def test_translate_meets_each_lines_phrases_and_bans_the_excluded(trained, inputs, tmp_path):
    cons = write(
        tmp_path / "c.jsonl",
        ['{"include": ["Hund"]}', "Ball\tKinder", "", '{"exclude": ["Frau"], "include": ["Buch"]}'],
    )
    out = tmp_path / "out.jsonl"
    assert translate(trained, inputs, out, "--constraints", str(cons), "--format", "jsonl") == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    texts = [row["hypotheses"][0]["text"] if "hypotheses" in row else row["text"] for row in rows]
    assert "Hund" in texts[0]
    assert "Ball" in texts[1] and "Kinder" in texts[1]
    assert texts[2] == ""
    assert "Buch" in texts[3] and "Frau" not in texts[3]
    out = tmp_path / "inline.txt"
    assert translate(trained, inputs, out, "--constraint", "Katze") == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert all("Katze" in line for i, line in enumerate(lines) if LINES[i])


@pytest.mark.parametrize(
    ("lines", "argv", "message"),
    [
        (['{"include": ["Hund"]}'], [], "has 4 lines but --constraints"),
        (["", '{"include": [""]}', "", ""], [], r'c.txt line 2: an empty phrase in "include"'),
        (["", "", "", "{oops"], [], r"c.txt line 4: not a JSON object"),
        (["a\tb\tc\td", "", "", ""], [], r"c.txt line 1: 4 phrases to include need a beam of at least 5"),
        (
            [" ".join(["Hund"] * 30), "", "", ""],
            ["--search.max_len_b", "5"],
            r"c.txt line 1: the phrases .* more",
        ),
        (
            ["", '{"include": ["Hund"]}', "", ""],
            ["--search.sampling", "true", "--search.nbest", "2"],  # 2 samples: no word on how many it draws
            r"line 2: phrases to include need beam",
        ),
    ],
)
def test_bad_constraints_are_one_line_naming_file_and_line(
    trained, inputs, tmp_path, capsys, lines, argv, message
):
    cons = write(tmp_path / "c.txt", lines)
    out = tmp_path / "out.txt"
    assert translate(trained, inputs, out, "--constraints", str(cons), *argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert re.search(message, err[0]), err[0]
    assert not out.exists()


def test_a_ctranslate2_model_hands_phrases_to_the_checkpoint_beside_it_or_refuses(
    trained, ct2_export, inputs, tmp_path, capsys
):
    export = tmp_path / "export"
    shutil.copytree(ct2_export, export)
    out = tmp_path / "out.txt"
    argv = ["--constraint", "Hund", "--search.length_penalty", "fairseq"]
    assert translate(export, inputs, out, *argv) == 2  # no checkpoint beside it
    err = capsys.readouterr().err
    assert "cannot decode with phrases to include" in err and len(err.strip().splitlines()) == 1
    shutil.copy(trained, tmp_path / json.loads((export / "attnx.json").read_text())["source_checkpoint"])
    assert translate(export, inputs, out, *argv) == 0
    assert "decoding with attnx's own engine from" in capsys.readouterr().err
    assert all("Hund" in line for i, line in enumerate(out.read_text().splitlines()) if LINES[i])
    # phrases to exclude stay with CTranslate2 (its suppress_sequences)
    out2 = tmp_path / "out2.txt"
    assert translate(export, inputs, out2, "--constraint", '{"exclude": ["Mann"]}', *argv[2:]) == 0
    assert "own engine" not in capsys.readouterr().err
    assert all("Mann" not in line for line in out2.read_text().splitlines())


def test_a_translation_the_maximum_length_ends_before_its_phrases_says_so(trained, tmp_path, capsys):
    """A phrase no hypothesis can write (its token twice under no_repeat_ngram 1) ends at the maximum length:
    the jsonl names the phrase unmet and one warning line names the input line."""
    inputs = write(tmp_path / "in.en", ["A dog.", "A cat."])
    out = tmp_path / "out.jsonl"
    argv = ["--constraints", str(write(tmp_path / "c.txt", ["", "Katze Katze"])), "--format", "jsonl"]
    argv += ["--search.no_repeat_ngram", "1", "--search.max_len_b", "8"]
    assert translate(trained, inputs, out, *argv) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert "unmet" not in rows[0]["hypotheses"][0] and rows[1]["hypotheses"][0]["unmet"] == [0]
    err = [line for line in capsys.readouterr().err.splitlines() if "maximum output length" in line]
    assert len(err) == 1 and err[0].endswith("line 2"), err

"""`attnx translate --constraints FILE` and `--constraint TEXT`: each line's phrases met and banned, the
CTranslate2 hand-over, and every bad input refused in one line naming the file and line."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from attnx.cli import main as attnx_main
from attnx.commands.constraint_lines import ConstraintLines
from attnx.errors import ConfigError
from attnx.inference.phrases import PhraseConstraints
from tests.commands.conftest import stop_in_the_second_chunk

LINES = ["A man is walking a dog in the park.", "Two children play with a ball.", "", "A woman reads a book."]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def words(text: str) -> list[str]:
    """The words of a translation: a phrase to exclude is banned as a word, not inside a compound."""
    return re.findall(r"\w+", text)


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


def test_a_constraints_file_is_read_ahead_for_its_first_phrase_to_include_and_any_to_exclude(tmp_path):
    """What decides the engines of a run before its first line: a file is read ahead, a pipe cannot be."""
    cons = write(tmp_path / "c.txt", ["", '{"exclude": ["Frau"]}', "Hund", '{"include": ["Ball"]}'])
    assert ConstraintLines(str(cons), None).ahead() == (f"--constraints {cons} line 3", True)
    assert ConstraintLines(str(write(cons, ["", '{"exclude": ["Frau"]}'])), None).ahead() == (None, True)
    assert ConstraintLines(str(write(cons, ["", ""])), None).ahead() == (None, False)
    assert ConstraintLines(None, '{"exclude": ["Frau"]}').ahead() == (None, True)
    assert ConstraintLines(None, "Hund").ahead() == ("--constraint", False)
    read, written = os.pipe()
    os.close(written)
    try:
        assert ConstraintLines(f"/dev/fd/{read}", None).ahead() is None
    finally:
        os.close(read)


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
    assert "Buch" in texts[3] and "Frau" not in words(texts[3])
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


def export_beside(ct2_export: Path, tmp_path: Path, checkpoint: Path | None = None) -> Path:
    """A copy of the export in `tmp_path`, with `checkpoint` beside it under the name the export records."""
    export = tmp_path / "export"
    shutil.copytree(ct2_export, export)
    if checkpoint is not None:
        shutil.copy(
            checkpoint, tmp_path / json.loads((export / "attnx.json").read_text())["source_checkpoint"]
        )
    return export


def test_a_ctranslate2_model_hands_lines_with_constraints_to_the_checkpoint_beside_it_or_refuses(
    trained, ct2_export, inputs, tmp_path, capsys
):
    """Phrases to include need the checkpoint; phrases to exclude go to it too (attnx matches them as words of
    the output), and without it stay with CTranslate2's bans, said in one line."""
    export = export_beside(ct2_export, tmp_path)
    out = tmp_path / "out.txt"
    argv = ["--constraint", "Hund", "--search.length_penalty", "fairseq"]
    assert translate(export, inputs, out, *argv) == 2  # no checkpoint beside it
    err = capsys.readouterr().err
    assert "cannot decode with phrases to include" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    excluded = ["--constraint", '{"exclude": ["Mann"]}']
    assert translate(export, inputs, out, *excluded) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "decoded by CTranslate2, which bans only each phrase's own segmentation" in err[0]
    )
    assert all("Mann" not in words(line) for line in out.read_text().splitlines())
    shutil.copy(trained, tmp_path / json.loads((export / "attnx.json").read_text())["source_checkpoint"])
    for given, out in ((argv, tmp_path / "in.txt"), (excluded, tmp_path / "ex.txt")):
        assert translate(export, inputs, out, *given) == 0
        err = capsys.readouterr().err
        assert "lines with constraints are decoded by attnx's engine from" in err, err
        assert "sha256 matches); the others by CTranslate2" in err
    assert all(
        "Hund" in line for i, line in enumerate((tmp_path / "in.txt").read_text().splitlines()) if LINES[i]
    )
    assert all("Mann" not in words(line) for line in (tmp_path / "ex.txt").read_text().splitlines())


def test_a_checkpoint_replaced_beside_the_export_is_refused_naming_both_digests(
    trained, ct2_export, inputs, tmp_path, capsys
):
    """Another model under the checkpoint's name would decode the lines with constraints while attnx names
    the checkpoint the export was made from."""
    from attnx.checkpoint import load_model, save_model

    loaded = load_model(trained)
    with torch.no_grad():
        for weight in loaded.model.parameters():
            weight.mul_(0.5)
    other = tmp_path / "other.ckpt"
    save_model(other, loaded.model, loaded.config, loaded.tokenizer)
    export = export_beside(ct2_export, tmp_path, other)
    out = tmp_path / "out.txt"
    assert translate(export, inputs, out, "--constraint", "Hund") == 2
    err = capsys.readouterr().err.strip().splitlines()
    recorded, now = (
        hashlib.sha256(trained.read_bytes()).hexdigest(),
        hashlib.sha256(other.read_bytes()).hexdigest(),
    )
    assert len(err) == 1 and not out.exists()
    assert f"was exported from a checkpoint with sha256 {recorded}" in err[0]
    assert f"now has {now}" in err[0] and "give --model the checkpoint it was exported from" in err[0]


def test_an_export_that_records_no_checkpoint_digest_is_handed_over_with_a_note(
    trained, ct2_export, inputs, tmp_path, capsys
):
    export = export_beside(ct2_export, tmp_path, trained)
    meta = json.loads((export / "attnx.json").read_text())
    for key in ("source_checkpoint_sha256", "source_checkpoint_bytes"):  # what attnx wrote before
        meta.pop(key, None)
    (export / "attnx.json").write_text(json.dumps(meta))
    out = tmp_path / "out.txt"
    assert translate(export, inputs, out, "--constraint", "Hund") == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "sha256" in line]
    assert len(err) == 1 and "lines with constraints are decoded by attnx's engine from" in err[0]
    assert f"which cannot be checked: {export} records no sha256 of it" in err[0]


CONSTRAINED = ["", '{"include": ["Hund"]}', "", '{"exclude": ["Frau"]}', "", "Ball"]
"""Constraints of six input lines: lines 2, 4 and 6 have some (4 only phrases to exclude)."""


def engines_of_lines(monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> dict[int, list[str]]:
    """Input line (1-based) → the engines that decoded it, filled as attnx translate runs in this process."""
    from attnx.inference.ctranslate2 import CTranslate2Translator
    from attnx.inference.eager import EagerTranslator

    decoded: dict[int, list[str]] = {}
    number: dict[tuple[int, ...], int] = {}

    def spy(cls, name):
        real = cls.generate_ids

        def generate_ids(self, ids, *args, **kw):
            if not number:
                number.update({tuple(x): i + 1 for i, x in enumerate(self.encode(lines))})
            for x in ids:
                decoded.setdefault(number[tuple(x)], []).append(name)
            return real(self, ids, *args, **kw)

        monkeypatch.setattr(cls, "generate_ids", generate_ids)

    spy(CTranslate2Translator, "ctranslate2")
    spy(EagerTranslator, "attnx")
    return decoded


def test_which_engine_decodes_a_line_is_decided_once_whatever_the_chunks_and_on_a_resume(
    trained, ct2_export, tmp_path, capsys, monkeypatch
):
    """Lines with constraints (to include or exclude) by attnx's engine over the checkpoint, the others by
    CTranslate2, in input order: one chunk a line, one chunk for all, and a run stopped after its first
    chunk and continued all decode each line with the same engine, and give the same output."""

    lines = [*LINES[:2], "The dog runs.", LINES[3], "A girl sings.", "Two dogs play with a ball."]
    inputs = write(tmp_path / "in.en", lines)
    cons = write(tmp_path / "c.jsonl", CONSTRAINED)
    export = export_beside(ct2_export, tmp_path, trained)
    expected = {
        1: ["ctranslate2"],
        2: ["attnx"],
        3: ["ctranslate2"],
        4: ["attnx"],
        5: ["ctranslate2"],
        6: ["attnx"],
    }
    outputs = []
    for size in ("1", "1000"):
        decoded = engines_of_lines(monkeypatch, lines)
        out = tmp_path / f"out{size}.txt"
        assert translate(export, inputs, out, "--constraints", str(cons), "--buffer_size", size) == 0
        assert decoded == expected, size
        said = [line for line in capsys.readouterr().err.splitlines() if "decoded by" in line]
        assert len(said) == 1 and said[0].startswith("attnx translate: lines with constraints are decoded")
        outputs.append(out.read_bytes())
        monkeypatch.undo()
    assert outputs[0] == outputs[1]
    texts = outputs[0].decode().splitlines()
    assert "Hund" in texts[1] and "Frau" not in words(texts[3]) and "Ball" in texts[5]

    resumed = tmp_path / "resumed.txt"
    argv = ["--constraints", str(cons), "--buffer_size", "2"]
    stop_in_the_second_chunk(monkeypatch)
    assert translate(export, inputs, resumed, *argv) == 130
    monkeypatch.undo()
    capsys.readouterr()
    decoded = engines_of_lines(monkeypatch, lines)
    assert translate(export, inputs, resumed, *argv) == 0
    assert "continuing after the 2 line(s) already in" in capsys.readouterr().err
    assert decoded == {k: v for k, v in expected.items() if k > 2}
    assert resumed.read_bytes() == outputs[0]


def test_a_continued_run_whose_engines_would_differ_is_refused(
    trained, ct2_export, tmp_path, capsys, monkeypatch
):
    """Stopped while attnx's engine decoded its lines with phrases to exclude, a run is not continued by
    CTranslate2's bans once the checkpoint is gone: one line says so, and the partial output is kept."""

    inputs = write(tmp_path / "in.en", LINES)
    cons = write(tmp_path / "c.jsonl", ['{"exclude": ["Mann"]}', "", "", '{"exclude": ["Frau"]}'])
    export = export_beside(ct2_export, tmp_path, trained)
    out = tmp_path / "out.txt"
    argv = ["--constraints", str(cons), "--buffer_size", "2"]
    stop_in_the_second_chunk(monkeypatch)
    assert translate(export, inputs, out, *argv) == 130
    monkeypatch.undo()
    partial = tmp_path / "out.txt.attnx-partial"
    kept = partial.read_bytes()
    (tmp_path / trained.name).unlink()
    capsys.readouterr()
    assert translate(export, inputs, out, *argv) == 2
    said = capsys.readouterr().err.strip().splitlines()
    notes, err = said[:-1], said[-1:]  # the precision the run continues in, then the refusal, one line
    assert all(
        note.startswith("attnx translate: decoding in float32, as the interrupted run") for note in notes
    )
    assert len(notes) <= 1 and f"{partial} holds 2 line(s) of an interrupted run" in err[0], said
    assert "with attnx's engine from" in err[0] and "this run would decode them with CTranslate2" in err[0]
    assert partial.read_bytes() == kept and not out.exists()


def test_lines_with_and_without_constraints_come_back_in_input_order():
    from attnx.commands.constraint_lines import ByConstraints
    from attnx.inference.hypothesis import Hypothesis
    from attnx.inference.lexical import PhraseIds

    class Engine:
        search, tokenizer, max_positions = None, None, 64

        def __init__(self, mark):
            self.mark, self.calls = mark, []

        def generate_ids(self, ids, prefixes=None, progress=False, scores=True, constraints=None):
            self.calls.append((ids, prefixes, constraints))
            return [[Hypothesis([self.mark, *x], 0.0, 0.0)] for x in ids]

    base, constrained = Engine(0), Engine(1)
    phrase = PhraseIds([[7]])
    both = ByConstraints(base, constrained)
    found = both.generate_ids(
        [[10], [11], [12], [13]], [[], [2], [], [3]], constraints=[None, phrase, phrase, None]
    )
    assert [hyps[0].tokens for hyps in found] == [[0, 10], [1, 11], [1, 12], [0, 13]]
    assert constrained.calls == [([[11], [12]], [[2], []], [phrase, phrase])]
    assert base.calls == [([[10], [13]], [[], [3]], None)]
    assert [h[0].tokens for h in both.generate_ids([[5]])] == [[0, 5]]


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
    err = [line for line in capsys.readouterr().err.splitlines() if "no_repeat_ngram 1 forbids" in line]
    assert len(err) == 1 and err[0].endswith("line 2"), err

"""``attnx translate``, ``attnx attention`` and ``attnx score`` as a user runs them."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import matplotlib.image
import pytest

import attnx
from attnx.cli import main as attnx_main
from attnx.commands.streaming import run_options
from attnx.inference.config import SearchConfig
from tests.commands.conftest import stop_in_the_second_chunk
from tests.inference.test_phrases import FORMS
from tests.inference.test_translator import LINES, spelled

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
        [
            sys.executable,
            "-m",
            "attnx",
            "translate",
            "--model",
            str(checkpoint),
            *FAST[2:],
            "--search.beam",
            "1",
        ],
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


# ------------------------------------------------------------------------------ output formats and scores

SHORT = ["--search.max_len_a", "0", "--search.max_len_b", "4"]
SOURCES = ["A dog runs.", "", "Two men sit on a bench.", "A girl in a red coat."]


def run_translate(*argv: str, stdin: bytes | None = None, cwd: Path | None = None, check: bool = True):
    """`attnx translate ARGV` in a subprocess (one thread), with stdout and stderr as text; in 32-true unless
    ARGV says otherwise, as the test process's expectations are (its `auto` is pinned to fp32)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    fp32 = [] if "--precision" in argv else ["--precision", "32-true"]
    result = subprocess.run(
        [sys.executable, "-m", "attnx", "translate", *argv, *fp32],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=cwd,
    )
    if check:
        assert result.returncode == 0, result.stderr.decode()
    return result


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.slow
def test_jsonl_holds_every_hypothesis_best_first_with_its_scores(checkpoint, tmp_path):
    src, out = write_lines(tmp_path / "in.txt", SOURCES), tmp_path / "out.jsonl"
    search = ["--search.beam", "3", "--search.nbest", "3", "--search.alignment", "true", *SHORT]
    argv = ["--model", str(checkpoint), "--input", str(src), "--output", str(out), *search]
    run_translate(*argv, "--format", "jsonl", "--token_scores", "true")
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(SOURCES)
    translator = attnx.load(
        checkpoint, search=SearchConfig(beam=3, nbest=3, alignment=True, max_len_a=0, max_len_b=4)
    )
    expected = translator.generate(SOURCES)
    for record, hyps, line in zip(records, expected, SOURCES, strict=True):
        got = record["hypotheses"]
        assert [h["text"] for h in got] == [h.text for h in hyps]  # the command is the Python API
        assert [h["score"] for h in got] == sorted((h["score"] for h in got), reverse=True)  # best first
        if not line:
            assert got == [{"text": "", "score": 0.0, "log_prob": 0.0, "tokens": 0, "alignment": []}]
            continue
        assert len(got) == 3
        for h, hyp in zip(got, hyps, strict=True):
            assert h["score"] == pytest.approx(hyp.score) and h["log_prob"] == pytest.approx(hyp.log_prob)
            assert h["tokens"] == len(hyp.tokens) and h["log_prob"] <= h["score"] < 0  # lp >= 1
            assert len(h["pieces"]) == len(h["token_log_probs"]) == h["tokens"] + 1
            assert h["pieces"][-1] == "</s>"
            assert sum(h["token_log_probs"]) == pytest.approx(h["log_prob"], abs=1e-4)
            assert all(0 <= j < h["tokens"] and i >= 0 for i, j in h["alignment"])


MOSES = re.compile(r"^(\d+) \|\|\| (.*?) \|\|\| (\d+-\d+(?: \d+-\d+)*|) ?\|\|\| F0= (\S+) \|\|\| (\S+)$")


@pytest.mark.slow
def test_moses_nbest_lines_parse_and_carry_the_same_scores(checkpoint, tmp_path):
    src = write_lines(tmp_path / "in.txt", SOURCES)
    search = ["--search.beam", "2", "--search.nbest", "2", "--search.alignment", "true", *SHORT]
    base = ["--model", str(checkpoint), "--input", str(src), *search]
    moses = run_translate(*base, "--format", "moses").stdout.decode("utf-8").splitlines()
    jsonl = [json.loads(x) for x in run_translate(*base, "--format", "jsonl").stdout.decode().splitlines()]
    expected = [(i, h) for i, r in enumerate(jsonl) for h in r["hypotheses"]]
    assert len(moses) == len(expected)
    for line, (i, h) in zip(moses, expected, strict=True):
        found = MOSES.match(line)
        assert found, line
        assert int(found.group(1)) == i and found.group(2) == h["text"]
        assert float(found.group(4)) == h["log_prob"] and float(found.group(5)) == h["score"]
        assert found.group(3) == " ".join(f"{a}-{b}" for a, b in h["alignment"])


def test_text_nbest_writes_marian_s_id_text_score_lines_and_sampling_alone_says_what_it_draws(
    checkpoint, tmp_path
):
    src = write_lines(tmp_path / "in.txt", SOURCES)
    base = ["--model", str(checkpoint), "--input", str(src), "--beam", "2", "--nbest", "2", *SHORT]
    text = run_translate(*base).stdout.decode("utf-8").splitlines()
    jsonl = [json.loads(x) for x in run_translate(*base, "--format", "jsonl").stdout.decode().splitlines()]
    expected = [
        f"{i} ||| {h['text']} ||| {h['score']!r}" for i, r in enumerate(jsonl) for h in r["hypotheses"]
    ]
    assert text == expected and text[0].startswith("0 ||| ")
    sampled = run_translate(
        "--model", str(checkpoint), "--input", str(src), "--sampling", "--search.seed", "1", *SHORT
    )
    assert len(sampled.stdout.decode().splitlines()) == len(SOURCES)
    assert "attnx translate: sampling draws 1 sample per input (search.nbest)" in sampled.stderr.decode()


def test_mbr_writes_each_distinct_candidate_with_its_expected_utility_best_first(checkpoint, tmp_path):
    src = write_lines(tmp_path / "in.txt", SOURCES)
    base = [
        "--model",
        str(checkpoint),
        "--input",
        str(src),
        "--search.mbr",
        "6",
        "--search.seed",
        "3",
        *SHORT,
    ]
    records = [json.loads(x) for x in run_translate(*base, "--format", "jsonl").stdout.decode().splitlines()]
    plain = run_translate(*base).stdout.decode("utf-8").splitlines()
    moses = run_translate(*base, "--format", "moses").stdout.decode("utf-8").splitlines()
    assert len(records) == len(plain) == len(SOURCES)
    assert plain == [r["hypotheses"][0]["text"] for r in records]  # the text output is MBR's choice
    expected = [(i, h) for i, r in enumerate(records) for h in r["hypotheses"]]
    assert len(moses) == len(expected)
    for line, source, record in zip(plain, SOURCES, records, strict=True):
        got = record["hypotheses"]
        if not source:
            assert got == [{"text": "", "score": 0.0, "log_prob": 0.0, "tokens": 0}] and line == ""
            continue
        utilities = [h["expected_utility"] for h in got]
        assert 1 <= len(got) <= 6 and len({h["text"] for h in got}) == len(got)  # distinct candidates
        assert utilities == sorted(utilities, reverse=True) and all(0 <= u <= 100 for u in utilities)
    for line, (i, h) in zip(moses, expected, strict=True):
        assert line.startswith(f"{i} ||| {h['text']} |||")
        if "expected_utility" in h:
            assert f"F0= {h['log_prob']!r} MBR= {h['expected_utility']!r} |||" in line


@pytest.mark.parametrize(
    ("mbr", "need"),
    [("100000", "894.1 GiB"), ("20000", "35.8 GiB")],  # numpy's ArrayMemoryError (851 and 52 GiB) once
)
def test_an_mbr_table_over_the_memory_available_is_one_line_with_the_estimate_and_the_cap(
    checkpoint, tmp_path, capsys, monkeypatch, mbr, need
):
    monkeypatch.setattr("attnx.inference.mbr.available_memory", lambda: 16 * 2**30)
    src = write_lines(tmp_path / "in.txt", SOURCES)
    out = tmp_path / "out.txt"
    argv = ["translate", "--model", str(checkpoint), "--input", str(src), "--output", str(out)]
    assert attnx_main([*argv, "--search.mbr", mbr]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"search.mbr {mbr}: the pairwise utilities of {mbr} candidates take about {need} of memory" in err
    assert "16.0 GiB are available; choose search.mbr 13364 or less" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_plain_text_with_alignments_appends_them_after_three_bars(checkpoint, tmp_path):
    src = write_lines(tmp_path / "in.txt", SOURCES)
    out = run_translate("--model", str(checkpoint), "--input", str(src), "--search.alignment", "true", *SHORT)
    lines = out.stdout.decode("utf-8").split("\n")[:-1]
    assert len(lines) == len(SOURCES) and lines[1] == ""
    for line in (lines[0], lines[2], lines[3]):
        text, bars, pairs = line.rpartition(" ||| ")
        assert bars and all(re.fullmatch(r"\d+-\d+", p) for p in pairs.split())


@pytest.mark.slow
def test_target_scores_the_given_translations(checkpoint, tmp_path):
    targets = ["Ein Hund rennt.", "", "Zwei Männer sitzen auf einer Bank.", "Ein Mädchen."]
    src, tgt = write_lines(tmp_path / "in.txt", SOURCES), write_lines(tmp_path / "tgt.txt", targets)
    base = ["--model", str(checkpoint), "--input", str(src), "--target", str(tgt)]
    plain = run_translate(*base).stdout.decode().splitlines()
    records = [json.loads(x) for x in run_translate(*base, "--format", "jsonl").stdout.decode().splitlines()]
    scored = attnx.load(checkpoint).score(SOURCES, targets)
    assert [float(x) for x in plain] == pytest.approx([h.log_prob for h in scored])
    assert [r["hypotheses"][0]["text"] for r in records] == [h.text for h in scored]
    assert [r["hypotheses"][0]["score"] for r in records] == pytest.approx([h.score for h in scored])


@pytest.mark.slow
def test_a_target_file_of_another_length_is_one_line_and_nothing_is_written(checkpoint, tmp_path):
    src, tgt = write_lines(tmp_path / "in.txt", SOURCES), write_lines(tmp_path / "tgt.txt", ["Ein Hund."])
    out = tmp_path / "out.txt"
    argv = ["--model", str(checkpoint), "--input", str(src), "--output", str(out)]
    result = run_translate(*argv, "--target", str(tgt), check=False)
    err = result.stderr.decode()
    assert result.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{src} has 4 lines but --target {tgt} has 1" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "tgt.txt"]
    # a stream is checked as it is read: the same line, and the partial output removed
    result = subprocess.run(
        [
            "bash",
            "-c",
            'exec "$@" --target <(echo "Ein Hund.")',
            "bash",
            sys.executable,
            "-m",
            "attnx",
            "translate",
            *argv,
            *SHORT,
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "has 1; they must pair up line by line" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "tgt.txt"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--token_scores", "true"], "--token_scores needs --format jsonl"),
        (["--target", "IN", "--prefix", "IN"], "give one of them"),
        (["--target", "IN", "--search.sampling", "true", "--format", "jsonl"], "do not apply"),
        (["--search.beam", "2", "--search.nbest", "3", "--format", "jsonl"], "cannot exceed search.beam"),
        (
            ["--search.sampling", "true", "--search.top_p", "0", "--format", "jsonl"],
            "top_p must be in (0, 1]",
        ),
        (["--weights", "[0.5,0.5]"], "weights need an ensemble"),
        (["--target", "IN", "--search.mbr", "4", "--format", "jsonl"], "--search.mbr do not apply"),
        (["--search.mbr", "6", "--search.mbr_candidates", "nbest"], "raise --search.beam to at least 6"),
        (["--precision", "16-mixed"], "precision 16-mixed decodes on CUDA devices"),
    ],
)
def test_options_that_cannot_work_together_are_one_line(checkpoint, tmp_path, capsys, argv, message):
    src = write_lines(tmp_path / "in.txt", SOURCES)
    out = tmp_path / "out.txt"
    argv = [str(src) if a == "IN" else a for a in argv]
    assert (
        attnx_main(
            ["translate", "--model", str(checkpoint), "--input", str(src), "--output", str(out), *argv]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and len(list(tmp_path.iterdir())) == 1


def test_precision_reaches_the_engine_and_the_partial_output_s_record(checkpoint, tmp_path, monkeypatch):
    from attnx.inference.eager import EagerTranslator

    seen: list[str] = []
    autocast = EagerTranslator.autocast

    def recording(self):
        seen.append(self.precision)
        return autocast(self)

    monkeypatch.setattr(EagerTranslator, "autocast", recording)
    src, out = write_lines(tmp_path / "in.txt", SOURCES), tmp_path / "out.txt"
    argv = ["translate", "--model", str(checkpoint), "--input", str(src), "--output", str(out), *SHORT]
    assert attnx_main([*argv, "--precision", "bf16-mixed"]) == 0
    assert seen and set(seen) == {"bf16-mixed"}
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(SOURCES)
    # what a partial output records: a run continued in another precision would mix two models' outputs
    options = run_options(str(checkpoint), None, None, "text", False, "bf16-mixed")
    assert options["precision"] == "bf16-mixed"
    assert "precision" not in run_options(str(checkpoint), None, None, "text", False)  # as recorded before


def test_a_continued_run_decodes_in_the_precision_it_started_in(checkpoint, tmp_path, capsys, monkeypatch):
    """A run that `auto` started in bf16-mixed, stopped in its second chunk, continues in bf16-mixed with
    `--precision auto` however a probe would choose now (once kept, the choice is the record's), says so in one
    line and writes the lines of the uninterrupted run; continued with another precision given, it starts over,
    saying why in one line."""
    from attnx.inference.eager import EagerTranslator
    from attnx.inference.precision import PrecisionChoice, decoding_probe

    seen: list[str] = []
    autocast = EagerTranslator.autocast
    monkeypatch.setattr(
        EagerTranslator, "autocast", lambda self: seen.append(self.precision) or autocast(self)
    )
    src = write_lines(tmp_path / "in.txt", SOURCES + SOURCES[::-1])  # 8 lines: 4 chunks
    argv = [
        "translate",
        "--model",
        str(checkpoint),
        "--input",
        str(src),
        "--device",
        "cpu",
        "--buffer_size",
        "2",
    ]
    argv += SHORT
    whole, out = tmp_path / "whole.txt", tmp_path / "out.txt"
    assert attnx_main([*argv, "--output", str(whole), "--precision", "bf16-mixed"]) == 0
    probed: list[str] = []

    def interrupted(now: str) -> None:
        stop_in_the_second_chunk(monkeypatch)
        with decoding_probe(lambda device, decoder: PrecisionChoice("bf16-mixed", "injected")):
            assert attnx_main([*argv, "--output", str(out)]) == 130
        monkeypatch.undo()
        monkeypatch.setattr(
            EagerTranslator, "autocast", lambda self: seen.append(self.precision) or autocast(self)
        )
        record = json.loads(out.with_name(out.name + ".attnx-partial.json").read_text(encoding="utf-8"))
        assert record["options"]["precision"] == "bf16-mixed" and record["lines"] == 2
        capsys.readouterr()
        seen.clear()

    interrupted("auto")
    with decoding_probe(
        lambda device, decoder: probed.append(device) or PrecisionChoice("32-true", "injected")
    ):
        assert attnx_main([*argv, "--output", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"attnx translate: decoding in bf16-mixed, as the interrupted run in {out}.attnx-partial did "
        "(--precision auto continues a run in the precision it started in)"
    ), err
    assert f"attnx translate: continuing after the 2 line(s) already in {out}.attnx-partial" in err[1], err
    assert probed == [] and set(seen) == {"bf16-mixed"}
    assert out.read_bytes() == whole.read_bytes()
    out.unlink()
    interrupted("auto")
    assert attnx_main([*argv, "--output", str(out), "--precision", "32-true"]) == 0
    (said,) = [line for line in capsys.readouterr().err.splitlines() if "starting over" in line]
    assert said == (
        f"attnx translate: starting over: {out}.attnx-partial holds 2 line(s) of an interrupted run with other "
        'options (precision "bf16-mixed" -> "32-true"); --precision auto continues a run in the precision it '
        "started in (bf16-mixed)"
    )
    assert set(seen) == {"32-true"}


def test_a_continued_run_of_an_export_decodes_in_the_compute_type_it_started_in(
    checkpoint, tmp_path, capsys, monkeypatch
):
    """The same for an export: its CTranslate2 compute type, chosen by `auto` as the run started, is the one a
    run continued with `--precision auto` loads, whatever the probe would choose now."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from attnx.export import export_ctranslate2
    from attnx.inference.compute_type import compute_type_probe

    other = next(t for t in ctranslate2.get_supported_compute_types("cpu") if t != "float32")
    exported = export_ctranslate2(checkpoint, tmp_path / "ct2")
    src = write_lines(tmp_path / "in.txt", SOURCES + SOURCES[::-1])
    argv = [
        "translate",
        "--model",
        str(exported),
        "--input",
        str(src),
        "--device",
        "cpu",
        "--buffer_size",
        "2",
    ]
    argv += [*SHORT, "--output", str(tmp_path / "out.txt")]

    def fastest(best: str):
        return compute_type_probe(
            lambda directory, device, threads, types: {t: 0.5 if t == best else 1.0 for t in types}
        )

    stop_in_the_second_chunk(monkeypatch)
    with fastest(other):
        assert attnx_main(argv) == 130
    monkeypatch.undo()
    capsys.readouterr()
    loaded = []
    real = attnx.inference.ctranslate2.CTranslate2Translator.load
    monkeypatch.setattr(
        attnx.inference.ctranslate2.CTranslate2Translator,
        "load",
        classmethod(lambda cls, *a, **kw: loaded.append(kw["compute_type"]) or real(*a, **kw)),
    )
    with fastest("float32"):
        assert attnx_main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"attnx translate: decoding in {other}, as the interrupted run in "), err
    assert "continuing after the 2 line(s)" in err[1] and loaded == [other], err


@pytest.mark.slow
def test_an_ensemble_and_a_prefix_reach_the_engine(checkpoint, tmp_path):
    src = write_lines(tmp_path / "in.txt", SOURCES)
    prefixes = write_lines(tmp_path / "prefix.txt", ["Ein", "", "", "Zwei"])
    ensemble = run_translate(
        "--model", f"[{checkpoint},{checkpoint}]", "--weights", "[0.25,0.75]", "--input", str(src), *SHORT
    )
    expected = attnx.load(
        [checkpoint, checkpoint], weights=[0.25, 0.75], search=SearchConfig(max_len_a=0, max_len_b=4)
    )
    assert ensemble.stdout.decode("utf-8").splitlines() == expected.translate(SOURCES)
    forced = run_translate(
        "--model",
        str(checkpoint),
        "--input",
        str(src),
        "--prefix",
        str(prefixes),
        "--format",
        "jsonl",
        "--token_scores",
        "true",
        "--search.max_len_a",
        "0",
        "--search.max_len_b",
        "8",
    )
    first = [json.loads(x)["hypotheses"][0] for x in forced.stdout.decode("utf-8").splitlines()]
    tokenizer = attnx.load(checkpoint).tokenizer
    for hyp, prefix in zip(first, ["Ein", "", "", "Zwei"], strict=True):
        pieces = [tokenizer.sp.id_to_piece(i) for i in tokenizer.encode_batch([prefix])[0]] if prefix else []
        assert hyp.get("pieces", [])[: len(pieces)] == pieces


# --------------------------------------------------------------------------- pipes, FIFOs and encodings


@pytest.mark.slow
def test_a_named_pipe_and_process_substitution_are_read(checkpoint, tmp_path):
    fifo = tmp_path / "lines.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("A dog runs.\nTwo men.\n", encoding="utf-8"))
    writer.start()
    result = run_translate("--model", str(checkpoint), "--input", str(fifo), *SHORT)
    writer.join()
    assert len(result.stdout.decode().splitlines()) == 2
    substituted = subprocess.run(
        [
            "bash",
            "-c",
            'exec "$@" --input <(printf "A dog.\\nA cat.\\nA cow.\\n")',
            "bash",
            sys.executable,
            "-m",
            "attnx",
            "translate",
            "--model",
            str(checkpoint),
            *SHORT,
        ],
        capture_output=True,
        text=True,
    )
    assert substituted.returncode == 0, substituted.stderr
    assert len(substituted.stdout.splitlines()) == 3


@pytest.mark.slow
def test_a_line_arriving_on_a_pipe_is_answered_before_the_input_ends(checkpoint):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "attnx", "translate", "--model", str(checkpoint), *SHORT]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env) as process:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(b"A dog runs.\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], 600)
        answered = bool(ready) and process.stdout.readline().endswith(b"\n")
        process.stdin.close()  # the input ends only now
        process.wait(timeout=600)
    assert answered and process.returncode == 0


def test_input_that_is_not_utf8_is_warned_with_a_count_and_the_first_line(checkpoint, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"A dog runs.\nA \xff cat.\nfine\n\xfe\xfe\n")
    result = run_translate("--model", str(checkpoint), "--input", str(src), *SHORT)
    err = result.stderr.decode()
    assert "2 line(s) of --input" in err and "not valid UTF-8 (the first: line 2)" in err and "U+FFFD" in err
    assert len(result.stdout.decode("utf-8").splitlines()) == 4


# ------------------------------------------------------------------------------- large inputs, resumes

MANY = 600


@pytest.fixture(scope="module")
def many_lines(tmp_path_factory, shared_data) -> Path:
    from tests.inference.conftest import multi30k_lines

    path = tmp_path_factory.mktemp("many") / "many.en"
    lines = multi30k_lines(shared_data, "train.en.gz", MANY)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def resumable_argv(checkpoint: Path, src: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "attnx",
        "translate",
        "--model",
        str(checkpoint),
        "--input",
        str(src),
        "--output",
        str(out),
        "--buffer_size",
        "10",
        "--search.beam",
        "1",
        *SHORT,
    ]


@pytest.fixture(scope="module")
def uninterrupted(checkpoint, many_lines, tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("whole") / "out.txt"
    subprocess.run(
        resumable_argv(checkpoint, many_lines, out),
        check=True,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return out.read_bytes()


def lines_recorded(record: Path) -> int:
    try:
        return json.loads(record.read_text(encoding="utf-8"))["lines"]
    except (OSError, ValueError):
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_an_interrupted_run_keeps_its_lines_and_the_same_command_continues(
    checkpoint, many_lines, uninterrupted, tmp_path, sig
):
    out = tmp_path / "out.txt"
    record = tmp_path / "out.txt.attnx-partial.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = resumable_argv(checkpoint, many_lines, out)
    with subprocess.Popen(argv, stderr=subprocess.PIPE, env=env) as process:
        while lines_recorded(record) < 50 and process.poll() is None:
            time.sleep(0.01)
        process.send_signal(sig)
        _, err = process.communicate(timeout=600)
    done = lines_recorded(record)
    assert 0 < done < MANY, "the run ended before it could be interrupted halfway"
    assert not out.exists()  # the output appears only complete
    partial = (tmp_path / "out.txt.attnx-partial").read_bytes()
    assert uninterrupted.startswith(partial[: len(partial) - (len(partial) - partial.rfind(b"\n") - 1)])
    if sig == signal.SIGTERM:
        assert process.returncode == 143
        last = err.decode().strip().splitlines()[-1]
        assert (
            f"stopped by SIGTERM after {done} of {MANY} line(s)" in last
            and "run the same command again" in last
        )
    else:
        assert process.returncode == -signal.SIGKILL
    again = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stderr
    assert f"continuing after the {done} line(s) already in" in again.stderr
    assert out.read_bytes() == uninterrupted
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_partial_output_is_continued_only_when_it_is_attnx_s_and_the_options_match(
    checkpoint, tmp_path, capsys
):
    src = write_lines(tmp_path / "in.txt", SOURCES * 3)
    out = tmp_path / "out.txt"
    argv = [
        "translate",
        "--model",
        str(checkpoint),
        "--input",
        str(src),
        "--output",
        str(out),
        "--buffer_size",
        "4",
        *SHORT,
    ]
    # a partial file nobody recorded is the user's: refused, kept
    partial = tmp_path / "out.txt.attnx-partial"
    partial.write_text("mine\n", encoding="utf-8")
    assert attnx_main(argv) == 1
    assert "has no record of writing it" in capsys.readouterr().err
    assert partial.read_text(encoding="utf-8") == "mine\n"
    partial.unlink()
    # a run stopped after its first chunk (simulated: its record and partial file as a kill leaves them)
    assert attnx_main(argv) == 0
    done = out.read_bytes()
    out.unlink()
    first_chunk = b"".join(done.splitlines(keepends=True)[:4])
    digest = hashlib.sha256(src.read_bytes()[: len("".join(x + "\n" for x in SOURCES).encode())]).hexdigest()
    options = json.loads(
        json.dumps(run_options(str(checkpoint), None, SearchConfig(max_len_a=0, max_len_b=4), "text", False))
    )
    state = {
        "written_by": "attnx translate",
        "output": str(out),
        "options": options,
        "lines": 4,
        "bytes": len(first_chunk),
        "sha256": hashlib.sha256(first_chunk).hexdigest(),
        "inputs": {"input": {"bytes": len("".join(x + "\n" for x in SOURCES).encode()), "sha256": digest}},
    }
    second_chunk = b"".join(done.splitlines(keepends=True)[4:8])
    pending = {"bytes": len(second_chunk), "sha256": hashlib.sha256(second_chunk).hexdigest()}
    record = tmp_path / "out.txt.attnx-partial.json"
    record.write_text(json.dumps({**state, "pending": pending}), encoding="utf-8")
    partial.write_bytes(first_chunk + second_chunk)  # a kill between the write and its record
    capsys.readouterr()
    assert attnx_main(argv) == 0
    assert "continuing after the 4 line(s)" in capsys.readouterr().err and out.read_bytes() == done
    # text added after what the record counts (not the chunk it names) is a change: refused, kept
    out.unlink()
    record.write_text(json.dumps({**state, "pending": pending}), encoding="utf-8")
    partial.write_bytes(first_chunk + b"half a li")
    assert attnx_main(argv) == 1
    assert "was changed since attnx wrote it" in capsys.readouterr().err
    assert partial.read_bytes() == first_chunk + b"half a li"
    # other options: the partial output is attnx's own, so it starts over, saying why
    (tmp_path / "out.txt.attnx-partial.json").write_text(json.dumps(state), encoding="utf-8")
    partial.write_bytes(first_chunk)
    assert attnx_main([*argv, "--search.beam", "2"]) == 0
    err = capsys.readouterr().err
    assert "starting over" in err and "search.beam 4 -> 2" in err
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(SOURCES) * 3
    # a partial file changed since attnx wrote it is refused and kept
    out.unlink()
    (tmp_path / "out.txt.attnx-partial.json").write_text(json.dumps(state), encoding="utf-8")
    partial.write_bytes(b"X" + first_chunk[1:])
    assert attnx_main(argv) == 1
    assert "was changed since attnx wrote it" in capsys.readouterr().err
    assert partial.read_bytes() == b"X" + first_chunk[1:]


@pytest.mark.slow
def test_sigterm_while_writing_to_a_pipe_says_how_many_lines_were_written(checkpoint, many_lines):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [
        sys.executable,
        "-m",
        "attnx",
        "translate",
        "--model",
        str(checkpoint),
        "--input",
        str(many_lines),
        "--buffer_size",
        "10",
        "--search.beam",
        "1",
        *SHORT,
    ]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as process:
        assert process.stdout is not None
        got = b"".join(process.stdout.readline() for _ in range(10))  # the first chunk arrived
        process.send_signal(signal.SIGTERM)
        rest, err = process.communicate(timeout=600)
    written = len((got + rest).splitlines())
    assert process.returncode == 143 and 10 <= written < MANY
    assert (
        f"stopped by SIGTERM after {written} of {MANY} line(s); {written} line(s) done were handed to standard output"
        in err.decode()
    )


@pytest.mark.slow
def test_score_reads_process_substitution_and_pairs_lines(tmp_path):
    script = 'exec "$@" --hypotheses <(printf "Ein Hund rennt.\\nZwei M\\xe4nner.\\n") --references <(printf "%s\\n" "$REF")'
    command = ["bash", "-c", script, "bash", sys.executable, "-m", "attnx", "score"]
    same = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "REF": "Ein Hund rennt.\nZwei Männer."}
    )
    assert same.returncode == 0, same.stderr
    assert "sacreBLEU BLEU" in same.stdout
    assert "1 line(s) of --hypotheses /dev/fd/" in same.stderr and "(the first: line 2)" in same.stderr
    fewer = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "REF": "Ein Hund rennt."}
    )
    error = [line for line in fewer.stderr.splitlines() if "error" in line]
    assert fewer.returncode == 2 and len(error) == 1
    assert "--hypotheses /dev/fd/" in error[0] and "has 2 lines but --references /dev/fd/" in error[0]


def test_score_reads_gzipped_files_as_download_writes_them(tmp_path, capsys):
    lines = "Ein Hund rennt.\nZwei Männer sitzen.\nEine Frau.\n"
    (tmp_path / "test.hyp").write_text(lines, encoding="utf-8")
    (tmp_path / "test.de.gz").write_bytes(gzip.compress(lines.encode("utf-8")))
    argv = ["score", "--hypotheses", str(tmp_path / "test.hyp"), "--references", str(tmp_path / "test.de.gz")]
    assert attnx_main(argv) == 0
    out, err = capsys.readouterr()
    assert "sacreBLEU BLEU = 100.00" in out and "segments: 3" in out and err == ""


def test_score_sentence_prints_one_line_per_segment_and_the_corpus_on_stderr(tmp_path, capsys):
    import sacrebleu

    hyps, refs = ["Ein Hund rennt.", "Zwei Männer.", ""], ["Ein Hund rennt.", "Zwei Frauen sitzen.", "Ja."]
    (tmp_path / "h").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (tmp_path / "r").write_text("\n".join(refs) + "\n", encoding="utf-8")
    argv = ["score", "--hypotheses", str(tmp_path / "h"), "--references", str(tmp_path / "r"), "--sentence"]
    assert attnx_main(argv) == 0
    out, err = capsys.readouterr()
    expected = [
        (sacrebleu.sentence_bleu(h, [r]).score, sacrebleu.sentence_chrf(h, [r]).score)
        for h, r in zip(hyps, refs, strict=True)
    ]
    assert out.splitlines() == [f"{b:.2f}\t{c:.2f}" for b, c in expected]
    assert "sacreBLEU BLEU" in err and "segments: 3" in err
    assert attnx_main([*argv, "--format", "json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3]
    assert [r["bleu"] for r in records] == pytest.approx([b for b, _ in expected])
    assert [r["chrf"] for r in records] == pytest.approx([c for _, c in expected])


def test_device_auto_decodes_on_cuda_where_there_is_one_and_says_so(
    checkpoint, tmp_path, monkeypatch, capsys
):
    import torch

    import attnx.inference.ctranslate2
    from attnx.commands.translate import decoding_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    device, line = decoding_device("auto", [str(checkpoint)])
    assert device == "cuda" and line is not None and "decoding on cuda (--device auto" in line
    assert decoding_device("cpu", [str(checkpoint)]) == ("cpu", None)  # a device named is taken as it is
    ctranslate2 = pytest.importorskip("ctranslate2")
    monkeypatch.setattr(attnx.inference.ctranslate2, "is_ctranslate2_model", lambda path: True)
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 0)
    assert decoding_device("auto", ["model-ct2"])[0] == "cpu"  # an export: CTranslate2 built without CUDA
    monkeypatch.undo()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    source = tmp_path / "in.txt"
    source.write_text("A dog runs.\n", encoding="utf-8")
    assert attnx_main(["translate", "--model", str(checkpoint), "--input", str(source), *FAST]) == 0
    err = capsys.readouterr().err
    assert "attnx translate: decoding on cpu (--device auto: no CUDA device here)" in err.splitlines()


@pytest.mark.parametrize(
    "search",
    [FAST, [*FAST, "--search.mbr", "2", "--search.mbr_candidates", "nbest"]],  # beam search, MBR decoding
    ids=["beam", "mbr"],
)
def test_translate_decodes_in_the_precision_auto_chooses_and_records_it(
    search, checkpoint, tmp_path, capsys, monkeypatch
):
    import attnx.inference.load as loading
    from attnx.inference.precision import PrecisionChoice, decoding_probe

    used = []
    real_load = loading.load
    monkeypatch.setattr(loading, "load", lambda *a, **kw: used.append(real_load(*a, **kw)) or used[-1])
    source, out = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("A dog runs.\nTwo cats.\n", encoding="utf-8")
    argv = ["translate", "--model", str(checkpoint), "--input", str(source), "--device", "cpu", *search]
    with decoding_probe(
        lambda device, decoder: PrecisionChoice("bf16-mixed", "bf16 products 3.1x fp32 (injected)")
    ):
        assert attnx_main([*argv, "--output", str(out)]) == 0
        assert capsys.readouterr().err.splitlines()[0] == (
            "decoding in bf16-mixed: bf16 products 3.1x fp32 (injected) (--precision 32-true to override)"
        )
        assert attnx_main([*argv, "--precision", "32-true"]) == 0  # given: not probed, not said
        assert "decoding in" not in capsys.readouterr().err
    assert [t.precision for t in used] == ["bf16-mixed", "32-true"]


def export_argv(export: Path, src: Path, out: Path, *argv: str) -> list[str]:
    return [
        "translate",
        "--model",
        str(export),
        "--input",
        str(src),
        "--output",
        str(out),
        "--device",
        "cpu",
        "--precision",
        "32-true",
        *argv,
    ]


def test_search_options_on_an_export_change_the_settings_stored_with_it(ct2_export, tmp_path, capsys):
    """`--beam 2`, `--nbest 2`, `--search.max_len_b`, a config file's `search` on an export change the settings
    stored with it, whose length penalty (CTranslate2's |Y|^alpha) stays: each was refused, the search rebuilt
    over SearchConfig's GNMT default. What CTranslate2 cannot do is still refused in one line."""
    src = write_lines(tmp_path / "in.txt", SOURCES)
    stored = attnx.load(ct2_export, precision="32-true")
    config = tmp_path / "search.yaml"
    config.write_text("search:\n  beam: 2\n  nbest: 2\n", encoding="utf-8")
    for i, (argv, changes) in enumerate(
        [
            (["--beam", "2"], {"beam": 2}),
            (["--nbest", "2", "--search.max_len_b", "8", "--format", "jsonl"], {"nbest": 2, "max_len_b": 8}),
            (["--config", str(config), "--format", "jsonl"], {"beam": 2, "nbest": 2}),
        ]
    ):
        out = tmp_path / f"out{i}.txt"
        assert attnx_main(export_argv(ct2_export, src, out, *argv)) == 0, capsys.readouterr().err
        expected = stored.with_search(**changes)
        assert expected.search.length_penalty == "fairseq"
        lines = out.read_text(encoding="utf-8").splitlines()
        if "jsonl" in argv:
            got = [[h["text"] for h in json.loads(line)["hypotheses"]] for line in lines]
            assert got == [[h.text for h in hyps] for hyps in expected.generate(SOURCES)]
        else:
            assert lines == expected.translate(SOURCES)
    capsys.readouterr()
    for argv, message in [
        (["--search.length_penalty", "gnmt"], "CTranslate2 has only the |Y|^alpha length penalty"),
        (
            ["--sampling", "--search.seed", str(2**32)],
            "search.seed 4294967296: CTranslate2's generator takes",
        ),
    ]:
        assert attnx_main(export_argv(ct2_export, src, tmp_path / "refused.txt", *argv)) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("model", ["checkpoint", "ct2_export"])
def test_seeded_sampling_repeats_and_a_resumed_run_gives_the_uninterrupted_output(
    model, request, tmp_path, capsys, monkeypatch
):
    """`--search.sampling true --search.seed 5`, 2 lines a chunk, with either engine: each chunk draws from a
    seed of its own that every engine's generator takes (an export refused every seeded run: its chunk seeds
    had 63 bits). The same command gives the same lines, and a run stopped by Ctrl+C in its second chunk
    continues, run again, to the output of the run that was not stopped."""

    path = request.getfixturevalue(model)
    src = write_lines(tmp_path / "in.txt", SOURCES + SOURCES[::-1])  # 8 lines: 4 chunks
    seeded = ["--buffer_size", "2", "--search.sampling", "true", "--search.seed", "5", "--search.nbest", "2"]
    seeded += ["--search.max_len_a", "0", "--search.max_len_b", "8"]
    whole, again, resumed = (tmp_path / f"{name}.txt" for name in ("whole", "again", "resumed"))
    for out in (whole, again):
        assert attnx_main(export_argv(path, src, out, *seeded)) == 0, capsys.readouterr().err
    assert whole.read_bytes() == again.read_bytes()
    assert len(whole.read_text(encoding="utf-8").splitlines()) == 2 * 8 - 2  # a blank line: one hypothesis
    stop_in_the_second_chunk(monkeypatch)
    capsys.readouterr()
    assert attnx_main(export_argv(path, src, resumed, *seeded)) == 130
    assert "stopped by Ctrl+C after 2 of 8 line(s)" in capsys.readouterr().err and not resumed.exists()
    monkeypatch.undo()
    assert attnx_main(export_argv(path, src, resumed, *seeded)) == 0
    assert "continuing after the 2 line(s) already in" in capsys.readouterr().err
    assert resumed.read_bytes() == whole.read_bytes()


# --- terminology constraints files ------------------------------------------------------------------------------

TERMS = ["--search.beam", "3", "--search.max_len_b", "6"]
"""Room for two phrases to include (a beam of k holds k - 1)."""


def constrained(checkpoint: Path, src: Path, terms: Path, out: Path, *argv: str) -> int:
    argv = ["--input", str(src), "--output", str(out), "--constraints", str(terms), *TERMS, *argv]
    return attnx_main(["translate", "--model", str(checkpoint), "--format", "jsonl", *argv])


@pytest.mark.parametrize("form", FORMS)
def test_a_constraints_file_line_may_take_every_form(checkpoint, tmp_path, capsys, form):
    """Each form of a line (the docs' list) gives what the Python API gives for the same constraints; only
    `\\n` ends a line, so a U+2028 inside one leaves the file as many lines as the input."""
    line, expected = FORMS[form]
    lines = ["A dog runs.", "Two men."]
    src, terms, out = write_lines(tmp_path / "in.en", lines), tmp_path / "terms.txt", tmp_path / "out.jsonl"
    terms.write_bytes(f"{line}\n\n".encode())
    assert constrained(checkpoint, src, terms, out) == 0, capsys.readouterr().err
    rows = [json.loads(row)["hypotheses"][0] for row in out.read_text(encoding="utf-8").splitlines()]
    api = attnx.load(checkpoint, search=SearchConfig(beam=3, max_len_b=6))
    assert [row["text"] for row in rows] == api.translate(lines, constraints=[expected, None])
    assert "unmet" not in rows[0]
    assert all(spelled(phrase) in rows[0]["text"] for phrase in expected.include), rows[0]["text"]
    if not expected:
        assert rows[0]["text"] == api.translate(lines[:1])[0]


def test_a_blank_input_line_with_phrases_to_include_reports_them_unmet(checkpoint, tmp_path, capsys):
    """Nothing is searched for a blank line: its translation stays blank, its phrases are unmet, and the
    warning counts it."""
    src = write_lines(tmp_path / "in.en", ["A dog runs.", "", "Two men."])
    terms = write_lines(tmp_path / "terms.txt", ["", '["Hund", "Ball"]', '{"exclude": ["Katze"]}'])
    out = tmp_path / "out.jsonl"
    assert constrained(checkpoint, src, terms, out) == 0
    rows = [json.loads(row)["hypotheses"][0] for row in out.read_text(encoding="utf-8").splitlines()]
    assert rows[1]["text"] == "" and rows[1]["unmet"] == [0, 1]
    assert "unmet" not in rows[0] and "unmet" not in rows[2]
    warned = [w for w in capsys.readouterr().err.splitlines() if "phrases to include" in w]
    assert (
        len(warned) == 1
        and warned[0].startswith("attnx translate: warning: 1 ")
        and warned[0].endswith("line 2")
    ), warned

"""bench/bench_constraints_draw.py and bench/bench_constraints.py at toy size: constraints drawn from the
references as the papers draw them, and the report's rows (the attnx side; fairseq is not installed here)."""

from __future__ import annotations

import gzip
import json
import random

from tests.conftest import bench_script

draw_script = bench_script("bench_constraints_draw")
bench = bench_script("bench_constraints")


def test_phrases_are_1_to_3_reference_words_not_overlapping_with_a_fixed_seed():
    words = ["ein", "Mann", "mit", "einem", "roten", "Hut", "sitzt", "auf", "einer", "Bank"]
    for seed in range(50):
        phrases = draw_script.draw(words, 2, 3, random.Random(seed))
        assert len(phrases) == 2
        spans = []
        for p in phrases:
            n = len(p.split())
            assert 1 <= n <= 3
            start = next(i for i in range(len(words)) if words[i : i + n] == p.split())
            spans.append(set(range(start, start + n)))
        assert not spans[0] & spans[1]
    assert draw_script.draw(["Hund"], 2, 3, random.Random(1)) == ["Hund"]  # room for one only


def test_the_draw_writes_one_line_per_reference_and_the_bench_reports_the_attnx_row(
    trained, trained_corpus, tmp_path, capsys
):
    refs = trained_corpus.references("test")[:6]
    sources = trained_corpus.sources("test")[:6]
    ref_file, src_file = tmp_path / "ref.de.gz", tmp_path / "src.en"
    with gzip.open(ref_file, "wt", encoding="utf-8") as f:
        f.write("".join(r + "\n" for r in refs))
    src_file.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    out = tmp_path / "c2.jsonl"
    assert draw_script.main(["--references", str(ref_file), "--phrases", "2", "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 6 and all(1 <= len(r["include"]) <= 2 for r in rows)
    again = tmp_path / "again.jsonl"
    draw_script.main(["--references", str(ref_file), "--phrases", "2", "--output", str(again)])
    assert again.read_text() == out.read_text()  # the seed fixes the draw
    capsys.readouterr()
    argv = ["--model", str(trained), "--source", str(src_file), "--references", str(ref_file)]
    assert bench.main([*argv, "--constraints", str(out), "--precision", "32-true", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("6 sentences, beam 4")
    row = json.loads(lines[1])
    assert row["toolkit"] == "attnx (32-true)" and row["constraints met"].endswith("(100.0%)")
    assert set(row) >= {
        "BLEU unconstrained",
        "BLEU constrained",
        "sent/s unconstrained",
        "sent/s constrained",
    }

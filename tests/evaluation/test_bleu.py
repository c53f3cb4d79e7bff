"""Scores: sacreBLEU exactly as its command line computes it; the paper-style BLEU on a hand example."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnx.cli import main as attnx
from attnx.evaluation.bleu import BleuReport, paper_bleu, paper_tokenize, score
from tests.inference.conftest import multi30k_lines


def sacrebleu_cli(ref: Path, hyp: Path, metric: str) -> str:
    cmd = [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-m", metric, "-b", "-w", "2"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def test_printed_bleu_and_chrf_equal_the_sacrebleu_command_line(shared_data, tmp_path, capsys):
    refs = multi30k_lines(shared_data, "test_2016_flickr.de.gz", 60)
    # a plausible system: some words dropped, some lines swapped with their neighbour
    hyps = [" ".join(r.split()[:-2]) if i % 3 else refs[i ^ 1] for i, r in enumerate(refs)]
    ref, hyp = tmp_path / "ref.de", tmp_path / "hyp.de"
    ref.write_text("\n".join(refs) + "\n", encoding="utf-8")
    hyp.write_text("\n".join(hyps) + "\n", encoding="utf-8")

    assert attnx(["score", "--hypotheses", str(hyp), "--references", str(ref)]) == 0
    printed = capsys.readouterr().out
    bleu = re.search(r"sacreBLEU BLEU = (\S+)", printed).group(1)
    chrf = re.search(r"sacreBLEU chrF2 = (\S+)", printed).group(1)
    assert bleu == sacrebleu_cli(ref, hyp, "bleu")
    assert chrf == sacrebleu_cli(ref, hyp, "chrf")
    assert 10 < float(bleu) < 90
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in printed
    assert "not comparable to sacreBLEU" in printed


def test_paper_style_splits_hyphenated_compounds_as_tensor2tensor():
    assert paper_tokenize("Ein rot-weißes Auto.") == "Ein rot ##AT##-##AT## weißes Auto ."
    # perl's s{(\S)-(\S)}{...}g does not rescan the character it consumed
    assert paper_tokenize("a-b-c") == "a ##AT##-##AT## b-c"


def test_paper_style_bleu_on_a_hand_example():
    hyp, ref = ["ein rot-weißes Auto fährt"], ["ein rot-weißes Auto parkt"]
    # tokens: ein rot ##AT##-##AT## weißes Auto {fährt|parkt}: n-gram precisions 5/6, 4/5, 3/4, 2/3, BP 1
    assert paper_bleu(hyp, ref) == pytest.approx(100 * (5 / 6 * 4 / 5 * 3 / 4 * 2 / 3) ** 0.25)
    # without the compound split the 4-gram precision is 0/1 and multi-bleu gives 0
    report = score(hyp, ref)
    assert report.bleu < report.paper_bleu
    assert isinstance(report, BleuReport) and report.n == 1


def test_paper_style_bleu_is_zero_when_an_ngram_order_has_no_match_like_multi_bleu():
    assert paper_bleu(["a b c d"], ["a b c e"]) == pytest.approx(0.0, abs=1e-9)  # 4-grams: 0/1


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="pair up"):
        score(["a"], ["a", "b"])


def test_sentence_scores_are_sacrebleus_sentence_bleu_and_chrf():
    import sacrebleu

    from attnx.evaluation.bleu import sentence_scores

    hyps, refs = (
        ["Ein Hund rennt im Park.", "Zwei Männer."],
        ["Ein Hund läuft im Park.", "Zwei Frauen sitzen."],
    )
    got, pairs = sentence_scores(hyps, refs), list(zip(hyps, refs, strict=True))
    assert [s.bleu for s in got] == [sacrebleu.sentence_bleu(h, [r]).score for h, r in pairs]
    assert [s.chrf for s in got] == [sacrebleu.sentence_chrf(h, [r]).score for h, r in pairs]
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        sentence_scores(hyps, refs[:1])


@pytest.mark.parametrize("sentence", ["false", "true"])
def test_empty_files_and_unpaired_lines_are_one_line(tmp_path, capsys, sentence):
    """An empty hypothesis file against an empty reference ended in sacrebleu's IndexError; it is one line naming
    both files, as lines that do not pair up are. A file of empty lines is empty translations, and scores."""
    empty, blank, two = tmp_path / "empty.hyp", tmp_path / "blank.hyp", tmp_path / "two.de"
    empty.write_text("")
    blank.write_text("\n\n")
    two.write_text("Ein Hund rennt.\nZwei Männer.\n")
    for hyp, ref, said in [
        (
            empty,
            empty,
            f"--hypotheses {empty} and --references {empty} hold no lines: there is nothing to score",
        ),
        (empty, two, f"--hypotheses {empty} has 0 lines but --references {two} has 2; they must pair up"),
        (two, empty, f"--hypotheses {two} has 2 lines but --references {empty} has 0; they must pair up"),
    ]:
        capsys.readouterr()
        argv = ["score", "--hypotheses", str(hyp), "--references", str(ref), "--sentence", sentence]
        assert attnx(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"attnx score: error: {said}") and len(err.strip().splitlines()) == 1, err
    assert attnx(["score", "--hypotheses", str(blank), "--references", str(two), "--sentence", sentence]) == 0
    assert "sacreBLEU BLEU = 0.00" in "".join(capsys.readouterr())


def test_nothing_to_score_is_refused_in_python_too():
    with pytest.raises(ValueError, match="the hypotheses and the references hold no lines"):
        score([], [])

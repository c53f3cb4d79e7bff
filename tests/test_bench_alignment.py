"""bench/bench_alignment.py (guided alignment's effect): word links from piece links, its two modes, and a
toy-size study that trains, scores and aligns both runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import bench_script

alignment = bench_script("bench_alignment")


def test_piece_links_become_links_of_their_words() -> None:
    # source pieces 0, 1 are word 0, piece 2 word 1; target pieces 0, 1 are words 0, 1
    links = alignment.word_links([(0, 0), (1, 0), (2, 1), (2, 5)], src_words=[0, 0, 1], tgt_words=[0, 1])
    assert links == {(0, 0), (1, 1)}  # two pieces of one word are one link; a piece past the words is none


def test_it_measures_checkpoints_or_runs_a_study_and_says_what_is_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    reference = ["--reference", str(tmp_path / "test.align")]
    for argv, said in (
        (reference, "give --checkpoint (measure these) or --work (train both, then measure)"),
        ([*reference, "--work", str(tmp_path), "--checkpoint", "a.ckpt"], "give --checkpoint"),
        ([*reference, "--work", str(tmp_path)], "the study needs --train_align"),
        (
            [*reference, "--work", str(tmp_path), "--train_align", "t.align", "--json", "a.json"],
            "--json goes with",
        ),
        ([*reference, "--checkpoint", "a.ckpt"], "--checkpoint needs --source and --target"),
    ):
        with pytest.raises(SystemExit) as stopped:
            alignment.main(argv)
        assert stopped.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.slow
def test_a_study_trains_the_model_with_and_without_guided_alignment_then_scores_and_aligns_both(
    shared_data: Path, tmp_path: Path
) -> None:
    train_lines, test_lines = 200, 3
    train_align, test_align = tmp_path / "train.align", tmp_path / "test.align"
    train_align.write_text("0-0\n" * 29_000)  # every pair has a first word each side; cut to the train lines
    test_align.write_text("0-0 1-1\n" * test_lines)
    work = tmp_path / "work"
    out = tmp_path / "table.md"
    argv = ["--work", str(work), "--data", str(shared_data), "--steps", "2", "--train_lines", str(train_lines),
            "--test_lines", str(test_lines), "--vocab_size", "500", "--threads", "1", "--train_align",
            str(train_align), "--reference", str(test_align), "--alignment_lambda", "0.5", "--output", str(out)]  # fmt: skip
    assert alignment.main(argv) == 0

    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert [row[0].strip() for row in rows] == ["paper (label-smoothed loss)", "guided alignment (λ 0.5)"]
    for row in rows:
        assert int(row[4]) == 2  # updates
        aer, precision, recall = (float(cell) for cell in row[5:8])
        assert 0 <= aer <= 1 and 0 <= precision <= 1 and 0 <= recall <= 1
    guided = yaml.safe_load((work / "configs" / "arm_guided_alignment.yaml").read_text())
    assert guided["model"]["loss"]["name"] == "guided_alignment"
    assert guided["data"]["data_dir"] == str(work / "data" / "multi30k_aligned")
    assert (work / "data" / "multi30k_aligned" / "train.align.bin").is_file()
    assert "loss" not in yaml.safe_load((work / "configs" / "arm_paper.yaml").read_text()).get("model", {})

    averaged = sorted(work.glob("runs/*/version_*/checkpoints/averaged.ckpt"))
    assert len(averaged) == 2
    assert alignment.main(argv) == 0  # run again: both runs found again, none trained anew
    assert sorted(work.glob("runs/*/version_*/checkpoints/averaged.ckpt")) == averaged

"""bench/bench_toolbox.py (the README's run against EMA, subword sampling and both): what it reads off the runs'
CSV logs, how validation picks, and a toy-size run of two arms end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import bench_script

toolbox = bench_script("bench_toolbox")


def test_validation_picks_the_averaged_checkpoints_best_valid_bleu_then_the_lower_loss() -> None:
    curves = {
        "readme": {"val/bleu": [(500, 30.0), (1000, 39.0)], "val/loss": [(500, 3.0), (1000, 2.9)]},
        "ema": {"val/bleu": [(500, 37.0), (1000, 35.5)], "val/loss": [(500, 2.8), (1000, 2.8)]},
        "subword sampling": {"val/bleu": [(1000, 20.0)], "val/loss": [(1000, 2.7)]},
    }
    # not the curves' best or last val/bleu (readme's): the averaged checkpoints' scores, loss on a tie
    valid = {"readme": 36.0, "ema": 36.0, "subword sampling": float("nan")}
    assert toolbox.validation_pick(valid, curves) == "ema"
    assert toolbox.validation_pick({"readme": 30.0, "ema": 30.5}, curves) == "ema"
    assert toolbox.validation_pick({"readme": float("nan")}, curves) is None


def test_the_logs_of_a_resumed_run_are_read_in_version_order(tmp_path: Path) -> None:
    header = "epoch,step,train/tokens_per_s,val/bleu,val/loss\n"
    for version, text in ((10, "0,30,,12.5,3.1\n0,31,900,,\n"), (2, "0,10,1000,,\n0,20,,10.0,3.5\n")):
        (tmp_path / f"version_{version}").mkdir()
        (tmp_path / f"version_{version}" / "metrics.csv").write_text(header + text)
    rows = toolbox.logged_rows(tmp_path)
    assert [r["step"] for r in rows] == ["10", "20", "30", "31"]
    assert toolbox.series(rows, "val/bleu") == [(20, 10.0), (30, 12.5)]
    assert toolbox.median(rows, "train/tokens_per_s") == 950.0
    assert toolbox.median(rows, "train/tgt_tokens_per_s") != toolbox.median(
        rows, "train/tgt_tokens_per_s"
    )  # nan


def test_each_arm_adds_its_options_to_the_readme_command() -> None:
    assert toolbox.arm_options("readme", 0.999, 0.1) == {}
    both = toolbox.arm_options("ema + subword sampling", 0.999, 0.1)
    assert both == {"ema": {"decay": 0.999}, "data": {"subword_sampling": {"alpha": 0.1}}}
    assert toolbox.merged({"data": {"data_dir": "d"}}, both)["data"] == {
        "data_dir": "d",
        "subword_sampling": {"alpha": 0.1},
    }
    assert toolbox.user_command("ema + subword sampling", 0.999, 0.1) == (
        "attnx fit --config configs/multi30k_cpu.yaml --ema.decay 0.999 --data.subword_sampling.alpha 0.1"
    )
    assert toolbox.user_command("readme", 0.999, 0.1, seed=3) == (
        "attnx fit --config configs/multi30k_cpu.yaml --seed_everything 3 --data.seed 3"
    )


@pytest.mark.slow
def test_toy_run_of_two_arms_has_their_rows_curves_and_pick(
    shared_data: Path, tmp_path: Path, capsys
) -> None:
    """The README's model for 4 updates on 200 pairs: the numbers mean nothing, the table, figure and pick exist."""
    argv = ["--work", str(tmp_path / "work"), "--data", str(shared_data), "--steps", "4", "--train_lines", "200",
            "--test_lines", "3", "--vocab_size", "500", "--val_check_interval", "2", "--bleu_samples", "3",
            "--arms", "readme,ema + subword sampling", "--threads", "1", "--seed", "2",
            "--output", str(tmp_path / "table.md"), "--figure", str(tmp_path / "curves.png")]  # fmt: skip
    assert toolbox.main(argv) == 0
    out = capsys.readouterr().out
    table = (tmp_path / "table.md").read_text()
    assert "| readme | 4 |" in table  # the run's updates come right after its name
    assert "| ema + subword sampling |" in table and "1.00x |" in table
    assert "chosen by validation (best valid BLEU of the averaged checkpoint): " in table
    assert (tmp_path / "work" / "scores" / "toolbox_readme_seed2_valid.json").is_file()
    assert "--seed_everything 2 --data.seed 2 --ema.decay 0.999 --data.subword_sampling.alpha 0.1" in table
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    assert "The training toolbox on Multi30k en-de, 4 updates of training each, seed 2 (" in out
    run = tmp_path / "work" / "runs" / "toolbox_ema_subword_sampling_seed2"
    used = yaml.safe_load((run / "version_0" / "config.yaml").read_text())
    assert used["seed_everything"] == 2 and used["data"]["seed"] == 2
    logged = toolbox.logged_rows(run)
    assert len(toolbox.series(logged, "val/loss")) == 2  # validations at steps 2 and 4
    fit_log = (tmp_path / "work" / "logs" / "fit_toolbox_ema_subword_sampling_seed2.log").read_text()
    assert (
        "ema: an average of the weights (decay 0.999" in fit_log
        and "subword sampling: BPE-dropout 0.1" in fit_log
    )

"""bench/bench_components.py (today's components against the paper's model): each arm's run under a name of its
own, and a toy-size study run one arm at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import bench_script

components = bench_script("bench_components")


def test_every_arm_runs_under_a_name_of_its_own() -> None:
    names = [components.run_name(arm) for arm in components.ARMS]
    assert len(set(names)) == len(names) and components.run_name("swiglu (d_ff 688)") == "arm_swiglu_d_ff_688"


def test_a_result_older_than_its_input_is_made_again(tmp_path: Path) -> None:
    """A study run again in its folder scores a translation written since its score, and translates again
    with a model written since its translation: a rerun never reports an earlier run's figures."""
    import os

    from attnx_steps import newer

    source, result = tmp_path / "hypotheses", tmp_path / "score.json"
    source.write_text("a\n")
    assert not newer(result, source)  # no result yet
    result.write_text("{}")
    os.utime(source, (1_000_000, 2_000_000))
    os.utime(result, (1_000_000, 1_000_000))
    assert not newer(result, source)  # the source was written after its result
    os.utime(result, (1_000_000, 3_000_000))
    assert newer(result, source)


@pytest.mark.slow
def test_a_study_run_one_arm_at_a_time_keeps_each_arm_s_own_run(shared_data: Path, tmp_path: Path) -> None:
    """`--arms paper`, then `--arms swiglu` in the same work folder: the second trains its own model (not the
    paper's run of the first, found again), then both together reuse the two runs."""
    work = ["--work", str(tmp_path / "work"), "--data", str(shared_data), "--steps", "2", "--train_lines", "200",
            "--test_lines", "2", "--vocab_size", "500", "--threads", "1"]  # fmt: skip

    def rows(arms: str) -> dict[str, list[str]]:
        out = tmp_path / f"{arms}.md"
        assert components.main([*work, "--arms", arms, "--output", str(out)]) == 0
        lines = [line.split(" | ") for line in out.read_text().splitlines() if line.startswith("| ")]
        return {cells[0].strip("| "): cells for cells in lines[1:]}

    paper = rows("paper")["paper"]
    swiglu = rows("swiglu (d_ff 688)")["swiglu (d_ff 688)"]
    assert paper[4] != swiglu[4]  # parameters: three 256 x 688 matrices against two 256 x 1024 ones
    both = rows("paper,swiglu (d_ff 688)")
    assert both["paper"][4] == paper[4] and both["swiglu (d_ff 688)"][4] == swiglu[4]
    assert sorted(p.name for p in (tmp_path / "work" / "runs").iterdir()) == [
        "arm_paper",
        "arm_swiglu_d_ff_688",
    ]

"""bench/bench_memory_options.py (LoRA and activation checkpointing: trainable parameters, peak memory, estimate):
what it reads off `attnx describe`, and a toy-size run of two arms end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnx.cli import main as attnx
from tests.conftest import bench_script

memory = bench_script("bench_memory_options")


def test_the_counts_and_the_estimate_are_read_off_what_describe_prints(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lora.yaml").write_text(
        "model: {transformer: {d_model: 32, d_ff: 64, n_heads: 4, encoder_layers: 2, decoder_layers: 2}}\n"
        "lora: {rank: 4}\n"
    )
    assert attnx(["describe", "--config", "lora.yaml", "--vocab_size", "300", "--device", "cpu"]) == 0
    read = memory.described(capsys.readouterr().out)
    assert read["trainable"] != read["parameters"] and int(read["trainable"].replace(",", "")) > 0
    assert read["memory"].endswith("iB") and read["activations"].endswith("iB")
    with pytest.raises(SystemExit, match="no parameter count or estimate"):
        memory.described("model: nothing\n")


@pytest.mark.slow
def test_toy_run_of_two_arms_measures_each(shared_data: Path, tmp_path: Path, capsys) -> None:
    """The base model for one update of 200 tokens: the numbers mean nothing; LoRA trains fewer parameters."""
    argv = ["--work", str(tmp_path / "work"), "--data", str(shared_data), "--steps", "1", "--max_tokens", "200",
            "--train_lines", "200", "--vocab_size", "500", "--arms", "plain,lora", "--threads", "1",
            "--output", str(tmp_path / "table.md")]  # fmt: skip
    assert memory.main(argv) == 0
    table = (tmp_path / "table.md").read_text()
    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ")
        for line in table.splitlines()
        if line.startswith("| ")
    }
    assert set(rows) >= {"plain", "lora"}
    assert rows["plain"][1] == rows["plain"][2] and rows["lora"][1] != rows["lora"][2]  # trainable vs all
    assert rows["plain"][3].endswith("iB") and rows["lora"][4].endswith("iB")
    assert "describe --config multi30k_cpu --config" in table and "--device cpu" in table
    assert (
        "LoRA (rank 8) and activation checkpointing: the base model, 1 update of 200 tokens"
        in capsys.readouterr().out
    )

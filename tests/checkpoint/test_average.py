"""Checkpoint averaging (§6.1) against a hand average; clear errors for files that cannot be averaged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnx.checkpoint import CheckpointError, average_checkpoints, last_checkpoints, load_model
from attnx.cli import main as attnx
from attnx.data.tokenizer import Tokenizer
from attnx.model import build_transformer
from tests.checkpoints import save_model, train_tokenizer
from tests.conftest import tiny_config


@pytest.fixture
def tokenizer(corpus: Path) -> Tokenizer:
    return Tokenizer.load(corpus / "spm.model")


def write_checkpoints(directory: Path, tokenizer: Tokenizer, steps=(10, 20, 30), **config) -> list[Path]:
    config = tiny_config(vocab_size=tokenizer.vocab_size, **config)
    paths = []
    for step in steps:
        torch.manual_seed(step)
        path = directory / f"step={step}.ckpt"
        save_model(path, build_transformer(config), config, tokenizer)
        paths.append(path)
    return paths


def test_average_equals_hand_average(tmp_path: Path, tokenizer: Tokenizer) -> None:
    paths = write_checkpoints(tmp_path, tokenizer)
    states = [torch.load(p, weights_only=True)["state_dict"] for p in paths]
    averaged = average_checkpoints(paths)
    name = "model.encoder_layers.0.ffn.w1.weight"
    by_hand = (states[0][name] + states[1][name] + states[2][name]) / 3
    torch.testing.assert_close(averaged["state_dict"][name], by_hand)
    assert averaged["state_dict"][name].dtype == torch.float32
    assert set(averaged["state_dict"]) == set(states[0])
    assert averaged["averaged_from"] == [str(p) for p in paths]


def test_command_averages_the_newest_k_into_a_loadable_checkpoint(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    paths = write_checkpoints(tmp_path, tokenizer, steps=(5, 40, 300))
    (tmp_path / "last.ckpt").write_bytes(paths[-1].read_bytes())  # not a step checkpoint: skipped
    assert last_checkpoints(tmp_path, 2) == paths[1:]
    out = tmp_path / "avg" / "averaged.ckpt"
    assert attnx(["average", "--dir", str(tmp_path), "--last", "2", "--output", str(out)]) == 0
    loaded = load_model(out)
    expected = (average_checkpoints(paths[1:])["state_dict"]["model.src_embedding.weight"]).to(torch.float32)
    torch.testing.assert_close(loaded.model.src_embedding.weight, expected)
    assert torch.load(out, weights_only=True)["attnx"]["transformer"]["d_model"] == 32


def test_last_ckpt_counts_when_it_is_the_newest_step(tmp_path: Path, tokenizer: Tokenizer) -> None:
    """A run stopped between two scheduled saves leaves its newest weights in `last.ckpt` alone: `--last k`
    takes it, and a `last.ckpt` that repeats the newest step checkpoint is not counted twice."""
    paths = write_checkpoints(tmp_path, tokenizer, steps=(26, 120, 150))
    last = tmp_path / "last.ckpt"
    for step, expected in ((150, paths[1:]), (179, [*paths[2:], last])):
        checkpoint = torch.load(paths[-1], weights_only=True)
        torch.save({**checkpoint, "global_step": step}, last)
        assert last_checkpoints(tmp_path, 2) == expected
    torch.save({"state_dict": {}, "global_step": 179}, tmp_path / "averaged.ckpt")  # no step in its name
    assert last_checkpoints(tmp_path, 5) == [*paths, last]


def test_checkpoints_before_and_after_a_dropout_change_average(tmp_path: Path, tokenizer: Tokenizer) -> None:
    """A run resumed with another dropout holds one model: its checkpoints average across the change."""
    before = write_checkpoints(tmp_path, tokenizer, steps=(1,), dropout=0.1)
    after = write_checkpoints(tmp_path, tokenizer, steps=(2,), dropout=0.3)
    averaged = average_checkpoints([*before, *after])
    assert averaged["attnx"]["transformer"]["dropout"] == 0.3  # the newest's, as every other setting


def test_checkpoints_of_another_model_are_refused_by_name(tmp_path: Path, tokenizer: Tokenizer) -> None:
    ours = write_checkpoints(tmp_path, tokenizer, steps=(1, 2))
    odd = write_checkpoints(tmp_path / "other", tokenizer, steps=(3,), d_ff=128)
    with pytest.raises(CheckpointError, match=r"other/step=3\.ckpt.*d_ff: 64 vs 128"):
        average_checkpoints([*ours, *odd])


def test_checkpoints_of_another_sentencepiece_model_are_refused_by_name(
    tmp_path: Path, tokenizer: Tokenizer, shared_data: Path
) -> None:
    """The same model config with another tokenizer of the same size: the ids of one are not the other's."""
    import gzip

    with gzip.open(shared_data / "multi30k" / "train.de.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()[5000:7000]
    other = train_tokenizer(lines, tokenizer.vocab_size)
    assert other.vocab_size == tokenizer.vocab_size and other.sha256 != tokenizer.sha256
    ours = write_checkpoints(tmp_path, tokenizer, steps=(1, 2))
    odd = write_checkpoints(tmp_path / "other", other, steps=(3,))
    with pytest.raises(
        CheckpointError, match=r"other/step=3\.ckpt.*another SentencePiece model than .*step=1"
    ):
        average_checkpoints([*ours, *odd])


def test_truncated_and_foreign_files_are_clear_errors(tmp_path: Path, tokenizer: Tokenizer, capsys) -> None:
    (good,) = write_checkpoints(tmp_path, tokenizer, steps=(1,))
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[:500])
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match="truncated"):
        average_checkpoints([good, truncated])
    argv = ["average", "--checkpoints", f"[{good}, {foreign}]", "--output", str(tmp_path / "x.ckpt")]
    assert attnx(argv) == 1
    assert "foreign.ckpt is not an attnx checkpoint" in capsys.readouterr().err


def test_an_existing_output_is_kept_unless_force(tmp_path: Path, tokenizer: Tokenizer, capsys) -> None:
    write_checkpoints(tmp_path, tokenizer)
    out = tmp_path / "notes.ckpt"
    out.write_bytes(b"not ours")
    argv = ["average", "--dir", str(tmp_path), "--last", "2", "--output", str(out)]
    assert attnx(argv) == 1
    assert "already exists" in capsys.readouterr().err and out.read_bytes() == b"not ours"
    assert attnx([*argv, "--force"]) == 0
    assert load_model(out).model is not None

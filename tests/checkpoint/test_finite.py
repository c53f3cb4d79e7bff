"""Weights that are not numbers: every reader of a checkpoint refuses NaN or an infinity in one line naming the
tensor and the file, and averaging never writes such a model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import attnx as api
from attnx.checkpoint import CheckpointError, average_checkpoints, read_checkpoint
from attnx.checkpoint.finite import non_finite_weight
from attnx.checkpoint.format import damaged_member
from attnx.cli import main as attnx
from tests.checkpoints import poison_tensor, reader_commands, tiny_checkpoint

REFUSED = "holds weights that are not finite numbers: "


def test_the_first_non_finite_weight_is_named_with_its_counts() -> None:
    finite = {"a": torch.zeros(3), "steps": torch.tensor([7]), "b": torch.ones(2, dtype=torch.float16)}
    assert non_finite_weight(finite) is None
    bad = torch.zeros(2, 3)
    bad[1] = float("nan")
    bad[0, 0] = float("-inf")
    assert non_finite_weight({**finite, "w": bad, "v": torch.full((2,), float("inf"))}) == (
        "w (3 NaN, 1 infinite of 6 values)"
    )
    assert non_finite_weight({"x": torch.tensor([1.0, float("inf")], dtype=torch.bfloat16)}) == (
        "x (1 infinite of 2 values)"
    )


def nan_row(good: Path, path: Path) -> tuple[Path, str]:
    """A copy of `good` whose source embedding's row 5 is NaN, written whole by torch.save (a sound archive)."""
    checkpoint = torch.load(good, weights_only=True)
    name = next(k for k in checkpoint["state_dict"] if "embed" in k and k.endswith("weight"))
    checkpoint["state_dict"][name][5] = float("nan")
    torch.save(checkpoint, path)
    return path, name


@pytest.fixture
def poisoned(corpus: Path, tmp_path: Path) -> tuple[Path, list[tuple[Path, str]]]:
    """A good tiny checkpoint, and two whose archives are sound but whose weights hold NaN: one NaN embedding row
    (saved by torch.save), one tensor's bytes rewritten with its CRC-32 recomputed. Each with what its refusal
    names."""
    good = tiny_checkpoint(corpus, tmp_path / "good.ckpt")
    row, name = nan_row(good, tmp_path / "nan-row.ckpt")
    rewritten = tmp_path / "rewritten.ckpt"
    shutil.copy(good, rewritten)
    poison_tensor(rewritten)
    assert damaged_member(rewritten) is None  # not a damaged archive: only the weights are wrong
    checkpoint = torch.load(rewritten, weights_only=True)
    tensor = next(k for k, v in checkpoint["state_dict"].items() if v.is_floating_point() and v.isnan().any())
    return good, [(row, f"{name} (32 NaN of "), (rewritten, f"{tensor} (1 NaN of ")]


def test_read_checkpoint_and_the_python_api_refuse_non_finite_weights(
    poisoned: tuple[Path, list[tuple[Path, str]]],
) -> None:
    good, bad = poisoned
    assert read_checkpoint(good)["state_dict"]
    for path, named in bad:
        for read in (read_checkpoint, api.load):
            with pytest.raises(CheckpointError) as caught:
                read(path)
            message = str(caught.value)
            assert message.startswith(f"checkpoint {path} {REFUSED}{named}") and "\n" not in message, message
            assert "use another checkpoint" in message


def test_averaging_refuses_a_non_finite_input_naming_it_and_the_tensor(
    poisoned: tuple[Path, list[tuple[Path, str]]],
) -> None:
    good, bad = poisoned
    for path, named in bad:
        with pytest.raises(CheckpointError, match=f"^checkpoint {path} {REFUSED}") as caught:
            average_checkpoints([good, path])
        assert named in str(caught.value)
    averaged = average_checkpoints([good, good])
    assert non_finite_weight(averaged["state_dict"]) is None


def test_every_command_refuses_non_finite_weights_in_one_line(
    corpus: Path,
    poisoned: tuple[Path, list[tuple[Path, str]]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """translate exited 0 with empty lines, average said "averaged 2 checkpoints", export wrote the model, test
    ended in an IndexError and fit blamed a diverged run: each is now one line naming the file and the tensor,
    exit status 1, nothing written."""
    good, bad = poisoned
    (tmp_path / "input.en").write_text("A dog runs.\n")
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    for path, named in bad:
        commands = reader_commands(corpus, good, path)
        for argv in commands:
            capsys.readouterr()
            rc = attnx(argv)
            said = capsys.readouterr()
            assert rc == 1 and "Traceback" not in said.err and said.out == "", (argv, said.err[-2000:])
            line = said.err.strip().splitlines()[-1]
            assert line.startswith(f"attnx {argv[0]}: error: checkpoint {path} {REFUSED}{named}"), (
                argv,
                line,
            )
    assert sorted(p.name for p in tmp_path.iterdir()) == before

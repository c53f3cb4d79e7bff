"""AttnxCLI's own jobs, each on a CLI built in-process and stopped before any Trainer method runs: the vocabulary
linked from the data, the refusals of `--init_from`, `--lr_scheduler` and a decoding command without weights,
the atomic checkpoint IO, the run folder of a fit and `--torch_threads`.

The CLI is built by `attnx.cli.main` as a command builds it (`attnx.commands.lightning.main`'s arguments, its
config names resolved, its errors reported), with `AttnxCLI` replaced by a subclass that stops at LightningCLI's
`after_instantiate_classes` hook: model, data and Trainer exist, nothing has trained or decoded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from lightning.fabric.plugins import TorchCheckpointIO

from attnx.cli import main as attnx
from attnx.commands import lightning
from attnx.commands.lightning_cli import DECODING_COMMANDS, AttnxCLI
from attnx.training.checkpointing import AtomicCheckpointIO
from attnx.training.optimizers import SCHEDULER_NEEDS_OPTIMIZER
from attnx.training.runs import RunFolder
from tests.training.conftest import _one_thread, fit_args  # noqa: F401 (one thread a module)


class Built(Exception):
    """Carries the CLI out of `attnx.cli.main` once its classes are instantiated."""

    def __init__(self, cli: AttnxCLI) -> None:
        super().__init__("built")
        self.cli = cli


class StopWhenBuilt(AttnxCLI):
    """AttnxCLI that stops after instantiating the model, the data and the Trainer, before running them."""

    def after_instantiate_classes(self) -> None:
        raise Built(self)


@pytest.fixture(autouse=True)
def _in_tmp_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each command runs in a fresh working directory (its `runs/`, if any, are written there)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def build(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """`build(argv)`: the AttnxCLI `attnx <argv>` builds."""
    monkeypatch.setattr(lightning, "AttnxCLI", StopWhenBuilt)

    def built(argv: list[str]) -> AttnxCLI:
        try:
            status = attnx(argv)
        except Built as done:
            return done.cli
        pytest.fail(f"attnx {argv[0]} ended with status {status} before building: {capsys.readouterr().err}")

    return built


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line `attnx <argv>` refuses it with (exit status 2)."""
    assert attnx(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


@pytest.fixture
def threads_restored() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_model_gets_the_vocabulary_of_the_prepared_corpus(corpus: Path, build) -> None:
    cli = build(fit_args(corpus))
    assert cli.datamodule.vocab_size == 300  # the corpus's 300-piece BPE; configs/tiny.yaml names no size
    assert cli.model.config.vocab_size == 300


def test_init_from_is_refused_outside_fit(corpus: Path, tmp_path: Path, capsys) -> None:
    line = refusal(fit_args(corpus, "--init_from", str(tmp_path / "a.ckpt"), subcommand="test"), capsys)
    assert (
        line == "attnx test: error: --init_from is for attnx fit; attnx test reads weights from --ckpt_path"
    )


def test_init_from_is_refused_with_ckpt_path(corpus: Path, tmp_path: Path, capsys) -> None:
    weights, run = str(tmp_path / "weights.ckpt"), str(tmp_path / "run.ckpt")
    line = refusal(fit_args(corpus, "--init_from", weights, "--ckpt_path", run), capsys)
    assert line.startswith(f"attnx fit: error: --init_from {weights} and --ckpt_path {run} both given"), line
    assert line.endswith("pass one of them")
    assert not (tmp_path / "runs").exists()


def test_a_scheduler_without_an_optimizer_is_refused_before_anything_is_built(
    corpus: Path, tmp_path: Path, capsys
) -> None:
    line = refusal(fit_args(corpus, "--lr_scheduler", "StepLR", "--lr_scheduler.step_size", "2"), capsys)
    assert line == f"attnx fit: error: {SCHEDULER_NEEDS_OPTIMIZER}"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("subcommand", DECODING_COMMANDS)
def test_a_decoding_command_without_weights_says_what_to_pass(subcommand: str, corpus: Path, capsys) -> None:
    line = refusal(fit_args(corpus, subcommand=subcommand), capsys)
    assert line.startswith(
        f"attnx {subcommand}: error: attnx {subcommand} needs weights: pass --ckpt_path CHECKPOINT"
    ), line
    assert "or set ckpt_path in the config" in line


def test_the_hint_of_a_command_without_weights_names_the_newest_run_s_averaged_checkpoint(
    corpus: Path, tmp_path: Path, capsys
) -> None:
    """It named runs/NAME/version_0/checkpoints/averaged.ckpt, whatever the config's runs."""
    assert "(e.g. runs/tiny/version_N/checkpoints/averaged.ckpt)" in refusal(
        fit_args(corpus, subcommand="test"), capsys
    )
    averaged = Path("runs/tiny/version_0/checkpoints/averaged.ckpt")
    averaged.parent.mkdir(parents=True)
    averaged.touch()
    line = refusal(fit_args(corpus, subcommand="test"), capsys)
    assert f"(e.g. {averaged}, the newest run of this config)" in line, line
    line = refusal(fit_args(corpus, "--name", "lora", subcommand="test"), capsys)
    assert "(e.g. runs/lora/checkpoints/averaged.ckpt)" in line, line


def test_the_trainer_writes_checkpoints_atomically_unless_the_config_gives_its_own_io(
    corpus: Path, build
) -> None:
    assert type(build(fit_args(corpus)).trainer.strategy.checkpoint_io) is AtomicCheckpointIO
    own = build(fit_args(corpus, "--trainer.plugins", "lightning.fabric.plugins.TorchCheckpointIO"))
    assert type(own.trainer.strategy.checkpoint_io) is TorchCheckpointIO


def test_a_fit_keeps_its_run_folder(corpus: Path, build) -> None:
    cli = build(fit_args(corpus))
    (folder,) = [c for c in cli.trainer.callbacks if isinstance(c, RunFolder)]
    assert folder.resumed is None and not folder.continued  # a new run
    recorded = yaml.safe_load(folder.config)  # the typed config, which every checkpoint records
    assert recorded["model"]["transformer"]["d_model"] == 32 and "ckpt_path" not in recorded


def test_torch_threads_sets_torch_s_thread_count(corpus: Path, build, threads_restored: None) -> None:
    torch.set_num_threads(1)
    build(fit_args(corpus, "--torch_threads", "3"))
    assert torch.get_num_threads() == 3

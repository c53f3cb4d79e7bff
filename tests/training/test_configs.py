"""Every config in configs/ parses through the real `attnx` parser and builds what it describes.

The paper's configs (base, big) need 8 GPUs and WMT14: they are checked at `--print_config` level (no data),
their models are built on the meta device with the paper's 37k vocabulary, and running them here fails with
one sentence. The one-machine configs are instantiated for real on the Multi30k slice.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch
import yaml

from attnx.cli import main as attnx
from attnx.commands.lightning_cli import AttnxCLI
from attnx.data.datamodule import TranslationDataModule
from attnx.model import TransformerConfig, build_transformer
from attnx.model.builders import count_parameters
from attnx.training.checkpointing import AtomicCheckpointIO, AverageCheckpoints, PeriodicCheckpoint
from attnx.training.module import TranslationTask
from tests.conftest import REPO

CONFIGS = REPO / "configs"
PAPER = {"base.yaml": (100_000, 0.1, 5, 63e6), "big.yaml": (300_000, 0.3, 20, 213e6)}
ONE_MACHINE = ["modern_multi30k.yaml", "multi30k_cpu.yaml", "tiny.yaml"]


def test_every_config_is_covered() -> None:
    # configs/table3/ holds override files, merged over base.yaml by tests/docs/test_table3_configs.py
    assert {p.name for p in CONFIGS.glob("*.yaml")} == set(PAPER) | set(ONE_MACHINE)


def printed(*args: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        attnx(["fit", *args, "--print_config"])
    assert exit_info.value.code == 0
    return yaml.safe_load(out.getvalue())


@pytest.mark.parametrize("name", PAPER)
def test_paper_config_parses_and_builds_its_model(name: str) -> None:
    steps, dropout, averaged, params = PAPER[name]
    config = printed("--config", str(CONFIGS / name))
    trainer, model, data = config["trainer"], config["model"], config["data"]
    assert (trainer["accelerator"], trainer["devices"], trainer["strategy"]) == ("gpu", 8, "ddp")
    assert trainer["precision"] == "bf16-mixed" and trainer["max_steps"] == steps
    assert data["max_tokens"] * trainer["devices"] * trainer["accumulate_grad_batches"] == 25_000
    assert (model["warmup_steps"], model["label_smoothing"], model["lr_factor"]) == (4000, 0.1, 1.0)
    assert tuple(model["betas"]) == (0.9, 0.98) and model["eps"] == 1e-9
    assert model["transformer"]["dropout"] == dropout
    search = config["evaluation"]["search"]
    assert (search["beam"], search["alpha"]) == (4, 0.6)
    callbacks = {c["class_path"].rsplit(".", 1)[1]: c["init_args"] for c in trainer["callbacks"]}
    assert callbacks["PeriodicCheckpoint"]["minutes"] == 10
    assert callbacks["PeriodicCheckpoint"]["keep"] >= averaged == callbacks["AverageCheckpoints"]["last"]
    transformer = TransformerConfig.from_dict(model["transformer"] | {"vocab_size": 37_000})
    with torch.device("meta"):
        assert count_parameters(build_transformer(transformer)) == pytest.approx(params, rel=0.02)


@pytest.mark.parametrize("name", PAPER)
def test_paper_config_without_gpus_says_what_to_override(name: str, capsys) -> None:
    assert attnx(["fit", "--config", str(CONFIGS / name)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "8 GPUs" in err[0] and "--trainer.accelerator cpu" in err[0]


@pytest.mark.parametrize("name", ONE_MACHINE)
def test_one_machine_config_instantiates(name: str, corpus: Path, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        cli = AttnxCLI(
            TranslationTask,
            TranslationDataModule,
            args=["--config", str(CONFIGS / name), "--data.data_dir", str(corpus)],
            run=False,
        )
    assert isinstance(cli.model, TranslationTask) and cli.model.config.vocab_size == 300
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert any(isinstance(c, PeriodicCheckpoint) for c in cli.trainer.callbacks)
    assert any(isinstance(c, AverageCheckpoints) for c in cli.trainer.callbacks)
    assert (
        cli.trainer.precision == "32-true" and cli.trainer.accelerator.__class__.__name__ == "CPUAccelerator"
    )
    if name == "multi30k_cpu.yaml":
        transformer = cli.model.config
        assert (transformer.encoder_layers, transformer.d_model, transformer.n_heads, transformer.d_ff) == (
            3,
            256,
            4,
            1024,
        )
        assert cli.trainer.max_steps == -1 and cli.datamodule.max_tokens == 2500
    if name == "modern_multi30k.yaml":
        model = cli.model.model
        layer = model.decoder_layers[0]
        assert model.encoder_layers[0].attn_residual.__class__.__name__ == "PreNorm"
        assert type(layer.self_residual.norm).__name__ == "RMSNorm"
        assert type(layer.ffn).__name__ == "SwiGLUFeedForward" and layer.ffn.w.out_features == 688
        assert type(model.tgt_positional).__name__ == "RotaryPositionalEncoding"
        assert (layer.self_attn.n_heads, layer.self_attn.kv_heads, layer.cross_attn.kv_heads) == (4, 2, 4)
        assert cli.trainer.max_steps == -1 and cli.datamodule.max_tokens == 2500

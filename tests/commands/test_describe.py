"""``attnx describe`` takes the options of ``attnx fit`` that change what it prints, spelt as fit spells them.

(Its reading of config files, presets, corpora and devices is tested in tests/commands/test_models.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from attnx.cli import main
from attnx.commands.describe import DataOptions, LoraOptions, ModelOptions, TrainerOptions, given
from attnx.commands.usage import option_names
from attnx.model import TransformerConfig, build_transformer
from attnx.model.builders import count_parameters


def described(*argv: str, capsys) -> dict[str, str]:
    """`attnx describe ARGV`'s lines by their first word (`model`, `d_model`, `components`, `parameters`...)."""
    assert main(["describe", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    return {line.split()[0].rstrip(":"): line for line in lines}


def test_describe_takes_fit_s_model_options_over_the_config_files(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """One key of a component's args changes and its others stay, as in fit: the very model fit would build."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("model:\n  transformer:\n    self_attention: {args: {d_k: 8}}\n")
    configs = ["--config", "tiny", "--config", "mine.yaml"]
    options = ["--model.transformer.d_model", "64", "--model.transformer.feedforward.name", "swiglu"]
    options += ["--model.transformer.self_attention.args.kv_heads", "2"]
    out = described(*configs, *options, "--vocab_size", "300", capsys=capsys)
    assert "d_model 64, d_ff 64, heads 4, layers 2+2" in out["d_model"]
    assert "vocab 300 (--vocab_size)" in out["d_model"]
    assert "feed-forward swiglu" in out["components"]
    assert out["model"].endswith(
        "mine.yaml + --model.transformer.d_model 64 + "
        "--model.transformer.self_attention.args.kv_heads 2 + --model.transformer.feedforward.name swiglu"
    )
    with pytest.raises(SystemExit) as printed:
        main(["fit", *configs, *options, "--print_config"])
    assert printed.value.code == 0
    fitted = yaml.safe_load(capsys.readouterr().out)["model"]["transformer"]
    assert fitted["self_attention"] == {"name": "multihead", "args": {"d_k": 8, "kv_heads": 2}}
    params = count_parameters(build_transformer(TransformerConfig.from_dict({**fitted, "vocab_size": 300})))
    assert f"parameters: {params:,} " in out["parameters"]


def test_describe_takes_them_over_a_preset(capsys) -> None:
    out = described("--preset", "base", "--model.transformer.encoder_layers", "3", capsys=capsys)
    assert out["model"] == "model: preset base + --model.transformer.encoder_layers 3"
    assert "layers 3+6" in out["d_model"]


def test_describe_takes_fit_s_trainer_data_and_lora_options(capsys) -> None:
    base = ["--config", "big", "--device", "a100"]
    out = "\n".join(described(*base, capsys=capsys).values())
    assert "1 batch of 3,125 tokens per side a step on each of 8 devices" in out
    assert "for 300,000 steps (max_steps)" in out
    options = ["--trainer.max_steps", "1000", "--trainer.devices", "2", "--data.max_tokens", "4096"]
    out = "\n".join(described(*base, *options, capsys=capsys).values())
    assert "1 batch of 4,096 tokens per side a step on each of 2 devices" in out
    assert "for 1,000 steps (max_steps)" in out
    out = described("--config", "tiny", "--lora.rank", "4", capsys=capsys)
    assert "of them train (lora rank 4), the rest frozen" in out["parameters"]


def test_describe_reads_the_corpus_fit_s_data_option_names(
    corpus: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    out = described(
        "--preset", "base", "--data.data_dir", str(corpus), "--data.max_tokens", "512", capsys=capsys
    )
    assert "vocab 300 (the prepared corpus's)" in out["d_model"]
    assert out["batches"].startswith("batches: ")


def test_a_misspelt_fit_option_is_refused_with_the_one_it_meant(capsys) -> None:
    assert main(["describe", "--preset", "base", "--model.transformer.d_modle", "3"]) == 2
    assert "did you mean --model.transformer.d_model?" in capsys.readouterr().err
    assert main(["describe", "--preset", "base", "--trainer.max_steps", "many"]) == 2
    assert 'Parser key "trainer.max_steps"' in capsys.readouterr().err


def test_its_options_are_fit_s_own() -> None:
    """Each option is spelt as one of `attnx fit`, and the model's are all of model.transformer's."""
    from attnx.commands.lightning import option_names as fit_options

    groups = {"model": ModelOptions, "trainer": TrainerOptions, "data": DataOptions, "lora": LoraOptions}
    mine = [name for prefix, group in groups.items() for name in option_names(group, prefix)]
    assert set(mine) - set(fit_options()) == set()
    transformer = [f.name for f in dataclasses.fields(dataclasses.fields(ModelOptions)[0].type)]
    linked = ["vocab_size"]  # fit takes it from the data, describe from --vocab_size
    assert transformer == [f.name for f in dataclasses.fields(TransformerConfig) if f.name not in linked]
    assert given(ModelOptions()) == given(TrainerOptions()) == {}  # nothing given: nothing over the files

"""``attnx describe``, ``attnx plugins``, ``attnx average`` and ``attnx configs`` as commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from attnx.cli import main
from attnx.data.corpus import FORMAT_VERSION
from attnx.model import TransformerConfig, build_transformer
from attnx.model.builders import count_parameters


def test_describe_takes_the_vocabulary_of_the_prepared_corpus(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "data" / "multi30k").mkdir(parents=True)
    meta = {"format_version": FORMAT_VERSION, "vocab_size": 8000}
    (tmp_path / "data" / "multi30k" / "meta.json").write_text(json.dumps(meta))
    monkeypatch.chdir(tmp_path)
    assert main(["describe", "--config", "multi30k_cpu"]) == 0
    out = capsys.readouterr().out
    assert "vocab 8000 (the prepared corpus's)" in out and "parameters: 7,577,600 (7.6M)" in out
    monkeypatch.chdir(tmp_path / "data")
    assert main(["describe", "--config", "multi30k_cpu"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if " vocab " in line)
    assert "vocab 37000 (the paper's; no prepared corpus found, --vocab_size sets another)" in line
    assert line.count("(") == line.count(")") == 1  # one clean parenthesis, not one inside another
    assert main(["describe", "--config", "multi30k_cpu", "--vocab_size", "8000"]) == 0
    assert "vocab 8000 (--vocab_size)" in capsys.readouterr().out


def test_describe_needs_one_source(capsys) -> None:
    assert main(["describe"]) == 2
    assert "--config or --preset" in capsys.readouterr().err


def test_plugins_lists_the_loss_components(capsys) -> None:
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "loss:" in out and "label_smoothed" in out and "reference" in out


def test_plugins_lists_one_kind_and_refuses_a_kind_there_is_not(capsys) -> None:
    assert main(["plugins", "--kind", "norm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("norm: choose with --model.transformer.norm.name NAME") and "rmsnorm" in out
    assert "multihead" not in out and "\nloss:" not in out
    assert main(["plugins", "--kind", "attn"]) == 2
    assert capsys.readouterr().err.strip() == (
        "attnx plugins: error: --kind attn: no such kind of component (did you mean attention? the kinds: "
        "attention, feedforward, positional, norm, loss)"
    )


def test_average_needs_checkpoints_or_a_directory(tmp_path: Path, capsys) -> None:
    assert main(["average", "--output", str(tmp_path / "a.ckpt")]) == 2
    assert "--checkpoints or --dir" in capsys.readouterr().err
    assert main(["average", "--dir", str(tmp_path / "none")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_describe_merges_several_configs_as_fit_does(tmp_path: Path, monkeypatch, capsys) -> None:
    """The second file changes d_model and one component's args; tiny's d_ff, heads and layers stay."""
    (tmp_path / "mine.yaml").write_text(
        "model:\n  transformer:\n    d_model: 64\n    self_attention: {args: {d_k: 8}}\n"
        "trainer:\n  max_steps: 3\n"
    )
    configs = ["--config", "tiny", "--config", "mine.yaml"]
    monkeypatch.chdir(tmp_path)

    assert main(["describe", *configs, "--vocab_size", "300"]) == 0
    described = capsys.readouterr().out
    assert "d_model 64, d_ff 64, heads 4, layers 2+2" in described
    assert "tiny.yaml + mine.yaml" in described
    with pytest.raises(SystemExit) as printed:
        main(["fit", *configs, "--print_config"])
    assert printed.value.code == 0
    fitted = yaml.safe_load(capsys.readouterr().out)["model"]["transformer"]
    assert fitted["d_ff"] == 64 and fitted["self_attention"] == {"name": "multihead", "args": {"d_k": 8}}
    config = TransformerConfig.from_dict({**fitted, "vocab_size": 300})
    params = count_parameters(build_transformer(config))
    assert f"parameters: {params:,} " in described  # the very model fit would build


def test_describe_estimates_memory_and_time_on_a_device(capsys) -> None:
    assert main(["describe", "--config", "big", "--device", "h100", "--devices", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("estimate ("))
    head, memory, time = out[start : start + 3]
    assert head == (
        "estimate (h100, bf16-mixed, 8 batches of 3,125 tokens per side a step on 1 device; "
        "estimates, not measurements):"
    )
    assert memory.startswith("  estimated memory per device: ") and memory.endswith("fits in 80 GiB")
    for part in ("weights 817 MiB", "gradients 817 MiB", "Adam 1.60 GiB", "activations"):
        assert part in memory  # 214.2M parameters: 4 + 4 + 8 bytes each
    assert "captured steps' graph pool" in memory  # one GPU with accumulation: fit captures its steps
    assert "at 35% MFU of 989 TFLOP/s (bf16-mixed peak of H100: NVIDIA H100 SXM5 data sheet" in time
    assert time.endswith("for 300,000 steps (max_steps)")
    # one GPU takes the 8 GPUs' batches in turn: fewer, larger ones, validating as often (5000 x 8 / 4 batches)
    assert out[start + 3].startswith(
        "  fewer, larger batches keep a GPU busier: --data.max_tokens 12500 --trainer.accumulate_grad_batches 2 "
        "--trainer.val_check_interval 10000 trains the same 25,000 tokens per side a step in an estimated "
    )
    assert main(["describe", "--config", "big", "--device", "a100", "--precision", "32-true"]) == 0
    described = capsys.readouterr().out
    assert "of 19.5 TFLOP/s (32-true peak of A100" in described
    assert "graph pool" not in described  # 8 GPUs under DDP without accumulation: nothing is captured
    assert main(["describe", "--preset", "base"]) == 0
    assert "add --device h100|h200|a100|cpu for an estimate" in capsys.readouterr().out


def test_describe_counts_the_batches_of_the_prepared_corpus(corpus: Path, tmp_path: Path, capsys) -> None:
    config = tmp_path / "fit.yaml"
    config.write_text(
        f"trainer: {{precision: bf16-mixed, max_time: '00:00:10:00'}}\n"
        f"model: {{transformer: {{d_model: 32, d_ff: 64, n_heads: 4, encoder_layers: 1, decoder_layers: 1}}}}\n"
        f"data: {{data_dir: {corpus}, max_tokens: 512}}\n"
    )
    assert main(["describe", "--config", str(config), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    batches = next(line for line in out.splitlines() if line.startswith("batches: "))
    assert "shapes" in batches and "shape_buckets 8" in batches  # bf16: what `attnx fit` would choose
    assert "(cpu, bf16-mixed, 1 batch of 512 tokens per side a step on 1 device" in out
    assert "bf16-mixed peak of this CPU" in out and "(max_time)" in out


def test_describe_counts_grouped_query_attention_and_a_gated_network(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """GQA shrinks the decoding cache and W^K, W^V; a gated network has three d x d_ff matrices."""
    monkeypatch.chdir(tmp_path)

    def described(transformer: str) -> dict[str, str]:
        (tmp_path / "m.yaml").write_text(f"model:\n  transformer:\n{transformer}")
        assert main(["describe", "--config", "tiny", "--config", "m.yaml", "--vocab_size", "300"]) == 0
        lines = capsys.readouterr().out.splitlines()
        return {line.split(":")[0]: line for line in lines if ":" in line}

    paper = described("    dropout: 0.1\n")
    gqa = described(
        "    self_attention: {name: multihead, args: {kv_heads: 1}}\n"
        "    cross_attention: {name: multihead, args: {kv_heads: 2}}\n"
        "    feedforward: {name: swiglu}\n"
    )
    # tiny: d_model 32, 4 heads, 2 decoder layers: 2 layers x 4 heads x (8 + 8) values x 2 bytes = 256 bytes
    assert (
        "256 bytes per target token, 256 bytes per source token"
        in paper["decoding cache per sentence (keys and values, 2 bytes each in bf16)"]
    )
    assert (
        "64 bytes per target token, 128 bytes per source token"
        in gqa["decoding cache per sentence (keys and values, 2 bytes each in bf16)"]
    )
    config = TransformerConfig.from_dict(
        TransformerConfig(
            vocab_size=300, d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2
        ).to_dict()
        | {
            "self_attention": {"name": "multihead", "args": {"kv_heads": 1}},
            "cross_attention": {"name": "multihead", "args": {"kv_heads": 2}},
            "feedforward": {"name": "swiglu"},
        }
    )
    model = build_transformer(config)
    assert f"parameters: {count_parameters(model):,} " in gqa["parameters"]
    ffn = model.encoder_layers[0].ffn
    assert sum(p.numel() for p in ffn.parameters()) == 3 * 32 * 64
    assert (
        model.decoder_layers[0].self_attn.in_proj.out_features == 32 + 2 * 8
    )  # W^Q, and one head of W^K, W^V


def test_describe_counts_the_lora_adapters_of_a_fit_config(tmp_path: Path, monkeypatch, capsys) -> None:
    """A config with lora.rank: the adapters' parameters are counted, and only they have gradients and Adam's
    moments in the estimate."""
    from attnx.model.lora import adapter_targets, add_adapters

    monkeypatch.chdir(tmp_path)
    (tmp_path / "lora.yaml").write_text(
        "model: {transformer: {d_model: 32, d_ff: 64, n_heads: 4, encoder_layers: 2, decoder_layers: 2}}\n"
        "lora: {rank: 4, projections: [in_proj, out_proj]}\n"
    )
    assert main(["describe", "--config", "lora.yaml", "--vocab_size", "300", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    model = build_transformer(
        TransformerConfig(vocab_size=300, d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2)
    )
    add_adapters(model, adapter_targets(model, ["in_proj", "out_proj"], ["*"]), 4, 16.0)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert f"parameters: {total:,} " in out and f"; {trainable:,} of them train (lora rank 4)" in out
    assert (
        f"Adam {8 * trainable / 2**10:,.0f} KiB of the {trainable:,} trainable parameters of {total:,}" in out
    )


def test_describe_reads_the_trainer_and_data_of_every_file_as_fit_merges_them(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """A second file that only switches activation checkpointing on keeps big's 8 devices, batches and steps."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpointing.yaml").write_text(
        "model:\n  transformer:\n    activation_checkpointing: true\n"
    )
    assert main(["describe", "--config", "big", "--config", "checkpointing.yaml", "--device", "a100"]) == 0
    out = capsys.readouterr().out
    assert "(a100, bf16-mixed, 1 batch of 3,125 tokens per side a step on each of 8 devices;" in out
    assert "with activation checkpointing" in out and "for 300,000 steps (max_steps)" in out


@pytest.mark.parametrize(
    ("component", "added"),
    [
        ("norm: {name: rmsnorm}", -(2 * 2 + 2 * 3) * 32),  # a gain and no bias in each of the 10 norms
        ("positional: {name: rotary}", 0),  # no parameters, as the sinusoid
        ("positional: {name: t5_relative}", 2 * 32 * 4),  # one table of 32 buckets x 4 heads per stack
    ],
)
def test_describe_counts_the_parameters_each_component_has(
    component: str, added: int, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)

    def parameters(transformer: str) -> int:
        (tmp_path / "m.yaml").write_text(f"model:\n  transformer:\n    {transformer}\n")
        assert main(["describe", "--config", "tiny", "--config", "m.yaml", "--vocab_size", "300"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("parameters: "))
        return int(line.split()[1].replace(",", ""))

    assert parameters(component) - parameters("dropout: 0.1") == added

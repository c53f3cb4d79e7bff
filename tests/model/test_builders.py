"""Builders: a config of names and numbers becomes the model it describes; the paper's presets; what a bad
config is told; the FLOPs formula; what must match for weights to belong to one model."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnx.errors import ConfigError
from attnx.model import TRAINING_ONLY, TransformerConfig, architecture, build_transformer
from attnx.model.builders import ComponentSpec, count_parameters, training_flops_per_token
from attnx.model.layers import PostNorm, PreNorm
from tests.conftest import tiny_config


@pytest.mark.parametrize(("preset", "paper"), [("base", 65e6), ("big", 213e6)])
def test_parameter_counts_match_table_3(preset, paper):
    model = build_transformer(getattr(TransformerConfig, preset)(vocab_size=37000))
    assert abs(count_parameters(model) - paper) / paper < 0.03


def test_big_preset_is_the_papers():
    big = TransformerConfig.big()
    assert (big.d_model, big.d_ff, big.n_heads, big.dropout) == (1024, 4096, 16, 0.3)
    assert (big.encoder_layers, big.decoder_layers) == (6, 6)


def test_config_round_trips_through_plain_dict():
    config = tiny_config(share_embeddings=False)
    config.self_attention.args = {"dropout": 0.1}
    again = TransformerConfig.from_dict(config.to_dict())
    assert again == config
    with pytest.raises(ValueError, match="unknown transformer config keys.*'d_modle'"):
        TransformerConfig.from_dict({"d_modle": 3})


def test_d_model_not_divisible_by_heads_is_a_clear_error():
    with pytest.raises(ValueError, match=r"d_model \(30\) must be a positive multiple of n_heads \(4\)"):
        build_transformer(tiny_config(d_model=30))


def test_a_positional_component_acting_where_the_model_has_no_place_is_refused_by_name():
    from attnx.components.positional import SinusoidalPositionalEncoding
    from attnx.model.builders import ComponentSpec
    from attnx.plugins import collect, plugin_manager
    from attnx.registry import Kind

    class OnValues(SinusoidalPositionalEncoding):
        acts_on = "values"  # the Transformer applies positions to embeddings, queries and keys, or scores

    registry = collect(plugin_manager(entry_points=False))
    registry.add(Kind.POSITIONAL, "on_values", OnValues)
    config = tiny_config()
    build_transformer(config, registry)  # the built-in sinusoid acts on the embeddings
    config.positional = ComponentSpec("on_values")
    with pytest.raises(ValueError, match="positional component 'on_values' acts on 'values'"):
        build_transformer(config, registry)


@pytest.mark.parametrize(
    ("positional", "words"),
    [("rotary", "acts on the queries and keys"), ("t5_relative", "adds a bias to the attention scores")],
)
def test_positions_inside_attention_with_an_attention_that_takes_none_are_refused_naming_both(
    positional, words
):
    from attnx.components.attention import MultiHeadAttention
    from attnx.model.builders import ComponentSpec
    from attnx.plugins import collect, plugin_manager
    from attnx.registry import Kind

    class Plain(MultiHeadAttention):
        positions_accepted = ()  # as a component written before positions acted inside attention

    registry = collect(plugin_manager(entry_points=False))
    registry.add(Kind.ATTENTION, "plain", Plain)
    config = tiny_config(positional=ComponentSpec(positional))
    build_transformer(config, registry)
    config.self_attention = ComponentSpec("plain")
    with pytest.raises(ValueError, match=f"'{positional}' {words}, but attention component 'plain' takes no"):
        build_transformer(config, registry)
    config.cross_attention = config.self_attention  # cross-attention is never given positions
    config.self_attention = ComponentSpec("multihead")
    build_transformer(config, registry)


def test_the_model_built_is_the_one_the_config_describes():
    config = tiny_config(encoder_layers=3, decoder_layers=1, d_ff=48, vocab_size=40, max_len=20)
    model = build_transformer(config)
    assert (len(model.encoder_layers), len(model.decoder_layers)) == (3, 1)
    assert model.encoder_layers[0].ffn.w1.weight.shape == (48, 32)
    assert model.vocab_size == 40 and model.max_positions == 20
    assert model.src_embedding.padding_idx == config.pad_id
    assert bool(
        (model.src_embedding.weight[config.pad_id] == 0).all()
    )  # the padding embedding starts at zero
    assert isinstance(model.encoder_layers[0].attn_residual, PostNorm)
    assert isinstance(model.encoder_norm, torch.nn.Identity)  # post-norm: no final norm
    pre = build_transformer(tiny_config(norm_position="pre"))
    assert isinstance(pre.decoder_layers[0].ffn_residual, PreNorm)
    assert isinstance(pre.encoder_norm, torch.nn.LayerNorm) and isinstance(
        pre.decoder_norm, torch.nn.LayerNorm
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(vocab_size=0), r"^vocab_size \(0\) must exceed pad_id \(0\)$"),
        (dict(norm_position="sandwich"), r"^norm_position must be one of \['post', 'pre'\], got 'sandwich'$"),
        (dict(dropout=1.0), r"^dropout must be in \[0, 1\), got 1.0$"),
        (dict(n_heads=0), r"^d_model \(32\) must be a positive multiple of n_heads \(0\)"),
        # d_ff 0 trained without a word (ReLU and SwiGLU alike), -8 was torch's RuntimeError
        (dict(d_ff=0), r"^d_ff must be an integer >= 1 \(the feed-forward network's inner width\), got 0$"),
        (dict(d_ff=-8), r"^d_ff must be an integer >= 1 \(the feed-forward network's inner width\), got -8$"),
        (dict(d_ff=0, feedforward=ComponentSpec("swiglu")), r"^d_ff must be an integer >= 1 .*, got 0$"),
        (dict(d_ff=64.0), r"^d_ff must be an integer >= 1 .*, got 64\.0$"),
        (
            dict(encoder_layers=0),
            r"^encoder_layers must be an integer >= 1 \(layers of the encoder\), got 0$",
        ),
        (
            dict(decoder_layers=-1),
            r"^decoder_layers must be an integer >= 1 \(layers of the decoder\), got -1$",
        ),
        (dict(max_len=0), r"^max_len must be an integer >= 1 \(the longest sequence\), got 0$"),
        (dict(pad_id=-1), r"^pad_id must be an integer >= 0 \(the padding token's id\), got -1$"),
        (dict(d_model=32.0), r"^d_model must be an integer, got 32\.0$"),
        (dict(vocab_size=True), r"^vocab_size must be an integer, got True$"),
        (dict(dropout=float("nan")), r"^dropout must be in \[0, 1\), got nan$"),
        (dict(dropout="0.1"), r"^dropout must be in \[0, 1\), got '0\.1'$"),
        (dict(share_embeddings="no"), r"^share_embeddings must be true or false, got 'no'$"),
        (
            dict(feedforward="swiglu"),
            r"^feedforward must be a component name with a mapping of args, got 'swiglu'$",
        ),
    ],
)
def test_an_impossible_config_is_one_line_naming_the_value(changes, message):
    with pytest.raises(ValueError, match=message):
        build_transformer(tiny_config(**changes))


@pytest.mark.parametrize(
    ("slot", "spec", "message"),
    [
        # the gated network's dropout 1.5 was F.dropout's ValueError traceback at the first step
        ("feedforward", ComponentSpec("swiglu", {"dropout": 1.5}), r"dropout must be in \[0, 1\), got 1\.5"),
        ("feedforward", ComponentSpec("geglu", {"dropout": -0.5}), r"dropout must be in \[0, 1\), got -0\.5"),
        ("feedforward", ComponentSpec("relu", {"dropout": 1.0}), r"dropout must be in \[0, 1\), got 1\.0"),
        (
            "feedforward",
            ComponentSpec("swiglu", {"bias": "false"}),
            r"bias must be true or false, got 'false'",
        ),
        # RMSNorm eps -1 and rotary base NaN trained into NaN: reported as a diverged run
        (
            "norm",
            ComponentSpec("rmsnorm", {"eps": -1}),
            r"eps must be a finite number > 0 \(e\.g\. 1e-6\), got -1",
        ),
        (
            "norm",
            ComponentSpec("layernorm", {"eps": float("nan")}),
            r"eps must be a finite number > 0 .*got nan",
        ),
        (
            "positional",
            ComponentSpec("rotary", {"base": float("nan")}),
            r"rotary base must be a finite number > 1",
        ),
        ("positional", ComponentSpec("rotary", {"base": float("inf")}), r"rotary base .*, got inf"),
        (
            "positional",
            ComponentSpec("rotary", {"dim": 4.0}),
            r"rotary dim \(4\.0\) must be even, positive, an int",
        ),
        (
            "positional",
            ComponentSpec("t5_relative", {"buckets": 32.0}),
            r"relative bias needs integers buckets >= 4",
        ),
        # kv_heads 2.0 was torch's "empty(): argument 'size' ... must be tuple of ints"
        (
            "self_attention",
            ComponentSpec("multihead", {"kv_heads": 2.0}),
            r"kv_heads must be an integer, one of",
        ),
        ("cross_attention", ComponentSpec("multihead", {"kv_heads": 2.0}), r"kv_heads must be an integer"),
        (
            "cross_attention",
            ComponentSpec("multihead", {"dropout": 1.5}),
            r"dropout must be in \[0, 1\), got 1\.5",
        ),
        ("self_attention", ComponentSpec("multihead", {"d_k": 0}), r"d_k must be an integer >= 1 .*, got 0"),
        (
            "self_attention",
            ComponentSpec("multihead", {"d_v": 2.5}),
            r"d_v must be an integer >= 1 .*, got 2\.5",
        ),
    ],
)
def test_a_component_value_out_of_range_is_one_line_naming_the_component_the_key_and_the_value(
    slot, spec, message
):
    with pytest.raises(ConfigError) as err:
        build_transformer(tiny_config(**{slot: spec}))
    assert re.match(rf"^{slot} '{spec.name}': {message}", str(err.value)), str(err.value)
    assert "\n" not in str(err.value)


def test_architecture_leaves_out_only_what_acts_while_training():
    values = tiny_config(dropout=0.3).to_dict()
    assert TRAINING_ONLY == ("dropout", "activation_checkpointing")
    assert architecture(values) == {k: v for k, v in values.items() if k not in TRAINING_ONLY}
    assert architecture(values) == architecture(tiny_config(dropout=0.0).to_dict())
    assert architecture(values) != architecture(tiny_config(dropout=0.3, d_ff=128).to_dict())


@pytest.mark.parametrize(
    "components",
    [
        {},
        {"feedforward": {"name": "swiglu"}},  # three d x d_ff matrices
        {"self_attention": {"name": "multihead", "args": {"kv_heads": 2}}},  # W^K, W^V of 2 heads of 4
        {"cross_attention": {"name": "multihead", "args": {"kv_heads": 1}}, "feedforward": {"name": "geglu"}},
        {"norm": {"name": "rmsnorm"}, "positional": {"name": "rotary"}},  # no matrices of their own
        {"positional": {"name": "t5_relative"}},  # a bias added to the scores: no multiply-add
    ],
    ids=["paper", "swiglu", "gqa", "mqa-cross-geglu", "rmsnorm-rotary", "t5_relative"],
)
def test_training_flops_per_token_are_three_times_the_forward_matmuls_torch_counts(components):
    """A forward pass with equal source and target lengths (the formula charges the encoder-decoder keys and
    values to target tokens), counted by torch; the decoder's self-attention runs on the fused kernel, which torch
    does not count, so its two matmuls per layer (`2·T·T·d` multiply-adds) are added by hand."""
    values = tiny_config(d_ff=48, vocab_size=40, encoder_layers=2, decoder_layers=3).to_dict() | components
    config = TransformerConfig.from_dict(values)
    model = build_transformer(config).eval()
    n = 6
    src, tgt = torch.randint(4, 40, (1, n)), torch.randint(4, 40, (1, n))
    mask = torch.ones(1, n, dtype=torch.bool)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        memory = model.encode(src, mask, weights=[])  # weights: the explicit attention, which torch counts
        model.decode(tgt, memory, mask, weights=[])
    forward = counter.get_total_flops() + config.decoder_layers * 2 * (2 * n * n * config.d_model)
    flops = training_flops_per_token(config, n, n)
    assert flops["per_token"] == pytest.approx(3 * forward / (2 * n))
    assert flops["per_target_token"] == pytest.approx(3 * forward / n)


def test_frozen_matrices_drop_their_weight_gradients_as_torch_counts() -> None:
    """LoRA freezes the model's matrices: torch's count of a forward and backward with everything training, less
    its count with only the shared embedding training (the output projection's weight gradient stays), is the
    layers' weight gradients, which `frozen` leaves out (with the projection's)."""
    config = tiny_config(d_ff=48, vocab_size=40, encoder_layers=2, decoder_layers=3)
    n, d, v = 6, config.d_model, config.vocab_size
    src, tgt = torch.randint(4, 40, (1, n)), torch.randint(4, 40, (1, n))
    mask = torch.ones(1, n, dtype=torch.bool)

    def counted(only_embedding: bool) -> int:
        model = build_transformer(config).train()
        for name, p in model.named_parameters():
            p.requires_grad_(not only_embedding or name == "src_embedding.weight")
        with FlopCounterMode(display=False) as counter:
            model(src, tgt, mask).float().square().mean().backward()
        return counter.get_total_flops()

    weight_gradients = counted(False) - counted(True)
    trained, frozen = (training_flops_per_token(config, n, n, frozen=f)["per_token"] * 2 * n for f in (0, 1))
    assert weight_gradients > 0
    assert trained - frozen == pytest.approx(weight_gradients + 2 * d * v * n)


def test_activation_checkpointing_recomputes_the_layers_but_not_the_projection() -> None:
    config = tiny_config(d_ff=48, vocab_size=40)
    n, d, v = 6, config.d_model, config.vocab_size
    plain, again = (training_flops_per_token(config, n, n, recomputed=r)["per_token"] * 2 * n for r in (0, 1))
    projection = 3 * 2 * d * v * n  # forward and backward of the output projection: never recomputed
    assert again - plain == pytest.approx((plain - projection) / 3)


def test_count_parameters_counts_a_shared_matrix_once_and_only_what_trains():
    model = build_transformer(tiny_config())
    assert count_parameters(model) == sum(p.numel() for p in set(model.parameters()))
    model.src_embedding.weight.requires_grad_(False)
    assert count_parameters(model) == sum(p.numel() for p in set(model.parameters())) - 50 * 32


def test_activation_checkpointing_is_training_only() -> None:
    """A run may resume with it switched on or off, and its checkpoints hold the same model."""
    assert "activation_checkpointing" in TRAINING_ONLY
    on = TransformerConfig(activation_checkpointing=True).to_dict()
    assert architecture(on) == architecture(TransformerConfig().to_dict())
    assert build_transformer(tiny_config(activation_checkpointing=True)).checkpoint_layers


def test_fit_s_options_choose_the_marian_and_fairseq_components_and_the_output_bias(capsys) -> None:
    """The new components by name from the command line, as any other: the config fit prints builds them."""
    import yaml

    from attnx.cli import main
    from attnx.components.feedforward import GeluFeedForward, SwishFeedForward
    from attnx.components.positional import (
        FairseqSinusoidalPositionalEncoding,
        MarianSinusoidalPositionalEncoding,
    )

    chosen = {
        ("swish", "marian_sinusoidal"): (SwishFeedForward, MarianSinusoidalPositionalEncoding),
        ("gelu", "fairseq_sinusoidal"): (GeluFeedForward, FairseqSinusoidalPositionalEncoding),
    }
    for (ffn, positional), (ffn_class, positional_class) in chosen.items():
        argv = ["fit", "--config", "tiny", "--model.transformer.feedforward.name", ffn]
        argv += ["--model.transformer.positional.name", positional, "--model.transformer.output_bias", "true"]
        with pytest.raises(SystemExit) as printed:
            main([*argv, "--print_config"])
        assert printed.value.code == 0
        transformer = yaml.safe_load(capsys.readouterr().out)["model"]["transformer"]
        assert transformer["feedforward"]["name"] == ffn and transformer["output_bias"] is True
        model = build_transformer(TransformerConfig.from_dict({**transformer, "vocab_size": 40}))
        assert (
            type(model.encoder_layers[0].ffn) is ffn_class and type(model.tgt_positional) is positional_class
        )
        assert model.output_bias.shape == (40,) and model.output_bias.requires_grad


def test_a_checkpoint_written_before_the_output_bias_loads_without_one(tmp_path) -> None:
    from attnx.checkpoint import load_model
    from tests.checkpoints import save_model, train_tokenizer

    tokenizer = train_tokenizer([f"word{i} other{i % 7} thing" for i in range(200)], 40)
    config = tiny_config(vocab_size=40)
    model = build_transformer(config)
    save_model(tmp_path / "old.ckpt", model, config, tokenizer)
    checkpoint = torch.load(tmp_path / "old.ckpt", weights_only=True)
    del checkpoint["attnx"]["transformer"]["output_bias"]  # what a checkpoint of before the field holds
    torch.save(checkpoint, tmp_path / "old.ckpt")
    loaded = load_model(tmp_path / "old.ckpt")
    assert loaded.config.output_bias is False and loaded.model.output_bias is None
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded.model.state_dict()[key], value)


def test_output_bias_must_be_true_or_false() -> None:
    with pytest.raises(ConfigError, match=r"^output_bias must be true or false, got 'no'$"):
        build_transformer(tiny_config(output_bias="no"))

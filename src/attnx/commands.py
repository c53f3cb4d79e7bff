"""Small commands that need neither data nor Lightning: ``attnx plugins`` and ``attnx describe``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from attnx.model import TransformerConfig, build_transformer
from attnx.model.builders import count_parameters
from attnx.plugins import registry
from attnx.registry import Kind


def plugins(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="attnx plugins",
        description="List every registered component by kind, with the plugin and distribution it came from.",
    )
    parser.parse_args(argv)
    reg = registry()
    for kind in Kind:
        print(f"{kind}:")
        for entry in (e for e in reg.entries() if e.kind == kind):
            cls = f"{entry.factory.__module__}.{entry.factory.__qualname__}"
            print(f"  {entry.name:<16} {cls}  [{entry.distribution}]")
    return 0


def transformer_section(values: dict[str, Any], source: str) -> dict[str, Any]:
    """Find the transformer settings in a fit config (``model.transformer``) or a bare transformer config."""
    if not isinstance(values, dict):
        raise SystemExit(f"attnx describe: {source} is not a YAML mapping")
    model = values.get("model")
    if isinstance(model, dict):
        model = model.get("init_args", model)
        if isinstance(model.get("transformer"), dict):
            return model["transformer"]
        raise SystemExit(f"attnx describe: {source} has a 'model' section but no 'model.transformer' in it")
    return values.get("transformer", values)


def training_flops_per_token(config: TransformerConfig, src_len: int, tgt_len: int) -> dict[str, float]:
    """Training FLOPs (forward + backward = 3 × forward, 2 FLOPs per multiply-add) per real token.

    Counts every matmul: projections and FFNs of each layer, attention scores and weighted sums
    (``2·len·d`` each per query, full square as the kernels compute it), and the output projection.
    """
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    enc_layer = 4 * d * d + 2 * d * f + 2 * src_len * d  # MACs per source token per layer
    dec_layer = 8 * d * d + 2 * d * f + 2 * tgt_len * d + 2 * src_len * d
    fwd_src = 2 * config.encoder_layers * enc_layer
    fwd_tgt = 2 * (config.decoder_layers * dec_layer + d * v)
    total = 3 * (fwd_src * src_len + fwd_tgt * tgt_len)
    return {"per_token": total / (src_len + tgt_len), "per_target_token": total / tgt_len}


def describe(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="attnx describe",
        description="Print the parameter count and estimated training FLOPs per token of a model; "
        "needs no data and no GPU.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--config", type=Path, help="a fit config (model.transformer section) or transformer YAML"
    )
    source.add_argument("--preset", choices=("base", "big"), help="the paper's base or big model (Table 3)")
    parser.add_argument(
        "--vocab_size",
        type=int,
        default=None,
        help="shared vocabulary size (default: the config's, else 37000)",
    )
    parser.add_argument(
        "--seq_len", type=int, default=25, help="source and target length for FLOPs (default 25)"
    )
    args = parser.parse_args(argv)
    if args.preset:
        config = getattr(TransformerConfig, args.preset)()
        label = f"preset {args.preset}"
    else:
        if not args.config.is_file():
            parser.error(f"config file {args.config} does not exist")
        values = transformer_section(
            yaml.safe_load(args.config.read_text(encoding="utf-8")), str(args.config)
        )
        try:
            config = TransformerConfig.from_dict(values or {})
        except (TypeError, ValueError) as err:
            parser.error(f"{args.config}: {err}")
        label = str(args.config)
    if args.vocab_size:
        config.vocab_size = args.vocab_size
    model = build_transformer(config)
    params = count_parameters(model)
    flops = training_flops_per_token(config, args.seq_len, args.seq_len)
    print(f"model: {label}")
    print(
        f"  d_model {config.d_model}, d_ff {config.d_ff}, heads {config.n_heads}, "
        f"layers {config.encoder_layers}+{config.decoder_layers}, dropout {config.dropout}, "
        f"vocab {config.vocab_size}, shared embeddings {config.share_embeddings}"
    )
    print(
        f"  components: self-attention {config.self_attention.name}, cross-attention "
        f"{config.cross_attention.name}, feed-forward {config.feedforward.name}, positional "
        f"{config.positional.name}, norm {config.norm.name} ({config.norm_position})"
    )
    print(f"parameters: {params:,} ({params / 1e6:.1f}M)")
    print(
        f"training FLOPs per token (source+target, length {args.seq_len} each): "
        f"{flops['per_token'] / 1e6:.1f} MFLOP; per target token: {flops['per_target_token'] / 1e6:.1f} MFLOP"
    )
    return 0

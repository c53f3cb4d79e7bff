"""Builders: flat hyperparameters and component names -> a
[`Transformer`][attnx.model.transformer.Transformer]; the paper's presets."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from attnx.components.values import flag, integer, is_integer, probability
from attnx.errors import ConfigError
from attnx.model.layers import RESIDUALS, DecoderLayer, EncoderLayer
from attnx.model.transformer import Transformer
from attnx.registry import ComponentRegistry, Kind


@dataclass
class ComponentSpec:
    """A component chosen by its registered name, with the keyword arguments of its constructor."""

    name: str
    """Registered name (`attnx plugins` lists them), e.g. `multihead`, `relu`, `sinusoidal`."""
    args: dict[str, Any] = field(default_factory=dict)
    """Extra constructor arguments beyond the shape arguments the model passes."""


@dataclass
class TransformerConfig:
    """Hyperparameters of the Transformer (§3, Table 3). Defaults are the paper's base model."""

    vocab_size: int = 37000
    """Size of the shared source/target vocabulary (linked from the data when training)."""
    d_model: int = 512
    """Width of embeddings and of every sub-layer output (§3.1)."""
    n_heads: int = 8
    """Attention heads h; d_k = d_v = d_model / h (§3.2.2)."""
    d_ff: int = 2048
    """Inner width of the position-wise feed-forward network (§3.3). For a gated network (`swiglu`, `geglu`)
    it is the width of each of its three `d_model x d_ff` matrices, so the same `d_ff` has 1.5x the parameters
    and FLOPs of the paper's two: about 2/3 of the paper's width keeps them equal (d_ff 688 against 1024)."""
    encoder_layers: int = 6
    """Encoder layers N (§3.1)."""
    decoder_layers: int = 6
    """Decoder layers N (§3.1)."""
    dropout: float = 0.1
    """P_drop: on each sub-layer output and on embeddings + positions (§5.4)."""
    max_len: int = 1024
    """Longest sequence the positional encoding accepts."""
    share_embeddings: bool = True
    """One matrix for source embedding, target embedding and pre-softmax projection (§3.4)."""
    output_bias: bool = False
    """A learned bias `(V,)` added to the logits after the pre-softmax projection (Marian's `final_logits_bias`);
    the paper has none. Every path that scores tokens adds it: training's loss, decoding, forced scoring."""
    norm_position: Literal["post", "pre"] = "post"
    """`post`: LayerNorm(x + Sublayer(x)) as in the paper; `pre`: x + Sublayer(LayerNorm(x))."""
    self_attention: ComponentSpec = field(default_factory=lambda: ComponentSpec("multihead"))
    """Attention used by encoder and decoder self-attention."""
    cross_attention: ComponentSpec = field(default_factory=lambda: ComponentSpec("multihead"))
    """Attention used by encoder-decoder attention."""
    feedforward: ComponentSpec = field(default_factory=lambda: ComponentSpec("relu"))
    """Position-wise feed-forward network."""
    positional: ComponentSpec = field(default_factory=lambda: ComponentSpec("sinusoidal"))
    """Positional encoding (`learned` is Table 3 row E)."""
    norm: ComponentSpec = field(default_factory=lambda: ComponentSpec("layernorm"))
    """Normalization used in every residual connection."""
    pad_id: int = 0
    """Id of the padding token (ignored by attention and the loss)."""
    activation_checkpointing: bool = False
    """Training keeps only each layer's input for the backward pass and runs the layer's forward again there
    (fairseq's `--checkpoint-activations`): much less activation memory for about a third more compute. The
    same gradients; `attnx describe` shows the memory with and without."""

    @classmethod
    def base(cls, **overrides: Any) -> TransformerConfig:
        """Table 3 'base': d_model 512, d_ff 2048, 8 heads, 6+6 layers, dropout 0.1 (65M params)."""
        return cls(**overrides)

    @classmethod
    def big(cls, **overrides: Any) -> TransformerConfig:
        """Table 3 'big': d_model 1024, d_ff 4096, 16 heads, 6+6 layers, dropout 0.3 (213M params)."""
        values: dict[str, Any] = dict(d_model=1024, d_ff=4096, n_heads=16, dropout=0.3)
        return cls(**(values | overrides))

    def to_dict(self) -> dict[str, Any]:
        """Plain, checkpoint-safe form (names and numbers only, never classes)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TransformerConfig:
        values = dict(values)
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(
                f"unknown transformer config keys {sorted(unknown)}; known keys: {sorted(cls.__dataclass_fields__)}"
            )
        for key in ("self_attention", "cross_attention", "feedforward", "positional", "norm"):
            if isinstance(values.get(key), dict):
                values[key] = ComponentSpec(**values[key])
        return cls(**values)


SLOTS = {
    "self_attention": Kind.ATTENTION,
    "cross_attention": Kind.ATTENTION,
    "feedforward": Kind.FEEDFORWARD,
    "positional": Kind.POSITIONAL,
    "norm": Kind.NORM,
}
"""The components of a TransformerConfig, by field, and the kind each is."""

SIZES = {
    "d_ff": (1, "the feed-forward network's inner width"),
    "encoder_layers": (1, "layers of the encoder"),
    "decoder_layers": (1, "layers of the decoder"),
    "max_len": (1, "the longest sequence"),
    "pad_id": (0, "the padding token's id"),
}
"""The integer fields of a TransformerConfig checked alone: the least value each takes, and what it counts."""


def _check(config: TransformerConfig) -> None:
    for key in ("vocab_size", "d_model", "n_heads"):  # their ranges are checked together below
        if not is_integer(getattr(config, key)):
            raise ConfigError(f"{key} must be an integer, got {getattr(config, key)!r}")
    for key, (least, what) in SIZES.items():
        integer(key, getattr(config, key), least, what)
    for key in ("share_embeddings", "output_bias", "activation_checkpointing"):
        flag(key, getattr(config, key))
    if config.d_model <= 0 or config.n_heads <= 0 or config.d_model % config.n_heads:
        raise ConfigError(
            f"d_model ({config.d_model}) must be a positive multiple of n_heads ({config.n_heads}): "
            "each head gets d_k = d_model / n_heads dimensions"
        )
    if config.vocab_size <= config.pad_id:
        raise ConfigError(f"vocab_size ({config.vocab_size}) must exceed pad_id ({config.pad_id})")
    if config.norm_position not in RESIDUALS:
        raise ConfigError(f"norm_position must be one of {sorted(RESIDUALS)}, got {config.norm_position!r}")
    probability("dropout", config.dropout)
    for slot in SLOTS:
        spec = getattr(config, slot)
        if not isinstance(spec, ComponentSpec) or not isinstance(spec.args, dict):
            raise ConfigError(f"{slot} must be a component name with a mapping of args, got {spec!r}")


PLACE_WORDS = {
    "queries_keys": "acts on the queries and keys",
    "scores": "adds a bias to the attention scores",
}


def positional_place(config: TransformerConfig, registry: ComponentRegistry) -> str:
    """Where the config's positional component acts (its class's `acts_on`), refused in one line when the
    Transformer has no such place."""
    factory = registry.get(Kind.POSITIONAL, config.positional.name)
    place = getattr(factory, "acts_on", None)
    if place not in Transformer.POSITIONAL_ACTS_ON:
        raise ConfigError(
            f"positional component {config.positional.name!r} acts on {place!r}, but the Transformer "
            f"applies positions only to the {', '.join(Transformer.POSITIONAL_ACTS_ON)} (a class attribute "
            "acts_on); choose another positional component"
        )
    return place


def refuse_positions(
    attention: ComponentSpec, positional: ComponentSpec, place: str, registry: ComponentRegistry
) -> None:
    """One line naming both when self-attention `attention` cannot apply positions acting on `place`."""
    accepted = getattr(registry.get(Kind.ATTENTION, attention.name), "positions_accepted", ())
    if place not in accepted:
        raise ConfigError(
            f"positional component {positional.name!r} {PLACE_WORDS[place]}, but attention component "
            f"{attention.name!r} takes no such positions (its positions_accepted: {tuple(accepted)}); "
            "choose an attention component that does (e.g. multihead) or a positional one on the embeddings"
        )


def build_transformer(config: TransformerConfig, registry: ComponentRegistry | None = None) -> Transformer:
    """Assemble a Transformer from `config`, looking components up in `registry` (default: installed plugins)."""
    registry = installed_registry(registry)
    _check(config)
    d, h = config.d_model, config.n_heads
    residual = RESIDUALS[config.norm_position]

    def component(slot: str, *shape: int) -> nn.Module:
        spec = getattr(config, slot)
        try:
            return registry.build(SLOTS[slot], spec.name, *shape, **spec.args)
        except ConfigError as err:  # the component refused a value: say which of the config's components
            err.args = (f"{slot} {spec.name!r}: {err}",)
            raise

    def norm() -> nn.Module:
        return component("norm", d)

    place = positional_place(config, registry)
    if place != "embeddings":
        refuse_positions(config.self_attention, config.positional, place, registry)

    def positional() -> nn.Module:
        # what positions on queries and keys turn: one head's queries and keys (d_k, Table 3 (B) sets it)
        head_dim = config.self_attention.args.get("d_k") or d // h
        shape = {"embeddings": (d, config.max_len), "queries_keys": (head_dim, config.max_len)}
        return component("positional", *shape.get(place, (h, config.max_len)))

    def wrap() -> nn.Module:
        return residual(norm(), config.dropout)

    encoder = nn.ModuleList(
        EncoderLayer(
            component("self_attention", d, h),
            component("feedforward", d, config.d_ff),
            wrap(),
            wrap(),
        )
        for _ in range(config.encoder_layers)
    )
    decoder = nn.ModuleList(
        DecoderLayer(
            component("self_attention", d, h),
            component("cross_attention", d, h),
            component("feedforward", d, config.d_ff),
            wrap(),
            wrap(),
            wrap(),
        )
        for _ in range(config.decoder_layers)
    )

    def embedding() -> nn.Embedding:
        emb = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_id)
        nn.init.normal_(emb.weight, mean=0.0, std=d**-0.5)
        emb.weight.data[config.pad_id].zero_()
        return emb

    src_embedding = embedding()
    if config.share_embeddings:
        tgt_embedding, output_projection = src_embedding, None
    else:
        tgt_embedding = embedding()
        output_projection = nn.Linear(d, config.vocab_size, bias=False)
        nn.init.normal_(output_projection.weight, mean=0.0, std=d**-0.5)
    pre_norm = config.norm_position == "pre"
    return Transformer(
        src_embedding=src_embedding,
        tgt_embedding=tgt_embedding,
        src_positional=positional(),
        tgt_positional=positional(),
        encoder_layers=encoder,
        decoder_layers=decoder,
        encoder_norm=norm() if pre_norm else None,
        decoder_norm=norm() if pre_norm else None,
        output_projection=output_projection,
        output_bias=nn.Parameter(torch.zeros(config.vocab_size)) if config.output_bias else None,
        dropout=config.dropout,
        pad_id=config.pad_id,
        max_positions=config.max_len,
        checkpoint_layers=config.activation_checkpointing,
    )


def installed_registry(registry: ComponentRegistry | None = None) -> ComponentRegistry:
    """`registry`, or the installed plugins' when None."""
    if registry is not None:
        return registry
    from attnx.plugins import registry as installed

    return installed()


def layer_matrices(
    config: TransformerConfig, registry: ComponentRegistry | None = None
) -> tuple[float, float]:
    """Weights of the matrices of one encoder layer and of one decoder layer (each a multiply-add per token).

    Attention: W^Q and W^O of `d x d`, W^K and W^V of `kv_heads / n_heads` of that (grouped-query attention,
    `kv_heads` in an attention's args); the feed-forward network: as many `d x d_ff` matrices as its class's
    `matrices` says (3 for a gated one, 2 when absent), looked up in `registry` (default: installed plugins).
    """
    registry = installed_registry(registry)
    d, f, h = config.d_model, config.d_ff, config.n_heads
    ffn = getattr(registry.get(Kind.FEEDFORWARD, config.feedforward.name), "matrices", 2) * d * f

    def projections(spec: ComponentSpec) -> float:  # W^Q, W^O, and W^K, W^V over kv_heads / n_heads
        return 2 * d * d + 2 * d * d * (spec.args.get("kv_heads") or h) / h

    encoder = projections(config.self_attention) + ffn
    return encoder, encoder + projections(config.cross_attention)


def training_flops_per_token(
    config: TransformerConfig,
    src_len: float,
    tgt_len: float,
    registry: ComponentRegistry | None = None,
    frozen: bool = False,
    recomputed: bool = False,
) -> dict[str, float]:
    """Training FLOPs (forward + backward = 3 × forward, 2 FLOPs per multiply-add) per real token.

    Counts every matmul: the layers' matrices ([`layer_matrices`][attnx.model.builders.layer_matrices]:
    grouped-query attention's smaller W^K and W^V, a gated network's three matrices), attention scores and
    weighted sums (`2·len·d` each per query, full square as the kernels compute it), and the output
    projection. `per_token` divides by source + target tokens, `per_target_token` by target tokens only.

    `frozen`: the model's own matrices are frozen (LoRA trains adapters beside them), so their backward
    computes the inputs' gradients and no weight gradients: 2 × forward for them instead of 3 (the attention
    scores keep 3; the adapters' own rank-r products are left out). `recomputed`: activation checkpointing runs
    the layers' forward once more during the backward (the FLOPs the hardware does, not the model's); the
    vocabulary projection, outside the checkpoints, runs once.
    """
    d, v = config.d_model, config.vocab_size
    encoder, decoder = layer_matrices(config, registry)
    weights = (2 if frozen else 3) + recomputed  # forward, inputs' gradients, weights' gradients, again
    scores = 3 + recomputed  # both operands' gradients
    enc_layer = weights * encoder + scores * 2 * src_len * d  # MACs per source token per layer
    dec_layer = weights * decoder + scores * (2 * tgt_len * d + 2 * src_len * d)
    fwd_src = 2 * config.encoder_layers * enc_layer
    fwd_tgt = 2 * (config.decoder_layers * dec_layer + (2 if frozen else 3) * d * v)
    total = fwd_src * src_len + fwd_tgt * tgt_len
    return {"per_token": total / (src_len + tgt_len), "per_target_token": total / tgt_len}


def decoding_cache_values(config: TransformerConfig) -> dict[str, int]:
    """Numbers the decoding cache holds per sentence: `per_target_token`, the self-attention keys and values
    each decoded position adds over the decoder's layers, and `per_source_token`, the encoder-decoder keys
    and values of each source position. Only the key/value heads are cached: `kv_heads` in an attention's
    args divides both by `n_heads / kv_heads` (d_k and d_v from its args, else `d_model / n_heads`)."""

    def per_position(spec: ComponentSpec) -> int:
        heads = spec.args.get("kv_heads") or config.n_heads
        d_k = spec.args.get("d_k") or config.d_model // config.n_heads
        d_v = spec.args.get("d_v") or config.d_model // config.n_heads
        return config.decoder_layers * heads * (d_k + d_v)

    return {
        "per_target_token": per_position(config.self_attention),
        "per_source_token": per_position(config.cross_attention),
    }


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


TRAINING_ONLY = ("dropout", "activation_checkpointing")
"""TransformerConfig fields that act only while training: a run may change them when it resumes, and checkpoints
that differ only in them hold the same model (they average, and load into each other)."""


def architecture(values: dict[str, Any]) -> dict[str, Any]:
    """A model config's plain values (`TransformerConfig.to_dict`) without the training-only ones: what must
    match for weights to belong to the same model."""
    return {key: value for key, value in values.items() if key not in TRAINING_ONLY}

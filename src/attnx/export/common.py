"""What each export target can represent, checked on the model config before any weight is touched.

Also what both exporters share: loading a checkpoint once its config passed the check, and writing the
output directory so that it appears only when complete.

An attnx model is assembled from registered components (`attnx plugins` lists them). An exporter maps
the paper's own components onto the target's fixed architecture, so a model that uses anything else (a
third-party attention, a positional encoding that acts on attention scores, constructor arguments that
change the computation) is refused with an [`ExportError`][attnx.export.common.ExportError] that names the component and what the
target supports, instead of writing a model that silently computes something else.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnx.checkpoint import LoadedModel, load_model, read_checkpoint
from attnx.errors import AttnxError
from attnx.files import WriteError, disk_full, staged_directory, write_failure
from attnx.model import ComponentSpec, TransformerConfig


class ExportError(AttnxError, ValueError):
    """A checkpoint cannot be exported to the requested format; the message says which part and why."""


@dataclass(frozen=True)
class Target:
    """The parts of attnx's model space one export format can represent."""

    name: str
    """Shown in error messages, e.g. `CTranslate2`."""
    positional: tuple[str, ...]
    """Positional components it can carry."""
    norm_positions: tuple[str, ...]
    """`post` (the paper's LayerNorm(x + Sublayer(x))) and/or `pre`."""
    layer_norm_eps: float | None = None
    """The only LayerNorm epsilon it computes with; None: any (the epsilon is part of the exported config)."""
    feedforward: tuple[str, ...] = ("relu",)
    """Feed-forward components it can carry."""
    norm: tuple[str, ...] = ("layernorm",)
    """Norm components it can carry."""
    kv_heads: bool = False
    """Whether attention may have fewer key/value heads than query heads (one count for a decoder layer's
    self- and encoder-decoder attention alike)."""


def _multihead_args(config: TransformerConfig, args: dict[str, Any]) -> list[str]:
    """Arguments of `multihead` an exporter cannot reproduce; `kv_heads` is checked against the target apart."""
    allowed = ("dropout", "bias", "d_k", "d_v", "kv_heads")
    problems = [f"argument {key!r}" for key in args if key not in allowed]
    head = config.d_model // config.n_heads
    for key in ("d_k", "d_v"):
        if args.get(key) not in (None, head):
            problems.append(f"{key}={args[key]} (only d_model / n_heads = {head})")
    return problems


def _no_args(allowed: tuple[str, ...]) -> Callable[[TransformerConfig, dict[str, Any]], list[str]]:
    def check(config: TransformerConfig, args: dict[str, Any]) -> list[str]:
        return [f"argument {key!r}" for key in args if key not in allowed]

    return check


# Components an exporter maps, with the constructor arguments whose effect it reproduces. `dropout`
# arguments only act in training.
ATTENTION = {"multihead": _multihead_args}
FEEDFORWARD = {
    "relu": _no_args(("dropout",)),
    "swish": _no_args(("dropout",)),
    "gelu": _no_args(("dropout",)),
    "swiglu": _no_args(("dropout", "bias")),
    "geglu": _no_args(("dropout", "bias")),
}
POSITIONAL = {
    "sinusoidal": _no_args(()),
    "marian_sinusoidal": _no_args(()),
    "fairseq_sinusoidal": _no_args(("padding_idx",)),
    "learned": _no_args(()),
    "rotary": _no_args(("base", "dim")),
    "t5_relative": _no_args(("buckets", "max_distance")),
}
NORM = {"layernorm": _no_args(("eps",)), "rmsnorm": _no_args(("eps",))}


def layer_norm_eps(config: TransformerConfig) -> float:
    """The epsilon of the config's norm: its `eps` argument, else its class's default."""
    if "eps" in config.norm.args:
        return float(config.norm.args["eps"])
    from attnx.plugins import registry
    from attnx.registry import Kind

    default = inspect.signature(registry().get(Kind.NORM, config.norm.name)).parameters["eps"].default
    return float(default)


def kv_heads(config: TransformerConfig, spec: ComponentSpec) -> int:
    """The key/value heads of an attention config: its `kv_heads` argument, else one per query head."""
    return int(spec.args.get("kv_heads") or config.n_heads)


def check_exportable(config: TransformerConfig, target: Target) -> None:
    """Raise [`ExportError`][attnx.export.common.ExportError] listing every part of `config` that `target` cannot represent."""
    problems: list[str] = []

    def component(
        field: str, spec: ComponentSpec, known: dict[str, Callable], names: tuple[str, ...]
    ) -> None:
        supported = " or ".join(repr(n) for n in names)
        if spec.name not in names or spec.name not in known:
            problems.append(
                f"{field} {spec.name!r} is not supported ({target.name} export supports {supported})"
            )
            return
        bad = known[spec.name](config, dict(spec.args))
        if bad:
            problems.append(f"{field} {spec.name!r} with {', '.join(bad)} is not supported")

    component("self_attention", config.self_attention, ATTENTION, tuple(ATTENTION))
    component("cross_attention", config.cross_attention, ATTENTION, tuple(ATTENTION))
    component("feedforward", config.feedforward, FEEDFORWARD, target.feedforward)
    component("positional", config.positional, POSITIONAL, target.positional)
    component("norm", config.norm, NORM, target.norm)
    heads = {
        field: kv_heads(config, getattr(config, field)) for field in ("self_attention", "cross_attention")
    }
    if not target.kv_heads:
        for field, count in heads.items():
            if count != config.n_heads:
                problems.append(
                    f"{field} {getattr(config, field).name!r} with kv_heads={count} is not supported "
                    f"({target.name} has one key/value head per query head, {config.n_heads})"
                )
    elif heads["self_attention"] != heads["cross_attention"]:
        problems.append(
            f"self_attention kv_heads={heads['self_attention']} beside cross_attention "
            f"kv_heads={heads['cross_attention']} is not supported ({target.name} gives a decoder layer's "
            "two attentions one count)"
        )
    if config.norm_position not in target.norm_positions:
        supported = " or ".join(repr(n) for n in target.norm_positions)
        problems.append(
            f"norm_position {config.norm_position!r} is not supported ({target.name} supports {supported})"
        )
    if target.layer_norm_eps is not None and config.norm.name == "layernorm":
        eps = layer_norm_eps(config)
        if eps != target.layer_norm_eps:
            problems.append(
                f"norm 'layernorm' with eps={eps:g} is not supported (only {target.layer_norm_eps:g})"
            )
    if problems:
        raise ExportError(f"cannot export to {target.name}: " + "; ".join(problems))


def load_exportable(ckpt_path: str | Path, target: Target) -> LoadedModel:
    """The checkpoint's model and tokenizer, once its config has passed [`check_exportable`][attnx.export.common.check_exportable].

    The config is checked before the model is built, so a model made of components that are not even
    installed here still gets the [`ExportError`][attnx.export.common.ExportError] rather than a registry error.
    """
    config = TransformerConfig.from_dict(read_checkpoint(ckpt_path)["attnx"]["transformer"])
    check_exportable(config, target)
    loaded = load_model(ckpt_path)
    if loaded.tokenizer.vocab_size != config.vocab_size:
        raise ExportError(
            f"checkpoint {ckpt_path}: the model has {config.vocab_size} embeddings but its SentencePiece model "
            f"{loaded.tokenizer.vocab_size} pieces; an exported model names every output by its piece"
        )
    return loaded


@contextlib.contextmanager
def staged_output(output: str | Path, force: bool) -> Iterator[Path]:
    """A fresh directory beside `output` to write into; it replaces `output` only once complete
    ([`staged_directory`][attnx.files.staged_directory]).

    `output` must not exist, or be an empty directory, unless `force`. An interrupted export leaves no
    half-written model behind (and, with `force`, the previous one intact); a full disk is one
    [`WriteError`][attnx.files.WriteError] line naming the output (and the file, where the writer says) and the
    free space, whichever library was writing (CTranslate2, safetensors).
    """
    output = Path(output)
    if output.exists() and not force and (not output.is_dir() or any(output.iterdir())):
        raise ExportError(
            f"{output} already exists; choose another output directory or replace it with --force (force=True from Python)"
        )
    with staged_directory(output) as work, _full_disk_named(output):
        yield work


@contextlib.contextmanager
def _full_disk_named(output: Path) -> Iterator[None]:
    """A full disk met while the export is written, as one line; inside the staged directory's block, so the
    free space is measured before what was written is removed."""
    try:
        yield
    except Exception as err:
        full = disk_full(err)
        if full is None:
            raise
        staged = Path(full.filename) if full.filename else None
        name = f"{output} ({staged.name})" if staged is not None else str(output)
        kept = f"the previous {output} is kept" if output.exists() else "nothing of it is left"
        raise WriteError(
            write_failure(name, full, what="export", kept=kept, free_in=output.parent.resolve())
        ) from err

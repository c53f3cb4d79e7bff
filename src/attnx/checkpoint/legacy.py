"""Checkpoints of the earlier attention layout: three projections `q_proj`, `k_proj`, `v_proj` where
[`MultiHeadAttention`][attnx.components.attention.MultiHeadAttention] now keeps one stacked `in_proj`.

A model loads either layout by itself (its load hook stacks the three). What a state dict alone cannot carry
over is what is keyed by parameter position rather than by name: the optimizer state a run resumes with
(Adam's moments, one entry per parameter) and a set of checkpoints averaged together that straddles the change.
[`upgrade_checkpoint`][attnx.checkpoint.legacy.upgrade_checkpoint] rewrites both in place: the moments of the
three projections are stacked exactly as their weights are, so a resumed run takes the step it would have.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnx.checkpoint.format import STATE_PREFIX, CheckpointError
from attnx.components.attention import SEPARATE_PROJECTIONS, MultiHeadAttention, fuse_separate_projections
from attnx.model import TransformerConfig, build_transformer


def separate_attentions(module: nn.Module, state: dict[str, Any]) -> list[str]:
    """Names (with a trailing dot) of the `MultiHeadAttention`s of `module` whose weights `state` holds in the
    earlier, separate layout."""
    return [
        f"{name}."
        for name, child in module.named_modules()
        if isinstance(child, MultiHeadAttention) and f"{name}.{SEPARATE_PROJECTIONS[0]}.weight" in state
    ]


def earlier_parameter_names(module: nn.Module, attentions: list[str]) -> dict[str, list[str]]:
    """Each parameter of `module` (in `parameters()` order) -> the parameters it stands for in the earlier
    layout: itself, or for a stacked `in_proj` weight the three projections' weights (biases likewise).

    The earlier order interleaved each projection's weight and bias (`q_proj.weight`, `q_proj.bias`,
    `k_proj.weight`, ...); [`earlier_order`][attnx.checkpoint.legacy.earlier_order] lays it out."""
    names: dict[str, list[str]] = {}
    for name, _ in module.named_parameters():
        prefix, _, leaf = name.rpartition("in_proj.")
        if leaf and prefix in attentions:
            names[name] = [f"{prefix}{projection}.{leaf}" for projection in SEPARATE_PROJECTIONS]
        else:
            names[name] = [name]
    return names


def earlier_order(parts: dict[str, list[str]]) -> list[str]:
    """The earlier layout's parameter names in `parameters()` order (the order an optimizer numbered them)."""
    order: list[str] = []
    for name, earlier in parts.items():
        if len(earlier) == 1:
            order.append(name)
        elif name.endswith("in_proj.weight"):  # the bias, if any, follows: both projection by projection
            bias = name.removesuffix("weight") + "bias"
            for i, weight in enumerate(earlier):
                order += [weight, parts[bias][i]] if bias in parts else [weight]
    return order


def upgrade_optimizer_state(state: dict[str, Any], parts: dict[str, list[str]]) -> dict[str, Any]:
    """An optimizer's `state_dict()` saved over the earlier parameters, renumbered over today's: the per-
    parameter tensors (Adam's moments) of stacked projections stacked, scalars (its step) kept."""
    earlier = earlier_order(parts)
    numbers = [number for group in state["param_groups"] for number in group["params"]]
    if len(numbers) != len(earlier):
        raise CheckpointError(
            f"the optimizer state holds {len(numbers)} parameters, the model's earlier layout {len(earlier)}: "
            "this checkpoint cannot resume here; start a new run from its weights with --init_from"
        )
    number_of = dict(zip(earlier, numbers, strict=True))
    group_of = {n: i for i, group in enumerate(state["param_groups"]) for n in group["params"]}
    groups = [dict(group, params=[]) for group in state["param_groups"]]
    moments: dict[int, dict[str, Any]] = {}
    for new_number, old_names in enumerate(parts.values()):
        olds = [number_of[old] for old in old_names]
        groups[group_of[olds[0]]]["params"].append(new_number)
        if all(old in state["state"] for old in olds):
            first = state["state"][olds[0]]
            moments[new_number] = {
                key: torch.cat([state["state"][old][key] for old in olds])
                if torch.is_tensor(value) and value.dim() > 0
                else value
                for key, value in first.items()
            }
    return {"state": moments, "param_groups": groups}


def upgrade_checkpoint(checkpoint: dict[str, Any], module: nn.Module | None = None) -> bool:
    """Bring a checkpoint of the earlier attention layout to today's, in place; whether it was one.

    `module` is what the checkpoint's `state_dict` belongs to (the training task, whose `model` is the
    Transformer); without one, the Transformer its `attnx` metadata describes is built on the meta device
    (no memory) to find the attention layers. The weights are stacked (`state_dict`), and so is every
    optimizer state saved with them (`optimizer_states`), so the checkpoint resumes as it would have.
    """
    state = checkpoint["state_dict"]
    if not any(key.endswith(f".{SEPARATE_PROJECTIONS[0]}.weight") for key in state):
        return False
    if module is None:
        with torch.device("meta"):
            model = build_transformer(TransformerConfig.from_dict(checkpoint["attnx"]["transformer"]))
        module = nn.Module()
        module.add_module(STATE_PREFIX.rstrip("."), model)
    attentions = separate_attentions(module, state)
    if not attentions:
        return False
    parts = earlier_parameter_names(module, attentions)
    if "optimizer_states" in checkpoint:
        checkpoint["optimizer_states"] = [
            upgrade_optimizer_state(optimizer, parts) for optimizer in checkpoint["optimizer_states"]
        ]
    for prefix in attentions:
        fuse_separate_projections(module, state, prefix)
    return True

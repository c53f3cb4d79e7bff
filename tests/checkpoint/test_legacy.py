"""Checkpoints of the earlier attention layout (`q_proj`, `k_proj`, `v_proj` apart): they load with identical
outputs, resume with the same optimizer state, and average with checkpoints of today's layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from attnx.checkpoint import (
    STATE_PREFIX,
    CheckpointError,
    average_checkpoints,
    load_model,
    upgrade_checkpoint,
)
from attnx.components.attention import MultiHeadAttention
from attnx.data.tokenizer import Tokenizer
from attnx.model import build_transformer
from attnx.training.module import TranslationTask
from tests.checkpoints import save_model
from tests.conftest import tiny_config


def earlier_names(module: nn.Module) -> list[tuple[str, nn.Parameter, slice | None]]:
    """`module`'s parameters as the earlier layout listed them: (name, today's parameter, its rows in it)."""
    attentions = {f"{n}.": m for n, m in module.named_modules() if isinstance(m, MultiHeadAttention)}
    listed = []
    for name, param in module.named_parameters():
        prefix, _, leaf = name.rpartition("in_proj.")
        if not leaf or prefix not in attentions:
            listed.append((name, param, None))
        elif leaf == "weight":  # each projection's weight, then its bias
            attention, start = attentions[prefix], 0
            for projection, size in zip(("q_proj", "k_proj", "v_proj"), attention.sizes, strict=True):
                rows = slice(start, start + size)
                listed.append((f"{prefix}{projection}.weight", param, rows))
                if attention.in_proj.bias is not None:
                    listed.append((f"{prefix}{projection}.bias", attention.in_proj.bias, rows))
                start += size
    return listed


def earlier_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """`module.state_dict()` as the earlier layout wrote it (three projections, in its key order)."""
    projections: dict[str, list] = {}
    for name, param, rows in earlier_names(module):
        if rows is not None:
            projections.setdefault(name.rpartition(".")[0].rpartition(".")[0] + ".", []).append(
                (name, param, rows)
            )
    state = {}
    for key, value in module.state_dict().items():
        prefix, _, leaf = key.rpartition("in_proj.")
        if leaf and prefix in projections:
            if leaf == "weight":
                state |= {name: param.detach()[rows].clone() for name, param, rows in projections[prefix]}
            continue
        state[key] = value
    return state


@pytest.mark.parametrize("bias", [True, False])
def test_an_earlier_state_dict_loads_and_computes_the_same(bias: bool) -> None:
    torch.manual_seed(0)
    model = build_transformer(tiny_config()).double().eval()
    if not bias:
        for attention in [m for m in model.modules() if isinstance(m, MultiHeadAttention)]:
            attention.in_proj.bias = None
    earlier = earlier_state(model)
    assert "encoder_layers.0.self_attn.q_proj.weight" in earlier
    assert not any("in_proj" in key for key in earlier)
    torch.manual_seed(1)
    fresh = build_transformer(tiny_config()).double().eval()
    if not bias:
        for attention in [m for m in fresh.modules() if isinstance(m, MultiHeadAttention)]:
            attention.in_proj.bias = None
    fresh.load_state_dict(earlier)  # strict: every key used, none missing
    src, tgt = torch.randint(4, 50, (3, 7)), torch.randint(4, 50, (3, 5))
    src_mask = torch.arange(7) < torch.tensor([[7], [5], [2]])
    assert torch.equal(fresh(src, tgt, src_mask), model(src, tgt, src_mask))
    assert fresh.state_dict().keys() == model.state_dict().keys()


def test_an_earlier_checkpoint_file_translates_and_averages_with_todays(tmp_path: Path, corpus: Path) -> None:
    """A run resumed across the change of layout holds checkpoints of both: they average, and the average
    is that of the same weights in one layout."""
    tokenizer = Tokenizer.load(corpus / "spm.model")
    config = tiny_config(vocab_size=tokenizer.vocab_size)
    models, paths = [], []
    for step in (1, 2):
        torch.manual_seed(step)
        models.append(build_transformer(config))
        paths.append(tmp_path / f"step={step}.ckpt")
        save_model(paths[-1], models[-1], config, tokenizer)
    checkpoint = torch.load(paths[0], weights_only=True)
    checkpoint["state_dict"] = {STATE_PREFIX + k: v for k, v in earlier_state(models[0]).items()}
    earlier = tmp_path / "earlier" / "step=1.ckpt"
    earlier.parent.mkdir()
    torch.save(checkpoint, earlier)

    loaded = load_model(earlier).model
    assert all(
        torch.equal(a, b)
        for a, b in zip(loaded.state_dict().values(), models[0].state_dict().values(), strict=True)
    )
    mixed, today = average_checkpoints([earlier, paths[1]]), average_checkpoints(paths)
    assert mixed["state_dict"].keys() == today["state_dict"].keys()
    assert all(torch.equal(mixed["state_dict"][k], v) for k, v in today["state_dict"].items())


def adam_steps(params: list[torch.Tensor], grads: list[torch.Tensor], steps: int = 2) -> torch.optim.AdamW:
    optimizer = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.98), eps=1e-9, fused=True)
    for _ in range(steps):
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad.clone()
        optimizer.step()
    return optimizer


def test_an_earlier_training_checkpoint_resumes_with_the_same_adam_moments() -> None:
    """The optimizer state of the earlier layout (one entry per projection) becomes today's (stacked), so
    the resumed run's next step is the one the earlier layout would have taken."""
    torch.manual_seed(0)
    task = TranslationTask(tiny_config())
    start = {k: v.clone() for k, v in task.state_dict().items()}
    grads = [torch.randn_like(p) for p in task.parameters()]
    today = adam_steps(list(task.parameters()), grads)

    twin = TranslationTask(tiny_config())  # the same weights and gradients, in the earlier layout
    twin.load_state_dict(start)
    grad_of = {id(param): grad for param, grad in zip(twin.parameters(), grads, strict=True)}
    whole = slice(None)
    listed = [(param, whole if rows is None else rows) for _, param, rows in earlier_names(twin)]
    leaves = [param.detach()[rows].clone().requires_grad_() for param, rows in listed]
    earlier = adam_steps(leaves, [grad_of[id(param)][rows] for param, rows in listed])
    assert len(earlier.state_dict()["state"]) > len(today.state_dict()["state"])

    checkpoint = {
        "state_dict": earlier_state(task),
        "optimizer_states": [earlier.state_dict()],
        "attnx": {"transformer": tiny_config().to_dict()},
    }
    resumed = TranslationTask(tiny_config())
    resumed.on_load_checkpoint(checkpoint)
    resumed.load_state_dict(checkpoint["state_dict"])
    optimizer = resumed.configure_optimizers()["optimizer"]
    optimizer.load_state_dict(checkpoint["optimizer_states"][0])
    for (number, ours), theirs in zip(
        optimizer.state_dict()["state"].items(), today.state_dict()["state"].values(), strict=True
    ):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0, msg=f"{number} {key}")
    for optimizer_, params in ((optimizer, list(resumed.parameters())), (today, list(task.parameters()))):
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad.clone()
        optimizer_.param_groups[0]["lr"] = 1e-2
        optimizer_.step()
    for a, b in zip(resumed.parameters(), task.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_an_optimizer_state_of_another_model_is_refused_in_one_line() -> None:
    task = TranslationTask(tiny_config())
    state = {"state": {}, "param_groups": [{"params": [0, 1, 2]}]}
    checkpoint = {"state_dict": earlier_state(task), "optimizer_states": [state], "attnx": {}}
    with pytest.raises(CheckpointError, match="optimizer state holds 3 parameters.*--init_from"):
        upgrade_checkpoint(checkpoint, task)
    assert not upgrade_checkpoint({"state_dict": task.state_dict()}, task)  # today's layout: nothing to do

"""The plugin manager: the built-ins load through the same hook as third-party plugins, in a fixed order, and
every registered component says which plugin and distribution it came from."""

from __future__ import annotations

import types

import pytest

from attnx import hookimpl
from attnx.model import build_transformer
from attnx.plugins import DEFAULT_PLUGINS, collect, plugin_manager, registry
from attnx.registry import DuplicateComponentError, Kind
from tests.conftest import tiny_config
from tests.test_registry import Swish, throwaway_plugin


def test_builtins_register_through_the_hook():
    pm = plugin_manager(entry_points=False)
    assert [name for name, _ in pm.list_name_plugin()] == list(DEFAULT_PLUGINS)
    reg = collect(pm)
    assert reg.entry("attention", "multihead").plugin == "attnx.components.attention"


def test_a_registered_plugin_is_usable_by_name():
    pm = plugin_manager(entry_points=False)
    plugin = throwaway_plugin("swish_plugin", "add_feedforward", Swish)
    pm.register(plugin)
    try:
        reg = collect(pm)
        config = tiny_config()
        config.feedforward.name = "mish"
        model = build_transformer(config, reg)
        assert isinstance(model.encoder_layers[0].ffn, Swish)
    finally:
        pm.unregister(plugin)


def test_every_component_says_where_it_came_from():
    pm = plugin_manager(entry_points=False)
    plugin = throwaway_plugin("swish_plugin", "add_feedforward", Swish)
    pm.register(plugin, name="swish_plugin")
    try:
        reg = collect(pm)
    finally:
        pm.unregister(plugin)
    builtin, added = reg.entry(Kind.FEEDFORWARD, "relu"), reg.entry(Kind.FEEDFORWARD, "mish")
    assert (builtin.plugin, builtin.distribution) == ("attnx.components.feedforward", "attnx (built-in)")
    assert (added.plugin, added.distribution) == ("swish_plugin", "registered in-process")
    assert (reg.plugin, reg.distribution) == (
        "<direct>",
        "<direct>",
    )  # what a direct reg.add() is credited to


def test_the_built_ins_register_first_so_a_clash_is_reported_against_them():
    """A plugin pluggy would call first (`tryfirst`) still registers after the built-ins."""
    pm = plugin_manager(entry_points=False)
    eager = types.ModuleType("eager_plugin")

    @hookimpl(tryfirst=True)
    def attnx_register_components(registry):
        registry.add_feedforward("relu", Swish)

    eager.attnx_register_components = attnx_register_components
    pm.register(eager, name="eager_plugin")
    try:
        with pytest.raises(DuplicateComponentError) as err:
            collect(pm)
    finally:
        pm.unregister(eager)
    assert str(err.value) == (
        "feedforward component 'relu' is registered twice: by plugin 'attnx.components.feedforward' "
        "(distribution attnx (built-in)) and by plugin 'eager_plugin' (distribution registered in-process). "
        "Uninstall one of them or rename the component."
    )


def test_the_process_wide_registry_is_built_once_with_the_installed_plugins():
    assert registry() is registry()
    assert {"multihead", "relu", "sinusoidal", "learned", "layernorm"} <= {
        e.name for e in registry().entries()
    }


class ThirdPartyTurn:
    """A query/key position written against the public protocol alone: each head's feature pairs turned by
    `0.3 · position` radians (`acts_on = "queries_keys"`, built as `cls(head_dim, max_len)`)."""

    acts_on = "queries_keys"

    def __init__(self, head_dim: int, max_len: int) -> None:
        self.head_dim = head_dim

    def __call__(self, x, offset=0):
        import torch

        assert x.shape[-1] == self.head_dim
        angle = 0.3 * torch.arange(offset, offset + x.shape[-2], dtype=x.dtype).unsqueeze(-1)  # (T, 1)
        even, odd = x[..., 0::2], x[..., 1::2]
        turned = (even * angle.cos() - odd * angle.sin(), even * angle.sin() + odd * angle.cos())
        return torch.stack(turned, -1).flatten(-2)  # (B, H, T, d_k)


class ThirdPartyBias:
    """A score bias written against the public protocol alone: `-0.5 · (i - j)²` in every head (`"scores"`,
    built as `cls(n_heads, max_len)`)."""

    acts_on = "scores"

    def __init__(self, n_heads: int, max_len: int) -> None:
        self.n_heads = n_heads

    def __call__(self, t, s, offset=0, causal=False):
        import torch

        query = torch.arange(offset, offset + t).unsqueeze(1)
        distance = (query - torch.arange(s).unsqueeze(0)).double()
        return (-0.5 * distance**2).expand(self.n_heads, t, s)  # (H, T, S)


def third_party_attention():
    """An attention component written against the public protocol and helpers alone: multi-query attention
    that takes positions on queries and keys and on the scores, reads its offset from the cache, and caches
    its one key/value head."""
    import math

    import torch
    from torch import nn

    from attnx.components.masking import (
        attention_mask,
        cache_offset,
        cached_keys_values,
        positioned_queries_keys,
        score_bias,
    )

    class Attention(nn.Module):
        positions_accepted = ("queries_keys", "scores")

        def __init__(self, d_model: int, n_heads: int, kv_heads: int = 1) -> None:
            super().__init__()
            self.h, self.g, self.d_k = n_heads, kv_heads, d_model // n_heads
            self.q, self.o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
            self.k, self.v = (
                nn.Linear(d_model, kv_heads * self.d_k) for _ in range(2)
            )  # fewer key/value heads

        def heads(self, x):
            return x.view(x.shape[0], x.shape[1], -1, self.d_k).transpose(1, 2)  # (B, heads, T, d_k)

        def forward(
            self,
            query,
            key_value,
            *,
            key_mask=None,
            causal=False,
            cache=None,
            need_weights=False,
            positions=None,
        ):
            b, t, _ = query.shape
            q, k = self.heads(self.q(query)), self.heads(self.k(key_value))
            if query is key_value:
                q, k = positioned_queries_keys(positions, q, k, cache_offset(cache))
            new = (k, self.heads(self.v(key_value)))
            k, v, offset = cached_keys_values(cache, lambda: new)  # (B, g, S, d_k): the cache holds g heads
            k, v = (x.repeat_interleave(self.h // self.g, dim=1) for x in (k, v))
            s = k.shape[2]
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, H, T, S)
            bias = score_bias(positions, t, s, offset, causal)
            if bias is not None:
                scores = scores + bias.to(scores.dtype)
            mask = attention_mask(key_mask, causal, t, s, offset, query.device)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = torch.softmax(scores, -1).nan_to_num(0.0)
            out = self.o((weights @ v).transpose(1, 2).reshape(b, t, -1))
            return (out, weights) if need_weights else out

    return Attention


@pytest.mark.parametrize("positional", ["turn", "bias", "rotary", "t5_relative"])
@pytest.mark.parametrize("attention", ["theirs", "multihead"])
def test_third_party_positions_and_attention_work_through_the_public_seams(positional, attention):
    """Each new seam (positions on queries and keys, on scores, an attention taking them, the cache's offset,
    a cache of fewer key/value heads) carries a component written against the public protocol alone, with the
    built-ins and with each other."""
    import torch

    from attnx.model.builders import ComponentSpec

    plugin = types.ModuleType("third_party_positions")

    @hookimpl
    def attnx_register_components(registry):
        registry.add_positional("turn", ThirdPartyTurn)
        registry.add_positional("bias", ThirdPartyBias)
        registry.add_attention("theirs", third_party_attention())

    plugin.attnx_register_components = attnx_register_components
    pm = plugin_manager(entry_points=False)
    pm.register(plugin, name="third_party_positions")
    try:
        registry_ = collect(pm)
    finally:
        pm.unregister(plugin)
    config = tiny_config(positional=ComponentSpec(positional), self_attention=ComponentSpec(attention))
    torch.manual_seed(0)
    model = build_transformer(config, registry_).double().eval()
    with torch.no_grad():
        for module in model.modules():  # T5's table starts at zero
            if getattr(module, "acts_on", None) == "scores":
                for p in module.parameters():
                    p.normal_()
        src = torch.randint(4, 50, (2, 7))
        src_mask = torch.ones(2, 7, dtype=torch.bool)
        src_mask[1, 5:] = False
        tgt = torch.randint(4, 50, (2, 6))
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)
        state = model.start_decoding(memory, src_mask)
        for i in range(6):
            torch.testing.assert_close(model.decode_step(tgt[:, i], state), full[:, i], rtol=1e-9, atol=1e-9)
        heads = 1 if attention == "theirs" else 4  # their attention keeps one key/value head in the cache
        assert all(c.k.shape == (2, heads, 6, 8) for c, _ in state.caches)
        order = torch.tensor([3, 0, 1, 2, 4, 5, 6])  # positions count: moving a token is not a permutation
        everything = torch.ones(2, 7, dtype=torch.bool)
        assert not torch.allclose(
            model.encode(src[:, order], everything), model.encode(src, everything)[:, order]
        )

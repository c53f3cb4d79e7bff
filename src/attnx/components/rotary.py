"""Rotary position embedding (RoFormer, Su et al. 2021): positions that turn queries and keys."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnx.components.values import integer, is_integer, positive
from attnx.errors import ConfigError
from attnx.hookspecs import hookimpl


class RotaryPositionalEncoding(nn.Module):
    """RoFormer §3.4.2 (eq. 34): the pair `(x_2i, x_2i+1)` of a query or key at position `m` is turned by
    the angle `m θ_i`, `θ_i = base^(-2i/d)`, so that `q_m · k_n` depends on `m - n` alone.

    Acts on the queries and keys of self-attention (`acts_on = "queries_keys"`), built as
    `cls(head_dim, max_len, base=10000.0, dim=None)`. `dim` turns only the first `dim` features of each head
    (partial rotary, CTranslate2's `rotary_dim`; default the whole head), `base` is the paper's 10000. Pairs are
    adjacent features (the paper's layout, CTranslate2's `rotary_interleave`). No parameters, no length limit:
    `max_len` is not needed, positions beyond it work as any other. Angles are computed in float64, the
    rotation in fp32 at least (bf16 queries and keys are cast back after it), so a float64 model gets exact
    rotations.
    """

    acts_on = "queries_keys"

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0, dim: int | None = None) -> None:
        super().__init__()
        head_dim = integer("head_dim", head_dim)
        dim = head_dim if dim is None else dim
        if not is_integer(dim) or dim <= 0 or dim % 2 or dim > head_dim:
            raise ConfigError(
                f"rotary dim ({dim!r}) must be even, positive, an integer and at most the head dimension "
                f"({head_dim})"
            )
        base = positive("rotary base", base, above=1.0, what="the paper's is 10000")
        self.dim = dim
        self.base = base
        inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,) θ_i
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        t = x.shape[-2]
        position = torch.arange(offset, offset + t, dtype=torch.float64, device=x.device)
        angle = position.unsqueeze(1) * self.inv_freq.to(x.device)  # (T, dim/2)
        wide = torch.promote_types(x.dtype, torch.float32)  # bf16 queries are turned in fp32, then cast back
        cos, sin = angle.cos().to(wide), angle.sin().to(wide)
        turned, rest = x[..., : self.dim].to(wide), x[..., self.dim :]
        even, odd = turned[..., 0::2], turned[..., 1::2]  # (B, H, T, dim/2) each
        pairs = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)  # (B, H, T, dim/2, 2)
        return torch.cat((pairs.flatten(-2).to(x.dtype), rest), dim=-1)  # (B, H, T, d_k)


@hookimpl
def attnx_register_components(registry) -> None:
    registry.add_positional("rotary", RotaryPositionalEncoding)

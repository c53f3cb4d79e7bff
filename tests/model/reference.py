"""An independent float64 Transformer written plainly, to check the real one against.

It reads the real model's weights by name and recomputes everything with explicit loops over heads and
layers: no module of attnx is called.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def layer_norm(x: Tensor, p: dict[str, Tensor], name: str, eps: float = 1e-5) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * p[f"{name}.weight"] + p[f"{name}.bias"]


def linear(x: Tensor, p: dict[str, Tensor], name: str) -> Tensor:
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def attention(
    query: Tensor, keys: Tensor, p: dict[str, Tensor], name: str, heads: int, allowed: Tensor
) -> Tensor:
    """``allowed``: (T, S) bool for one sentence. Heads computed one at a time. The weights are read in
    either layout: ``q_proj``, ``k_proj``, ``v_proj`` apart, or stacked in that order as ``in_proj``."""
    if f"{name}.in_proj.weight" in p:
        weight, bias = p[f"{name}.in_proj.weight"], p[f"{name}.in_proj.bias"]
        d_q = d_k = (weight.shape[0] - p[f"{name}.out_proj.weight"].shape[1]) // 2
        rows = {"q_proj": slice(0, d_q), "k_proj": slice(d_q, d_q + d_k), "v_proj": slice(d_q + d_k, None)}
        p = p | {f"{name}.{k}.weight": weight[r] for k, r in rows.items()}
        p = p | {f"{name}.{k}.bias": bias[r] for k, r in rows.items()}
    q = linear(query, p, f"{name}.q_proj")
    k = linear(keys, p, f"{name}.k_proj")
    v = linear(keys, p, f"{name}.v_proj")
    d_k = q.shape[-1] // heads
    outs = []
    for h in range(heads):
        cols = slice(h * d_k, (h + 1) * d_k)
        scores = q[:, cols] @ k[:, cols].T / math.sqrt(d_k)
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append(torch.softmax(scores, -1) @ v[:, cols])
    return linear(torch.cat(outs, -1), p, f"{name}.out_proj")


def sinusoids(n: int, d: int) -> Tensor:
    pe = torch.zeros(n, d, dtype=torch.float64)
    for pos in range(n):
        for i in range(0, d, 2):
            pe[pos, i] = math.sin(pos / 10000 ** (i / d))
            pe[pos, i + 1] = math.cos(pos / 10000 ** (i / d))
    return pe


def transformer_logits(
    model: torch.nn.Module, src: Tensor, src_len: int, tgt_in: Tensor, heads: int
) -> Tensor:
    """Logits ``(T, V)`` of one sentence pair (post-norm, shared embeddings, sinusoids, eval mode)."""
    p = {k: v.double() for k, v in model.state_dict().items()}
    emb = p["src_embedding.weight"]
    d = emb.shape[1]
    n_enc = len({k.split(".")[1] for k in p if k.startswith("encoder_layers.")})
    n_dec = len({k.split(".")[1] for k in p if k.startswith("decoder_layers.")})
    src = src[:src_len]
    x = emb[src] * math.sqrt(d) + sinusoids(len(src), d)
    all_keys = torch.ones(len(src), len(src), dtype=torch.bool)
    for i in range(n_enc):
        L = f"encoder_layers.{i}"
        x = layer_norm(
            x + attention(x, x, p, f"{L}.self_attn", heads, all_keys), p, f"{L}.attn_residual.norm"
        )
        ffn = linear(torch.relu(linear(x, p, f"{L}.ffn.w1")), p, f"{L}.ffn.w2")
        x = layer_norm(x + ffn, p, f"{L}.ffn_residual.norm")
    memory = x
    t = len(tgt_in)
    y = emb[tgt_in] * math.sqrt(d) + sinusoids(t, d)
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    cross = torch.ones(t, len(src), dtype=torch.bool)
    for i in range(n_dec):
        L = f"decoder_layers.{i}"
        y = layer_norm(y + attention(y, y, p, f"{L}.self_attn", heads, causal), p, f"{L}.self_residual.norm")
        y = layer_norm(
            y + attention(y, memory, p, f"{L}.cross_attn", heads, cross), p, f"{L}.cross_residual.norm"
        )
        ffn = linear(torch.relu(linear(y, p, f"{L}.ffn.w1")), p, f"{L}.ffn.w2")
        y = layer_norm(y + ffn, p, f"{L}.ffn_residual.norm")
    return y @ emb.T

"""One layer's attention heads for a sentence, drawn like the paper's appendix figures (`attnx attention`).

[EagerTranslator.attention][attnx.inference.eager.EagerTranslator.attention] translates the sentence and collects
every attention's weights over the teacher-forced result. The figure has one panel per head: first the
encoder self-attention heads of the chosen layer (source × source), then its encoder-decoder attention heads
(target × source). A target row is labelled with the token predicted at that step.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

from attnx.errors import ConfigError

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from attnx.inference.eager import AttentionMaps  # noqa: E402

COLUMNS = 4
"""Heads per row of panels."""


def plot_attention(maps: AttentionMaps, layer: int = -1) -> Figure:
    """Panels of every head of `layer`: encoder self-attention rows first, then encoder-decoder attention."""
    n_layers = len(maps.encoder)
    if not -n_layers <= layer < n_layers or not -len(maps.cross) <= layer < len(maps.cross):
        raise ConfigError(
            f"layer {layer} does not exist: the model has {n_layers} encoder and {len(maps.cross)} decoder "
            "layers (0-based, negative counts from the last)"
        )
    enc, dec = maps.encoder[layer], maps.cross[layer]  # (H, S, S), (H, T, S)
    heads = enc.shape[0]
    cols = min(heads, COLUMNS)
    rows_per_block = math.ceil(heads / cols)
    s, t = len(maps.source_tokens), len(maps.target_tokens)
    cell = 0.28  # inches per token
    width = cols * (cell * s + 1.4)
    height = rows_per_block * (cell * s + 1.9) + rows_per_block * (cell * t + 1.9) + 1.5
    fig, axes = plt.subplots(
        2 * rows_per_block,
        cols,
        figsize=(width, height),
        squeeze=False,
        gridspec_kw={"height_ratios": [s] * rows_per_block + [t] * rows_per_block},
    )
    layer_no = layer % n_layers
    blocks = [
        ("encoder self-attention", enc, maps.source_tokens),
        ("encoder-decoder attention", dec, maps.target_tokens),
    ]
    for block, (title, weights, row_tokens) in enumerate(blocks):
        for h in range(rows_per_block * cols):
            ax = axes[block * rows_per_block + h // cols, h % cols]
            if h >= heads:
                ax.set_visible(False)
                continue
            ax.imshow(weights[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
            ax.set_title(f"{title}\nlayer {layer_no}, head {h}", fontsize=9)
            ax.set_xticks(range(s), maps.source_tokens, rotation=90, fontsize=7)
            ax.set_yticks(range(len(row_tokens)), row_tokens, fontsize=7)
            ax.tick_params(length=0)
    chars = max(40, int(width * 12))  # characters per title line at 10 pt
    title = "\n".join(
        textwrap.wrap(f"source: {' '.join(maps.source_tokens)}", chars)
        + textwrap.wrap(f"translation: {maps.translation}", chars)
        + ["colour: attention weight, 0 (dark) to 1 (bright)"]
    )
    fig.suptitle(title, fontsize=10)
    title_inches = 0.2 * (title.count("\n") + 1) + 0.3
    fig.tight_layout(rect=(0, 0, 1, 1 - title_inches / height))
    return fig


def save_attention_figure(maps: AttentionMaps, output: str | Path, layer: int = -1, dpi: int = 120) -> Path:
    """Draw [`plot_attention`][attnx.inference.attention_map.plot_attention] to a PNG file (its folder is created)."""
    fig = plot_attention(maps, layer)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(output, dpi=dpi)
    finally:
        plt.close(fig)
    return output

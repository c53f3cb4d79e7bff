"""The attention figure: one panel per head, encoder self-attention and encoder-decoder attention."""

from __future__ import annotations

import pytest

import attnx
from attnx.inference.attention_map import plot_attention, save_attention_figure
from attnx.inference.config import SearchConfig

SOURCE = "A man in an orange hat starring at something."


def test_figure_layout_one_panel_per_head_per_attention(checkpoint, loaded, tmp_path):
    maps = attnx.load(checkpoint, search=SearchConfig(beam=2, max_len_b=8)).attention(SOURCE)
    heads = loaded.config.n_heads
    fig = plot_attention(maps, layer=0)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2 * heads
    titles = [ax.get_title() for ax in panels]
    assert sum("encoder self-attention" in x for x in titles) == heads
    assert sum("encoder-decoder attention" in x for x in titles) == heads
    assert [label.get_text() for label in panels[0].get_xticklabels()] == maps.source_tokens
    assert [label.get_text() for label in panels[-1].get_yticklabels()] == maps.target_tokens
    with pytest.raises(ValueError, match="does not exist"):
        plot_attention(maps, layer=5)
    png = save_attention_figure(maps, tmp_path / "deep" / "a.png", layer=-1, dpi=50)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

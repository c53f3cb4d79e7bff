"""``attnx attention``: a PNG with one panel per head, encoder self-attention and encoder-decoder attention."""

from __future__ import annotations

import matplotlib.image
import pytest
import torch

from attnx.inference.attention_map import attention_maps, main, plot_attention
from attnx.inference.search import SearchConfig

SOURCE = "A man in an orange hat starring at something."


def test_attention_command_writes_a_png_of_every_head(checkpoint, tmp_path, capsys):
    out = tmp_path / "attn.png"
    assert (
        main(["--ckpt_path", str(checkpoint), "--source", SOURCE, "--output", str(out), "--beam", "2"]) == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(out).shape
    assert width > 600 and height > 400
    assert f"wrote {out}" in capsys.readouterr().out


def test_figure_layout_one_panel_per_head_per_attention(loaded):
    maps = attention_maps(loaded, SOURCE, SearchConfig(beam=2, max_len_b=8))
    heads, s, t = loaded.config.n_heads, len(maps.source_tokens), len(maps.target_tokens)
    assert maps.source_tokens[-1] == maps.target_tokens[-1] == "</s>"
    assert [w.shape for w in maps.encoder] == [(heads, s, s)] * loaded.config.encoder_layers
    assert [w.shape for w in maps.cross] == [(heads, t, s)] * loaded.config.decoder_layers
    torch.testing.assert_close(maps.cross[0].sum(-1), torch.ones(heads, t))  # rows are distributions

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

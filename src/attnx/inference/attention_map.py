"""``attnx attention``: one layer's attention heads for a sentence, drawn like the paper's appendix figures.

The sentence is translated first (beam search by default); then the model re-reads the source and its own
translation with teacher forcing, collecting every attention's weights through the ``weights`` lists of
:meth:`Transformer.encode` and :meth:`Transformer.decode`. The figure has one panel per head: first the
encoder self-attention heads of the chosen layer (source × source), then its encoder-decoder attention heads
(target × source). A target row is labelled with the token predicted at that step.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from torch import Tensor  # noqa: E402

from attnx.checkpoint import CheckpointError, LoadedModel, load_model  # noqa: E402
from attnx.data.batch import BOS_ID, EOS_ID, collate  # noqa: E402
from attnx.inference.search import SearchConfig, translate_batch  # noqa: E402
from attnx.inference.translate import parse_device  # noqa: E402

COLUMNS = 4
"""Heads per row of panels."""


@dataclass
class AttentionMaps:
    """Weights of every layer for one sentence pair; ``encoder[l]`` ``(H, S, S)``, ``cross[l]`` ``(H, T, S)``."""

    source_tokens: list[str]  # S pieces, ending in </s>
    target_tokens: list[str]  # T pieces predicted, ending in </s>
    translation: str
    encoder: list[Tensor]
    cross: list[Tensor]


def attention_maps(loaded: LoadedModel, source: str, config: SearchConfig) -> AttentionMaps:
    """Translate ``source``, then collect the attention weights of the teacher-forced pass over the result."""
    model, tokenizer = loaded.model, loaded.tokenizer
    device = next(model.parameters()).device
    src_ids = tokenizer.encode(source.strip())[: loaded.config.max_len - 1]
    if config.max_positions is None:
        config = replace(config, max_positions=loaded.config.max_len)
    batch = collate([(src_ids, [])])
    src, src_mask = batch.src.to(device), batch.src_mask.to(device)
    tgt_ids = translate_batch(model, src, src_mask, config)[0]
    tgt_in = torch.tensor([[BOS_ID, *tgt_ids]], device=device)
    encoder: list[Tensor] = []
    cross: list[Tensor] = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            memory = model.encode(src, src_mask, weights=encoder)
            model.decode(tgt_in, memory, src_mask, weights=cross)
    finally:
        model.train(was_training)

    def pieces(ids: list[int]) -> list[str]:
        return [tokenizer.sp.id_to_piece(i) for i in ids]

    return AttentionMaps(
        source_tokens=pieces([*src_ids, EOS_ID]),
        target_tokens=pieces([*tgt_ids, EOS_ID]),
        translation=tokenizer.decode(tgt_ids),
        encoder=[w[0].float().cpu() for w in encoder],
        cross=[w[0].float().cpu() for w in cross],
    )


def plot_attention(maps: AttentionMaps, layer: int = -1) -> Figure:
    """Panels of every head of ``layer``: encoder self-attention rows first, then encoder-decoder attention."""
    n_layers = len(maps.encoder)
    if not -n_layers <= layer < n_layers or not -len(maps.cross) <= layer < len(maps.cross):
        raise ValueError(
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="attnx attention",
        description="Translate one sentence and draw the attention heads of one layer (encoder self-attention "
        "and encoder-decoder attention) to a PNG, like the paper's appendix figures.",
    )
    parser.add_argument(
        "--ckpt_path", required=True, type=Path, help="checkpoint written by attnx fit/average"
    )
    parser.add_argument("--source", required=True, help="the source sentence (plain text)")
    parser.add_argument(
        "--layer",
        type=int,
        default=-1,
        help="layer to draw, 0-based; negative counts from the last (default -1)",
    )
    parser.add_argument(
        "--output", type=Path, default=Path("attn.png"), help="PNG file to write (default attn.png)"
    )
    parser.add_argument(
        "--beam", type=int, default=4, help="beam size for the translation; 1 = greedy (default 4)"
    )
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent α (default 0.6)")
    parser.add_argument("--dpi", type=int, default=120, help="resolution of the PNG (default 120)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    args = parser.parse_args(argv)
    if not args.source.strip():
        parser.error("--source is empty")
    if args.beam < 1:
        parser.error("--beam must be at least 1")
    device = parse_device(parser, args.device)
    try:
        loaded = load_model(args.ckpt_path, device=device)
    except CheckpointError as err:
        print(f"attnx attention: {err}", file=sys.stderr)
        return 2
    maps = attention_maps(loaded, args.source, SearchConfig(beam=args.beam, alpha=args.alpha))
    try:
        fig = plot_attention(maps, args.layer)
    except ValueError as err:
        parser.error(str(err))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=args.dpi)
    plt.close(fig)
    print(f"translation: {maps.translation}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

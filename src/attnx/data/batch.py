"""The one seam between data and model: every batch the model sees is a [`Batch`][attnx.data.batch.Batch]."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from attnx.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "Batch", "collate"]


@dataclass
class Batch:
    """A padded batch of sentence pairs.

    `tgt_in` is `<s> y_1 .. y_n` and `tgt_out` is `y_1 .. y_n </s>` (teacher forcing, shifted by one).
    """

    src: Tensor  # (B, S) long, PAD_ID-padded on the right
    tgt_in: Tensor  # (B, T) long
    tgt_out: Tensor  # (B, T) long, PAD_ID where there is no target
    src_mask: Tensor  # (B, S) bool, True = real token
    tgt_mask: Tensor  # (B, T) bool, True = real token
    n_src_tokens: int  # real (non-pad) source tokens
    n_tgt_tokens: int  # real target tokens (= positions the loss counts)
    index: Tensor | None = None  # (B,) position of each pair in its split, to restore corpus order
    # (N,) long: the (B*T)-order positions the loss scores; by default where tgt_mask is True (N = n_tgt_tokens).
    # A captured step passes all B*T positions (a shape that does not depend on the data): positions
    # whose tgt_out is PAD_ID then count nothing.
    tgt_positions: Tensor | None = None
    # (N, 3) long: batch row, target position, source position of each aligned piece pair (guided alignment);
    # None where the split was prepared without alignments
    alignment: Tensor | None = None

    def __post_init__(self) -> None:
        # found here, on the host where batches are built: selecting the counted positions with the boolean
        # mask on a GPU (`features[tgt_mask]`) waits for the GPU to finish everything queued, every batch
        if self.tgt_positions is None:
            self.tgt_positions = self.tgt_mask.flatten().nonzero().squeeze(1)

    @property
    def size(self) -> int:
        return self.src.shape[0]

    def _map(self, move: Callable[[Tensor], Tensor]) -> Batch:
        """The same batch with `move` applied to every tensor the model reads; `index` stays on the host."""
        return Batch(
            src=move(self.src),
            tgt_in=move(self.tgt_in),
            tgt_out=move(self.tgt_out),
            src_mask=move(self.src_mask),
            tgt_mask=move(self.tgt_mask),
            n_src_tokens=self.n_src_tokens,
            n_tgt_tokens=self.n_tgt_tokens,
            index=self.index,
            tgt_positions=move(self.tgt_positions),
            alignment=None if self.alignment is None else move(self.alignment),
        )

    def to(self, device: torch.device | str, non_blocking: bool | None = None) -> Batch:
        """The batch on `device` (Lightning calls this to move each batch).

        `non_blocking` defaults to True for CUDA devices: from pinned memory ([`pin_memory`][attnx.data.batch.Batch.pin_memory]) the copy
        then runs asynchronously, overlapped with the computation queued before it. Copies to the CPU stay
        blocking, so their values can be read at once.
        """
        if non_blocking is None:
            non_blocking = torch.device(device).type == "cuda"
        return self._map(lambda x: x.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """The batch in page-locked host memory; `DataLoader(pin_memory=True)` calls this in its pinning thread.

        Needs an accelerator: PyTorch raises a RuntimeError where none is present.
        """
        return self._map(lambda x: x.pin_memory())


def collate(
    pairs: list[tuple[list[int] | Tensor, list[int] | Tensor]],
    pad_id: int = PAD_ID,
    index: list[int] | Tensor | None = None,
) -> Batch:
    """Pad `(src_ids, tgt_ids)` pairs (ids without BOS/EOS) into a [`Batch`][attnx.data.batch.Batch].

    The source gets `</s>` appended; the target becomes `<s> y` (input) and `y </s>` (output).
    """
    b = len(pairs)
    s = max(len(src) for src, _ in pairs) + 1
    t = max(len(tgt) for _, tgt in pairs) + 1
    src = torch.full((b, s), pad_id, dtype=torch.long)
    tgt_in = torch.full((b, t), pad_id, dtype=torch.long)
    tgt_out = torch.full((b, t), pad_id, dtype=torch.long)
    for i, (x, y) in enumerate(pairs):
        x = torch.as_tensor(x, dtype=torch.long)
        y = torch.as_tensor(y, dtype=torch.long)
        src[i, : len(x)] = x
        src[i, len(x)] = EOS_ID
        tgt_in[i, 0] = BOS_ID
        tgt_in[i, 1 : len(y) + 1] = y
        tgt_out[i, : len(y)] = y
        tgt_out[i, len(y)] = EOS_ID
    src_mask = src != pad_id
    tgt_mask = tgt_out != pad_id
    return Batch(
        src=src,
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        src_mask=src_mask,
        tgt_mask=tgt_mask,
        n_src_tokens=int(src_mask.sum()),
        n_tgt_tokens=int(tgt_mask.sum()),
        index=None if index is None else torch.as_tensor(index, dtype=torch.long),
    )

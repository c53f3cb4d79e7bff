"""The eager engine: [`EagerTranslator`][attnx.inference.eager.EagerTranslator] decodes a checkpoint's
Transformer in PyTorch with [`translate_batch`][attnx.inference.search.translate_batch].

It batches its input by tokens (shortest first, padding included) and, besides the
[`Translator`][attnx.inference.translator.Translator] calls, collects attention weights for plots
(`attention`). Nothing here needs Lightning.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from attnx.checkpoint import load_model
from attnx.data.batch import BOS_ID, EOS_ID, collate
from attnx.data.tokenizer import Tokenizer
from attnx.inference.config import DEFAULT_MAX_TOKENS, SearchConfig
from attnx.inference.search import translate_batch
from attnx.inference.translator import Translator, fitted_search
from attnx.model import Transformer


def token_batches(lengths: Sequence[int], max_tokens: int) -> Iterator[list[int]]:
    """Indices of `lengths` grouped, shortest first, so that rows × longest ≤ `max_tokens` (≥ 1 row each)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) + 1) * lengths[i] > max_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


@dataclass
class AttentionMaps:
    """Weights of every layer for one sentence pair; `encoder[l]` `(H, S, S)`, `cross[l]` `(H, T, S)`."""

    source_tokens: list[str]  # S pieces, ending in </s>
    target_tokens: list[str]  # T pieces predicted, ending in </s>
    translation: str
    encoder: list[Tensor]
    cross: list[Tensor]


class EagerTranslator(Translator):
    """A model, its tokenizer and how to search (§6.1 by default: beam 4, α 0.6, input length + 50).

    Args:
        model: The Transformer (any device; decoding runs where its weights are).
        tokenizer: The joint SentencePiece model the Transformer was trained with.
        search: Beam size, length penalty and maximum output length. `max_positions` defaults to the
            model's own limit.
        max_tokens: Source tokens per decoding batch, padding included.
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        search: SearchConfig | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_positions = int(model.max_positions)
        self.search = fitted_search(search or SearchConfig(), self.max_positions)
        self.max_tokens = max_tokens

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        search: SearchConfig | None = None,
        **kw: Any,
    ) -> EagerTranslator:
        """The model and tokenizer a checkpoint of `attnx fit`/`attnx average` carries."""
        loaded = load_model(path, device=device)
        return cls(loaded.model, loaded.tokenizer, search, **kw)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device) -> EagerTranslator:
        """Move the model to `device` (in place) and return this translator."""
        self.model.to(device)
        return self

    def with_search(self, **changes: Any) -> EagerTranslator:
        """A translator sharing this one's model, with some search settings changed (e.g. `beam=1`)."""
        return EagerTranslator(
            self.model, self.tokenizer, dataclasses.replace(self.search, **changes), self.max_tokens
        )

    # ---------------------------------------------------------------------------------------------- ids

    def translate_tensors(self, src: Tensor, src_mask: Tensor) -> list[list[int]]:
        """Best output ids (no BOS/EOS) of a padded batch already on the model's device."""
        return translate_batch(self.model, src, src_mask, self.search)

    def translate_ids(self, ids: Sequence[Sequence[int]], progress: bool = False) -> list[list[int]]:
        """Output ids for source ids (no BOS/EOS), one per input in input order; `[]` in gives `[]` out."""
        ids = self.truncate(ids)
        out: list[list[int]] = [[] for _ in ids]
        todo = [i for i, x in enumerate(ids) if x]
        lengths = [len(ids[i]) + 1 for i in todo]  # + the source </s>
        device = self.device
        with tqdm(
            total=len(todo), unit="sent", disable=not progress, file=sys.stderr, dynamic_ncols=True
        ) as bar:
            for batch in token_batches(lengths, self.max_tokens):
                b = collate([(ids[todo[j]], []) for j in batch])
                hyps = self.translate_tensors(b.src.to(device), b.src_mask.to(device))
                for j, hyp in zip(batch, hyps, strict=True):
                    out[todo[j]] = hyp
                bar.update(len(batch))
        return out

    # ---------------------------------------------------------------------------------------- attention

    def attention(self, source: str) -> AttentionMaps:
        """Translate `source`, then collect every attention's weights over the teacher-forced result."""
        src_ids = self.truncate(self.encode([source]))[0]
        if not src_ids:
            raise ValueError("attention needs a non-empty source sentence")
        tgt_ids = self.translate_ids([src_ids])[0]
        device = self.device
        batch = collate([(src_ids, [])])
        src, src_mask = batch.src.to(device), batch.src_mask.to(device)
        tgt_in = torch.tensor([[BOS_ID, *tgt_ids]], device=device)
        encoder: list[Tensor] = []
        cross: list[Tensor] = []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                memory = self.model.encode(src, src_mask, weights=encoder)
                self.model.decode(tgt_in, memory, src_mask, weights=cross)
        finally:
            self.model.train(was_training)

        def pieces(ids: list[int]) -> list[str]:
            return [self.tokenizer.sp.id_to_piece(i) for i in ids]

        return AttentionMaps(
            source_tokens=pieces([*src_ids, EOS_ID]),
            target_tokens=pieces([*tgt_ids, EOS_ID]),
            translation=self.decode(tgt_ids),
            encoder=[w[0].float().cpu() for w in encoder],
            cross=[w[0].float().cpu() for w in cross],
        )

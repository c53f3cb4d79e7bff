"""The one way to translate: [`Translator`][attnx.inference.translator.Translator] (model + tokenizer + search settings) and [`load`][attnx.inference.translator.load].

Every command that decodes — `attnx translate`, `attnx attention`, `attnx test`/`predict`, validation
BLEU during `attnx fit`, the HTTP server — and the Python API go through a Translator:

```python
import attnx

translator = attnx.load("averaged.ckpt")
translator.translate(["A dog runs."])
```

A Translator batches its input by tokens (shortest first, padding included), truncates inputs longer than
the model accepts (with a warning), returns one output per input in input order, and maps blank input to
blank output. Nothing here needs Lightning.
"""

from __future__ import annotations

import dataclasses
import logging
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
from attnx.inference.search import SearchConfig, translate_batch
from attnx.model import Transformer

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 4096
"""Source tokens per decoding batch, padding included."""


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


def one_line(text: str) -> str:
    """Keep a translation on one output line whatever the detokenizer produced."""
    return text.replace("\r", " ").replace("\n", " ").strip()


def encode_lines(tokenizer: Tokenizer, lines: Sequence[str]) -> list[list[int]]:
    """Source ids of `lines` (stripped; blank lines give `[]`)."""
    texts = [line.strip() for line in lines]
    todo = [i for i, text in enumerate(texts) if text]
    ids: list[list[int]] = [[] for _ in texts]
    for i, x in zip(todo, tokenizer.encode_batch([texts[i] for i in todo]) if todo else [], strict=True):
        ids[i] = x
    return ids


def truncate_ids(ids: Sequence[Sequence[int]], max_positions: int) -> list[list[int]]:
    """Cut inputs a model of `max_positions` cannot read (the source `</s>` takes one), with one warning."""
    limit = max_positions - 1
    too_long = [i + 1 for i, x in enumerate(ids) if len(x) > limit]
    if too_long:
        shown = ", ".join(map(str, too_long[:10])) + (" ..." if len(too_long) > 10 else "")
        log.warning(
            "%d input(s) exceed the model's %d positions and were truncated to %d tokens: input %s",
            len(too_long),
            max_positions,
            limit,
            shown,
        )
    return [list(x[:limit]) for x in ids]


def translate_lines(translator: Any, lines: Sequence[str] | str, progress: bool = False) -> list[str]:
    """`translator.translate(lines)` of any engine: encode, `translate_ids`, decode; blank stays blank."""
    if isinstance(lines, str):
        raise TypeError("translate takes a list of lines; wrap a single sentence: translate([text])")
    outputs = translator.translate_ids(translator.encode(lines), progress=progress)
    return [translator.decode(x) if line.strip() else "" for line, x in zip(lines, outputs, strict=True)]


@dataclass
class AttentionMaps:
    """Weights of every layer for one sentence pair; `encoder[l]` `(H, S, S)`, `cross[l]` `(H, T, S)`."""

    source_tokens: list[str]  # S pieces, ending in </s>
    target_tokens: list[str]  # T pieces predicted, ending in </s>
    translation: str
    encoder: list[Tensor]
    cross: list[Tensor]


class Translator:
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
        search = search or SearchConfig()
        if search.beam < 1:
            raise ValueError(f"search.beam must be at least 1, got {search.beam}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_positions = int(model.max_positions)
        if search.max_positions is None or search.max_positions > self.max_positions:
            search = dataclasses.replace(search, max_positions=self.max_positions)
        self.search = search
        self.max_tokens = max_tokens

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        search: SearchConfig | None = None,
        **kw: Any,
    ) -> Translator:
        """The model and tokenizer a checkpoint of `attnx fit`/`attnx average` carries."""
        loaded = load_model(path, device=device)
        return cls(loaded.model, loaded.tokenizer, search, **kw)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device) -> Translator:
        """Move the model to `device` (in place) and return this translator."""
        self.model.to(device)
        return self

    def with_search(self, **changes: Any) -> Translator:
        """A translator sharing this one's model, with some search settings changed (e.g. `beam=1`)."""
        return Translator(
            self.model, self.tokenizer, dataclasses.replace(self.search, **changes), self.max_tokens
        )

    # ---------------------------------------------------------------------------------------------- ids

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Source ids of `lines` (stripped; blank lines give `[]`)."""
        return encode_lines(self.tokenizer, lines)

    def truncate(self, ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Cut inputs the model cannot read (`max_positions` with the source `</s>`), with one warning."""
        return truncate_ids(ids, self.max_positions)

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

    # --------------------------------------------------------------------------------------------- text

    def decode(self, ids: Sequence[int]) -> str:
        return one_line(self.tokenizer.decode(list(ids)))

    def translate(self, lines: Sequence[str] | str, progress: bool = False) -> list[str]:
        """Translations of `lines` (one segment each), same number and order; blank in gives blank out."""
        return translate_lines(self, lines, progress)

    def __call__(self, lines: Sequence[str]) -> list[str]:
        return self.translate(lines)

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


def load(
    path: str | Path,
    device: str | torch.device = "cpu",
    search: SearchConfig | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> Any:
    """A translator for `path`: a checkpoint file of `attnx fit`/`attnx average`, or a directory written
    by `attnx export --format ctranslate2` (decoded by CTranslate2).

    Both kinds answer the same calls: `translate(lines)`, `translate_ids(ids)`, `to(device)`,
    `search`, `tokenizer`.
    """
    path = Path(path)
    if path.is_dir():
        from attnx.checkpoint import CheckpointError
        from attnx.export.ctranslate2 import CTranslate2Translator, is_ctranslate2_model

        if is_ctranslate2_model(path):
            return CTranslate2Translator.load(path, device=device, search=search, max_tokens=max_tokens)
        raise CheckpointError(
            f"{path} is a directory but not a model exported by `attnx export --format ctranslate2`; "
            "give a checkpoint file (*.ckpt) or an exported CTranslate2 directory"
        )
    return Translator.from_checkpoint(path, device=device, search=search, max_tokens=max_tokens)

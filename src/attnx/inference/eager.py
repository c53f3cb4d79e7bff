"""The eager engine: [`EagerTranslator`][attnx.inference.eager.EagerTranslator] decodes a checkpoint's
Transformer (or an ensemble of checkpoints) in PyTorch with [`generate`][attnx.inference.search.generate] and
scores given targets with [`force_decode`][attnx.inference.scoring.force_decode].

It batches its input by tokens (shortest first, padding included) and, besides the
[`Translator`][attnx.inference.translator.Translator] calls, collects attention weights for plots
(`attention`). Nothing here needs Lightning.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from attnx.checkpoint import load_model
from attnx.data.batch import BOS_ID, EOS_ID, collate
from attnx.data.tokenizer import Tokenizer
from attnx.errors import ConfigError
from attnx.inference.config import DEFAULT_MAX_TOKENS, SearchConfig, changed_search, check_precision
from attnx.inference.decoder import Decoder, EnsembleDecoder, ModelDecoder
from attnx.inference.hypothesis import Hypothesis
from attnx.inference.lexical import PhraseIds
from attnx.inference.mbr import candidate_search, rerank
from attnx.inference.phrases import check_phrases
from attnx.inference.precision import resolve_precision
from attnx.inference.scoring import force_decode
from attnx.inference.search import generate
from attnx.inference.terms import vocabulary
from attnx.inference.translator import Translator, blank, fitted_search
from attnx.model import Transformer

DECODING_PRECISIONS: dict[str, torch.dtype | None] = {
    "32-true": None,
    "bf16-mixed": torch.bfloat16,
    "16-mixed": torch.float16,
}
"""Precisions a checkpoint decodes in, named as `attnx fit`'s `--trainer.precision`: the mixed ones run the
matrix products under autocast in that dtype while softmax, log-probabilities and scores stay float32."""


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of `precision` on `device` (None: 32-true), or a usage error naming the choices."""
    check_precision(precision, device.type)
    return DECODING_PRECISIONS[precision]


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
    """A model (or an ensemble of models), its tokenizer and how to search (§6.1 by default: beam 4, α 0.6,
    input length + 50).

    Args:
        model: The Transformer (any device; decoding runs where its weights are), or several Transformers
            trained with the same SentencePiece model, decoded as one ensemble
            ([`EnsembleDecoder`][attnx.inference.decoder.EnsembleDecoder]).
        tokenizer: The joint SentencePiece model the Transformer was trained with.
        search: How to decode ([`SearchConfig`][attnx.inference.config.SearchConfig]). `max_positions`
            defaults to the model's own limit.
        max_tokens: Source tokens per decoding batch, padding included.
        weights: An ensemble's weights, one per model (default: equal).
        precision: `32-true` (default), `bf16-mixed` or `16-mixed` (CUDA only): the matrix products under
            autocast in bf16 or fp16, softmax and scores in float32
            ([`DECODING_PRECISIONS`][attnx.inference.eager.DECODING_PRECISIONS]); `auto`: chosen from the
            device ([`attnx.inference.precision`][attnx.inference.precision]).
    """

    def __init__(
        self,
        model: Transformer | Sequence[Transformer],
        tokenizer: Tokenizer,
        search: SearchConfig | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        weights: Sequence[float] | None = None,
        precision: str = "32-true",
    ) -> None:
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, got {max_tokens}")
        models = [model] if isinstance(model, nn.Module) else list(model)
        if weights is not None and len(models) == 1:
            raise ConfigError("ensemble weights need an ensemble: give several models")
        self.models = models
        self.model = models[0]
        self.weights = None if weights is None else list(weights)
        self.decoder: Decoder = (
            ModelDecoder(self.model)
            if len(models) == 1
            else EnsembleDecoder([ModelDecoder(m) for m in models], weights)
        )
        self.tokenizer = tokenizer
        self.max_positions = min(int(m.max_positions) for m in models)
        self.search = fitted_search(search or SearchConfig(), self.max_positions)
        self.max_tokens = max_tokens
        self.precision = resolve_precision(precision, self.decoder)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path | Sequence[str | Path],
        device: str | torch.device = "cpu",
        search: SearchConfig | None = None,
        **kw: Any,
    ) -> EagerTranslator:
        """The model and tokenizer a checkpoint of `attnx fit`/`attnx average` carries; a list of checkpoints
        is an ensemble, whose models must share their SentencePiece model."""
        paths = [path] if isinstance(path, (str, Path)) else list(path)
        if not paths:
            raise ConfigError("no checkpoint given")
        loaded = [load_model(p, device=device) for p in paths]
        # compared by what decides the segmentation: a model recording another training folder is the same
        first = loaded[0].tokenizer.segmentation
        for p, other in zip(paths[1:], loaded[1:], strict=True):
            if other.tokenizer.segmentation != first:
                raise ConfigError(
                    f"{paths[0]} and {p} were trained with different SentencePiece models; an ensemble needs "
                    "models that share one vocabulary"
                )
        models = [x.model for x in loaded]
        return cls(models[0] if len(models) == 1 else models, loaded[0].tokenizer, search, **kw)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device) -> EagerTranslator:
        """Move the model(s) to `device` (in place) and return this translator."""
        autocast_dtype(self.precision, torch.device(device))
        for m in self.models:
            m.to(device)
        return self

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context decoding runs in: autocast in the translator's precision, or nothing for 32-true."""
        dtype = DECODING_PRECISIONS[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def with_search(self, **changes: Any) -> EagerTranslator:
        """A translator sharing this one's model, with some search settings changed (e.g. `beam=1`)."""
        models = self.model if len(self.models) == 1 else self.models
        search = changed_search(self.search, **changes)
        return EagerTranslator(models, self.tokenizer, search, self.max_tokens, self.weights, self.precision)

    # ---------------------------------------------------------------------------------------------- ids

    def generate_tensors(
        self,
        src: Tensor,
        src_mask: Tensor,
        prefixes: Sequence[Sequence[int]] | None = None,
        generator: torch.Generator | None = None,
        constraints: Sequence[PhraseIds | None] | None = None,
    ) -> list[list[Hypothesis]]:
        """Hypotheses of a padded batch already on the model's device (aligned when `search.alignment`; with
        `search.mbr`, the candidates ranked by expected utility, `text` filled)."""
        draw = candidate_search(self.search)
        with self.autocast():
            results = generate(
                self.decoder,
                src,
                src_mask,
                draw,
                prefixes=prefixes,
                generator=generator,
                constraints=constraints,
                vocabulary=None if constraints is None else vocabulary(self.tokenizer),
            )
            results = rerank(results, self.search, self.decode)
            if self.search.alignment:
                self._align(src, src_mask, results)
        return results

    def _align(self, src: Tensor, src_mask: Tensor, results: list[list[Hypothesis]]) -> None:
        """Fill each hypothesis's alignment from a teacher-forced pass over it (as `score` aligns)."""
        rows = [i for i, hyps in enumerate(results) for _ in hyps]
        if not rows:
            return
        index = torch.tensor(rows, device=src.device)
        flat = [h for hyps in results for h in hyps]
        forced = force_decode(
            self.decoder, src[index], src_mask[index], [h.tokens for h in flat], self.search, alignment=True
        )
        for hyp, scored in zip(flat, forced, strict=True):
            hyp.alignment = scored.alignment

    def translate_tensors(self, src: Tensor, src_mask: Tensor) -> list[list[int]]:
        """Best output ids (no BOS/EOS) of a padded batch already on the model's device."""
        return [hyps[0].tokens for hyps in self.generate_tensors(src, src_mask)]

    def _generator(self) -> torch.Generator | None:
        """One random stream for a whole call, so a seed fixes every sample of it."""
        if not self.search.samples or self.search.seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(self.search.seed)

    def generate_ids(
        self,
        ids: Sequence[Sequence[int]],
        prefixes: Sequence[Sequence[int]] | None = None,
        progress: bool = False,
        scores: bool = True,
        constraints: Sequence[PhraseIds | None] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per input, `search.nbest` hypotheses best first (`text` empty); `[]` in gives one empty hypothesis
        (listing its phrases to include as `unmet`). The search computes the scores as it goes: they are
        filled whatever `scores` says."""
        if prefixes is not None and len(prefixes) != len(ids):
            raise ConfigError(f"{len(prefixes)} prefixes for {len(ids)} inputs: give one per input")
        if constraints is not None:
            if len(constraints) != len(ids):
                raise ConfigError(f"{len(constraints)} constraints for {len(ids)} inputs: give one per input")
            check_phrases(constraints, ids, prefixes, self.search)
        # a blank input is not searched: its phrases to include stay unmet
        out = [blank(None if constraints is None else constraints[i]) for i in range(len(ids))]
        todo = [i for i, x in enumerate(ids) if x]
        lengths = [len(ids[i]) + 1 for i in todo]  # + the source </s>
        device = self.device
        generator = self._generator()
        with tqdm(
            total=len(todo), unit="sent", disable=not progress, file=sys.stderr, dynamic_ncols=True
        ) as bar:
            for batch in token_batches(lengths, self.max_tokens):
                rows = [todo[j] for j in batch]
                b = collate([(ids[i], []) for i in rows])
                batch_prefixes = None if prefixes is None else [prefixes[i] for i in rows]
                batch_constraints = None if constraints is None else [constraints[i] for i in rows]
                hyps = self.generate_tensors(
                    b.src.to(device), b.src_mask.to(device), batch_prefixes, generator, batch_constraints
                )
                for i, h in zip(rows, hyps, strict=True):
                    out[i] = h
                bar.update(len(batch))
        return out

    def score_ids(
        self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
    ) -> list[Hypothesis]:
        """Forced scoring of each pair (ids without BOS/EOS), batched by tokens; one hypothesis per pair."""
        if len(sources) != len(targets):
            raise ConfigError(f"{len(targets)} targets for {len(sources)} sources")
        out: list[Hypothesis | None] = [None] * len(sources)
        lengths = [max(len(x), len(y)) + 1 for x, y in zip(sources, targets, strict=True)]
        device = self.device
        for batch in token_batches(lengths, self.max_tokens):
            b = collate([(sources[i], []) for i in batch])
            with self.autocast():
                scored = force_decode(
                    self.decoder,
                    b.src.to(device),
                    b.src_mask.to(device),
                    [targets[i] for i in batch],
                    self.search,
                )
            for i, hyp in zip(batch, scored, strict=True):
                out[i] = hyp
        return [hyp for hyp in out if hyp is not None]

    # ---------------------------------------------------------------------------------------- attention

    def attention(self, source: str) -> AttentionMaps:
        """Translate `source`, then collect every attention's weights over the teacher-forced result."""
        if len(self.models) > 1:
            raise ConfigError("attention maps are drawn for one model: give one checkpoint, not an ensemble")
        src_ids = self.truncate(self.encode([source]))[0]
        if not src_ids:
            raise ConfigError("attention needs a non-empty source sentence")
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
            with torch.inference_mode(), self.autocast():
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

"""The CTranslate2 engine: a directory written by `attnx export --format ctranslate2`
([`export_ctranslate2`][attnx.export.ctranslate2.export_ctranslate2]) decoded by CTranslate2 behind the
[`Translator`][attnx.inference.translator.Translator] calls.

The directory holds CTranslate2's `model.bin`, `sentencepiece.model` (the checkpoint's tokenizer) and
`attnx.json` (format version, the transformer config, the default search settings, each file's SHA-256), which
[`is_ctranslate2_model`][attnx.inference.ctranslate2.is_ctranslate2_model] checks and
[`CTranslate2Translator`][attnx.inference.ctranslate2.CTranslate2Translator] reads.

**Search.** [`CTranslate2Translator`][attnx.inference.ctranslate2.CTranslate2Translator] maps [`SearchConfig`][attnx.inference.config.SearchConfig] onto
`ctranslate2.Translator.translate_batch`; how the two searches differ, and what is done about it:

* *Length penalty.* CTranslate2 divides a finished hypothesis's log-probability by `|Y| ** length_penalty`
  and has no other form, so only `length_penalty="fairseq"` (`|Y| ** α`) can be reproduced; the GNMT
  form raises a `ValueError` for beams wider than 1 (greedy search has no penalty). With
  `return_end_token=True` the `</s>` is part of the hypothesis, so `|Y|` counts it as attnx does.
* *Maximum length.* attnx allows `L` tokens and then forces `</s>`; CTranslate2 has one
  `max_decoding_length` per call and no forced end token: it stops after that many tokens, `</s>` or
  not. Sentences are therefore decoded in groups of equal `L` with `max_decoding_length = L + 1` (room
  for the `</s>`); a hypothesis that reaches the limit without `</s>` has one token too many, which is
  cut, so no output is ever longer than attnx allows. Only for such sentences can the output differ from
  attnx's (attnx would have scored the forced `</s>`; CTranslate2 ranks the unfinished hypothesis).
* *Beam bookkeeping.* attnx's beam shrinks when a hypothesis finishes (it keeps its slot) and stops when no
  live hypothesis can still win; CTranslate2 keeps `beam` live hypotheses and stops once `beam`
  hypotheses have finished (`beam * patience`; `patience` is a [`CTranslate2Translator`][attnx.inference.ctranslate2.CTranslate2Translator]
  argument). Both return the best finished hypothesis they found; the sets they explore differ after the
  first hypothesis finishes, so beam outputs agree on most but not all sentences (greedy outputs agree
  exactly).
* *Banned tokens.* attnx never generates `<pad>` or `<s>`; they are suppressed here too. CTranslate2
  renormalizes the remaining probabilities (attnx keeps the model's own), which changes a step's
  log-probabilities by `log(1 - p(<pad>) - p(<s>))`, about 1e-5 for a trained model: only near-ties can
  rank differently.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from attnx.checkpoint import CheckpointError
from attnx.checkpoint.digests import check_digests
from attnx.data.batch import BOS_ID, EOS_ID, PAD_ID
from attnx.data.tokenizer import Tokenizer
from attnx.errors import ConfigError
from attnx.inference.config import DEFAULT_MAX_TOKENS, SearchConfig, changed_search
from attnx.inference.hypothesis import Hypothesis
from attnx.inference.lengths import length_penalty, max_output_length
from attnx.inference.mbr import candidate_search, rerank
from attnx.inference.phrases import PhraseIds, banned_phrases
from attnx.inference.translator import Translator, blank, fitted_search
from attnx.model import TransformerConfig

FORMAT = "attnx-ctranslate2"
FORMAT_VERSION = 1
METADATA = "attnx.json"
SPM_MODEL = "sentencepiece.model"
DEFAULT_SEARCH = SearchConfig(beam=4, alpha=0.6, length_penalty="fairseq", max_len_a=1.0, max_len_b=50)
"""§6.1's beam, α and maximum length, with the one length-penalty form CTranslate2 has (`|Y| ** α`)."""


def import_ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError as err:
        raise ImportError(
            "CTranslate2 export and decoding need the ctranslate2 package: pip install 'attnx[ct2]'"
        ) from err
    return ctranslate2


def read_metadata(directory: str | Path) -> dict[str, Any] | None:
    """`attnx.json` of an exported directory, or None when `directory` is not one."""
    path = Path(directory) / METADATA
    if not path.is_file() or not (Path(directory) / "model.bin").is_file():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def is_ctranslate2_model(directory: str | Path) -> bool:
    """Whether `directory` was written by [`export_ctranslate2`][attnx.export.ctranslate2.export_ctranslate2] (any format version)."""
    return Path(directory).is_dir() and read_metadata(directory) is not None


def stored_search(meta: dict[str, Any]) -> SearchConfig:
    """What an export decodes with unless told otherwise: the search settings `attnx.json` (`meta`) stores."""
    return SearchConfig(**meta["search"]) if meta.get("search") else DEFAULT_SEARCH


CT2_SEED_MAX = 2**32 - 1
"""The largest seed `ctranslate2.set_random_seed` takes (an unsigned 32-bit integer)."""


def check_search(search: SearchConfig) -> None:
    """Raise `ValueError` for settings CTranslate2's search cannot reproduce."""
    if search.alignment:
        raise ConfigError(
            "alignments come from the encoder-decoder attention of attnx's own engine: decode the checkpoint "
            "(*.ckpt) the export was made from"
        )
    if search.epsilon > 0:
        raise ConfigError(
            "CTranslate2 has no epsilon sampling: decode the checkpoint (*.ckpt) the export was made from, or "
            "sample with top_k/top_p"
        )
    if search.samples and search.seed is not None and search.seed > CT2_SEED_MAX:
        raise ConfigError(
            f"search.seed {search.seed}: CTranslate2's generator takes seeds from 0 to 2**32 - 1 = {CT2_SEED_MAX}"
        )
    if not search.samples and search.beam > 1 and search.length_penalty == "gnmt" and search.alpha != 0:
        raise ConfigError(
            "CTranslate2 has only the |Y|^alpha length penalty (length_penalty='fairseq'), not GNMT's "
            "((5+|Y|)/6)^alpha; decode with length_penalty='fairseq' (or alpha=0, or beam=1), or with the "
            "attnx checkpoint"
        )


def check_tokenizer(directory: Path, meta: dict[str, Any], tokenizer: Tokenizer) -> None:
    """Refuse a `sentencepiece.model` other than the one the model was exported with, in one line naming both
    files: its ids would silently mean other pieces. An export without the hash (attnx before it recorded it)
    is checked against the vocabulary CTranslate2 saved beside `model.bin`, piece by piece (CTranslate2 loads
    no model without it)."""
    recorded = meta.get("tokenizer_sha256")
    if recorded is not None:
        if recorded != tokenizer.sha256:
            raise CheckpointError(
                f"{tokenizer.path} is not the SentencePiece model {directory / 'model.bin'} was exported with "
                f"(SHA-256 {tokenizer.sha256[:12]}…, {METADATA} records {recorded[:12]}…): put the exported "
                "sentencepiece.model back, or export the checkpoint again"
            )
        return
    pieces = [tokenizer.sp.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    for name in ("shared_vocabulary.json", "source_vocabulary.json"):  # CTranslate2 >= 3 writes one of them
        path = directory / name
        try:
            saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError):
            saved = None  # CTranslate2 refuses it when it loads the model
        if saved is not None and saved != pieces:
            raise CheckpointError(
                f"{tokenizer.path} is not the SentencePiece model {directory / 'model.bin'} was exported with "
                f"(its pieces differ from {path.name}): put the exported sentencepiece.model back, or export "
                "the checkpoint again"
            )


def _device(device: str | torch.device) -> tuple[str, int]:
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"CTranslate2 runs on cpu or cuda, not {device}")
    return device.type, device.index or 0


class CTranslate2Translator(Translator):
    """An exported model decoded by CTranslate2, with the calls of attnx's own Translator.

    Args:
        directory: Written by [`export_ctranslate2`][attnx.export.ctranslate2.export_ctranslate2].
        device: `cpu`, `cuda` or `cuda:N`.
        search: Search settings; default: those stored at export.
        max_tokens: Source tokens per CTranslate2 batch, padding included.
        compute_type: CTranslate2's compute type (`default`: the stored weight type where the device
            supports it).
        threads: CTranslate2 threads per translation (`intra_threads`; 0: its default).
        patience: CTranslate2's beam `patience`: a sentence stops once `beam * patience` hypotheses
            have finished. At 1 (CTranslate2's default) it can stop before a live hypothesis that would
            still win under the length penalty has finished; 2 reproduces attnx's beam outputs more often
            at some cost in speed (docs/deploy.md).
    """

    def __init__(
        self,
        directory: str | Path,
        device: str | torch.device = "cpu",
        search: SearchConfig | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        compute_type: str = "default",
        threads: int = 0,
        patience: float = 1.0,
    ) -> None:
        directory = Path(directory)
        meta = read_metadata(directory)
        if meta is None:
            raise ConfigError(
                f"{directory} is not a CTranslate2 model written by attnx export (no {METADATA} with "
                f"format {FORMAT!r} beside model.bin)"
            )
        if meta.get("format_version") != FORMAT_VERSION:
            raise ConfigError(
                f"{directory} has attnx-ctranslate2 format {meta.get('format_version')!r}; this attnx reads "
                f"{FORMAT_VERSION}: export the checkpoint again"
            )
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, got {max_tokens}")
        if patience <= 0:
            raise ConfigError(f"patience must be positive, got {patience}")
        self.directory = directory
        self.metadata = meta
        self.config = TransformerConfig.from_dict(meta["transformer"])
        self.max_positions = self.config.max_len
        check_digests(directory, meta, METADATA)  # CTranslate2 would load a damaged model.bin as it is
        self.tokenizer = Tokenizer.load(directory / meta.get("tokenizer", SPM_MODEL))
        check_tokenizer(directory, meta, self.tokenizer)
        self.pieces = [self.tokenizer.sp.id_to_piece(i) for i in range(self.tokenizer.vocab_size)]
        self.piece_ids = {piece: i for i, piece in enumerate(self.pieces)}
        self.search = self._capped(search or stored_search(meta))
        self.max_tokens = max_tokens
        self.compute_type = compute_type
        self.threads = threads
        self.patience = patience
        self._translator: Any = None
        self.to(device)

    OPTIONS = ("max_tokens", "compute_type", "threads", "patience")
    """The keywords of `load` that are options of the translator; the others change search settings."""

    @classmethod
    def load(
        cls,
        directory: str | Path,
        device: str | torch.device = "cpu",
        search: SearchConfig | None = None,
        **kw: Any,
    ) -> CTranslate2Translator:
        """A translator for `directory`: keywords named in `OPTIONS` go to the constructor, the others change
        `search` (default: the settings stored at export), e.g. `beam=1`."""
        translator = cls(directory, device, search, **{k: kw.pop(k) for k in cls.OPTIONS if k in kw})
        return translator.with_search(**kw) if kw else translator

    def _capped(self, search: SearchConfig) -> SearchConfig:
        check_search(search)
        return fitted_search(search, self.max_positions)

    @property
    def device(self) -> torch.device:
        return self._device

    def to(self, device: str | torch.device) -> CTranslate2Translator:
        """Load the model on `device` (`cpu`, `cuda`, `cuda:N`) and return this translator."""
        ct2 = import_ctranslate2()
        kind, index = _device(device)
        try:
            self._translator = ct2.Translator(
                str(self.directory),
                device=kind,
                device_index=index,
                compute_type=self.compute_type,
                intra_threads=self.threads,
            )
        except ValueError as err:
            if "compute type" not in str(err):
                raise
            supported = ", ".join(sorted(ct2.get_supported_compute_types(kind, index)))
            raise ConfigError(
                f"CTranslate2 cannot compute in {self.compute_type} on this {kind} device (it can in: "
                f"{supported}); choose another precision"
            ) from None
        self._device = torch.device(kind, index) if kind == "cuda" else torch.device("cpu")
        return self

    def with_search(self, **changes: Any) -> CTranslate2Translator:
        """This translator with some search settings changed (the loaded model is shared)."""
        other = object.__new__(CTranslate2Translator)
        other.__dict__.update(self.__dict__)
        other.search = self._capped(changed_search(self.search, **changes))
        return other

    # ---------------------------------------------------------------------------------------------- ids

    def max_output_length(self, source_length: int) -> int:
        """`L` tokens before `</s>` for `n` source ids (+ `</s>`), as `lengths.max_output_length` counts them."""
        s = self.search
        return max_output_length(source_length + 1, s.max_len_a, s.max_len_b, s.max_positions)

    def _options(self) -> dict[str, Any]:
        s = self.search
        options: dict[str, Any] = dict(
            beam_size=1 if s.sampling else s.beam,
            patience=self.patience,
            length_penalty=s.alpha if s.length_penalty == "fairseq" else 0.0,
            num_hypotheses=1 if s.sampling else s.nbest,  # samples: each input repeated nbest times
            return_scores=True,
            no_repeat_ngram_size=s.no_repeat_ngram,
            min_decoding_length=s.min_length,
            return_end_token=True,  # |Y| counts the </s>, and a missing </s> marks a hypothesis cut at the limit
            max_input_length=0,  # inputs are truncated here, as attnx does
            suppress_sequences=[[self.pieces[PAD_ID]], [self.pieces[BOS_ID]]],
            max_batch_size=self.max_tokens,
            batch_type="tokens",
        )
        if s.sampling:  # CTranslate2's top-k 0 is the whole vocabulary, as attnx's
            options.update(sampling_topk=s.top_k, sampling_topp=s.top_p, sampling_temperature=s.temperature)
        return options

    def generate_ids(
        self,
        ids: Sequence[Sequence[int]],
        prefixes: Sequence[Sequence[int]] | None = None,
        progress: bool = False,
        scores: bool = True,
        constraints: Sequence[PhraseIds | None] | None = None,
    ) -> list[list[Hypothesis]]:
        """Per input, `search.nbest` hypotheses best first (`text` empty); `[]` in gives one empty hypothesis.

        CTranslate2 searches; `log_prob` and `token_log_probs` then come from CTranslate2's `score_batch` over
        the hypotheses found (the model's own log-probabilities, as attnx reports them), and `score` is
        `log_prob / lp(|Y|)` as attnx ranks. CTranslate2's own search scores are not those: it renormalizes
        the distribution after banning `<pad>` and `<s>` (about 1e-2 apart over a sentence). With
        `scores=False` (`translate`, `translate_ids`) that pass is skipped: `score` is CTranslate2's own
        and `log_prob` NaN.
        """
        banned = banned_phrases(ids, prefixes, constraints, "a CTranslate2 model", self.pieces.__getitem__)
        if (s := self.search).mbr:  # draw the candidates, then rank them by expected utility
            draw = self.with_search(**dataclasses.asdict(candidate_search(s)))
            return rerank(draw.generate_ids(ids, prefixes, progress, scores, constraints), s, self.decode)
        out: list[list[Hypothesis]] = [blank() for _ in ids]
        groups: dict[tuple[int, Any], list[int]] = defaultdict(list)  # one limit and one ban list per call
        for i, x in enumerate(ids):
            if x:
                prefix = len(prefixes[i]) if prefixes is not None else 0
                groups[max(self.max_output_length(len(x)), prefix), banned[i]].append(i)
        options = self._options()
        if self.search.sampling and self.search.seed is not None:
            # CTranslate2 seeds each worker thread's generator once, when the thread starts: a fresh model
            # (fresh threads) makes every call with the same seed draw the same samples.
            import_ctranslate2().set_random_seed(self.search.seed)
            self.to(self.device)
        copies = self.search.nbest if self.search.sampling else 1
        eos = self.pieces[EOS_ID]
        total = sum(map(len, groups.values()))
        with tqdm(total=total, unit="sent", disable=not progress, file=sys.stderr, dynamic_ncols=True) as bar:
            for (limit, bans), members in sorted(groups.items()):
                rows = [i for i in members for _ in range(copies)]
                target_prefix = None
                if prefixes is not None and any(prefixes[i] for i in rows):
                    target_prefix = [[self.pieces[t] for t in prefixes[i]] or None for i in rows]
                results = self._translator.translate_batch(
                    [[self.pieces[t] for t in ids[i]] for i in rows],
                    target_prefix,
                    max_decoding_length=limit + 1,
                    **{**options, "suppress_sequences": [*options["suppress_sequences"], *map(list, bans)]},
                )
                found: list[tuple[int, list[int]]] = []
                own: list[float] = []  # CTranslate2's search scores
                for i, result in zip(rows, results, strict=True):
                    for tokens, score in zip(result.hypotheses, result.scores, strict=True):
                        tokens = tokens[:-1] if tokens and tokens[-1] == eos else tokens[:limit]
                        found.append((i, [self.piece_ids[t] for t in tokens]))
                        own.append(score)
                if scores:
                    scored = self.score_ids([ids[i] for i, _ in found], [y for _, y in found])
                else:
                    scored = [Hypothesis(y, s, math.nan) for (_, y), s in zip(found, own, strict=True)]
                by_input: dict[int, list[Hypothesis]] = defaultdict(list)
                for (i, _), hyp in zip(found, scored, strict=True):
                    by_input[i].append(hyp)
                for i, hyps in by_input.items():
                    out[i] = sorted(hyps, key=lambda h: h.score, reverse=True)
                bar.update(len(members))
        return out

    def score_ids(
        self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]
    ) -> list[Hypothesis]:
        """Forced scoring of each pair with CTranslate2's `score_batch` (batched by tokens)."""
        if len(sources) != len(targets):
            raise ConfigError(f"{len(targets)} targets for {len(sources)} sources")
        if not sources:
            return []
        s = self.search
        results = self._translator.score_batch(
            [[self.pieces[t] for t in x] for x in sources],
            [[self.pieces[t] for t in y] for y in targets],
            max_batch_size=self.max_tokens,
            batch_type="tokens",
            max_input_length=0,
        )
        out = []
        for y, result in zip(targets, results, strict=True):
            steps = list(result.log_probs)  # one per target token, then </s>
            log_prob = sum(steps)
            score = log_prob / length_penalty(len(y) + 1, s.alpha, s.length_penalty)
            out.append(Hypothesis(list(y), score, log_prob, steps))
        return out

    def __repr__(self) -> str:
        return f"CTranslate2Translator({str(self.directory)!r}, device={str(self.device)!r}, search={self.search})"

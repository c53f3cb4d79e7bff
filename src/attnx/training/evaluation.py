"""§6 evaluation during `attnx fit`/`validate`/`test`/`predict`: translate, gather, write, score.

[TranslationEvaluator][attnx.training.evaluation.TranslationEvaluator] is a callback: the LightningModule
only computes losses. It decodes through the module's [Translator][attnx.inference.translator.Translator]
(the same path as `attnx translate` and the Python API), splits each evaluation batch between the ranks,
gathers the translations on rank 0 in corpus order, writes them (test, predict) and scores them with
sacreBLEU against the raw references (validation, test). `test` and `predict` report the sentences decoded
on standard error as they go (a line redrawn on a terminal, one a minute in a log file); `written` names the
file the translations went to (`attnx test` prints it last).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from attnx.data.batch import Batch
from attnx.data.text import read_lines
from attnx.errors import ConfigError
from attnx.evaluation.agreement import Agreement, agreement
from attnx.evaluation.bleu import BleuReport, score
from attnx.inference.config import AUTO, PAPER_SEARCH, Precision, SearchConfig, check_precision
from attnx.inference.lexical import PhraseIds
from attnx.inference.phrases import (
    check_phrases,
    encode_phrases,
    parse_line,
    unmet_lines,
    unmet_warnings,
)
from attnx.inference.progress import Progress

"""§6.1's beam 4, α 0.6, maximum length input + 50 (copied, never modified)."""


class TranslationEvaluator(Callback):
    """Translate the evaluation splits with the model and score them (config section `evaluation`).

    * validation (during `fit` and in `validate`): the sentences with corpus position below
      `bleu_samples`, with `search` at beam `valid_beam`; logs `val/bleu`.
    * test: every sentence of the test split with `search`; writes the translations in corpus order, prints
      sacreBLEU BLEU and chrF (with signatures) and the paper-style BLEU, logs `test/bleu` and `test/chrf`.
    * predict: every sentence of the test split with `search`; writes the translations.
    """

    def __init__(
        self,
        search: SearchConfig = PAPER_SEARCH,
        bleu_samples: int = 500,
        valid_beam: int = 1,
        output_file: str | None = None,
        precision: Precision = AUTO,
        compare_fp32: bool = False,
        constraints: str | None = None,
    ) -> None:
        """
        Args:
            search: How `test` and `predict` decode (§6.1: beam 4, α 0.6, max length input + 50), and,
                with `valid_beam`, validation: every option of `attnx translate --search.*` (sampling, MBR,
                `no_repeat_ngram`, `min_length`, ...) except `nbest` and `alignment`, one translation per sentence.
            bleu_samples: Validation sentences translated and scored each validation (those with corpus
                position below this number); 0 turns validation BLEU off.
            valid_beam: Beam size for validation BLEU (1 = greedy, the cheapest).
            output_file: Where `test` and `predict` write translations, one a line in corpus order. None:
                `<split>.hyp` in the folder they log in, e.g. `runs/NAME/version_0/test/averaged/test.hyp`.
            precision: What decoding runs in, as `attnx translate --precision`, whatever `trainer.precision`
                trains in: 32-true, bf16-mixed, 16-mixed on CUDA, or auto (the default): bf16-mixed where a
                probe finds the device's bf16 units make decoding faster, else 32-true, chosen when the run
                starts and said on standard error.
            compare_fp32: `test` in a reduced precision also translates the split in 32-true and prints how
                far its translations stray: BLEU and chrF of both, the share of identical lines, and a warning
                where the reduced precision falls more than 1 point below fp32's BLEU or chrF
                ([`agreement`][attnx.evaluation.agreement.agreement]; then decode that model in 32-true).
            constraints: `test` and `predict` only: a file of terminology constraints beside the test set, one
                line per sentence of the split in corpus order, read as `attnx translate --constraints` reads
                its file (`{"include": [...], "exclude": [...], "ordered": false}`, a JSON array of phrases to
                include, `null`, a JSON string, or tab-separated phrases to include; blank: none). With
                `compare_fp32`, the fp32 pass decodes with the same constraints.
        """
        if bleu_samples < 0 or valid_beam < 1:
            raise ConfigError(
                f"evaluation needs bleu_samples >= 0 and valid_beam >= 1, got {bleu_samples} and {valid_beam}"
            )
        if search.nbest != 1 or search.alignment:
            raise ConfigError(
                "evaluation writes and scores one translation per sentence: evaluation.search.nbest must be 1 "
                "and evaluation.search.alignment false (attnx translate writes n-best lists and alignments)"
            )
        self.search = search
        self.bleu_samples = bleu_samples
        self.valid_beam = valid_beam
        self.output_file = output_file
        self.precision = precision
        self.compare_fp32 = compare_fp32
        self.agreement: Agreement | None = None
        """How the last `test`'s translations compared with fp32's (rank 0, with `compare_fp32`)."""
        self._fp32: list[tuple[int, list[int]]] = []
        self.decodes_in: str | None = None
        """The precision decoding runs in, `auto` resolved (set when a run starts)."""
        self.constraints = constraints
        self._phrases: list[PhraseIds | None] | None = None  # per sentence of the split being decoded
        self.unmet = 0
        """Sentences of the last `test` or `predict` whose translation left out phrases to include."""
        self._unmet: dict[str, list[int]] = {}  # why (`unmet_reason`) -> the constraints file's lines
        self.report: BleuReport | None = None
        self.written: Path | None = None
        """The file the last `test` or `predict` wrote its translations to (rank 0)."""
        self._translations: list[tuple[int, list[int]]] = []
        self._progress: Progress | None = None
        self._counted = False  # whether the console shows the count of the last batch already
        self._limited, self._said_limited, self._seen = False, False, 0  # validation of some batches only

    # ------------------------------------------------------------------------------------------- decoding

    def _translate(self, trainer: pl.Trainer, module: pl.LightningModule, batch: Batch, limit: int | None):
        """Translate this rank's share of `batch` (rows `index % world == rank`, below `limit`)."""
        if batch.index is None:
            raise RuntimeError("evaluation batches carry no corpus index (Batch.index); translations need it")
        index = batch.index.cpu()
        keep = index % trainer.world_size == trainer.global_rank
        if limit is not None and self._limited:  # the first `limit` sentences of the batches validated
            keep &= torch.arange(len(index)) + self._seen < limit
            self._seen += len(index)
        elif limit is not None:
            keep &= index < limit
        rows = keep.nonzero().flatten()
        if not len(rows):
            return
        search = self.search
        if trainer.validating or trainer.sanity_checking:
            # validation BLEU compares checkpoints: always a (deterministic) beam of `valid_beam`
            search = dataclasses.replace(
                search,
                beam=self.valid_beam,
                sampling=False,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                epsilon=0.0,
                seed=None,
                mbr=0,
                mbr_utility="chrf",
                mbr_candidates="sample",
            )
        on_device = rows.to(batch.src.device)
        src, src_mask = batch.src[on_device], batch.src_mask[on_device]
        width = int(src_mask.sum(1).max())  # the selected rows may need fewer columns
        translator = module.translator(search, precision=self.decodes_in or self.precision)
        self.decodes_in = translator.precision  # `auto`: measured on the model, now on its device, said once
        phrases = None
        if self._phrases is None or trainer.validating or trainer.sanity_checking:
            hyps = translator.translate_tensors(src[:, :width], src_mask[:, :width])
        else:
            corpus_index = index[rows].tolist()
            phrases = [self._phrases[i] for i in corpus_index]
            ids = [x[m].tolist()[:-1] for x, m in zip(src, src_mask, strict=True)]  # without the </s>
            where = [f"evaluation.constraints {self.constraints} line {i + 1}" for i in corpus_index]
            check_phrases(phrases, ids, None, translator.search, where)
            found = translator.generate_tensors(src[:, :width], src_mask[:, :width], constraints=phrases)
            unmet = unmet_lines(phrases, [h[0].unmet for h in found], ids, translator.search, 0)
            for reason, at in unmet.items():  # positions in this batch: their lines in the file
                self.unmet += len(at)
                self._unmet.setdefault(reason, []).extend(corpus_index[j] + 1 for j in at)
            hyps = [h[0].tokens for h in found]
        self._translations.extend(zip(index[rows].tolist(), hyps, strict=True))
        if self._comparing(trainer):  # the same lines with the same constraints, in fp32
            fp32 = module.translator(search, precision="32-true")
            if phrases is None:
                theirs = fp32.translate_tensors(src[:, :width], src_mask[:, :width])
            else:
                found = fp32.generate_tensors(src[:, :width], src_mask[:, :width], constraints=phrases)
                theirs = [h[0].tokens for h in found]
            self._fp32.extend(zip(index[rows].tolist(), theirs, strict=True))

    def _comparing(self, trainer: pl.Trainer) -> bool:
        """Whether this stage also decodes in fp32 to compare (`test`, `compare_fp32`, a reduced precision)."""
        reduced = (self.decodes_in or self.precision) != "32-true"
        return self.compare_fp32 and reduced and bool(trainer.testing)

    def _read_constraints(self, trainer: pl.Trainer, module: pl.LightningModule, stage: str) -> None:
        """Read and encode `constraints` for the split `stage` decodes: one line per sentence, or one line
        naming the file and what to do."""
        self._phrases, self.unmet, self._unmet = None, 0, {}
        if self.constraints is None:
            return
        path = Path(self.constraints)
        try:
            lines = read_lines(path)  # "\n" ends a line, as in every file of lines
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"evaluation.constraints {path}: cannot read it ({err})") from None
        corpus, split = corpus_split(trainer, stage)
        if corpus is not None and len(lines) != len(corpus.references(split)):
            raise ConfigError(
                f"evaluation.constraints {path} has {len(lines)} lines but the {split} split has "
                f"{len(corpus.references(split))} sentences: give one line per sentence, in corpus order (blank: none)"
            )
        where = [f"evaluation.constraints {path} line {i + 1}" for i in range(len(lines))]
        items = [parse_line(line, label) for line, label in zip(lines, where, strict=True)]
        self._phrases = encode_phrases(module.translator().encode, items, where)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # before any step: a precision the device cannot decode in is a usage error, not a failure hours in
        # `auto` is measured on the model where it decodes, by the first batch that decodes; nothing decodes
        # with validation BLEU off, and then it is neither measured nor said
        if self.precision != AUTO:
            check_precision(self.precision, trainer.strategy.root_device.type)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._translations, self._seen = [], 0
        self._limited = validation_is_limited(trainer)
        if self._limited and self.bleu_samples > 0 and not self._said_limited and trainer.is_global_zero:
            self._said_limited = True
            print(
                f"validation BLEU scores the first {self.bleu_samples} sentences of the batches validated "
                "(trainer.limit_val_batches), not the split's first ones",
                file=sys.stderr,
                flush=True,
            )

    def on_validation_batch_end(
        self, trainer, pl_module, outputs: Any, batch: Batch, batch_idx, dataloader_idx=0
    ):
        if self.bleu_samples > 0:
            self._translate(trainer, pl_module, batch, self.bleu_samples)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.bleu_samples == 0:
            return
        report = self._score(trainer, self._gather(trainer, pl_module, "valid"), "valid")
        bleu = trainer.strategy.broadcast(report.bleu if report is not None else 0.0, src=0)
        pl_module.log("val/bleu", bleu, prog_bar=True, sync_dist=True)

    def _start_progress(self, trainer: pl.Trainer, stage: str) -> None:
        """Count the sentences decoded on rank 0, unless a progress bar is drawn already."""
        self._translations, self._progress = [], None
        if not trainer.is_global_zero:
            return
        loaders = getattr(trainer, f"{stage}_dataloaders", None)
        loader = loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders
        dataset = getattr(loader, "dataset", None)
        total = len(dataset) if hasattr(dataset, "__len__") else None
        live = sys.stderr.isatty()
        shown = not (live and trainer.progress_bar_callback is not None)
        self._progress = Progress(
            f"attnx {stage}", total, sys.stderr, live=live, enabled=shown, unit="sentences"
        )

    def _advance(self, batch: Batch) -> None:
        if self._progress is not None:
            shown = self._progress.shown
            self._progress.update(self._progress.done + batch.src.size(0))
            self._counted = self._progress.shown != shown

    def _end_progress(self) -> None:
        """The last count, once: not again where the last batch's line gave it (a log file's line a minute)."""
        if self._progress is not None:
            self._progress.close() if self._counted else self._progress.finish()
            self._progress = None

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._read_constraints(trainer, pl_module, "test")
        self._start_progress(trainer, "test")
        self._fp32, self.agreement = [], None

    def on_test_batch_end(self, trainer, pl_module, outputs: Any, batch: Batch, batch_idx, dataloader_idx=0):
        self._translate(trainer, pl_module, batch, None)
        self._advance(batch)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end_progress()
        self._say_unmet()
        translations = self._gather(trainer, pl_module, "test", write=True)
        self.report = self._score(trainer, translations, "test")
        if self.report is not None:  # rank 0: the scores are the command's result, printed to stdout
            print("\n".join(self.report.lines()), flush=True)
        if self._comparing(trainer):
            self._compare(trainer, pl_module, translations)
        for logger in (
            getattr(trainer, "loggers", []) if self.decodes_in else ()
        ):  # hparams.yaml of its folder
            logger.log_hyperparams({"decoding_precision": self.decodes_in})
        for name in ("bleu", "chrf"):
            value = getattr(self.report, name) if self.report is not None else 0.0
            pl_module.log(f"test/{name}", trainer.strategy.broadcast(value, src=0), sync_dist=True)

    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._read_constraints(trainer, pl_module, "predict")
        self._start_progress(trainer, "predict")

    def on_predict_batch_end(
        self, trainer, pl_module, outputs: Any, batch: Batch, batch_idx, dataloader_idx=0
    ):
        self._translate(trainer, pl_module, batch, None)
        self._advance(batch)

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end_progress()
        self._say_unmet()
        self._gather(trainer, pl_module, "predict", write=True)

    def _say_unmet(self) -> None:
        lines = {reason: sorted(found) for reason, found in self._unmet.items()}
        for warning in unmet_warnings(lines, self.search, "--evaluation.search."):
            print(f"attnx: warning: evaluation.constraints {self.constraints}: {warning}", file=sys.stderr)

    # ----------------------------------------------------------------------------- gather, write, score

    def _compare(self, trainer: pl.Trainer, module: pl.LightningModule, translations) -> None:
        """Print how this test's translations compare with fp32's of the same lines (rank 0)."""
        self._translations, self._fp32 = self._fp32, []
        fp32 = self._gather(trainer, module, "test")
        if translations is None or fp32 is None:
            return
        corpus, split = corpus_split(trainer, "test")
        references = corpus.references(split)
        ours, theirs = [text for _, text in translations], [text for _, text in fp32]
        refs = [references[i] for i, _ in translations]
        self.agreement = agreement(str(self.decodes_in), ours, theirs, refs, lang=corpus.tgt_lang)
        print(self.agreement.line(), flush=True)
        if not self.agreement.holds:
            print(f"attnx test: warning: {self.agreement.line()}", file=sys.stderr, flush=True)

    def _gather(
        self, trainer: pl.Trainer, module: pl.LightningModule, stage: str, write: bool = False
    ) -> list[tuple[int, str]] | None:
        """All ranks' translations as `(corpus index, text)` in corpus order, on rank 0 (None elsewhere)."""
        pairs, self._translations = self._translations, []
        if trainer.world_size > 1:
            gathered: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(gathered, pairs)
            pairs = [pair for part in gathered for pair in part]
        if not trainer.is_global_zero:
            return None
        translator = module.translator()
        by_index = dict(pairs)  # distributed samplers may repeat a sentence to even out the ranks
        texts = [(i, translator.decode(by_index[i])) for i in sorted(by_index)]
        if write:
            path = self._output_path(trainer, stage)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(text + "\n" for _, text in texts), encoding="utf-8")
            self.written = path
        return texts

    def _output_path(self, trainer: pl.Trainer, stage: str) -> Path:
        if self.output_file is not None:
            return Path(self.output_file)
        _, split = corpus_split(trainer, stage)  # the folder names the stage: `test/averaged/test.hyp`
        log_dir = trainer.log_dir or trainer.default_root_dir
        return Path(log_dir) / f"{split or stage}.hyp"

    def _score(self, trainer: pl.Trainer, translations: list[tuple[int, str]] | None, stage: str):
        """sacreBLEU of `translations` against the raw references of `stage`'s split (rank 0)."""
        if translations is None:
            return None
        corpus, split = corpus_split(trainer, stage)
        if corpus is None:
            raise RuntimeError(f"the datamodule exposes no corpus/{stage}_split, so BLEU has no references")
        references = corpus.references(split)
        return score(
            [text for _, text in translations], [references[i] for i, _ in translations], lang=corpus.tgt_lang
        )


def validation_is_limited(trainer: pl.Trainer) -> bool:
    """Whether this validation runs fewer batches than the split holds (`trainer.limit_val_batches`)."""
    counted = getattr(trainer, "num_val_batches", None) or []
    loaders = trainer.val_dataloaders
    loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
    try:
        return bool(counted) and any(n < len(loader) for n, loader in zip(counted, loaders, strict=False))
    except TypeError:  # a loader without a length
        return False


def corpus_split(trainer: pl.Trainer, stage: str) -> tuple[Any, str] | tuple[None, None]:
    """The prepared corpus and the split name `stage` reads (predict reads the test split)."""
    datamodule = trainer.datamodule
    corpus = getattr(datamodule, "corpus", None)
    split = getattr(datamodule, f"{stage}_split", None)
    if split is None and stage == "predict":
        split = getattr(datamodule, "test_split", None)
    return (corpus, split) if corpus is not None and split is not None else (None, None)

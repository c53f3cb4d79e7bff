"""The LightningModule: §5 training (loss, optimizer, schedule) and §6 evaluation (beam search + sacreBLEU)."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor

from attnx.checkpoint import CheckpointError, make_metadata
from attnx.commands import training_flops_per_token
from attnx.data.batch import Batch
from attnx.data.tokenizer import Tokenizer
from attnx.inference.average import config_difference
from attnx.inference.search import SearchConfig, translate_batch
from attnx.model import TransformerConfig, build_transformer
from attnx.training.loss import LossSums, translation_loss
from attnx.training.schedule import lr_lambda

CPU_PEAK_FLOPS = 180e9
"""fp32 matmul ceiling measured on the 2-core development CPU (MKL, AVX2); the default MFU denominator on CPU."""

BASE_MODEL = TransformerConfig()
"""The default model: the paper's base Transformer (copied, never modified)."""

PAPER_SEARCH = SearchConfig()
"""The default decoding of test and predict: §6.1's beam 4, α 0.6, maximum length input + 50."""

THROUGHPUT_WINDOW = 20
"""Training batches over which tokens/s and MFU are averaged."""


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; training stops instead of corrupting the weights."""


class TranslationTask(pl.LightningModule):
    """Train and evaluate a Transformer translation model (§5, §6).

    Training minimizes label-smoothed cross-entropy (§5.4) with Adam (β1 0.9, β2 0.98, ε 1e-9) and the
    learning rate of Eq. 3, stepped once per optimizer update (so gradient accumulation does not change it).
    Validation reports loss, NLL and perplexity on the whole validation split and sacreBLEU of the first
    ``val_bleu_samples`` sentences; ``test`` beam-searches the test split, writes the translations in corpus
    order and prints sacreBLEU, chrF (with signatures) and the paper-style BLEU. ``predict`` writes the
    translations of the predict split.

    A NaN or infinite training loss raises :class:`NonFiniteLossError` naming the step: once it appears the
    weights are usually already damaged, and skipping batches would hide a diverging run.

    Dropout draws from a generator reseeded at every training batch from (seed, optimizer step, micro-batch,
    rank), so a run resumed from a checkpoint draws exactly the masks the uninterrupted run would have drawn.
    """

    def __init__(
        self,
        transformer: TransformerConfig = BASE_MODEL,
        label_smoothing: float = 0.1,
        lr_factor: float = 1.0,
        warmup_steps: int = 4000,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
        weight_decay: float = 0.0,
        val_bleu_samples: int = 500,
        val_beam: int = 1,
        search: SearchConfig = PAPER_SEARCH,
        peak_flops: float | None = None,
        output_file: str | None = None,
    ) -> None:
        """
        Args:
            transformer: The model (§3, Table 3): sizes, dropout and the components chosen by plugin name.
                ``vocab_size`` is linked from the data.
            label_smoothing: ε_ls of §5.4 (paper: 0.1). Loss = (1 - ε)·NLL + ε·mean over the vocabulary of
                -log p (cross-entropy with the smoothed target; padding ignored).
            lr_factor: Multiplier of Eq. 3: lr = lr_factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5).
                The paper uses 1.0 for base and big.
            warmup_steps: Linear warm-up length of Eq. 3 in optimizer updates (paper: 4000).
            betas: Adam β1, β2 (paper: 0.9, 0.98).
            eps: Adam ε (paper: 1e-9).
            weight_decay: Decoupled weight decay (AdamW); the paper uses none (0.0, which is plain Adam).
            val_bleu_samples: Translate the validation sentences with corpus position below this number and
                report their sacreBLEU as ``val/bleu`` each validation (0 turns it off).
            val_beam: Beam size for validation BLEU (1 = greedy, the cheapest); the other search settings
                are ``search``'s.
            search: Beam search for ``test`` and ``predict`` (§6.1: beam 4, α 0.6, max length input + 50).
            peak_flops: Peak FLOP/s of one device, the denominator of ``train/mfu``. None: the fp32 matmul
                ceiling of one core of the 2-core development CPU (180e9) on CPU, so both cores busy can read
                above 100%; Lightning's table on GPUs.
            output_file: Where ``test`` and ``predict`` write translations, one a line in corpus order.
                None: ``<log_dir>/test.<split>.hyp`` and ``<log_dir>/predict.<split>.hyp``.
        """
        super().__init__()
        if isinstance(transformer, dict):  # a checkpoint's plain hyperparameters
            transformer = TransformerConfig.from_dict(transformer)
        if isinstance(search, dict):
            search = SearchConfig(**search)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        if warmup_steps < 1 or lr_factor <= 0:
            raise ValueError(f"need warmup_steps >= 1 and lr_factor > 0, got {warmup_steps} and {lr_factor}")
        self.save_hyperparameters()
        # Checkpoints load with weights_only=True: hyperparameters must be plain values, never dataclasses.
        for key, value in list(self.hparams.items()):
            if dataclasses.is_dataclass(value):
                self.hparams[key] = dataclasses.asdict(value)
        self.config = dataclasses.replace(transformer)
        self.label_smoothing = label_smoothing
        self.lr_factor = lr_factor
        self.warmup_steps = warmup_steps
        self.betas = tuple(betas)
        self.eps = eps
        self.weight_decay = weight_decay
        self.val_bleu_samples = val_bleu_samples
        self.val_search = dataclasses.replace(search, beam=val_beam)
        self.search = search
        self.peak_flops = peak_flops
        self.output_file = output_file
        self.model = build_transformer(self.config)
        self.seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        self._tokenizer: Tokenizer | None = None
        self._throughput: deque[tuple[float, int, float]] = deque(maxlen=THROUGHPUT_WINDOW + 1)
        self._val_sums = torch.zeros(3, dtype=torch.float64)
        self._translations: list[tuple[int, list[int]]] = []

    # ----------------------------------------------------------------------------------------- data access

    @property
    def tokenizer(self) -> Tokenizer:
        """The data's tokenizer (from the datamodule), saved into every checkpoint for decoding."""
        if self._tokenizer is not None:
            return self._tokenizer
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is None or not hasattr(datamodule, "tokenizer"):
            raise RuntimeError(
                "TranslationTask needs the tokenizer of its data: train through a TranslationDataModule "
                "(`attnx fit`), or set `task.tokenizer = Tokenizer.load(...)`"
            )
        return datamodule.tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def _corpus_split(self, stage: str) -> tuple[Any, str] | tuple[None, None]:
        datamodule = self.trainer.datamodule
        corpus = getattr(datamodule, "corpus", None)
        split = getattr(datamodule, f"{stage}_split", None)
        if split is None and stage == "predict":
            split = getattr(datamodule, "test_split", None)
        return (corpus, split) if corpus is not None and split is not None else (None, None)

    # -------------------------------------------------------------------------------------------- training

    def forward(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor) -> Tensor:
        return self.model(src, tgt_in, src_mask)

    def _loss(self, batch: Batch) -> LossSums:
        return translation_loss(self.model, batch, self.label_smoothing)

    def _reseed(self, batch_idx: int) -> None:
        micro = batch_idx % self.trainer.accumulate_grad_batches
        # int tuples hash the same in every process and run (only str/bytes hashing is salted)
        torch.manual_seed(hash((self.seed, self.global_step, micro, self.global_rank)) % 2**63)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        self._reseed(batch_idx)
        sums = self._loss(batch)
        tokens = batch.n_tgt_tokens
        loss = sums.loss / tokens
        if not torch.isfinite(loss):
            raise NonFiniteLossError(
                f"training loss is {loss.item()} at optimizer step {self.global_step + 1} (batch {batch_idx} of "
                f"epoch {self.current_epoch}); the run diverged. Lower model.lr_factor or raise "
                "model.warmup_steps, set trainer.gradient_clip_val, or train in fp32 "
                "(--trainer.precision 32-true); then resume from an earlier checkpoint."
            )
        nll = sums.nll / tokens
        self.log("train/loss", loss, prog_bar=True, batch_size=tokens)
        self.log("train/nll", nll, batch_size=tokens)
        self.log("train/ppl", torch.exp(nll), batch_size=tokens)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], prog_bar=True, batch_size=tokens)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Batch, batch_idx: int) -> None:
        tokens = batch.n_src_tokens + batch.n_tgt_tokens
        self._throughput.append((time.perf_counter(), tokens, self._batch_flops(batch)))
        if len(self._throughput) < 2:
            return
        elapsed = self._throughput[-1][0] - self._throughput[0][0]
        window = list(self._throughput)[1:]  # work done between the first and the last timestamp
        tokens_per_s = sum(t for _, t, _ in window) / elapsed
        flops_per_s = sum(f for _, _, f in window) / elapsed
        # Per-device rates times the device count: token-budget batches keep the ranks equally loaded.
        self.log("train/tokens_per_s", tokens_per_s * self.trainer.world_size, prog_bar=True)
        self.log("train/mfu", flops_per_s / self._peak_flops())

    def on_train_epoch_start(self) -> None:
        self._throughput.clear()  # the epoch boundary (loader start) is not training time

    def on_validation_end(self) -> None:
        self._throughput.clear()  # nor is validation

    def _batch_flops(self, batch: Batch) -> float:
        """Model FLOPs of one training step on ``batch`` (forward + backward, real tokens only)."""
        n = batch.size
        per_token = training_flops_per_token(self.config, batch.n_src_tokens / n, batch.n_tgt_tokens / n)
        return per_token["per_token"] * (batch.n_src_tokens + batch.n_tgt_tokens)

    def _peak_flops(self) -> float:
        if self.peak_flops is None:
            self.peak_flops = CPU_PEAK_FLOPS
            if self.device.type == "cuda":
                from lightning.fabric.utilities.throughput import get_available_flops

                dtype = {"bf16": torch.bfloat16, "16": torch.float16}.get(
                    str(self.trainer.precision).split("-")[0], torch.float32
                )
                self.peak_flops = get_available_flops(self.device, dtype) or CPU_PEAK_FLOPS
        return self.peak_flops

    def configure_optimizers(self) -> dict[str, Any]:
        # fused: one kernel for all parameters (4x faster than the per-tensor loop on CPU)
        optimizer = torch.optim.AdamW(
            self.parameters(),
            lr=1.0,
            betas=self.betas,
            eps=self.eps,
            weight_decay=self.weight_decay,
            fused=self.device.type in ("cpu", "cuda"),
        )
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda(self.config.d_model, self.warmup_steps, self.lr_factor)
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": schedule, "interval": "step", "frequency": 1},
        }

    # ------------------------------------------------------------------------------------------ validation

    def on_validation_epoch_start(self) -> None:
        self._val_sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        self._translations = []

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        sums = self._loss(batch)
        self._val_sums += torch.stack([sums.loss.double(), sums.nll.double(), sums.tokens.double()])
        if self.val_bleu_samples > 0:
            if batch.index is None:
                raise RuntimeError("validation batches carry no corpus index (Batch.index); BLEU needs it")
            rows = (batch.index < self.val_bleu_samples).nonzero().flatten().tolist()
            if rows:
                self._translate(batch, self.val_search, rows)

    def on_validation_epoch_end(self) -> None:
        loss, nll, tokens = self.trainer.strategy.reduce(self._val_sums, reduce_op="sum").tolist()
        tokens = max(tokens, 1.0)
        # every rank holds the same values: sync_dist only averages equal numbers (and keeps Lightning quiet)
        self.log("val/loss", loss / tokens, prog_bar=True, sync_dist=True)
        self.log("val/nll", nll / tokens, sync_dist=True)
        self.log("val/ppl", math.exp(min(nll / tokens, 50.0)), sync_dist=True)
        if self.val_bleu_samples > 0:
            report = self._score("valid")
            bleu = self.trainer.strategy.broadcast(report.bleu if report is not None else 0.0, src=0)
            self.log("val/bleu", bleu, prog_bar=True, sync_dist=True)

    # ------------------------------------------------------------------------------------ test and predict

    def _translate(
        self, batch: Batch, search: SearchConfig, rows: list[int] | None = None
    ) -> list[list[int]]:
        src, src_mask, index = batch.src, batch.src_mask, batch.index
        if rows is not None and len(rows) < batch.size:
            keep = torch.tensor(rows, device=src.device)
            src, src_mask, index = src[keep], src_mask[keep], index[keep.cpu()]
        if search.max_positions is None:
            search = dataclasses.replace(search, max_positions=self.config.max_len)
        hypotheses = translate_batch(self.model, src, src_mask, search)
        self._translations.extend(zip(index.tolist(), hypotheses, strict=True))
        return hypotheses

    def on_test_epoch_start(self) -> None:
        self._translations = []

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._translate(batch, self.search)

    def on_test_epoch_end(self) -> None:
        report = self._score("test", write=True)
        if report is not None:  # rank 0: the scores are the command's result, printed to stdout
            print("\n".join(report.lines()), flush=True)
        for name in ("bleu", "chrf"):
            value = getattr(report, name) if report is not None else 0.0
            self.log(f"test/{name}", self.trainer.strategy.broadcast(value, src=0), sync_dist=True)

    def on_predict_epoch_start(self) -> None:
        self._translations = []

    def predict_step(self, batch: Batch, batch_idx: int) -> list[list[int]]:
        return self._translate(batch, self.search)

    def on_predict_epoch_end(self) -> None:
        self._gather_translations("predict", write=True)

    def _gather_translations(self, stage: str, write: bool = False) -> list[tuple[int, str]] | None:
        """All ranks' translations as ``(corpus index, text)`` in corpus order, on rank 0 (None elsewhere)."""
        pairs = self._translations
        self._translations = []
        if self.trainer.world_size > 1:
            gathered: list[Any] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(gathered, pairs)
            pairs = [pair for part in gathered for pair in part]
        if not self.trainer.is_global_zero:
            return None
        by_index = dict(pairs)  # distributed samplers may repeat a sentence to even out the ranks
        texts = [(i, self.tokenizer.decode(by_index[i])) for i in sorted(by_index)]
        if write:
            path = self._output_path(stage)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(text + "\n" for _, text in texts), encoding="utf-8")
            rank_zero_info(f"{len(texts)} translations written to {path}")
        return texts

    def _output_path(self, stage: str) -> Path:
        if self.output_file is not None:
            return Path(self.output_file)
        _, split = self._corpus_split(stage)
        log_dir = self.trainer.log_dir or self.trainer.default_root_dir
        return Path(log_dir) / f"{stage}.{split or 'data'}.hyp"

    def _score(self, stage: str, write: bool = False):
        """sacreBLEU of this epoch's translations against the raw references of ``stage``'s split (rank 0)."""
        from attnx.evaluation.bleu import score

        translations = self._gather_translations(stage, write=write)
        if translations is None:
            return None
        corpus, split = self._corpus_split(stage)
        if corpus is None:
            raise RuntimeError(f"the datamodule exposes no corpus/{stage}_split, so BLEU has no references")
        references = corpus.references(split)
        return score(
            [text for _, text in translations], [references[i] for i, _ in translations], lang=corpus.tgt_lang
        )

    # ----------------------------------------------------------------------------------------- checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["attnx"] = make_metadata(self.config, self.tokenizer)
        checkpoint["attnx_training"] = {"seed": self.seed}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        meta = checkpoint.get("attnx")
        if meta is None:
            raise CheckpointError("checkpoint has no attnx metadata; it was not written by `attnx fit`")
        theirs, ours = meta["transformer"], self.config.to_dict()
        if theirs != ours:
            diff = config_difference(theirs, ours, "checkpoint", "config")
            raise CheckpointError(f"checkpoint is of another model than the config describes ({diff})")
        self.seed = checkpoint.get("attnx_training", {}).get("seed", self.seed)

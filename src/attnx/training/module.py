"""The LightningModule: §5 training — the loss, Adam and the schedule of Eq. 3. It trains; nothing else.

Decoding and BLEU are [`TranslationEvaluator`][attnx.training.evaluation.TranslationEvaluator]'s (through
[`Translator`][attnx.inference.translator.Translator]), throughput and MFU [`TokenThroughput`][attnx.training.throughput.TokenThroughput]'s, and the
console lines [`ProgressLog`][attnx.training.progress.ProgressLog]'s.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from attnx.checkpoint import (
    CheckpointError,
    check_tokenizer,
    config_difference,
    make_metadata,
    upgrade_checkpoint,
)
from attnx.components.loss import LossSums, alignment_sums
from attnx.data.batch import Batch
from attnx.data.tokenizer import Tokenizer
from attnx.errors import AttnxError, ConfigError
from attnx.inference.config import SearchConfig
from attnx.inference.eager import EagerTranslator
from attnx.model import ComponentSpec, TransformerConfig, architecture, build_transformer
from attnx.registry import Kind
from attnx.training.capture import StepEngine
from attnx.training.captured_steps import syncs_gradients
from attnx.training.host_syncs import log_host
from attnx.training.schedule import lr_lambda

BASE_MODEL = TransformerConfig()
"""The default model: the paper's base Transformer (copied, never modified)."""

FUSED_LOSS = ComponentSpec("label_smoothed")
"""The default loss: label-smoothed cross-entropy with the projection fused in (copied, never modified)."""


def perplexity(nll: float) -> float:
    """`exp(nll)` of an NLL per token in nats, capped at exp(50) (an untrained model's would overflow)."""
    return math.exp(min(nll, 50.0))


class NonFiniteLossError(AttnxError, FloatingPointError):
    """The training loss became NaN or infinite; training stops instead of corrupting the weights."""


class TranslationTask(pl.LightningModule):
    """Train a Transformer translation model (§5).

    Training minimizes the configured loss (§5.4 label-smoothed cross-entropy by default) with Adam (β1 0.9,
    β2 0.98, ε 1e-9) and the learning rate of Eq. 3, stepped once per optimizer update (so gradient
    accumulation does not change it). Validation and test report loss, NLL and perplexity over the whole split.

    A NaN or infinite training loss raises [NonFiniteLossError][attnx.training.module.NonFiniteLossError]
    naming the step and batch, before that step changes the weights: once it appears the weights are usually
    already damaged, and skipping batches would hide a diverging run.

    Dropout draws from a generator reseeded at every training batch from (seed, optimizer step, micro-batch,
    rank), so a run resumed from a checkpoint draws exactly the masks the uninterrupted run would have drawn.
    """

    def __init__(
        self,
        transformer: TransformerConfig = BASE_MODEL,
        loss: ComponentSpec = FUSED_LOSS,
        label_smoothing: float = 0.1,
        lr_factor: float = 1.0,
        warmup_steps: int = 4000,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
        weight_decay: float = 0.0,
    ) -> None:
        """
        Args:
            transformer: The model (§3, Table 3): sizes, dropout and the components chosen by plugin name.
                `vocab_size` is linked from the data.
            loss: The training loss, a registered `loss` component (`attnx plugins` lists them):
                `label_smoothed` (fused with the projection; the default) or `reference` (plain, slower).
            label_smoothing: ε_ls of §5.4 (paper: 0.1). Loss = (1 - ε)·NLL + ε·mean over the vocabulary of
                -log p (cross-entropy with the smoothed target; padding ignored).
            lr_factor: Multiplier of Eq. 3: lr = lr_factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5).
                The paper uses 1.0 for base and big.
            warmup_steps: Linear warm-up length of Eq. 3 in optimizer updates (paper: 4000).
            betas: Adam β1, β2 (paper: 0.9, 0.98).
            eps: Adam ε (paper: 1e-9).
            weight_decay: Decoupled weight decay (AdamW); the paper uses none (0.0, which is plain Adam).
        """
        super().__init__()
        if isinstance(transformer, dict):  # a checkpoint's plain hyperparameters
            transformer = TransformerConfig.from_dict(transformer)
        if isinstance(loss, dict):
            loss = ComponentSpec(**loss)
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        if warmup_steps < 1 or lr_factor <= 0:
            raise ConfigError(f"need warmup_steps >= 1 and lr_factor > 0, got {warmup_steps} and {lr_factor}")
        self.save_hyperparameters()
        # Checkpoints load with weights_only=True: hyperparameters must be plain values, never dataclasses.
        for key, value in list(self.hparams.items()):
            if dataclasses.is_dataclass(value):
                self.hparams[key] = dataclasses.asdict(value)
        from attnx.plugins import registry

        self.config = dataclasses.replace(transformer)
        self.loss = registry().build(Kind.LOSS, loss.name, label_smoothing, **loss.args)
        self.lr_factor = lr_factor
        self.warmup_steps = warmup_steps
        self.betas = tuple(betas)
        self.eps = eps
        self.weight_decay = weight_decay
        self.model = build_transformer(self.config)
        # seed_everything (LightningCLI's --seed_everything) keeps the seed only in PL_GLOBAL_SEED, the
        # variable its docstring names for passing it to subprocesses; Lightning has no getter for it.
        self.seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        self._tokenizer: Tokenizer | None = None
        self._sums: Tensor | None = None
        self._step_losses: list[tuple[int, int, Tensor]] = []  # (batch_idx, target tokens, loss and NLL sums)
        self.step_engine: StepEngine | None = None
        """Replays training batches from CUDA graphs where set (by `attnx fit`'s CapturedSteps)."""
        self._grads_done = False  # this batch's gradients were added by a replayed graph

    # ----------------------------------------------------------------------------------------- data access

    @property
    def tokenizer(self) -> Tokenizer:
        """The data's tokenizer (from the datamodule), saved into every checkpoint for decoding."""
        if self._tokenizer is not None:
            return self._tokenizer
        try:
            datamodule = self.trainer.datamodule
        except RuntimeError:  # not attached to a Trainer
            datamodule = None
        if datamodule is None or not hasattr(datamodule, "tokenizer"):
            raise RuntimeError(
                "TranslationTask needs the tokenizer of its data: train through a TranslationDataModule "
                "(`attnx fit`), or set `task.tokenizer = Tokenizer.load(...)`"
            )
        return datamodule.tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def translator(
        self, search: SearchConfig | None = None, max_tokens: int | None = None, precision: str = "32-true"
    ) -> EagerTranslator:
        """An [EagerTranslator][attnx.inference.eager.EagerTranslator] over the model being trained, decoding in
        `precision` (`auto`: chosen from the device, [`attnx.inference.precision`][attnx.inference.precision])."""
        if max_tokens is None:
            return EagerTranslator(self.model, self.tokenizer, search, precision=precision)
        return EagerTranslator(self.model, self.tokenizer, search, max_tokens, precision=precision)

    # -------------------------------------------------------------------------------------------- training

    def forward(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor) -> Tensor:
        return self.model(src, tgt_in, src_mask)

    def _reseed(self, batch_idx: int) -> None:
        micro = batch_idx % self.trainer.accumulate_grad_batches
        # int tuples hash the same in every process and run (only str/bytes hashing is salted)
        torch.manual_seed(hash((self.seed, self.global_step, micro, self.global_rank)) % 2**63)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        self._reseed(batch_idx)
        sums = self._replayed(batch, batch_idx)
        if sums is None:
            computed: LossSums = self.loss(self.model, batch)
            loss = computed.objective() / batch.n_tgt_tokens
            sums = alignment_sums(computed).detach()
        else:
            # for Lightning's bookkeeping only: the replayed graph has added the gradients already
            loss = sums[0] / batch.n_tgt_tokens
            sums = torch.cat([sums, sums.new_zeros(2)])
        # logged once a step from the host (on_before_optimizer_step), never here: see attnx.training.host_syncs
        self._step_losses.append((batch_idx, batch.n_tgt_tokens, sums))
        return loss

    def _replayed(self, batch: Batch, batch_idx: int) -> Tensor | None:
        """The batch's loss and NLL sums from its captured graph, its gradients added; None: run it eagerly."""
        self._grads_done = False
        if self.step_engine is None or not self.training:
            return None
        if batch_idx % self.trainer.accumulate_grad_batches == 0:
            # Lightning zeroes a step's gradients after its first training_step, before that batch's backward
            # (its rule: batch_idx % accumulate == 0); a replay's backward runs inside the training step
            for optimizer in self.trainer.optimizers:
                optimizer.zero_grad(set_to_none=False)
        # the divisor of this step: a GradientAccumulationScheduler changes it between epochs
        self.step_engine.divisor = self.trainer.accumulate_grad_batches
        sums = self.step_engine.run(batch, syncing=syncs_gradients(self.trainer.strategy.model))
        self._grads_done = sums is not None
        return sums

    def setup(self, stage: str) -> None:
        """Refuse, before the first step, a loss trained on word alignments (`guided_alignment`) beside batches
        segmented anew (`data.subword_sampling`): the links are of the prepared segmentation's pieces."""
        sampling = getattr(getattr(self.trainer, "datamodule", None), "subword_sampling", None)
        aligned = getattr(self.loss, "alignment_lambda", None) is not None
        if stage == "fit" and aligned and getattr(sampling, "enabled", False):
            raise ConfigError(
                f"model.loss guided_alignment and data.subword_sampling.alpha {sampling.alpha} together: the "
                "word alignments link the prepared segmentation's pieces, which sampling replaces; leave one out"
            )

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Lightning's backward, except after a replayed batch: its graph has added the gradients."""
        if self._grads_done:
            self._grads_done = False
            return
        super().backward(loss, *args, **kwargs)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        """Zero the gradients; in place while steps are captured (the graphs add into those very tensors), and
        not after a replayed batch, which zeroed them before its graph added its own."""
        if not self._grads_done:
            optimizer.zero_grad(set_to_none=self.step_engine is None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """`nn.Module.zero_grad`, in place while steps are captured whatever `set_to_none` asks: Lightning
        clears the module's gradients this way at the start of fit and (through `on_validation_model_zero_grad`)
        before each validation within training, and the graphs add into those very tensors."""
        super().zero_grad(set_to_none=set_to_none and self.step_engine is None)

    def on_validation_model_zero_grad(self) -> None:
        """Lightning's release of the gradients before a validation on a step boundary: set to None in an eager
        run (their memory is free for validation), zeroed in place while steps are captured (they stay
        allocated: the next step's replays add into them)."""
        self.zero_grad(set_to_none=True)

    def on_train_batch_start(self, batch: Batch, batch_idx: int) -> None:
        if batch_idx % self.trainer.accumulate_grad_batches == 0:
            self._step_losses.clear()  # a step's batches start (or a resumed run's first one)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Check and log the step's losses, and its learning rate: once per optimizer step, from the host."""
        if self._step_losses:
            loss, nll, alignment = self._check_losses()
            log_host(self, "train/loss", loss, prog_bar=True)
            log_host(self, "train/nll", nll)
            log_host(self, "train/ppl", perplexity(nll))
            if alignment is not None:
                log_host(self, "train/alignment_loss", alignment)
        log_host(self, "train/lr", optimizer.param_groups[0]["lr"], prog_bar=True)

    def _check_losses(self) -> tuple[float, float, float | None]:
        """The loss and NLL per target token over the step's batches; refuses to step on a NaN or infinite
        loss. Read back once per optimizer step, before it changes the weights, rather than at each batch:
        a read-back makes the host wait until the GPU has run everything queued, and at every batch of a step
        (8 in the paper's setting on one GPU) that wait leaves the GPU idle while the host prepares the next."""
        batches, tokens, sums = zip(*self._step_losses, strict=True)
        self._step_losses.clear()
        rows = torch.stack(sums).double().tolist()  # per batch: loss, NLL, alignment sums, aligned positions
        per_token = [(loss + alignment) / n for (loss, _, alignment, _), n in zip(rows, tokens, strict=True)]
        if all(math.isfinite(v) for v in per_token):
            aligned = sum(r[3] for r in rows)
            alignment = sum(r[2] for r in rows) / aligned if aligned else None
            return sum(r[0] for r in rows) / sum(tokens), sum(r[1] for r in rows) / sum(tokens), alignment
        value, batch_idx = next(
            (v, b) for v, b in zip(per_token, batches, strict=True) if not math.isfinite(v)
        )
        raise NonFiniteLossError(
            f"training loss is {value} at optimizer step {self.global_step + 1} (batch {batch_idx} of "
            f"epoch {self.current_epoch}); the run diverged. Lower model.lr_factor or raise "
            "model.warmup_steps, set trainer.gradient_clip_val, or train in fp32 "
            "(--trainer.precision 32-true); then resume from an earlier checkpoint."
        )

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
        return {"optimizer": optimizer, "lr_scheduler": self.schedule(optimizer)}

    def schedule(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """§5.3 Eq. 3 as a multiple of `optimizer`'s learning rate (1.0 for the paper's Adam, so the schedule
        is the rate), stepped after every update: Lightning's `lr_scheduler` entry."""
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda(self.config.d_model, self.warmup_steps, self.lr_factor)
        )
        return {"scheduler": scheduler, "interval": "step", "frequency": 1}

    def on_train_start(self) -> None:
        """Apply this run's schedule and Adam settings over the optimizer state a resumed checkpoint restored
        (which holds the learning rate and settings it was saved with), so that a resume with another
        `lr_factor`, `warmup_steps`, `betas`, `eps` or `weight_decay` trains its next step with them."""
        for config in self.trainer.lr_scheduler_configs:
            schedule = config.scheduler
            if isinstance(schedule, torch.optim.lr_scheduler.LambdaLR):
                for group, factor, base in zip(
                    schedule.optimizer.param_groups, schedule.lr_lambdas, schedule.base_lrs, strict=True
                ):
                    group["lr"] = base * factor(schedule.last_epoch)
        for optimizer in self.trainer.optimizers:
            for group in optimizer.param_groups:
                group.update(betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)

    # ------------------------------------------------------------------------ validation and test: loss

    def _start_sums(self) -> None:
        self._sums = torch.zeros(5, dtype=torch.float64, device=self.device)

    def _add_sums(self, batch: Batch) -> None:
        sums = self.loss(self.model, batch)
        self._sums += torch.cat([sums.tokens.double().reshape(1), alignment_sums(sums).double()])

    def _log_sums(self, stage: str) -> None:
        tokens, loss, nll, alignment, aligned = self.trainer.strategy.reduce(
            self._sums, reduce_op="sum"
        ).tolist()
        tokens = max(tokens, 1.0)
        # every rank holds the same values: sync_dist only averages equal numbers (and keeps Lightning quiet)
        self.log(f"{stage}/loss", loss / tokens, prog_bar=stage == "val", sync_dist=True)
        self.log(f"{stage}/nll", nll / tokens, sync_dist=True)
        self.log(f"{stage}/ppl", perplexity(nll / tokens), sync_dist=True)
        if (
            aligned
        ):  # guided alignment on a split prepared with alignments: the term apart, per aligned position
            self.log(f"{stage}/alignment_loss", alignment / aligned, sync_dist=True)

    def on_validation_epoch_start(self) -> None:
        self._start_sums()

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._add_sums(batch)

    def on_validation_epoch_end(self) -> None:
        self._log_sums("val")

    def on_test_epoch_start(self) -> None:
        self._start_sums()

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._add_sums(batch)

    def on_test_epoch_end(self) -> None:
        self._log_sums("test")

    def predict_step(self, batch: Batch, batch_idx: int) -> None:
        """Nothing to compute here: the evaluator callback translates each predict batch."""

    # ----------------------------------------------------------------------------------------- checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["attnx"] = make_metadata(self.config, self.tokenizer)
        checkpoint["attnx_training"] = {"seed": self.seed}

    def _check_tokenizer(self, checkpoint: dict[str, Any]) -> None:
        """The data's SentencePiece model must be the checkpoint's (without data, e.g. `load_from_checkpoint`
        in Python, there is nothing to compare with)."""
        try:
            tokenizer, path = self.tokenizer, self.trainer.ckpt_path
        except RuntimeError:  # no trainer or no datamodule
            return
        check_tokenizer(checkpoint, path, tokenizer)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        meta = checkpoint.get("attnx")
        if meta is None:
            raise CheckpointError("checkpoint has no attnx metadata; it was not written by `attnx fit`")
        self._check_tokenizer(checkpoint)
        # dropout may change when a run resumes (the CLI says so); the architecture may not
        theirs, ours = architecture(meta["transformer"]), architecture(self.config.to_dict())
        if theirs != ours:
            diff = config_difference(theirs, ours, "checkpoint", "config")
            raise CheckpointError(f"checkpoint is of another model than the config describes ({diff})")
        self.seed = checkpoint.get("attnx_training", {}).get("seed", self.seed)
        upgrade_checkpoint(checkpoint, self)  # the earlier attention layout: weights and Adam's moments

"""The best checkpoint by a validation score, and early stopping on it (config section `best`).

`attnx fit --best.metric bleu` keeps `best.ckpt` beside the run's other checkpoints: the weights of the
validation with the highest BLEU so far (or the lowest loss or perplexity). `--best.patience 5` also ends
training after 5 validations in a row without an improvement of more than `--best.min_delta`, as fairseq's
`--patience` and Marian's `--early-stopping` do; the run then ends as at `max_steps` (its last checkpoint
saved and the last k averaged), and one line says why. `best.ckpt` is a training checkpoint: `attnx test
--ckpt_path best` decodes the newest of the config's runs (or `--ckpt_path .../best.ckpt` a given one), and
`attnx average` leaves it out (it repeats one of the step checkpoints).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from attnx.errors import ConfigError
from attnx.training.checkpointing import PeriodicCheckpoint
from attnx.training.evaluation import TranslationEvaluator

Metric = Literal["bleu", "loss", "ppl"]

HIGHER_IS_BETTER = {"bleu": True, "loss": False, "ppl": False}
"""Which way each validation score improves."""


class BestCheckpoint(Callback):
    """Keep the checkpoint of the best validation (`best.ckpt`) and stop when validation stops improving."""

    def __init__(
        self, metric: Metric | None = None, patience: int | None = None, min_delta: float = 0.0
    ) -> None:
        """
        Args:
            metric: The validation score that picks `best.ckpt`: `bleu` (val/bleu, highest; needs
                evaluation.bleu_samples > 0), `loss` or `ppl` (val/loss, val/ppl, lowest). None: no best.ckpt
                and no early stopping.
            patience: End training after this many validations in a row without an improvement of `metric`
                (fairseq's --patience, Marian's --early-stopping); None: train to max_steps or max_time.
            min_delta: How much better than the best so far a score must be to count as an improvement.
        """
        if patience is not None and patience < 1:
            raise ConfigError(
                f"--best.patience must be at least 1 (or null: never stop early), got {patience}"
            )
        if min_delta < 0:
            raise ConfigError(f"--best.min_delta must be >= 0, got {min_delta}")
        if patience is not None and metric is None:
            raise ConfigError(
                f"--best.patience {patience} needs the score it waits on: add --best.metric bleu (or loss, ppl)"
            )
        self.metric = metric
        self.patience = patience
        self.min_delta = min_delta
        self.best: float | None = None
        self.best_step: int | None = None
        self.waited = 0  # validations since the best one
        self.path: Path | None = None

    @property
    def key(self) -> str:
        return f"val/{self.metric}"

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.metric != "bleu" or stage != "fit":
            return
        evaluators = [c for c in trainer.callbacks if isinstance(c, TranslationEvaluator)]
        if evaluators and evaluators[0].bleu_samples == 0:
            raise ConfigError(
                "--best.metric bleu needs validation BLEU, which evaluation.bleu_samples 0 turns off: set "
                "--evaluation.bleu_samples N, or take --best.metric loss"
            )

    def _directory(self, trainer: pl.Trainer) -> Path:
        periodic = periodic_checkpoint(trainer)
        if periodic is not None and periodic.dirpath:
            return Path(periodic.dirpath)
        return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"

    def _improved(self, value: float) -> bool:
        if self.best is None:
            return True
        if HIGHER_IS_BETTER[self.metric]:
            return value > self.best + self.min_delta
        return value < self.best - self.min_delta

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.metric is None or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        if self.key not in trainer.callback_metrics:
            raise ConfigError(f"--best.metric {self.metric}: validation logged no {self.key}")
        value = float(trainer.callback_metrics[self.key])  # the same on every rank (logged with sync_dist)
        step = trainer.global_step
        if self._improved(value):
            self.best, self.best_step, self.waited = value, step, 0
            self.path = self._directory(trainer) / "best.ckpt"
            trainer.save_checkpoint(self.path, weights_only=False)  # every rank joins the save
            if trainer.is_global_zero:
                print(f"best {self.key} {value:.4g} at step {step}: {self.path}", flush=True)
            return
        self.waited += 1
        if self.patience is not None and self.waited >= self.patience:
            trainer.should_stop = True
            periodic = periodic_checkpoint(trainer)
            if periodic is not None:  # the step's checkpoint came before this validation: resume after it
                periodic.save_last(trainer)
            if trainer.is_global_zero:
                print(
                    f"early stopping at step {step}: {self.key} has not improved for {self.waited} validations "
                    f"(best {self.best:.4g} at step {self.best_step}, in {self.path}); --best.patience sets how many",
                    flush=True,
                )

    def state_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "best": self.best,
            "best_step": self.best_step,
            "waited": self.waited,
            "path": str(self.path) if self.path else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("metric") != self.metric:  # another score now: start its count afresh
            return
        self.best, self.best_step = state_dict.get("best"), state_dict.get("best_step")
        self.waited = int(state_dict.get("waited", 0))
        self.path = Path(state_dict["path"]) if state_dict.get("path") else None


def periodic_checkpoint(trainer: pl.Trainer) -> PeriodicCheckpoint | None:
    """The run's [PeriodicCheckpoint][attnx.training.checkpointing.PeriodicCheckpoint], if it has one."""
    found = [c for c in trainer.callbacks if isinstance(c, PeriodicCheckpoint)]
    return found[0] if found else None

"""An exponential moving average (EMA) of the weights (config section `ema`): fairseq's `--ema-decay`,
Marian's `--exponential-smoothing`, Eole's `average_decay`.

`attnx fit --ema.decay 0.9999` keeps, beside the weights the optimizer trains, their average
`ema ← decay · ema + (1 - decay) · weights`, updated after every `every`-th optimizer step from step `start` on
(before it the average follows the weights). Validation (loss, BLEU, `best.ckpt`, early stopping) scores the
EMA weights, and every checkpoint holds them as its model weights, so `attnx average`, `attnx export`,
`attnx serve` and `attnx translate` take them as they take any weights; the trained weights travel in the
checkpoint beside them ([`attnx.checkpoint.ema`][attnx.checkpoint.ema]) and a resumed run continues both
exactly. `--ema.evaluate training` scores the trained weights instead (in fit's validation, and in
`attnx validate` / `test` / `predict` of a checkpoint with an EMA). One line says which weights a command uses.

The decay is constant (no warm-up): after `n` averaging updates the weights the average started from still
weigh `decay^n` in it, 96% for 0.999 over 40 updates. Where a run's planned steps leave them more than
[INITIAL_SHARE][attnx.training.ema.INITIAL_SHARE], one line says so as training starts, with a decay that suits
the run ([short_run_line][attnx.training.ema.WeightEMA.short_run_line]); so does one at the end of a run that stopped
before its planned steps (`trainer.max_time`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, Timer
from torch import Tensor

from attnx.checkpoint.ema import EMA_KEY, ema_state
from attnx.errors import ConfigError

Weights = Literal["ema", "training"]

INITIAL_SHARE = 0.05
"""Above this share of the average still held by the weights it started from (`decay^updates`), a run is too
short for its decay, and the EMA says so."""

SUITED_SHARE = 0.01
"""The share of the starting weights a suggested decay leaves in the average at the end of the run."""


class WeightEMA(Callback):
    """Keep an exponential moving average of the weights; validate, test and save with it."""

    def __init__(
        self, decay: float | None = None, every: int = 1, start: int = 0, evaluate: Weights = "ema"
    ) -> None:
        """
        Args:
            decay: The EMA's decay per update, in (0, 1): 0.9999 averages over about the last 10,000 updates
                (fairseq's `--ema-decay`, Marian's `--exponential-smoothing` 1e-4 is decay 0.9999). None (the
                default): no EMA.
            every: Update the average after every `every`-th optimizer step (fairseq's
                `--ema-update-freq`); the decay applies per update.
            start: Optimizer steps during which the average copies the weights instead of averaging them
                (fairseq's `--ema-start-update`): the first weights of a run are far from any useful average.
            evaluate: Which weights fit's validation and `attnx validate` / `test` / `predict` of a checkpoint
                with an EMA use: `ema` (the default) or `training` (those the optimizer trains). Checkpoints always
                hold the EMA weights as their model weights, and the trained weights for resuming.
        """
        if decay is not None and not 0.0 < decay < 1.0:
            raise ConfigError(f"ema.decay must be in (0, 1) (e.g. 0.9999), got {decay}")
        if every < 1:
            raise ConfigError(f"ema.every must be >= 1 (optimizer steps between updates), got {every}")
        if start < 0:
            raise ConfigError(f"ema.start must be >= 0 (optimizer steps), got {start}")
        self.decay = decay
        self.every = every
        self.start = start
        self.evaluate = evaluate
        self.updates = 0
        """How many times the average was updated (the copies before `start` included)."""
        self._step = 0  # the optimizer step of the last update
        self._shadow: dict[str, Tensor] = {}  # the EMA weights, by parameter name
        self._backup: dict[str, Tensor] | None = None  # the trained weights while validation uses the EMA
        self._resumed: dict[str, Any] | None = None  # a resumed fit's stored EMA state, until on_fit_start
        self._planned: int | None = None  # the optimizer steps the run was planned to end at, where known

    @property
    def state_key(self) -> str:
        return "WeightEMA"

    def _parameters(self, pl_module: pl.LightningModule) -> dict[str, torch.nn.Parameter]:
        return dict(pl_module.named_parameters())

    def ema_weights(self) -> dict[str, Tensor]:
        """The EMA weights by parameter name (empty without an EMA or before fit)."""
        return dict(self._shadow)

    # ------------------------------------------------------------------------------------------- training

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The average starts here, after the strategy has moved the module to its device and cast it (a
        copy made in `setup` would stay on the CPU in fp32 while the weights go to the GPU or to bf16)."""
        if self.decay is None:
            return
        # the weights in place: those of --init_from, or of a resumed run's checkpoint (its EMA weights)
        self._shadow = {
            name: p.detach().to(_ema_dtype(p.dtype), copy=True)
            for name, p in self._parameters(pl_module).items()
        }
        if self._resumed is not None:  # the module takes the trained weights back from the checkpoint
            stored, self._resumed = self._resumed, None
            with torch.no_grad():
                for name, p in self._parameters(pl_module).items():
                    p.copy_(stored["training"][name])
        scored = "the EMA weights" if self.evaluate == "ema" else "the trained weights"
        kept = {str(s.dtype).removeprefix("torch.") for s in self._shadow.values()}
        trained = {str(p.dtype).removeprefix("torch.") for p in self._parameters(pl_module).values()}
        wider = (
            f", kept in {', '.join(sorted(kept))} beside {', '.join(sorted(trained))} weights"
            if kept != trained
            else ""
        )
        _say(
            trainer,
            f"ema: an average of the weights (decay {self.decay}, every {self.every} step"
            f"{'s' if self.every > 1 else ''}, from step {self.start}{wider}); validation scores {scored}, "
            "checkpoints hold the EMA weights",
        )
        self._planned, source = planned_steps(trainer)
        if self._planned is not None and (line := self.short_run_line(self._planned, source)):
            _say(trainer, line)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A run that stopped before its planned steps (`max_time`, or one whose steps the trainer did not know
        when it started) says where that left the average."""
        stopped = self._planned is None or trainer.global_step < self._planned
        if self.decay is not None and stopped and (line := self.short_run_line(trainer.global_step)):
            _say(trainer, line)

    def short_run_line(self, steps: int, planned_by: str | None = None) -> str | None:
        """One line where an average over a run that ends at optimizer step `steps` (as `planned_by` plans it,
        or where it stopped: None) is still more than [INITIAL_SHARE][attnx.training.ema.INITIAL_SHARE] the
        weights it started from, with a decay that suits the run; None where it is not, or without an EMA."""
        if self.decay is None:
            return None
        updates = averaging_updates(steps, self.every, self.start)
        share = self.decay**updates
        if share <= INITIAL_SHARE:
            return None
        if planned_by:
            run, ends = f"this run's {steps:,} optimizer steps ({planned_by})", " end"
        else:
            run, ends = f"training stopped at step {steps:,}", ","
        if not updates:
            return (
                f"ema: warning: {run}{ends} within ema.start {self.start:,}: the average only copies the weights; "
                "a smaller --ema.start averages them"
            )
        started = f"the weights of step {self.start:,} (ema.start)" if self.start else "the initial weights"
        counted = f"{updates:,} updates at decay {self.decay} ({self.decay}^{updates:,})"
        percent = f"{share:.0%}" if share < 0.995 else f"{share:.1%}"  # 0.999^4 is not 100%
        suits = (
            f"--ema.decay {suited_decay(updates)} suits {updates:,} updates (leaves them {SUITED_SHARE:.0%})"
        )
        if planned_by:
            return (
                f"ema: warning: {percent} of the average will still be {started} at the end: {run} make "
                f"{counted}; {suits}"
            )
        return (
            f"ema: warning: {percent} of the average is still {started}: {run}, after {counted}; {suits}; "
            "--ema.evaluate training scores the checkpoints' trained weights"
        )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._catch_up(trainer, pl_module)

    def _catch_up(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Update the average with the optimizer step just taken, once. Also called before a checkpoint is
        written and before validation: a checkpoint callback that runs before this one at the end of a batch
        still saves the average of its own step, so a resumed run misses no update."""
        step = trainer.global_step
        if not self._shadow or step <= self._step:  # no EMA, or an accumulation window goes on
            return
        self._step = step
        if (step - 1) % self.every:
            return
        shadow = list(self._shadow.values())
        trained = self._backup or {name: p.detach() for name, p in self._parameters(pl_module).items()}
        weights = [trained[name].to(s.dtype) for name, s in self._shadow.items()]  # a no-op but in 16 bits
        if step <= self.start:
            torch._foreach_copy_(shadow, weights)
        else:  # ema + (1 - decay)(w - ema) = decay·ema + (1 - decay)·w, in place: no host sync, no new memory
            torch._foreach_lerp_(shadow, weights, 1.0 - self.decay)
        self.updates += 1

    # -------------------------------------------------------------------------- validation on the average

    def _swap_in(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._catch_up(trainer, pl_module)
        if self._shadow and self.evaluate == "ema" and self._backup is None:
            parameters = self._parameters(pl_module)
            self._backup = {name: p.detach().clone() for name, p in parameters.items()}
            with torch.no_grad():  # in place: a captured step's graphs keep pointing at these tensors
                for name, p in parameters.items():
                    p.copy_(self._shadow[name])

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._backup is not None:
            with torch.no_grad():
                for name, p in self._parameters(pl_module).items():
                    p.copy_(self._backup[name])
            self._backup = None

    # ------------------------------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "step": self._step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.updates = int(state_dict.get("updates", 0))
        self._step = int(state_dict.get("step", 0))

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if not self._shadow:
            return
        self._catch_up(trainer, pl_module)
        parameters = self._parameters(pl_module)
        trained = self._backup or {name: p.detach() for name, p in parameters.items()}
        by_id = {id(p): name for name, p in parameters.items()}
        state = checkpoint["state_dict"]
        # every key of a parameter (tied embeddings have several) gets its EMA tensor
        for key, value in pl_module.state_dict(keep_vars=True).items():
            if key in state and id(value) in by_id:
                state[key] = self._shadow[by_id[id(value)]]
        checkpoint[EMA_KEY] = {
            "decay": self.decay,
            "every": self.every,
            "start": self.start,
            "updates": self.updates,
            "training": trained,
        }

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """A resumed fit: the module holds the checkpoint's model weights (the EMA's, where it has one); the
        average takes them and the module the trained weights."""
        if trainer.state.fn != "fit":
            return  # validate, test, predict: chosen once the weights are in place (_use_evaluated_weights)
        stored = ema_state(checkpoint)
        if self.decay is None:
            if stored is not None:
                raise ConfigError(
                    f"{trainer.ckpt_path} is of a run with an EMA of its weights (decay {stored['decay']}): "
                    f"resume it with --ema.decay {stored['decay']}, or start a new run from its EMA weights "
                    "with --init_from"
                )
            return
        # the module holds the checkpoint's model weights now, before the strategy moves and casts it: the
        # average takes them in on_fit_start, and the module the trained weights
        self._resumed = stored
        if stored is None:
            _say(trainer, f"ema: {trainer.ckpt_path} has no EMA; the average starts from its weights")

    # ------------------------------------------------------------------------- validate, test and predict

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._swap_in(trainer, pl_module)
        else:
            self._use_evaluated_weights(trainer, pl_module)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._use_evaluated_weights(trainer, pl_module)

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._use_evaluated_weights(trainer, pl_module)

    def _use_evaluated_weights(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Say which weights of `--ckpt_path` the command uses; the trained ones replace the EMA's where
        `evaluate` asks for them."""
        path = trainer.ckpt_path
        if not path:
            return
        # mapped, not read: only the trained weights, where they are wanted, are read from the disk
        try:
            stored = ema_state(torch.load(path, map_location="cpu", weights_only=True, mmap=True))
        except RuntimeError:  # a file torch cannot map (written before torch 1.6) holds no EMA
            return
        if stored is None:
            return
        command = trainer.state.fn.value
        if self.evaluate == "ema":
            _say(
                trainer,
                f"attnx {command}: the EMA weights of {path} (decay {stored['decay']}, {stored['updates']} "
                "updates; --ema.evaluate training takes the trained weights)",
            )
            return
        if "training" not in stored:
            raise ConfigError(
                f"--ema.evaluate training: {path} holds only EMA weights (an averaged or exported model); pass "
                "a checkpoint of the run, or leave out --ema.evaluate"
            )
        with torch.no_grad():
            for name, p in self._parameters(pl_module).items():
                p.copy_(stored["training"][name])
        _say(trainer, f"attnx {command}: the trained weights of {path} (ema.evaluate training), not its EMA")


def planned_steps(trainer: pl.Trainer) -> tuple[int | None, str]:
    """The optimizer step a run ends at, as the trainer knows it when fit starts, and where that comes from:
    `trainer.max_steps`, else Lightning's count from the epochs (`max_epochs` times the steps of one); None for a
    run bounded by `max_time` (or by nothing)."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return trainer.max_steps, "trainer.max_steps"
    timed = any(isinstance(callback, Timer) for callback in trainer.callbacks)
    if timed or trainer.max_epochs is None or trainer.max_epochs < 0:  # its end is known only when it comes
        return None, ""
    estimated = trainer.estimated_stepping_batches
    return (int(estimated), "trainer.max_epochs") if math.isfinite(estimated) else (None, "")


def averaging_updates(steps: int, every: int, start: int) -> int:
    """The updates that average the weights (not those that copy them, up to step `start`) in optimizer steps
    1 to `steps`, one every `every` steps from step 1."""

    def updates(n: int) -> int:
        return (n - 1) // every + 1 if n >= 1 else 0

    return max(0, updates(steps) - updates(start))


def suited_decay(updates: int) -> float:
    """A decay that leaves [SUITED_SHARE][attnx.training.ema.SUITED_SHARE] of the starting weights in the
    average after `updates` updates (`decay^updates` = 0.01), `1 - decay` to two significant digits."""
    decay = SUITED_SHARE ** (1 / updates)
    return round(1.0 - float(f"{1.0 - decay:.2g}"), 10)


def _ema_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the average of weights of `dtype` is kept in: fp32 for 16-bit weights (`bf16-true`), whose
    8 bits of mantissa would round an update of `1 - decay` = 1e-4 away (fairseq's `--ema-fp32`), else their
    own."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _say(trainer: pl.Trainer, line: str) -> None:
    if trainer.is_global_zero:
        print(line, flush=True)

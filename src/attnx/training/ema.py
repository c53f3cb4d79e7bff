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
"""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from attnx.checkpoint.ema import EMA_KEY, ema_state
from attnx.errors import ConfigError

Weights = Literal["ema", "training"]


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


def _ema_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the average of weights of `dtype` is kept in: fp32 for 16-bit weights (`bf16-true`), whose
    8 bits of mantissa would round an update of `1 - decay` = 1e-4 away (fairseq's `--ema-fp32`), else their
    own."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _say(trainer: pl.Trainer, line: str) -> None:
    if trainer.is_global_zero:
        print(line, flush=True)

"""An optimizer or learning-rate schedule chosen on the command line (`--optimizer`, `--lr_scheduler`,
LightningCLI's options) in place of the paper's Adam and Eq. 3, and the line that says so.

- `--optimizer X` replaces Adam (`model.betas`, `model.eps` and `model.weight_decay` are Adam's and go
  unused); Eq. 3 still sets the learning rate, as a multiple of X's `lr`, as it does of Adam's 1.0.
- `--lr_scheduler Y` (with `--optimizer`) replaces Eq. 3 (`model.lr_factor` and `model.warmup_steps` go
  unused); Y steps after every optimizer update, as Eq. 3 does (ReduceLROnPlateau, Lightning's way: at the
  end of every epoch, on its `monitor`).
- `--lr_scheduler` without `--optimizer` is refused: the paper's Adam runs at lr 1.0 because Eq. 3 is its
  rate, so another schedule needs an optimizer with a rate of its own.
"""

from __future__ import annotations

from typing import Any

import torch

from attnx.training.module import TranslationTask

SCHEDULER_NEEDS_OPTIMIZER = (
    "--lr_scheduler replaces Eq. 3's schedule, which is the whole learning rate of the paper's Adam (it runs at "
    "lr 1.0 under it); give the optimizer and its rate too, e.g. --optimizer Adam --optimizer.lr 0.0005 "
    "--optimizer.betas '[0.9, 0.98]' --optimizer.eps 1e-9"
)


def _name(choice: Any) -> str:
    """`SGD` for `{class_path: torch.optim.SGD, init_args: {...}}`."""
    class_path = choice.get("class_path") if hasattr(choice, "get") else choice
    return str(class_path).rpartition(".")[2]


def _plateau(choice: Any) -> bool:
    return _name(choice) == "ReduceLROnPlateau"


def choice_line(optimizer: Any, lr_scheduler: Any, model: Any) -> str:
    """What runs in place of the paper's Adam and Eq. 3, in one line, from the parsed config's `optimizer`,
    `lr_scheduler` and `model` sections."""
    name = _name(optimizer)
    line = (
        f"attnx fit: --optimizer {name} replaces the paper's optimizer (Adam with model.betas, model.eps and "
        "model.weight_decay, which are not used)"
    )
    if lr_scheduler:
        scheduler = _name(lr_scheduler)
        when = "at the end of every epoch, on its monitor" if _plateau(lr_scheduler) else "after every update"
        return (
            f"{line}; --lr_scheduler {scheduler} replaces Eq. 3's schedule (model.lr_factor and "
            f"model.warmup_steps are not used) and steps {when}"
        )
    lr = float((optimizer.get("init_args") or {}).get("lr", 0.0))
    transformer = model.get("transformer") or {}
    d_model, warmup = int(transformer.get("d_model")), int(model.get("warmup_steps"))
    peak = lr * float(model.get("lr_factor")) * (d_model * warmup) ** -0.5
    return (
        f"{line}; the learning rate still follows Eq. 3, times {name}'s lr {lr:g} (peak {peak:.3g} at step "
        f"{warmup}); --lr_scheduler replaces the schedule"
    )


def configure_optimizers(
    module: TranslationTask, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None
) -> dict[str, Any]:
    """Lightning's `configure_optimizers` result for an optimizer (and schedule) given on the command line."""
    if lr_scheduler is None:
        return {"optimizer": optimizer, "lr_scheduler": module.schedule(optimizer)}
    if isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor},
        }
    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": lr_scheduler, "interval": "step", "frequency": 1},
    }

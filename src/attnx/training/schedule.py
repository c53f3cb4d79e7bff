"""§5.3 Eq. 3: the learning rate rises linearly for `warmup` steps, then decays as 1/√step."""

from __future__ import annotations

from functools import partial

from attnx.errors import ConfigError


def inverse_sqrt_schedule(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """`lrate = factor · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)` for optimizer update `step ≥ 1`.

    The peak, `factor · (d_model · warmup_steps)^-0.5`, is reached at `step == warmup_steps`.
    """
    if step < 1:
        raise ValueError(f"Eq. 3 counts optimizer updates from 1, got step {step}")
    if warmup_steps < 1:
        raise ConfigError(f"warmup_steps must be at least 1, got {warmup_steps}")
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def lr_lambda(d_model: int, warmup_steps: int, factor: float = 1.0):
    """The multiplier for `torch.optim.lr_scheduler.LambdaLR` over a base learning rate of 1.

    `LambdaLR` calls it with the number of scheduler steps already taken (0 before the first update),
    so update `n` (counted from 1) trains with `inverse_sqrt_schedule(n)`.
    """
    return partial(_from_zero, d_model=d_model, warmup_steps=warmup_steps, factor=factor)


def _from_zero(taken: int, d_model: int, warmup_steps: int, factor: float) -> float:
    return inverse_sqrt_schedule(taken + 1, d_model, warmup_steps, factor)

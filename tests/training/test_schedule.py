"""§5.3 Eq. 3, alone and as the optimizer sees it."""

from __future__ import annotations

import pytest
import torch

from attnx.training.schedule import inverse_sqrt_schedule, lr_lambda


def test_eq3_at_its_landmarks() -> None:
    d, warmup = 512, 4000
    assert inverse_sqrt_schedule(1, d, warmup) == pytest.approx(512**-0.5 * 4000**-1.5)  # 1.75e-7
    assert inverse_sqrt_schedule(warmup, d, warmup) == pytest.approx(512**-0.5 * 4000**-0.5)  # the peak
    assert inverse_sqrt_schedule(warmup, d, warmup) == pytest.approx(6.9877e-4, rel=1e-4)
    assert inverse_sqrt_schedule(4 * warmup, d, warmup) == pytest.approx(512**-0.5 * 16000**-0.5)
    assert inverse_sqrt_schedule(4 * warmup, d, warmup) == pytest.approx(
        inverse_sqrt_schedule(warmup, d, warmup) / 2
    )
    assert inverse_sqrt_schedule(10, 256, 1000, factor=2.0) == pytest.approx(2 * 256**-0.5 * 10 * 1000**-1.5)


def test_peak_is_at_warmup() -> None:
    values = [inverse_sqrt_schedule(s, 512, 100) for s in range(1, 400)]
    assert max(range(len(values)), key=values.__getitem__) + 1 == 100


def test_lambda_lr_gives_update_n_the_rate_of_step_n() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([param], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(256, 10, factor=2.0))
    for n in range(1, 30):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(inverse_sqrt_schedule(n, 256, 10, 2.0))
        optimizer.step()
        scheduler.step()


def test_rejects_step_zero() -> None:
    with pytest.raises(ValueError, match="from 1"):
        inverse_sqrt_schedule(0, 512, 4000)

"""The checks of a component's numbers: an integer is no bool or float, a probability is below 1, a positive
number is finite; each refusal one line naming the key, the value and the range."""

from __future__ import annotations

import numpy as np
import pytest

from attnx.components.values import flag, integer, optional_integer, positive, probability
from attnx.errors import ConfigError


def test_values_in_range_come_back_as_plain_numbers() -> None:
    assert integer("d_ff", np.int64(8)) == 8 and type(integer("d_ff", np.int64(8))) is int
    assert optional_integer("d_k", None) is None and optional_integer("d_k", 4) == 4
    assert probability("dropout", 0) == 0.0 and positive("eps", 1e-6) == 1e-6 and flag("bias", False) is False


@pytest.mark.parametrize(
    ("check", "value", "message"),
    [
        (
            lambda v: integer("d_ff", v, what="the hidden width"),
            0,
            "d_ff must be an integer >= 1 (the hidden width), got 0",
        ),
        (lambda v: integer("d_ff", v), 2.0, "d_ff must be an integer >= 1, got 2.0"),
        (lambda v: integer("pad_id", v, least=0), True, "pad_id must be an integer >= 0, got True"),
        (lambda v: probability("dropout", v), 1.5, "dropout must be in [0, 1), got 1.5"),
        (lambda v: probability("dropout", v), float("nan"), "dropout must be in [0, 1), got nan"),
        (lambda v: probability("dropout", v), "0.1", "dropout must be in [0, 1), got '0.1'"),
        (lambda v: positive("eps", v), -1, "eps must be a finite number > 0, got -1"),
        (lambda v: positive("eps", v), float("inf"), "eps must be a finite number > 0, got inf"),
        (lambda v: positive("base", v, above=1.0), float("nan"), "base must be a finite number > 1, got nan"),
        (lambda v: flag("bias", v), "no", "bias must be true or false, got 'no'"),
    ],
)
def test_a_value_out_of_range_is_one_line_naming_the_key_the_value_and_the_range(
    check, value, message
) -> None:
    with pytest.raises(ConfigError) as err:
        check(value)
    assert str(err.value) == message

"""What a Lightning command shows: attnx's progress bar where Lightning would draw its own, and none of
Lightning's tips."""

from __future__ import annotations

import logging

from lightning.pytorch.callbacks import TQDMProgressBar

from attnx.commands.lightning_console import quiet_third_parties, with_progress_bar
from attnx.training.progress import TrainingProgressBar


def test_attnx_s_bar_is_added_unless_one_is_chosen_or_none_is_wanted() -> None:
    other = object()
    callbacks = with_progress_bar({"callbacks": [other]})
    assert callbacks[0] is other and isinstance(callbacks[1], TrainingProgressBar)
    assert with_progress_bar({"callbacks": [TQDMProgressBar()]}) is None
    assert with_progress_bar({"enable_progress_bar": False}) is None


def test_lightning_s_tips_are_kept_off_the_console() -> None:
    quiet_third_parties()
    assert logging.getLogger("lightning.pytorch.utilities.rank_zero").level == logging.WARNING

"""What a Lightning command shows: attnx's progress bar where Lightning would draw its own, and none of
Lightning's tips."""

from __future__ import annotations

import logging
import warnings

from lightning.pytorch.callbacks import TQDMProgressBar

from attnx.commands.lightning_console import one_line_warnings, quiet_third_parties, with_progress_bar
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


def test_attnx_s_own_warnings_are_one_line_and_others_keep_their_source(monkeypatch) -> None:
    import numpy as theirs

    import attnx.training.checkpointing as ours

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    one_line_warnings()
    one_line_warnings()  # twice: not wrapped twice
    line = warnings.formatwarning(
        "only 1 checkpoint was kept", UserWarning, ours.__file__, 290, "rank_zero_warn("
    )
    assert line == "UserWarning: only 1 checkpoint was kept\n"
    other = warnings.formatwarning("deprecated", DeprecationWarning, theirs.__file__, 7, "x = 1")
    assert other.startswith(f"{theirs.__file__}:7: ") and "x = 1" in other

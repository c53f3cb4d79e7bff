"""Each error attnx expects carries its exit status, and is found where a library wrapped it in its own."""

from __future__ import annotations

import pytest

from attnx.checkpoint import CheckpointError
from attnx.configs import ConfigNotFound
from attnx.data.errors import DataError
from attnx.errors import AttnxError, ConfigError, UsageError, expected_error
from attnx.export.common import ExportError
from attnx.registry import ComponentArgumentError, DuplicateComponentError, UnknownComponentError
from attnx.training.module import NonFiniteLossError
from attnx.training.runs import ResumeRefused


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (AttnxError, 1),
        (CheckpointError, 1),
        (DataError, 1),
        (ExportError, 1),
        (NonFiniteLossError, 1),
        (UsageError, 2),
        (ConfigError, 2),
        (ConfigNotFound, 2),
        (ResumeRefused, 2),
        (UnknownComponentError, 2),
        (ComponentArgumentError, 2),
        (DuplicateComponentError, 2),
    ],
)
def test_every_error_carries_its_exit_status(error: type[AttnxError], status: int) -> None:
    assert issubclass(error, AttnxError) and error("x").exit_code == status


def test_a_bad_setting_is_still_a_value_error_to_python_callers() -> None:
    with pytest.raises(ValueError, match="beam"):
        raise ConfigError("search.beam must be at least 1")
    assert issubclass(CheckpointError, ValueError) and issubclass(UnknownComponentError, LookupError)


def test_the_attnx_error_a_library_raised_from_is_found() -> None:
    refused = ConfigError("search.nbest (3) cannot exceed search.beam (2)")
    try:
        try:
            raise refused
        except ConfigError as err:
            raise ValueError("Does not validate against any of the Union subtypes") from err
    except ValueError as wrapped:
        assert expected_error(wrapped) is refused
    assert expected_error(refused) is refused


def test_an_error_only_handled_while_another_was_raised_is_not_the_cause() -> None:
    """Only `raise ... from` says an error stands for another; a bug raised while handling one stays a bug."""
    try:
        try:
            raise ConfigError("handled")
        except ConfigError:
            raise KeyError("a bug")  # noqa: B904 (the implicit chain is what is tested)
    except KeyError as err:
        assert isinstance(err.__context__, ConfigError) and expected_error(err) is None
    assert expected_error(ValueError("plain")) is None

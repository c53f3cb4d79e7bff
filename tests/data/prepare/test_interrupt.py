"""Stop signals held back by `uninterrupted` blocks and raised as `Interrupted` once the outermost block ends."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from attnx.data.prepare.interrupt import STOP_SIGNALS, Interrupted, interrupt, uninterrupted


@pytest.fixture
def handlers() -> Iterator[list[int]]:
    """prepare's handling of the stop signals, as `attnx prepare` installs it; the signals it ran for."""
    ran: list[int] = []

    def stop(signum: int, frame: object) -> None:
        ran.append(signum)
        interrupt(signum)

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield ran
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def send(signum: int) -> None:
    """`signum` to this thread: blocked here, it waits here (a signal to the process could go to another)."""
    signal.pthread_kill(threading.get_ident(), signum)


def blocked() -> set[int]:
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


@pytest.mark.parametrize("signum", sorted(STOP_SIGNALS), ids=lambda s: signal.Signals(s).name)
def test_a_signal_during_the_block_is_raised_after_it(handlers: list[int], signum: int) -> None:
    before = blocked()
    done = []
    with pytest.raises(Interrupted) as raised, uninterrupted():
        assert blocked() >= STOP_SIGNALS
        send(signum)
        assert not handlers  # held back: the block goes on to its end
        done.append(True)
    assert done and handlers == [signum]
    assert raised.value.signum == signum and not raised.value.corpus_replaced
    assert isinstance(raised.value, KeyboardInterrupt)  # unwinds like Ctrl-C
    assert blocked() == before


@pytest.mark.parametrize("how", ["signal", "handler"])
def test_nested_blocks_raise_only_when_the_outermost_ends(handlers: list[int], how: str) -> None:
    """A signal held back by the mask, or one whose handler ran inside a block (it was already on its way when
    the block began, see `uninterrupted`): either waits for the outermost block."""
    steps = []
    with pytest.raises(Interrupted) as raised, uninterrupted():
        with uninterrupted():
            if how == "signal":
                send(signal.SIGTERM)
            else:
                interrupt(signal.SIGTERM)
        steps.append("after the inner block")
        with uninterrupted():
            steps.append("in the second inner block")
        steps.append("at the end of the outer block")
    assert steps == ["after the inner block", "in the second inner block", "at the end of the outer block"]
    assert raised.value.signum == signal.SIGTERM
    assert handlers == ([signal.SIGTERM] if how == "signal" else [])


def test_a_handler_that_runs_inside_the_block_is_deferred_to_its_end() -> None:
    ran = []
    with pytest.raises(Interrupted) as raised, uninterrupted():
        interrupt(signal.SIGTERM)
        ran.append(True)
    assert ran and raised.value.signum == signal.SIGTERM
    with uninterrupted():  # raised once: the next block starts clean
        pass


def test_without_a_signal_nothing_is_raised_and_the_mask_is_restored(handlers: list[int]) -> None:
    before = blocked()
    with uninterrupted(), uninterrupted():
        pass
    assert blocked() == before and not handlers
    with pytest.raises(ValueError, match="inside"), uninterrupted():  # an error of the block passes through
        raise ValueError("inside")
    assert blocked() == before
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        with uninterrupted():  # a signal blocked before the block stays blocked after it
            pass
        assert blocked() == before | {signal.SIGTERM}
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def test_interrupt_outside_a_block_raises_at_once() -> None:
    with pytest.raises(Interrupted) as raised:
        interrupt(signal.SIGINT)
    assert raised.value.signum == signal.SIGINT
    with uninterrupted():  # nothing left over for a later block
        pass

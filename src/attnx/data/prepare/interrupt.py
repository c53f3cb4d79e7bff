"""Ctrl-C and SIGTERM held back while prepare's output directory is between two states the next run understands.

The library's half of prepare's signal handling: [`uninterrupted`][attnx.data.prepare.interrupt.uninterrupted]
blocks keep a corpus consistent, and [`interrupt`][attnx.data.prepare.interrupt.interrupt] is what a stop-signal
handler calls (`attnx prepare` installs one; `attnx.commands.prepare`).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
"""Ctrl-C and SIGTERM: the signals that stop prepare."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM (a scheduler, `timeout`, `kill`) or Ctrl-C during prepare: unwinds like Ctrl-C, so the scratch
    directory is removed. `corpus_replaced` says whether the new corpus was already in place."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.corpus_replaced = False


class _Deferred:
    """Signals that came during [uninterrupted][attnx.data.prepare.interrupt.uninterrupted] blocks, raised after
    them."""

    depth = 0
    pending: int | None = None


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done, then raise
    [Interrupted][attnx.data.prepare.interrupt.Interrupted].

    Both layers: the signals are blocked (so no handler runs), and prepare's own handler defers one whose
    handler was already on its way when the block began (Python runs a handler some bytecodes after the
    signal, so blocking alone can still see it raised inside the block).
    """
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    _Deferred.depth += 1
    try:
        yield
    finally:
        _Deferred.depth -= 1
        try:
            # unblocking runs the handler of a signal the mask held, which may raise Interrupted itself: the one
            # deferred by the handler is still taken, or the next block of this process would raise it
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        finally:
            if _Deferred.depth == 0 and _Deferred.pending is not None:
                signum, _Deferred.pending = _Deferred.pending, None
                raise Interrupted(signum)


def interrupt(signum: int) -> None:
    """What a handler of the [stop signals][attnx.data.prepare.interrupt.STOP_SIGNALS] calls: raise
    [Interrupted][attnx.data.prepare.interrupt.Interrupted] now or, inside an
    [uninterrupted][attnx.data.prepare.interrupt.uninterrupted] block, when the outermost block ends."""
    if _Deferred.depth:
        _Deferred.pending = signum
    else:
        raise Interrupted(signum)

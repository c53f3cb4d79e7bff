"""A choice measured once per process: what `auto` decodes in, for checkpoints
([`attnx.inference.precision`][attnx.inference.precision]) and for CTranslate2 exports
([`attnx.inference.compute_type`][attnx.inference.compute_type]).

A [`ProbeCache`][attnx.inference.probes.ProbeCache] measures a key's choice on its first request, answers the
same for the rest of the process, and says it on standard error once per key; `replaced` swaps what measures
for a block (tests, benchmarks) and restores what was cached and said before it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

Choice = TypeVar("Choice")
Measure = TypeVar("Measure", bound=Callable)

__all__ = ["ProbeCache"]


class ProbeCache(Generic[Measure, Choice]):
    """Choices by key, each measured once with `measure` and said once with `line`.

    Args:
        measure: What measures a choice; [`choice`][attnx.inference.probes.ProbeCache.choice] calls it with
            the arguments it is given.
        line: The line on standard error that says a choice.
    """

    def __init__(self, measure: Measure, line: Callable[[Choice], str]) -> None:
        self.measure = measure
        self.line = line
        self._chosen: dict[Hashable, Choice] = {}
        self._said: set[Hashable] = set()
        self._quiet = False

    def choice(self, key: Hashable, *args, say: bool = True) -> Choice:
        """The choice for `key`: `measure(*args)` on the first call for it, then the same answer; with `say`, its
        line goes to standard error on the first call that says it."""
        if key not in self._chosen:
            self._chosen[key] = self.measure(*args)
        if say and not self._quiet and key not in self._said:
            self._said.add(key)
            print(self.line(self._chosen[key]), file=sys.stderr, flush=True)
        return self._chosen[key]

    @contextlib.contextmanager
    def replaced(self, measure: Measure, say: bool = True) -> Iterator[None]:
        """Within the block, choices are measured afresh by `measure` (cached for the block); without `say`,
        nothing is said in the block. What was chosen and said before comes back after it."""
        saved = (self.measure, dict(self._chosen), set(self._said), self._quiet)
        self.measure, self._quiet = measure, not say
        self._chosen.clear()
        self._said.clear()
        try:
            yield
        finally:
            self.measure, chosen, said, self._quiet = saved
            self._chosen.clear()
            self._chosen.update(chosen)
            self._said.clear()
            self._said.update(said)

"""The per-file analysis budget: work units (facts computed: deterministic) and seconds (a safety net).

The flow analysis spends one unit per expression evaluated plus one per alternative it yields. Work
reused from a cache (a call summary, a module's stored fields) is charged again at its full cost, so
the units a file spends do not depend on which files a worker analysed before it. Once the budget is
spent, every further charge fails at once: the file's remaining functions are skipped quickly and the
engine reports one KL099 at the function where the budget ran out.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

# Reused summaries count in full, so units overstate time where a helper is called often: a real
# file linted in 2 s (ms-swift's template/base.py) spends 5.4 million, while one where each unit is
# dear (scipy's _lebedev.py, a 30-case `match` feeding one helper) spends 10 us a unit. The units
# make the limit deterministic for pathological files; the seconds stop the slow ones.
DEFAULT_UNITS = 50_000_000
DEFAULT_SECONDS = 60.0
_CLOCK_EVERY = 4096  # units between two looks at the clock


class BudgetExceeded(Exception):
    """The file's analysis budget is spent."""


class Budget:
    """What one file may spend; `exceeded_in` is the top-level function being analysed when it ran out."""

    def __init__(self, units: int | None = None, seconds: float | None = None) -> None:
        self.units = units
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.spent = 0
        self._next_clock = _CLOCK_EVERY
        self.function: Any = None
        self.exceeded_in: Any = None
        self.reason = ""
        self._charged: set[Hashable] = set()

    def charge_once(self, key: Hashable, units: int) -> None:
        """Charge work done once per worker (a module's stored fields) once per file."""
        if key not in self._charged:
            self._charged.add(key)
            self.spend(units)

    def start_function(self, func: Any) -> None:
        if self.exceeded_in is None:
            self.function = func

    def spend(self, units: int) -> None:
        if self.exceeded_in is not None:
            raise BudgetExceeded
        self.spent += units
        if self.units is not None and self.spent > self.units:
            self._exceed(f"{self.units} work units")
        if self.deadline is not None and self.spent >= self._next_clock:
            self._next_clock = self.spent + _CLOCK_EVERY
            if time.monotonic() > self.deadline:
                self._exceed("the time limit")

    def _exceed(self, reason: str) -> None:
        self.exceeded_in = self.function if self.function is not None else True
        self.reason = reason
        raise BudgetExceeded


_UNLIMITED = Budget()
_active = _UNLIMITED


def spend(units: int) -> None:
    _active.spend(units)


def spent() -> int:
    return _active.spent


def charge_once(key: Hashable, units: int) -> None:
    _active.charge_once(key, units)


def start_function(func: Any) -> None:
    _active.start_function(func)


@contextmanager
def limited(budget: Budget) -> Iterator[Budget]:
    """Charge the analysis run inside the block to `budget`."""
    global _active
    saved, _active = _active, budget
    try:
        yield budget
    finally:
        _active = saved

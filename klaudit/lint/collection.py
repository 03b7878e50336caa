"""The garbage collector during a lint run: rare passes, and syntax trees kept out of them.

The analysis allocates millions of short-lived objects beside the large, long-lived syntax trees of
the files. At Python's default thresholds the collector's passes re-scan those trees over and over
(a quarter of the time on real trees); during a run (`rare_collections`) passes are made rare, not
disabled. Even rare passes scanned each tree LibCST built once or twice more (a third of a second on
TRL): a tree holds no reference cycles, so there is nothing for the collector to find in it. Inside a
run, a tree is therefore built without a pass in the middle of it and then moved out of the
collector's generations (`gc.freeze`, `building_tree`); its nodes are still freed by reference
counting. After the run, what was frozen goes back to the oldest generation.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

GC_THRESHOLDS = (100_000, 50, 100)

_freezing = False  # inside a run that froze nothing of the caller's: trees are frozen once built


@contextmanager
def rare_collections() -> Iterator[None]:
    """GC_THRESHOLDS and frozen trees inside the block (forked workers inherit both), the caller's own
    thresholds after it. Trees are frozen only where the caller froze nothing itself, so that
    returning the frozen objects to the collector afterwards returns only the run's."""
    global _freezing
    saved, was_freezing = gc.get_threshold(), _freezing
    _freezing = was_freezing or gc.get_freeze_count() == 0
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        if _freezing and not was_freezing:
            gc.unfreeze()
        _freezing = was_freezing


@contextmanager
def building_tree() -> Iterator[None]:
    """Around the parse of a syntax tree: inside a run, no collector pass while it is built and none
    over it afterwards (see the module's docstring); elsewhere nothing changes."""
    if not _freezing:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()

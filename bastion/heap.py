"""The garbage collector around the moments a process makes most of what it will hold: a
daemon's recovery (at 100,000 jobs, about six collected containers a job), its intake of many
new jobs, and a reader of the whole queue (`bastion list`, `bastion why`: a few containers per
job, all live until it ends).

While those are made, full collections would walk the growing heap again and again; they
find nothing (a job's objects are live), so the collector is paused for the load. After it,
what was loaded is frozen (``gc.freeze``): later full collections skip it, so a quiet
daemon's collections cost what changes, not what it holds. Measured at 100,000 jobs: the
recovery 10.2 -> 8.2 s, an idle cycle's longest 0.53 -> 0.19 s and idle CPU 5.1 -> 2.8%.

Jobs taken in while the daemon runs are frozen the same way once ``FREEZE_AFTER_JOBS`` have
come since the last freeze (``settle``: a collection of what is not frozen, then a freeze).
Without it, a daemon that took in 100,000 jobs rather than recovering them walked them all in
each full collection: 54 of them during that intake, 21.3 of its 239 s, up to 0.8 s each, and
one in the first policy pass after it (0.74 of 0.88 s).

A reader only pauses collections (``paused``): it is done with what it made soon after, and a
program that lists the queue through ``launch.api`` again and again must get it back. Measured
at 20,000 jobs: `bastion list --json` 1.18-1.27 -> 1.04-1.14 s.

What a frozen object costs: garbage among them that only a cycle collection could free
(they are freed by reference counts otherwise) waits until ``thaw``, at a daemon's close.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Collections paused while the block runs (none of what it makes is garbage before its
    end: each collection would walk it all and free nothing)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def bulk_load() -> Iterator[None]:
    """Collections paused while the block runs; what it made (and all before) frozen after."""
    try:
        with paused():
            yield
    finally:
        gc.freeze()


FREEZE_AFTER_JOBS = 1000  # new jobs taken in between two freezes (``settle``)


def settle() -> None:
    """What was made since the last freeze, collected (that alone: a frozen object is never
    walked again) and the rest frozen: garbage cycles made before are freed, not kept."""
    gc.collect()
    gc.freeze()


def thaw() -> None:
    """Frozen objects become collectable again (a daemon closing, or letting go of a root)."""
    gc.unfreeze()

"""The daemon's thread pools and the wrappers that keep one failure local to its call."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

from bastion.retry import quietly as quietly  # the steps map with pools.quietly


def run_all(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()


def started_pool(workers: int, name: str) -> concurrent.futures.ThreadPoolExecutor:
    """A pool whose threads all exist already. An executor starts a thread per submission
    while it has fewer than ``workers``, and each start waits for the new thread to get the
    GIL: handing a burst's starts to a fresh pool, whose first threads were already forking
    processes, took 0.5 s of the admitting cycle (48 thread starts behind busy threads). Made
    while nothing of its own runs yet, the threads start in a few milliseconds."""
    pool = concurrent.futures.ThreadPoolExecutor(workers, name)
    gate = threading.Barrier(workers + 1)
    for _ in range(workers):  # each blocks a thread until all are made: none is reused
        pool.submit(gate.wait, 30)
    gate.wait(30)
    return pool


def retrying(call: Callable[[Any], Any], attempts: int = 4) -> Callable[[Any], Any]:
    """For reads that must all succeed (recovery): a few quick retries, then raise."""

    def wrapped(arg: Any) -> Any:
        for attempt in range(attempts):
            try:
                return call(arg)
            except Exception:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.05 * 2**attempt)
        return None

    return wrapped

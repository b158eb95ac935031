"""One retry loop with a bounded exponential backoff.

Why: a call that may fail for a moment (a rate limit, a 5xx) is retried a bounded number of
times with a growing pause, and a failure that is no such moment is raised at once. Writing
the loop once keeps the policy (which errors, how many times, how long) visible at the call
site instead of in yet another hand-written loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def exponential(first: float, cap: float) -> Callable[[int], float]:
    """The pause before retry ``k`` (0-based): ``first * 2**k``, at most ``cap``."""
    return lambda k: min(first * 2 ** min(k, 40), cap)


DEFAULT_DELAY = exponential(0.5, 15.0)


def retry(
    call: Callable[[], T],
    retries: int,
    should_retry: Callable[[Exception], bool],
    delay: Callable[[int], float] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``; on an exception that ``should_retry`` accepts, up to ``retries`` more tries
    with ``delay(k)`` seconds before try ``k + 1`` (default: 0.5 s doubling up to 15 s). The
    last failure is raised as it is."""
    pause = delay or DEFAULT_DELAY
    for k in range(retries + 1):
        try:
            return call()
        except Exception as error:
            if k == retries or not should_retry(error):
                raise
            sleep(pause(k))
    raise AssertionError("unreachable")

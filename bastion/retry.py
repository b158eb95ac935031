"""One retry loop with a bounded exponential backoff, and one way to tell whether a write
whose answer was lost took effect.

Why a retry loop: a call that may fail for a moment (a rate limit, a 5xx) is retried a bounded
number of times with a growing pause, and a failure that is no such moment is raised at once.
Writing the loop once keeps the policy (which errors, how many times, how long) visible at the
call site instead of in yet another hand-written loop.

Why ``read_back``: a create or conditional write may succeed while its answer is lost (a
timeout, a dropped connection); the client library then retries, and the retry meets our own
first try as a conflict ("already exists", HTTP 409, 412 Precondition Failed). The error says
nothing about whose write is there, so we look: re-read the object (the bucket object, the
container, the JobSet, the VM) and compare it with what we wrote (bytes, token, size, labels).
Bucket backends and runners decide it the same way, here; this module imports nothing of
Bastion's, so both may import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def quietly(call: Callable[[T], R]) -> Callable[[T], R | Exception]:
    """For a pool's map: return the exception instead of raising it, so one failure stays
    with its item (the caller reports it there) and the others' results are kept."""

    def wrapped(arg: T) -> R | Exception:
        try:
            return call(arg)
        except Exception as e:
            return e

    return wrapped


def each(
    call: Callable[..., R], args: Iterable[tuple[Any, ...]], pool: Executor | None = None
) -> list[R | Exception]:
    """``call(*a)`` for each ``a``, in order (in ``pool`` when given): one that raises gives
    its exception in its place, and the others still run (a batch of bucket requests)."""
    run = quietly(lambda a: call(*a))
    return list(pool.map(run, args)) if pool is not None else [run(a) for a in args]


def error_text(error: BaseException) -> str:
    """What a log line says of an error: its type, then its message. A timeout's message is
    empty (``TimeoutError()``), which left "could not record the finished job: " saying
    nothing on the GCS emulator."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


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


@dataclass(frozen=True)
class ReadBack(Generic[T]):
    """What is there after a write whose answer was lost or that met a conflict."""

    found: T | None  # what a fresh read found; None: nothing is there
    ours: bool  # it is what our own write would have left: the write took effect

    @property
    def gone(self) -> bool:
        """Nothing is there: neither our write nor anyone else's (deleted since, or never
        made); the caller may create it again."""
        return self.found is None


def read_back(find: Callable[[], T | None], is_ours: Callable[[T], bool]) -> ReadBack[T]:
    """Was the lost answer ours? ``find()`` reads what is there now (None when absent);
    ``is_ours(found)`` compares it with what we wrote (the same bytes; the size we made it;
    labels naming our root and attempt). Never trust the conflict alone: look."""
    found = find()
    return ReadBack(found, found is not None and is_ours(found))

"""A burst's next specs, read while this cycle decides and writes (the prefetch).

While a burst waits (markers beyond this cycle's intake, or specs a full listing found and
left for the next cycles), the loop starts the next cycle's reads right after this cycle's
ingest, in a thread of its own: what the listing left first, then a ranged listing of the
next window of markers (``SpecWatch.peek``, leaving out the ones this cycle consumed) and the
specs they name, as many as the next cycle takes in, in one ``read_many_with_token`` call.
Their round trips then overlap this cycle's policy pass and state writes instead of
following them.

The next cycle lists its own look as always, and uses a prefetched read only for a job whose
markers in that look were all seen by the prefetch: a spec written again since has a newer
marker (a client writes its marker after the spec, under a new name each time), so it is read
again, as is a read that failed. What the prefetch read and no look asks for is dropped.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from bastion.bucket.objects import TokenRead
from bastion.bucket.specwatch import Look, SpecWatch
from bastion.bucket.store import Store

log = logging.getLogger("bastion.daemon")


@dataclass
class Prefetched:
    """What one prefetch saw: the markers it listed (marker -> job) and each job's read."""

    markers: Mapping[str, str]
    reads: Mapping[str, TokenRead]

    def usable(self, look: Look) -> dict[str, TokenRead]:
        """The reads ``look`` may take as they are: every marker naming the job in the look
        was listed by the prefetch, and the read did not fail."""
        newer: set[str] = set()  # jobs the look has a marker for that the prefetch did not see
        for marker, name in look.markers.items():
            if marker not in self.markers:
                newer.add(name)
        return {
            name: read
            for name, read in self.reads.items()
            if name not in newer and not isinstance(read, Exception)
        }


class Prefetch:
    """One prefetch at a time, in a thread of its own (``start`` in the loop's thread after
    ingest, ``take`` in the next cycle's ingest)."""

    def __init__(self) -> None:
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "bastion-prefetch")
        self._future: concurrent.futures.Future[Prefetched] | None = None

    def start(
        self,
        store: Store,
        specwatch: SpecWatch,
        pool: concurrent.futures.Executor | None,
        first: list[str],
        most: int,
    ) -> None:
        """Read ahead ``first`` (what a full listing left for the next cycle), then the specs
        of the next window of markers, ``most`` in all: what the next cycle will take in."""
        if self._future is None:
            skip = specwatch.not_to_take()  # (now, in the loop's thread)
            self._future = self._thread.submit(
                _read_next, store, specwatch, skip, pool, first[:most], most
            )

    def take(self) -> Prefetched | None:
        """The prefetch under way, once done; None when none was started or it failed (the
        cycle then reads everything itself)."""
        future, self._future = self._future, None
        if future is None:
            return None
        try:
            return future.result()
        except Exception as e:
            log.debug("the prefetch failed; this cycle reads its specs itself: %s", e)
            return None

    def peek(self) -> Prefetched | None:
        """The prefetch under way, once done, left for the next cycle to take (tests)."""
        try:
            return self._future.result() if self._future is not None else None
        except Exception:
            return None

    def close(self) -> None:
        self._future = None
        self._thread.shutdown(wait=True)


def _read_next(
    store: Store,
    specwatch: SpecWatch,
    skip: set[str],
    pool: concurrent.futures.Executor | None,
    first: list[str],
    most: int,
) -> Prefetched:
    markers = specwatch.peek(skip) if len(first) < most else {}
    names = list(dict.fromkeys(first + [markers[m] for m in sorted(markers)]))[:most]
    reads = store.specs.read_many_with_token(names, pool)
    return Prefetched(markers, dict(zip(names, reads, strict=True)))

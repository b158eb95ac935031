"""The latency model of a distant bucket (``LatencyBucket``), apart from the benchmarks that
use it: the CLI's measurement (``cli_on_model.py``) imports it and nothing of the daemon's."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any


class LatencyBucket:
    """The daemon's bucket as a local directory that answers like a distant, scalable one.

    Every request (a call on the store's ``Objects``) waits ``latency`` first and is counted.
    A listing counts a request per 800 names and waits once per 16 of them, as GcsObjects
    lists name ranges 16 at a time; a ``delete_many`` counts one per 100 paths and waits once
    (GCS batch requests, sent concurrently); a ``read_many_with_token`` counts one per path
    and waits once per ``GcsObjects.READS_IN_FLIGHT`` of them (the GETs it keeps in flight),
    and a ``write_many_if`` (or ``create_many``) likewise per ``WRITES_IN_FLIGHT``.
    The quota file's lookup goes through its own ``Objects`` and is neither delayed nor
    counted (one request per cycle, which the store counters show).
    No HTTP client runs, so gcsfs's CPU (request building, JSON parsing on its event-loop
    thread) is missing from the daemon's figures; the emulator runs include it.

    Unlike the emulator, requests never queue behind one another (its filesystem store takes
    a global lock per write, its memory store scans every object per write): this is the GCS
    model, with the daemon's own work (threads, parsing, process starts) all real. A growing
    log's append counts as one request here but costs three on GCS (part, compose, delete); a
    burst's logs are all new (one request each)."""

    def __init__(self, inner: Any, latency: float) -> None:
        self.inner = inner
        self.latency = latency
        self.routes: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if not callable(method):
            return method

        def request(*args: Any, **kwargs: Any) -> Any:
            time.sleep(self.latency)
            result = method(*args, **kwargs)
            pages = 1
            if name == "list" and len(result) > 1000:
                pages = -(-len(result) // 800)
                time.sleep(self.latency * (-(-pages // 16) - 1))
            if name == "delete_many":  # GCS batch requests of 100, sent concurrently
                pages = max(1, -(-len(args[0]) // 100))
            with self._lock:
                self.routes[name] += pages
            return result

        return request

    def read_many_with_token(self, paths: list[str], *args: Any) -> Any:
        """GcsObjects.read_many_with_token: its GETs go READS_IN_FLIGHT at a time."""
        return self._batch(
            "READS_IN_FLIGHT", "read_with_token", self.inner.read_many_with_token, paths, *args
        )

    def write_many_if(self, writes: list[Any], *args: Any) -> Any:
        """GcsObjects.write_many_if: its uploads go WRITES_IN_FLIGHT at a time."""
        return self._batch("WRITES_IN_FLIGHT", "write_if", self.inner.write_many_if, writes, *args)

    def create_many(self, items: list[Any], *args: Any) -> Any:
        """GcsObjects.create_many: a ``write_many_if`` of objects that must be absent."""
        return self._batch("WRITES_IN_FLIGHT", "create", self.inner.create_many, items, *args)

    def _batch(self, in_flight: str, route: str, call: Any, items: list[Any], *args: Any) -> Any:
        """One call of many requests: a wait per wave of what GcsObjects keeps in flight
        (its attribute ``in_flight``), a request counted per item."""
        from bastion.bucket.gcs import GcsObjects  # (here: the CLI's model imports no more)

        time.sleep(self.latency * -(-len(items) // getattr(GcsObjects, in_flight)))
        result = call(items, *args)
        with self._lock:
            self.routes[route] += len(items)
        return result

    def reset(self) -> None:
        with self._lock:
            self.routes.clear()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"total": sum(self.routes.values()), "routes": dict(self.routes)}

"""A container's output read by byte offset, though the engine starts a log only at a time.

The Docker runner's ``read_output`` is asked for bytes ``offset`` to ``offset + limit``; the
engine's log API takes only ``since`` (a time). So ``OutputReader`` remembers, per container,
the byte offset reached, the stamp to ask from next time (a little before the newest line read)
and how many bytes of the lines stamped since then it returned already; the next read asks for
those lines only and skips those bytes, so a job's steady output costs O(new bytes). Lines may
share a stamp (a long line comes in 16 KiB pieces stamped alike), hence counts of bytes rather
than "after this stamp". Without a cursor for an offset (a restarted daemon) it reads from the
start.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache

from docker.errors import NotFound

# Log lines of stdout and stderr are stamped by two goroutines, each just before it takes the
# log file's lock, so the log can hold a line stamped a little earlier than the one before it.
# Reading ``since`` this much before the newest line read keeps such a line (what is re-read is
# skipped by the byte counts we kept); it also bounds what each read fetches again.
OVERLAP_NS = 20_000_000

# (container, since in ns) -> (stamp in ns, bytes) per log line, from ``since`` (or a little
# earlier) on
LogLines = Callable[[str, int], Iterator[tuple[int, bytes]]]


@dataclass
class _Cursor:
    """Where the last read of a container's output ended."""

    pos: int = 0  # byte offset in the output reached
    since_ns: int = 0  # the next read asks for lines stamped at or after this (0: all)
    window: list[tuple[int, int]] = field(default_factory=list)  # (stamp, bytes read) >= since


class OutputReader:
    """Reads containers' outputs by byte offset through ``log_lines`` (the engine's log)."""

    def __init__(self, log_lines: LogLines) -> None:
        self.log_lines = log_lines
        self._cursors: dict[str, _Cursor] = {}

    def read(self, ref: str, offset: int, limit: int) -> bytes:
        """Bytes ``offset`` to ``offset + limit`` of container ``ref``'s output (b"" when it
        is gone, or shorter than ``offset``)."""
        if limit <= 0:
            return b""
        cursor = self._cursors.get(ref)
        if cursor is None or cursor.pos != offset:
            cursor = _Cursor()
        skip = offset - cursor.pos + sum(n for _, n in cursor.window)
        since = cursor.since_ns
        out = bytearray()
        window: list[tuple[int, int]] = []  # (stamp, bytes passed) of every line from `since`
        newest, keep = since, 4096
        try:
            for stamp, line in self.log_lines(ref, since):
                if stamp < since:
                    continue  # the engine's `since` is a float: it may send a little more
                if skip >= len(line):
                    skip -= len(line)
                    window.append((stamp, len(line)))
                else:
                    piece = line[skip : skip + limit - len(out)]
                    out += piece
                    window.append((stamp, skip + len(piece)))
                    skip = 0
                newest = max(newest, stamp)
                if len(window) > keep:  # reading from the start: keep only the recent lines
                    window = [w for w in window if w[0] >= newest - OVERLAP_NS]
                    keep = max(4096, 2 * len(window))
                if len(out) >= limit:
                    break
        except NotFound:
            return b""
        if skip:  # the output is shorter than `offset`: nothing to return, nothing to keep
            self._cursors.pop(ref, None)
            return b""
        since = max(since, newest - OVERLAP_NS)
        self._cursors[ref] = _Cursor(
            offset + len(out), since, [w for w in window if w[0] >= since and w[1]]
        )
        return bytes(out)

    def forget(self, ref: str) -> None:
        """Container ``ref`` was removed: its cursor goes."""
        self._cursors.pop(ref, None)


@lru_cache(maxsize=256)
def _second(prefix: bytes) -> int:
    return calendar.timegm(time.strptime(prefix.decode(), "%Y-%m-%dT%H:%M:%S"))


def parse_stamp(stamp: bytes) -> int:
    """``2024-05-20T11:14:27.123456789Z`` (always UTC, nanoseconds) as ns since the epoch."""
    fraction = stamp[20:].rstrip(b"Z")
    return _second(stamp[:19]) * 1_000_000_000 + int(fraction.ljust(9, b"0")[:9] or 0)

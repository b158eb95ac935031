"""Each worker's own output of a multi-host job (``bastion logs NAME --worker=K|all``).

The daemon merges worker 0's output into ``ROOT/logs/NAME`` (what ``bastion logs`` prints and
``gsutil cat`` reads); every worker's output stays beside it, in the chunks its agent wrote
(``ROOT/runs/NAME/<attempt>/workers/<w>/log/``; see :class:`bastion.bucket.store.Store`).
This module
reads those chunks for every attempt of the current submission, in order. It only reads.

- ``--worker=K``: worker K's output, each attempt under a header line.
- ``--worker=all``: every worker's lines, each prefixed ``[a<attempt> w<worker>]``; within
  an attempt, worker by worker when printed at once, chunk by chunk as they come with --follow.
- A worker with no output of its own in an attempt (its agent never started): what its
  startup script printed (``workers/<w>/bootstrap``), once the job has ended or without
  --follow, which says why it never started.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bastion.bucket.runs import bootstrap_worker, parse_run_name
from bastion.bucket.store import Store
from bastion.runners.base import attempt_name


@dataclass
class _Stream:
    """What has been printed of one worker of one attempt."""

    next_seq: int = 0
    partial: bytes = b""  # the unfinished last line (--worker=all prefixes whole lines)
    header_done: bool = False


@dataclass
class WorkerOutput:
    """Reads worker output of the submission ``submission`` of job ``name``."""

    store: Store
    name: str
    submission: str
    worker: int | None  # None: every worker
    streams: dict[tuple[int, int], _Stream] = field(default_factory=dict)

    def attempts(self, count: int) -> list[tuple[int, str]]:
        """(number, attempt name) of attempts 1..count: names are derived, never listed."""
        root = self.store.root_url
        return [
            (n, attempt_name(root, self.name, self.submission, n, "run"))
            for n in range(1, count + 1)
        ]

    def workers_seen(self, attempts: int) -> set[int]:
        found = set()
        for _, attempt in self.attempts(attempts):
            for name in self.store.runs.list(self.name, attempt):
                parsed = parse_run_name(name)
                if parsed and parsed[1] == "log":
                    found.add(parsed[0])
                elif (w := bootstrap_worker(name)) is not None:
                    found.add(w)
        return found

    def new_output(self, attempts: int, final: bool = False) -> Iterator[bytes]:
        """What was written since the last call, attempt by attempt. ``final``: the job has
        ended; an unfinished last line is printed too."""
        for number, attempt in self.attempts(attempts):
            chunks: dict[int, list[int]] = {}
            booted: set[int] = set()
            for name in self.store.runs.list(self.name, attempt):
                parsed = parse_run_name(name)
                if parsed and parsed[1] == "log" and parsed[2] is not None:
                    chunks.setdefault(parsed[0], []).append(parsed[2])
                elif (b := bootstrap_worker(name)) is not None:
                    booted.add(b)
            workers = sorted(chunks.keys() | booted) if self.worker is None else [self.worker]
            for w in workers:
                stream = self.streams.setdefault((number, w), _Stream())
                if final and w in booted and w not in chunks and not stream.header_done:
                    yield from self._bootstrap(number, attempt, w, stream)
                    continue
                seqs = set(chunks.get(w, []))
                while stream.next_seq in seqs:  # contiguous only: a gap is filled later
                    data = self.store.runs.read_chunk(self.name, attempt, w, stream.next_seq)
                    stream.next_seq += 1
                    yield from self._emit(number, w, stream, data)
                if final:
                    yield from self._emit(number, w, stream, b"", flush=True)

    def _bootstrap(self, number: int, attempt: str, w: int, stream: _Stream) -> Iterator[bytes]:
        """A worker with no output of its own (one that never started): what its startup
        script printed, which says why (see bastion.runners.startup)."""
        data = self.store.runs.read_bootstrap(self.name, attempt, w) or b""
        stream.header_done = True
        if self.worker is None:
            yield from self._emit(number, w, stream, data, flush=True)
            return
        yield (
            f"=== [bastion] attempt {number}, worker {w} wrote no output; its startup "
            "script printed ===\n"
        ).encode()
        yield data if data.endswith(b"\n") or not data else data + b"\n"

    def _emit(
        self, number: int, worker: int, stream: _Stream, data: bytes, flush: bool = False
    ) -> Iterator[bytes]:
        if self.worker is not None:
            if data and not stream.header_done:
                stream.header_done = True
                yield f"=== [bastion] attempt {number}, worker {worker} ===\n".encode()
            if data:
                yield data
            return
        prefix = f"[a{number} w{worker}] ".encode()
        text = stream.partial + data
        lines = text.split(b"\n")
        stream.partial = lines.pop()
        for line in lines:
            yield prefix + line + b"\n"
        if flush and stream.partial:
            yield prefix + stream.partial + b"\n"
            stream.partial = b""


def parse_worker(value: str) -> int | None:
    """``--worker``: a worker's index, or ``all`` (None)."""
    if value == "all":
        return None
    if not value.isdigit():
        raise ValueError(f"--worker={value}: give a worker's index (0, 1, ...) or 'all'")
    return int(value)


def follow(
    reader: WorkerOutput, attempts_now: Callable[[], tuple[int, bool]], poll_seconds: float = 1.0
) -> Iterator[bytes]:
    """Print new output until ``attempts_now()`` says the job ended: (attempts, ended)."""
    while True:
        attempts, ended = attempts_now()
        yield from reader.new_output(attempts, final=ended)
        if ended:
            return
        time.sleep(poll_seconds)

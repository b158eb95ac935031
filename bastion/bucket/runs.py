"""What remote attempts report: the agents' records of a live attempt (``store.agents``), apart
from its output (``store.runs``), so that one listing of ROOT/agents/ per cycle covers every
running attempt (O(running), not O(output)):

    agents/<job>/<attempt>/workers/<w>/started    the agent's claim, create-if-absent
    agents/<job>/<attempt>/workers/<w>/heartbeat  replaced every few seconds while it runs
    agents/<job>/<attempt>/workers/<w>/progress   {chunks, bytes}: replaced after each chunk
    agents/<job>/<attempt>/workers/<w>/exit       {code, preempted, time, reason, chunks}

deleted with the attempt's machines; its output and provisioning record stay:

    runs/<job>/<attempt>/provision.json           written by a cloud runner before create
    runs/<job>/<attempt>/workers/<w>/log/<seq:08d>  output chunks, in order; rewritten under
                                                  the same name when a write's answer was
                                                  lost (idempotent)
    runs/<job>/<attempt>/workers/<w>/bootstrap    what the worker's startup script printed
                                                  before the agent took over

Names in a listing are relative to the attempt; run_name/parse_run_name are the only code that
builds or reads them, so readers (runners/kit/records.py) know no paths.
"""

from __future__ import annotations

import json
from typing import Any

from bastion.bucket.counted import CountedObjects
from bastion.bucket.objects import ObjectInfo

RUNS, AGENTS, PROVISION = "runs", "agents", "provision.json"
RUN_RECORDS = ("started", "heartbeat", "progress", "exit", "checkpoint")


def run_name(worker: int, kind: str, seq: int | None = None) -> str:
    """``workers/<w>/<kind>`` for a record; ``workers/<w>/log/<seq>`` for a chunk."""
    if kind == "log":
        return f"workers/{worker}/log/{seq:08d}"
    return f"workers/{worker}/{kind}"


def parse_run_name(name: str) -> tuple[int, str, int | None] | None:
    """(worker, kind, seq) of a name in a run listing; None for anything else."""
    parts = name.split("/")
    if len(parts) < 3 or parts[0] != "workers" or not parts[1].isdigit():
        return None
    if len(parts) == 3 and parts[2] in RUN_RECORDS:
        return int(parts[1]), parts[2], None
    if len(parts) == 4 and parts[2] == "log" and len(parts[3]) == 8 and parts[3].isdigit():
        return int(parts[1]), "log", int(parts[3])
    return None


def bootstrap_worker(name: str) -> int | None:
    """The worker of a ``workers/<w>/bootstrap`` name in a run listing; None otherwise."""
    parts = name.split("/")
    if len(parts) == 3 and parts[0] == "workers" and parts[1].isdigit():
        return int(parts[1]) if parts[2] == "bootstrap" else None
    return None


class Agents:
    """``agents/``: the records of live attempts, one listing for all of them."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def _parts(self, job: str, attempt: str, worker: int, kind: str) -> tuple[str, ...]:
        return (AGENTS, job, attempt, *run_name(worker, kind).split("/"))

    def list(self, job: str, attempt: str) -> dict[str, ObjectInfo]:
        """One attempt's records (``workers/0/heartbeat``, ...)."""
        return self._bucket.find(AGENTS, job, attempt)

    def list_all(self) -> dict[tuple[str, str], dict[str, ObjectInfo]]:
        """Every live attempt's records in one listing, by (job, attempt)."""
        found: dict[tuple[str, str], dict[str, ObjectInfo]] = {}
        for name, info in self._bucket.find(AGENTS).items():
            parts = name.split("/", 2)
            if len(parts) == 3:
                record = ObjectInfo(parts[2], info.size, info.token)
                found.setdefault((parts[0], parts[1]), {})[parts[2]] = record
        return found

    def claim(self, job: str, attempt: str, worker: int, record: dict[str, Any]) -> bool:
        """Write ``started`` only if absent: False when this worker of this attempt already
        started (a startup script run again after a reboot must not start the command twice).
        A retry of our own create whose answer was lost finds the same bytes and succeeds."""
        data = json.dumps(record, sort_keys=True).encode()
        return self._bucket.create(data, *self._parts(job, attempt, worker, "started"))

    def write(self, job: str, attempt: str, worker: int, kind: str, record: dict[str, Any]) -> None:
        """Replace a worker's ``heartbeat``, ``progress`` or ``exit`` record."""
        assert kind in ("heartbeat", "progress", "exit", "checkpoint"), kind
        data = json.dumps(record, sort_keys=True).encode()
        self._bucket.write(data, *self._parts(job, attempt, worker, kind))

    def read(self, job: str, attempt: str, worker: int, kind: str) -> dict[str, Any] | None:
        """A worker's started/heartbeat/exit record; None when absent or unreadable (a record
        is replaced whole, so unreadable means damaged: treat it as never written)."""
        raw = self._bucket.read(*self._parts(job, attempt, worker, kind))
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def delete(self, job: str, attempt: str) -> None:
        """The attempt's records (its machines are gone); its output stays in runs/."""
        for name in self.list(job, attempt):
            self._bucket.delete(AGENTS, job, attempt, *name.split("/"))
        self._bucket.remove_local_tree(AGENTS, job, attempt)
        self._bucket.remove_local_directory(AGENTS, job)  # the job's, once it is empty


class Runs:
    """``runs/``: an attempt's output chunks, provisioning record and bootstrap output."""

    def __init__(self, bucket: CountedObjects, agents: Agents) -> None:
        self._bucket = bucket
        self._agents = agents

    def list(self, job: str, attempt: str) -> dict[str, ObjectInfo]:
        """The attempt's output chunks in one recursive listing (one request per 1,000
        objects on a bucket): names relative to the attempt, e.g. ``workers/0/log/00000003``."""
        found = self._bucket.find(RUNS, job, attempt)
        return {name: info for name, info in found.items() if name != PROVISION}

    def write_chunk(self, job: str, attempt: str, worker: int, seq: int, data: bytes) -> None:
        """A plain overwrite: rewriting a chunk whose answer was lost stores the same bytes."""
        self._bucket.write(data, RUNS, job, attempt, *run_name(worker, "log", seq).split("/"))

    def read_chunk(self, job: str, attempt: str, worker: int, seq: int, start: int = 0) -> bytes:
        parts = run_name(worker, "log", seq).split("/")
        return self._bucket.read_range(start, RUNS, job, attempt, *parts)

    def write_provision(self, job: str, attempt: str, record: dict[str, Any]) -> None:
        data = json.dumps(record, sort_keys=True).encode()
        self._bucket.write(data, RUNS, job, attempt, PROVISION)

    def read_provision(self, job: str, attempt: str) -> dict[str, Any] | None:
        raw = self._bucket.read(RUNS, job, attempt, PROVISION)
        return json.loads(raw) if raw else None

    def bootstrap_url(self, job: str, attempt: str, worker: int | None = None) -> str:
        """Where worker ``worker``'s startup script copies its own output (the one trace of a
        worker whose interpreter or package install failed, since no agent ever wrote a
        word); with None, the URL with ``{worker}`` in the worker's place (the script learns
        its index at boot)."""
        w = "{worker}" if worker is None else str(int(worker))
        return self._bucket.url(RUNS, job, attempt, "workers", w, "bootstrap")

    def read_bootstrap(
        self, job: str, attempt: str, worker: int, tail: int = 16384
    ) -> bytes | None:
        """The last ``tail`` bytes of what the worker's startup script printed; None when it
        copied nothing (no such worker, or a script that never got that far)."""
        parts = (RUNS, job, attempt, "workers", str(int(worker)), "bootstrap")
        info = self._bucket.info(*parts)
        if info is None:
            return None
        return self._bucket.read_range(max(0, info.size - tail), *parts)

    def delete(self, job: str, attempt: str) -> None:
        """Every object of the attempt, records and output (idempotent)."""
        self._agents.delete(job, attempt)
        for name in self.list(job, attempt):  # chunks and bootstrap output, all under runs/
            self._bucket.delete(RUNS, job, attempt, *name.split("/"))
        self._bucket.delete(RUNS, job, attempt, PROVISION)
        self._bucket.remove_local_tree(RUNS, job, attempt)

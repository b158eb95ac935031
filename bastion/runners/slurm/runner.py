"""The slurm runner itself: start (create-if-absent), poll, stop, delete and the sweep,
composed of Slurm's commands (:mod:`.commands`), the submission (:mod:`.batch`), the state
mapping (:mod:`.observe`) and the runner kit's agent channel and per-cycle listing.

- *Create if absent*: Slurm has no idempotent submit (a second ``sbatch`` with the same name is
  accepted), so ``start`` writes the provisioning record, looks for a job of that name first
  (``squeue --name``) and adopts it; after its own submit it looks once more and, if a race
  made two, keeps the oldest and cancels the others (every racer picks the same one).
- *One squeue per cycle*: every poll reads one ``squeue -t all`` listing made once per daemon
  cycle (every user's jobs, so a pending job's position in its partition counts everyone
  ahead of it; ownership is this root's comment); a job only asks Slurm once more when it left
  ``squeue`` (``MinJobAge``) without its agents' word (``sacct``, or the ``jobcomp_file``
  where there is no slurmdbd), or failed before any agent ran (``scontrol show job``): once
  per job, cached.
- *Stop*: ``scancel --signal=TERM`` to the job's steps (every agent stops its command, flushes
  and writes its exit record; the job then ends), a queued job is cancelled outright; at the
  deadline ``scancel --signal=KILL --full`` and ``scancel``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from bastion.bucket.store import Store
from bastion.runners.base import (
    Attempt,
    AttemptPhase,
    Handle,
    Observation,
    Owned,
    Runner,
    RunnerError,
    name_prefix,
    root_tag,
)
from bastion.runners.kit.channel import AgentChannel
from bastion.runners.kit.lease_fence import check_term
from bastion.runners.kit.listing import CycleListing
from bastion.runners.slurm import batch
from bastion.runners.slurm import observe as states
from bastion.runners.slurm.commands import SlurmCommands
from bastion.runners.slurm.squeue import QUEUED, Row, queue_position, workers_of

LISTING_TTL = 1.0
Listing = tuple[float, list[Row], list[Row]]  # (wall clock when made, ours, everyone's)


class SlurmRunner(Runner):
    kind = "slurm"

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.root = str(settings.get("root") or "")
        if not self.root:
            raise RunnerError("the slurm runner needs the setting root (the daemon's root URL)")
        self.settings = dict(settings)
        self.tag = root_tag(self.root)
        self.prefix = name_prefix(self.root)
        self.store = Store(self.root)
        self.listing_ttl = float(settings.get("listing_ttl", LISTING_TTL))
        self.tiers = {str(k): str(v) for k, v in (settings.get("tiers") or {}).items()}
        for tier, said in self.tiers.items():
            batch.parse_placement(said, f"tiers.{tier}")  # refuse a bad settings file at once
        self.output = batch.output_mode(self.settings)
        batch.warn_seconds(self.settings)
        self.commands = SlurmCommands(self.settings)
        self._jobs: CycleListing[None, Listing] = CycleListing(
            lambda _key: self._list_jobs(), self.listing_ttl
        )
        self.channel = AgentChannel(
            self.store,
            heartbeat_timeout=float(settings.get("heartbeat_timeout", 120)),
            flush_seconds=float(settings.get("flush_seconds", 45)),
            start_timeout=float(settings.get("start_timeout", 1800)),
            listing_ttl=self.listing_ttl,
        )
        self._lock = threading.Lock()
        self._stopped: set[str] = set()  # attempts we asked to stop: their CANCELLED is ours
        self._termed: set[int] = set()  # jobs whose steps got SIGTERM from us
        self._killed: set[int] = set()
        self._cancelled: set[int] = set()  # jobs sent a plain scancel: once is enough
        self._starting: dict[str, threading.Lock] = {}

    @property
    def calls(self) -> dict[str, int]:
        """Slurm commands run so far, by name (for the benchmark and the cost tests)."""
        return self.commands.calls

    @property
    def agents_report(self) -> bool:
        """Output and exit records come from the agents (``output = bucket``)."""
        return self.output == "bucket"

    def run(self, name: str, *args: str, input: str | None = None) -> str:
        return self.commands.run(name, *args, input=input)

    def _ours(self, row: Row) -> bool:
        """Made by this root's slurm runner for the attempt it is named after."""
        return (
            row.name.startswith(self.prefix)
            and row.tag("bastion-root") == self.tag
            and row.tag("bastion-runner") == self.kind
            and row.tag("bastion-attempt-name") == row.name
        )

    # -- listings, once per cycle ----------------------------------------------------------------
    def begin_cycle(self) -> None:
        self._jobs.begin_cycle()
        self.channel.begin_cycle()

    def _list_jobs(self) -> Listing:
        wall = time.time()
        everyone = self.commands.squeue()
        return wall, [r for r in everyone if self._ours(r)], [r for r in everyone if r.queued]

    def listing(self) -> tuple[float, list[Row]]:
        """(when it was made, wall clock; this root's jobs), one squeue per cycle."""
        wall, ours, _ = self._jobs.get(None)
        return wall, ours

    def _row(self, handle: Handle) -> tuple[float, Row | None]:
        at, rows = self.listing()
        job_id = handle.get("job_id")
        for row in rows:
            if row.name == handle["name"] and (job_id is None or row.job_id == job_id):
                return at, row
        return at, None

    def _invalidate(self) -> None:
        self._jobs.deleted(None)

    def agents(self, handle: Handle, over: bool = False) -> Observation | None:
        """The agents' word; ``over``: Slurm says the job is over, so from a listing made now
        (the cycle's may predate the agents' last records)."""
        if not self.agents_report:
            return None
        return self.channel.settled(handle) if over else self.channel.agents(handle)

    # -- start -----------------------------------------------------------------------------------
    def start(self, attempt: Attempt) -> Handle:
        """Adopt the job of this name if Slurm has one; else write the provisioning record,
        check the lease term, submit, and resolve a race that made two (the oldest stays)."""
        args = self.sbatch_args(attempt)  # refuses bad options before anything is made
        nodes = batch.nodes_of(attempt)
        script = self.batch_script(attempt, nodes)
        with self._lock:
            lock = self._starting.setdefault(attempt.name, threading.Lock())
        with lock:
            found = self._adopt(attempt)
            if found is not None:
                return found
            created = time.time()
            record = {
                "kind": self.kind,
                "name": attempt.name,
                "workers": nodes,
                "root_tag": self.tag,
                "time": created,
            }
            self.store.runs.write_provision(attempt.job, attempt.name, record)
            check_term(self.store, attempt)  # sbatch takes no fencing token
            out = self.run("sbatch", *args, input=script)
            job_id = int(out.strip().split(";")[0])
            self.store.runs.write_provision(attempt.job, attempt.name, {**record, "job_id": job_id})
            found = self._adopt(attempt)  # a racing submit of the same name: the oldest wins
            if found is not None:
                return found
            return self._handle(attempt.job, attempt.name, job_id, nodes, created)

    def _adopt(self, attempt: Attempt) -> Handle | None:
        rows = [r for r in self.commands.squeue("--name", attempt.name) if self._ours(r)]
        if not rows:
            return None
        rows.sort(key=lambda r: r.job_id)
        keep, extra = rows[0], [r for r in rows[1:] if r.live]
        if extra:
            self.run("scancel", *(str(r.job_id) for r in extra))
        record = self.store.runs.read_provision(attempt.job, attempt.name) or {}
        self._invalidate()
        return self._handle(
            attempt.job, attempt.name, keep.job_id, batch.nodes_of(attempt), record.get("time")
        )

    def _handle(
        self, job: str, name: str, job_id: int | None, workers: int, created: float | None
    ) -> Handle:
        return {"name": name, "job": job, "job_id": job_id, "workers": workers, "created": created}

    def placement(self, attempt: Attempt) -> dict[str, str]:
        """partition, qos, account: the settings' defaults, then the tier's, then the job's."""
        return batch.placement(attempt, self.settings, self.tiers)

    def sbatch_args(self, attempt: Attempt) -> list[str]:
        return batch.sbatch_args(attempt, self.settings, self.tiers, self.tag)

    def batch_script(self, attempt: Attempt, nodes: int) -> str:
        return batch.batch_script(attempt, nodes, self.settings, self.root)

    # -- poll ------------------------------------------------------------------------------------
    def poll(self, handle: Handle) -> Observation:
        at, row = self._row(handle)
        if row is None:
            created = handle.get("created")
            if created is not None and at < float(created) + 1.0:
                return Observation(
                    AttemptPhase.QUEUED, f"submitted as Slurm job {handle.get('job_id')}"
                )
            return self._left_squeue(handle)
        if row.state in QUEUED:
            _, _, pending = self._jobs.get(None)
            return states.queued(row, queue_position(row, pending))
        if row.live:
            return states.live(row, self.agents(handle), self.agents_report)
        seen = self.agents(handle, over=True)
        return self._ended(handle, row.job_id, row.state, row.reason, seen)

    def _ended(
        self, handle: Handle, job_id: int, state: str, reason: str, seen: Observation | None
    ) -> Observation:
        return states.ended(
            job_id,
            state,
            reason,
            seen,
            stopped=handle["name"] in self._stopped,
            code_of=lambda: self.commands.exit_code(job_id),
            agents=self.agents_report,
        )

    def _left_squeue(self, handle: Handle) -> Observation:
        """Gone from squeue (MinJobAge passed, or a controller that lost its state): the
        agents' word if they all finished, else accounting, else LOST."""
        seen = self.agents(handle, over=True)
        job_id = handle.get("job_id")
        found = self.commands.account(int(job_id)) if job_id is not None else None
        if found is not None:
            return self._ended(handle, int(job_id), found[0], "", seen)
        if seen is not None and seen.finished and seen.phase is not AttemptPhase.LOST:
            return seen
        return Observation(
            AttemptPhase.LOST,
            f"Slurm job {job_id} is gone from squeue and accounting",
            retryable=True,
        )

    # -- stop, delete, list ----------------------------------------------------------------------
    def stop(self, handle: Handle, deadline: float) -> None:
        """SIGTERM to the job's steps once (each agent stops its command, flushes, reports);
        a job with no agent yet is cancelled; SIGKILL to everything at the deadline."""
        with self._lock:
            self._stopped.add(handle["name"])
        _, row = self._row(handle)
        if row is None or not row.live:
            return
        job = str(row.job_id)
        no_agent = self.agents_report and self.agents(handle) is None
        if row.state in QUEUED or row.state == "CONFIGURING" or no_agent:
            self._cancel(row.job_id)
        elif time.time() >= deadline:
            if row.job_id not in self._killed:
                self._killed.add(row.job_id)
                self.run("scancel", "--signal=KILL", "--full", job)
                self.run("scancel", job)
        elif row.job_id not in self._termed:
            self._termed.add(row.job_id)
            self.run("scancel", "--signal=TERM", job)
        self._invalidate()

    def delete(self, handle: Handle) -> bool:
        """Cancel the job while Slurm still has it live; once over, its agents' records go
        (the output stays) and it is no longer this runner's."""
        if handle.get("job_id") is not None:
            _, row = self._row(handle)
            if row is not None and row.live:
                if row.state != "COMPLETING":
                    self._cancel(row.job_id)
                return False
        self.channel.delete(handle)
        self.channel.listing.invalidate(None)
        with self._lock:
            self._stopped.discard(handle["name"])
        return True

    def _cancel(self, job_id: int) -> None:
        """``scancel`` once per job: the cycle's listing may still show a job cancelled a
        moment ago as live (a stop and a delete in one cycle), and Slurm needs no reminder."""
        if job_id in self._cancelled:
            return
        self.run("scancel", str(job_id))
        self._cancelled.add(job_id)
        self._invalidate()

    def list_owned(self) -> list[Owned]:
        """This root's jobs: live ones, and ended ones whose agents' records are still there
        (not deleted yet); plus records whose job left squeue. Another root's or user's job,
        or one without this root's comment, is never listed."""
        _, rows = self.listing()
        records = self.channel.agent_listing()
        owned: dict[str, Owned] = {}
        for row in sorted(rows, key=lambda r: r.job_id):
            if row.name in owned:
                continue
            job = row.tag("bastion-job") or row.name
            if not (row.live or (job, row.name) in records):
                continue
            nodes = row.tag("bastion-nodes") or ""
            workers = (
                int(nodes) if nodes.isdigit() else workers_of(records.get((job, row.name), {}))
            )
            handle = self._handle(job, row.name, row.job_id, workers, None)
            owned[row.name] = Owned(row.name, handle, not row.live)
        for job, name, workers in self.channel.owned_records(self.prefix, set(owned)):
            owned[name] = Owned(name, self._handle(job, name, None, workers, None), True)
        return list(owned.values())

    def read_output(self, handle: Handle, offset: int, limit: int) -> bytes:
        """Worker 0's output: from the bucket (its agent), or the task's ``--output`` file on
        the shared file system, read by offset (Slurm appends; nothing is truncated)."""
        if self.agents_report:
            return self.channel.read_output(handle, offset, limit)
        path = batch.output_path(self.settings, handle["name"], 0)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""

    def describe(self, handle: Handle) -> str | None:
        n = int(handle.get("workers", 1))
        return f"Slurm job {handle.get('job_id')} ({n} node{'' if n == 1 else 's'})"

    def close(self) -> None:
        self.channel.close()

"""The slurm runner: one Slurm batch job per attempt, one agent per node, reports via the bucket.

A daemon on a cluster's login node gives Slurm users what Slurm alone does not (project quotas
with borrowing, one bucket for specs, logs and history); Slurm keeps doing what it is good at
(placing jobs on nodes, partitions, preemption). See engines.md section 4 for the flags used.

- *One job per attempt*: ``sbatch --parsable --job-name=<attempt name> --no-requeue``, with a
  ``--comment`` naming this root, the runner, the job and the attempt (ownership comes from it,
  not from the name prefix alone). Bastion owns requeue: a preemption is a new attempt, as
  everywhere else, so a Slurm job never restarts in place.
- *One agent per node*: the batch script is ``srun --ntasks-per-node=1`` of the startup script
  the cloud runners use (:mod:`bastion.runners.startup`), the agent taking its worker index
  from ``SLURM_PROCID`` (``--worker_env``). Output, heartbeats and exit records reach the
  bucket through the agents (:class:`bastion.runners.kit.records.RemoteRecords`): the compute nodes
  must reach the bucket.
- *Create if absent*: Slurm has no idempotent submit (a second ``sbatch`` with the same name is
  accepted), so ``start`` writes the provisioning record, looks for a job of that name first
  (``squeue --name``) and adopts it; after its own submit it looks once more and, if a race
  made two, keeps the oldest and cancels the others (every racer picks the same one).
- *One squeue per cycle*: every poll reads one ``squeue -t all --me`` listing made once per
  daemon cycle (``begin_cycle``; without a daemon, at most once per ``listing_ttl``); a job
  only asks Slurm once more when it left ``squeue`` (``MinJobAge``) without its agents' word
  (``sacct``, or the ``jobcomp_file`` where there is no slurmdbd), or failed before any agent
  ran (``scontrol show job``, for its exit code): once per job, cached.
- *States* (engines.md 4.3): PENDING is QUEUED with Slurm's reason; CONFIGURING, and RUNNING
  before any agent reported, PROVISIONING; RUNNING and COMPLETING RUNNING (never finished
  while Slurm still ends the job, so a preemption in progress is not taken for a failure);
  COMPLETED, FAILED, OUT_OF_MEMORY, TIMEOUT: the agents' outcome (exit codes), with Slurm's
  reason for a time limit or memory; CANCELLED that Bastion did not ask for: FAILED with
  Slurm's reason; PREEMPTED, NODE_FAIL, BOOT_FAIL: PREEMPTED (retryable, not the job's
  failure); gone from squeue, accounting and the agents: LOST.
- *Stop*: ``scancel --signal=TERM`` to the job's steps (every agent stops its command, flushes
  and writes its exit record; the job then ends), a queued job is cancelled outright; at the
  deadline ``scancel --signal=KILL --full`` and ``scancel``.

Settings (``[runners.slurm]`` in the daemon's settings file; all optional but ``root``):

- ``partition``, ``account``, ``qos``: defaults for every job.
- ``tiers``: per quota tier the job was admitted on, e.g. ``{0 = "partition:high", 1 =
  "partition:low,qos:scavenger"}`` (comma-separated ``partition:``, ``qos:``, ``account:``):
  a job within its project's quota runs in the partition that is not preempted, a job
  borrowing idle quota in one that is. A job's own runner options ``partition``, ``qos``,
  ``account`` win.
- ``time``: the default ``--time`` (a job's ``time`` option wins), e.g. ``"4:00:00"``.
- ``python`` (default: the daemon's own interpreter, as on a shared file system),
  ``package_url``, ``agent_args``, ``heartbeat_timeout`` (default 120): as for the cloud
  runners.
- ``slurm_output``: where Slurm writes the batch script's own output (srun's messages; the
  job's output goes to the bucket), default ``/dev/null``; a pattern on a shared file system
  (``/shared/bastion/%x.out``) keeps it for debugging.
- ``sbatch_args``: extra ``sbatch`` flags for every job (``["--constraint=a100"]``).
- ``bin_dir``: where ``sbatch``, ``squeue``, ``scancel`` are (default: ``PATH``).
- ``jobcomp_file``: the cluster's ``JobCompLoc`` (``JobCompType=jobcomp/filetxt``), read for
  jobs that left ``squeue`` where ``sacct`` has no slurmdbd.
- ``listing_ttl``: seconds a listing lasts without a daemon driving cycles (default 1).

A job's resources are its totals over all nodes (as the quota meters them): ``gpu`` becomes
``--gres=gpu:<gpu/nodes>``, ``cpu`` ``--cpus-per-task=<cpu/nodes>``, ``memory`` (GiB)
``--mem=<memory/nodes>G``; runner option ``nodes`` (default 1) sets ``--nodes``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bastion.bucket.runs import parse_run_name
from bastion.bucket.store import ObjectInfo, Store
from bastion.runners import startup
from bastion.runners.base import (
    Attempt,
    AttemptPhase,
    Handle,
    Observation,
    Owned,
    Runner,
    RunnerError,
    TryAgain,
    name_prefix,
    root_tag,
)
from bastion.runners.kit.lease_fence import check_term
from bastion.runners.kit.records import RemoteRecords

COMMAND_TIMEOUT = 60.0
LISTING_TTL = 1.0
# squeue's columns; the comment last, since only it may hold the separator.
SQUEUE_FORMAT = "%i|%j|%T|%r|%N|%P|%k"
# Slurm cannot be reached (a transient condition; the same call may work next cycle).
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted|"
    r"Connection refused|Communication connection failure|Slurm backup controller in standby",
    re.IGNORECASE,
)
_LIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "SIGNALING",
        "RESIZING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "STAGE_OUT",
        "SPECIAL_EXIT",
    }
)
_QUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
_PREEMPTED = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
_RESOURCE_FLAGS = {"gpu": "gres", "cpu": "cpus-per-task", "memory": "mem"}


@dataclass(frozen=True)
class Row:
    """One job as ``squeue`` lists it."""

    job_id: int
    name: str
    state: str
    reason: str
    nodes: str
    partition: str
    comment: str

    @property
    def live(self) -> bool:
        return self.state in _LIVE

    def tag(self, key: str) -> str | None:
        """``key=value`` from the comment Bastion wrote."""
        for word in self.comment.split():
            k, sep, v = word.partition("=")
            if sep and k == key:
                return v
        return None


def parse_squeue(text: str) -> list[Row]:
    rows = []
    for line in text.splitlines():
        parts = line.split("|", 6)
        if len(parts) == 7 and parts[0].strip().isdigit():
            job_id, name, state, reason, nodes, partition, comment = parts
            state = state.split()[0] if state.strip() else ""
            rows.append(
                Row(
                    int(job_id),
                    name,
                    state,
                    reason,
                    nodes,
                    partition,
                    "" if comment == "(null)" else comment,
                )
            )
    return rows


def comment_for(attempt: Attempt, tag: str) -> str:
    """What the job is, in words Bastion reads back: root, runner, attempt name, job, number.
    Job names are safe identifiers (no spaces), so words split cleanly."""
    return (
        f"bastion-root={tag} bastion-runner=slurm bastion-attempt-name={attempt.name} "
        f"bastion-job={attempt.job} bastion-attempt={attempt.attempt} "
        f"bastion-nodes={_nodes(attempt)}"
    )


def _brief(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


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
        self.bin_dir = str(settings.get("bin_dir") or "")
        self.heartbeat_timeout = float(settings.get("heartbeat_timeout", 120))
        self.listing_ttl = float(settings.get("listing_ttl", LISTING_TTL))
        self.jobcomp_file = str(settings.get("jobcomp_file") or "")
        self.tiers = {str(k): str(v) for k, v in (settings.get("tiers") or {}).items()}
        for tier, said in self.tiers.items():
            _placement(said, f"tiers.{tier}")  # refuse a bad settings file at once
        self._lock = threading.Lock()
        self._listing_lock = threading.Lock()
        self._listing: tuple[float, float, list[Row]] | None = None  # (monotonic, wall, rows)
        self._per_cycle = False
        self._agent_listing: tuple[float, dict[tuple[str, str], dict[str, ObjectInfo]]] | None
        self._agent_listing = None
        self._records: dict[str, RemoteRecords] = {}
        self._stopped: set[str] = set()  # attempts we asked to stop: their CANCELLED is ours
        self._termed: set[int] = set()  # jobs whose steps got SIGTERM from us
        self._killed: set[int] = set()
        self._accounting: dict[int, tuple[str, int | None]] = {}  # job id -> (state, code)
        self._starting: dict[str, threading.Lock] = {}
        self.calls: dict[str, int] = {}  # Slurm commands run, by name (figures, tests)

    # -- Slurm's commands ------------------------------------------------------------------------
    def _binary(self, name: str) -> str:
        if self.bin_dir:
            return os.path.join(self.bin_dir, name)
        found = shutil.which(name)
        if found is None:
            raise RunnerError(
                f"{name} is not on PATH: install Slurm's client commands on the "
                "daemon's machine (Debian: slurm-client) or set [runners.slurm] "
                "bin_dir"
            )
        return found

    def run(self, name: str, *args: str, input: str | None = None) -> str:
        """Run one Slurm command; its stdout. Slurm unreachable: TryAgain; any other refusal:
        RunnerError with Slurm's own message."""
        argv = [self._binary(name), *args]
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
        try:
            done = subprocess.run(
                argv, input=input, capture_output=True, text=True, timeout=COMMAND_TIMEOUT
            )
        except FileNotFoundError:
            raise RunnerError(
                f"{argv[0]} not found: install Slurm's client commands or fix "
                "[runners.slurm] bin_dir"
            ) from None
        except subprocess.TimeoutExpired:
            raise TryAgain(f"{name} did not answer within {COMMAND_TIMEOUT:.0f} s") from None
        if done.returncode != 0:
            message = _brief(done.stderr or done.stdout or f"exit status {done.returncode}")
            if _UNREACHABLE.search(message):
                raise TryAgain(f"{name}: the Slurm controller is unreachable: {message}")
            raise RunnerError(f"{name} refused: {message}")
        return done.stdout

    def squeue(self, *args: str) -> list[Row]:
        return parse_squeue(
            self.run("squeue", "-h", "-t", "all", "--me", "-o", SQUEUE_FORMAT, *args)
        )

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
        with self._listing_lock:
            self._per_cycle = True
            self._listing = None
            self._agent_listing = None

    def _stale(self, at: float) -> bool:
        return not self._per_cycle and time.monotonic() - at > self.listing_ttl

    def listing(self) -> tuple[float, list[Row]]:
        """(when it was made, wall clock; this root's jobs), one squeue per cycle."""
        with self._listing_lock:
            if self._listing is None or self._stale(self._listing[0]):
                wall = time.time()
                rows = [r for r in self.squeue() if self._ours(r)]
                self._listing = (time.monotonic(), wall, rows)
            return self._listing[1], self._listing[2]

    def agent_listing(self) -> dict[tuple[str, str], dict[str, ObjectInfo]]:
        with self._listing_lock:
            if self._agent_listing is None or self._stale(self._agent_listing[0]):
                self._agent_listing = (time.monotonic(), self.store.agents.list_all())
            return self._agent_listing[1]

    def _row(self, handle: Handle) -> tuple[float, Row | None]:
        at, rows = self.listing()
        job_id = handle.get("job_id")
        for row in rows:
            if row.name == handle["name"] and (job_id is None or row.job_id == job_id):
                return at, row
        return at, None

    def records(self, handle: Handle) -> RemoteRecords:
        with self._lock:
            found = self._records.get(handle["name"])
            if found is None:
                found = RemoteRecords(
                    self.store,
                    handle["job"],
                    handle["name"],
                    int(handle.get("workers", 1)),
                    self.heartbeat_timeout,
                )
                self._records[handle["name"]] = found
            return found

    def _attempt_records(self, handle: Handle) -> dict[str, ObjectInfo]:
        return self.agent_listing().get((handle["job"], handle["name"]), {})

    def agents(self, handle: Handle) -> Observation | None:
        return self.records(handle).observe(self._attempt_records(handle), time.time())

    # -- start -----------------------------------------------------------------------------------
    def start(self, attempt: Attempt) -> Handle:
        """Adopt the job of this name if Slurm has one; else write the provisioning record,
        check the lease term, submit, and resolve a race that made two (the oldest stays)."""
        args = self.sbatch_args(attempt)  # refuses bad options before anything is made
        nodes = _nodes(attempt)
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
            out = self.run("sbatch", *args, input=self.batch_script(attempt, nodes))
            job_id = int(out.strip().split(";")[0])
            self.store.runs.write_provision(attempt.job, attempt.name, {**record, "job_id": job_id})
            found = self._adopt(attempt)  # a racing submit of the same name: the oldest wins
            if found is not None:
                return found
            return self._handle(attempt.job, attempt.name, job_id, nodes, created)

    def _adopt(self, attempt: Attempt) -> Handle | None:
        rows = [r for r in self.squeue("--name", attempt.name) if self._ours(r)]
        if not rows:
            return None
        rows.sort(key=lambda r: r.job_id)
        keep, extra = rows[0], [r for r in rows[1:] if r.live]
        if extra:
            self.run("scancel", *(str(r.job_id) for r in extra))
        record = self.store.runs.read_provision(attempt.job, attempt.name) or {}
        self._invalidate()
        return self._handle(
            attempt.job, attempt.name, keep.job_id, _nodes(attempt), record.get("time")
        )

    def _handle(
        self, job: str, name: str, job_id: int | None, workers: int, created: float | None
    ) -> Handle:
        return {"name": name, "job": job, "job_id": job_id, "workers": workers, "created": created}

    def _invalidate(self) -> None:
        if not self._per_cycle:
            with self._listing_lock:
                self._listing = None

    def placement(self, attempt: Attempt) -> dict[str, str]:
        """partition, qos, account: the settings' defaults, then the tier's, then the job's."""
        found = {
            k: str(self.settings[k])
            for k in ("partition", "qos", "account")
            if self.settings.get(k)
        }
        if attempt.tier is not None and str(attempt.tier) in self.tiers:
            found.update(_placement(self.tiers[str(attempt.tier)], f"tiers.{attempt.tier}"))
        found.update(
            {
                k: str(attempt.options[k])
                for k in ("partition", "qos", "account")
                if attempt.options.get(k)
            }
        )
        return found

    def sbatch_args(self, attempt: Attempt) -> list[str]:
        nodes = _nodes(attempt)
        args = [
            "--parsable",
            f"--job-name={attempt.name}",
            f"--comment={comment_for(attempt, self.tag)}",
            "--no-requeue",
            f"--nodes={nodes}",
            "--ntasks-per-node=1",
            f"--output={self.settings.get('slurm_output') or '/dev/null'}",
            "--open-mode=append",
        ]
        for resource, flag in _RESOURCE_FLAGS.items():
            total = attempt.resources.get(resource)
            if not total:
                continue
            if total % nodes:
                raise RunnerError(
                    f"resources.{resource} = {total} does not divide among "
                    f"{nodes} nodes (runner option nodes): give a multiple of "
                    f"{nodes}"
                )
            each = total // nodes
            value = {"gres": f"gpu:{each}", "mem": f"{each}G"}.get(flag, str(each))
            args.append(f"--{flag}={value}")
        for key, value in sorted(self.placement(attempt).items()):
            args.append(f"--{key}={value}")
        limit = attempt.options.get("time") or self.settings.get("time")
        if limit:
            args.append(f"--time={limit}")
        args += [str(a) for a in self.settings.get("sbatch_args") or []]
        return args

    def batch_script(self, attempt: Attempt, nodes: int) -> str:
        """``srun`` of the agent's startup script on every node, one task each; a task that
        fails ends the others (``--kill-on-bad-exit``), as one worker failing fails the job."""
        agent_args = [*map(str, self.settings.get("agent_args") or []), "--worker_env=SLURM_PROCID"]
        if attempt.bundle:
            agent_args.append(f"--bundle={json.dumps(dict(attempt.bundle), sort_keys=True)}")
        task = startup.script(
            root=self.root,
            job=attempt.job,
            attempt=attempt.name,
            num_workers=nodes,
            command=attempt.command,
            env=attempt.env,
            python=str(self.settings.get("python") or sys.executable),
            package_url=self.settings.get("package_url"),
            agent_args=agent_args,
        )
        return (
            f"#!/bin/bash\n# bastion: attempt {attempt.name}, one agent per node\n"
            f"exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 --nodes={nodes} "
            f"bash -c {shlex.quote(task)}\n"
        )

    # -- poll ------------------------------------------------------------------------------------
    def poll(self, handle: Handle) -> Observation:
        at, row = self._row(handle)
        job_id = handle.get("job_id")
        if row is None:
            created = handle.get("created")
            if created is not None and at < float(created) + 1.0:
                return Observation(AttemptPhase.QUEUED, f"submitted as Slurm job {job_id}")
            return self._left_squeue(handle)
        state, where = row.state, f"Slurm job {row.job_id}"
        if state in _QUEUED:
            why = f" ({row.reason})" if row.reason and row.reason != "None" else ""
            return Observation(
                AttemptPhase.QUEUED, f"{where} pending in partition {row.partition}{why}"
            )
        if state == "CONFIGURING":
            return Observation(AttemptPhase.PROVISIONING, f"{where} configuring {row.nodes}")
        seen = self.agents(handle)
        if row.live:
            if seen is None:
                return Observation(
                    AttemptPhase.PROVISIONING,
                    f"{where} {state.lower()} on {row.nodes}; agents starting",
                )
            return Observation(
                AttemptPhase.RUNNING,
                f"{seen.reason} on {row.nodes} ({where}"
                f"{', ending' if seen.finished or state != 'RUNNING' else ''})",
                workers=seen.workers,
            )
        return self._ended(handle, row.job_id, state, row.reason, seen)

    def _ended(
        self, handle: Handle, job_id: int, state: str, reason: str, seen: Observation | None
    ) -> Observation:
        """The job is over (every process of it is gone): the agents' word, with Slurm's."""
        where = f"Slurm job {job_id}"
        workers = seen.workers if seen is not None else ()
        if seen is not None and seen.phase is AttemptPhase.SUCCEEDED:
            return seen
        if state in _PREEMPTED:
            what = "preempted by Slurm" if state == "PREEMPTED" else f"{state} (node failure)"
            return Observation(
                AttemptPhase.PREEMPTED, f"{what}: {where}", retryable=True, workers=workers
            )
        if state == "CANCELLED" and handle["name"] not in self._stopped:
            said = f" ({reason})" if reason and reason != "None" else ""
            return Observation(
                AttemptPhase.FAILED, f"{where} was cancelled outside Bastion{said}", workers=workers
            )
        if state in ("TIMEOUT", "DEADLINE", "OUT_OF_MEMORY"):
            why = {
                "TIMEOUT": "reached its time limit",
                "DEADLINE": "reached its deadline",
                "OUT_OF_MEMORY": "ran out of memory",
            }[state]
            code = seen.exit_code if seen is not None else self._exit_code(job_id)
            return Observation(
                AttemptPhase.FAILED, f"{where} {why} ({state})", code, workers=workers
            )
        if seen is not None and seen.finished:
            return seen
        if state == "COMPLETED":
            if seen is None:
                return Observation(
                    AttemptPhase.LOST, f"{where} completed but no agent reported", retryable=True
                )
            return Observation(AttemptPhase.SUCCEEDED, f"{where} completed", 0, workers=workers)
        code = self._exit_code(job_id) if state == "FAILED" else None
        if handle["name"] in self._stopped:
            return Observation(
                AttemptPhase.FAILED, f"{where} stopped ({state})", code, workers=workers
            )
        said = f" ({reason})" if reason and reason != "None" else ""
        started = "" if seen is not None else " before its agents started"
        return Observation(
            AttemptPhase.FAILED, f"{where} {state}{started}{said}", code, workers=workers
        )

    def _left_squeue(self, handle: Handle) -> Observation:
        """Gone from squeue (MinJobAge passed, or a controller that lost its state): the
        agents' word if they all finished, else accounting, else LOST."""
        seen = self.agents(handle)
        job_id = handle.get("job_id")
        found = self._account(int(job_id)) if job_id is not None else None
        if found is not None:
            return self._ended(handle, int(job_id), found[0], "", seen)
        if seen is not None and seen.finished and seen.phase is not AttemptPhase.LOST:
            return seen
        return Observation(
            AttemptPhase.LOST,
            f"Slurm job {job_id} is gone from squeue and accounting",
            retryable=True,
        )

    def _account(self, job_id: int) -> tuple[str, int | None] | None:
        """(state, exit code) from sacct, else the job-completion file; once per job."""
        with self._lock:
            if job_id in self._accounting:
                return self._accounting[job_id]
        found = None
        try:
            out = self.run("sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State,ExitCode")
            for line in out.splitlines():
                state, _, code = line.partition("|")
                if state.strip():
                    found = (state.split()[0], _code(code))
                    break
        except (RunnerError, TryAgain):
            pass
        if found is None and self.jobcomp_file:
            found = _jobcomp(self.jobcomp_file, job_id)
        if found is not None:
            with self._lock:
                self._accounting[job_id] = found
        return found

    def _exit_code(self, job_id: int) -> int | None:
        """The job's exit code (``scontrol show job``), once per job."""
        with self._lock:
            if job_id in self._accounting:
                return self._accounting[job_id][1]
        try:
            out = self.run("scontrol", "show", "job", "-o", str(job_id))
        except (RunnerError, TryAgain):
            return None
        state = re.search(r"\bJobState=(\S+)", out)
        code = re.search(r"\bExitCode=(\S+)", out)
        found = (state.group(1) if state else "", _code(code.group(1)) if code else None)
        with self._lock:
            self._accounting[job_id] = found
        return found[1]

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
        if row.state in _QUEUED or row.state == "CONFIGURING" or self.agents(handle) is None:
            self.run("scancel", job)
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
                    self.run("scancel", str(row.job_id))
                    self._invalidate()
                return False
        self.store.agents.delete(handle["job"], handle["name"])
        with self._lock:
            self._records.pop(handle["name"], None)
            self._stopped.discard(handle["name"])
        with self._listing_lock:
            self._agent_listing = None
        return True

    def list_owned(self) -> list[Owned]:
        """This root's jobs: live ones, and ended ones whose agents' records are still there
        (not deleted yet); plus records whose job left squeue. Another root's or user's job,
        or one without this root's comment, is never listed."""
        _, rows = self.listing()
        records = self.agent_listing()
        owned: dict[str, Owned] = {}
        for row in sorted(rows, key=lambda r: r.job_id):
            if row.name in owned:
                continue
            job = row.tag("bastion-job") or row.name
            has_records = (job, row.name) in records
            if row.live or has_records:
                nodes = row.tag("bastion-nodes") or ""
                workers = (
                    int(nodes) if nodes.isdigit() else _workers_of(records.get((job, row.name), {}))
                )
                handle = self._handle(job, row.name, row.job_id, workers, None)
                owned[row.name] = Owned(row.name, handle, not row.live)
        for (job, name), found in records.items():
            if name.startswith(self.prefix) and name not in owned:
                handle = self._handle(job, name, None, _workers_of(found), None)
                owned[name] = Owned(name, handle, True)
        return list(owned.values())

    def read_output(self, handle: Handle, offset: int, limit: int) -> bytes:
        return self.records(handle).read_output(
            offset, limit, worker=0, listing=self._attempt_records(handle)
        )

    def describe(self, handle: Handle) -> str | None:
        n = int(handle.get("workers", 1))
        return f"Slurm job {handle.get('job_id')} ({n} node{'' if n == 1 else 's'})"

    def close(self) -> None:
        with self._lock:
            self._records.clear()


def _nodes(attempt: Attempt) -> int:
    raw = attempt.options.get("nodes", 1)
    try:
        nodes = int(raw)
    except (TypeError, ValueError):
        nodes = 0
    if nodes < 1:
        raise RunnerError(f"runner option nodes = {raw!r} is not a positive whole number")
    return nodes


def _placement(said: str, where: str) -> dict[str, str]:
    """``"partition:high,qos:normal"`` as {partition: high, qos: normal}."""
    found = {}
    for item in said.split(","):
        key, sep, value = item.strip().partition(":")
        if not sep or key not in ("partition", "qos", "account") or not value:
            raise RunnerError(
                f"runner slurm: {where} = {said!r}: give comma-separated "
                "partition:NAME, qos:NAME, account:NAME; fix the daemon's "
                "runner settings"
            )
        found[key] = value
    return found


def _code(text: str) -> int | None:
    """Slurm's ``ExitCode=code:signal``: the code, or 128+signal when a signal ended it."""
    code, _, sig = text.strip().partition(":")
    if not code.isdigit():
        return None
    if int(code) == 0 and sig.isdigit() and int(sig):
        return 128 + int(sig)
    return int(code)


def _jobcomp(path: str, job_id: int) -> tuple[str, int | None] | None:
    """The last line for ``job_id`` in a ``jobcomp/filetxt`` file."""
    found = None
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith(f"JobId={job_id} "):
                    state = re.search(r"\bJobState=(\S+)", line)
                    code = re.search(r"\bExitCode=(\S+)", line)
                    if state:
                        found = (state.group(1), _code(code.group(1)) if code else None)
    except OSError:
        return None
    return found


def _workers_of(records: Mapping[str, ObjectInfo]) -> int:
    return 1 + max((p[0] for r in records if (p := parse_run_name(r))), default=0)


def from_settings(settings: Mapping[str, Any]) -> SlurmRunner:
    return SlurmRunner(settings)


__all__: Sequence[str] = ("SlurmRunner", "from_settings", "parse_squeue")

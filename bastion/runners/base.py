"""The runner contract: one small interface for every place a job can run.

The daemon decides *what* should run; a runner knows *how* it runs somewhere (a process on this
machine, a container, a TPU slice, a GPU VM). The daemon never looks inside a runner's handle:
it stores it opaquely in the job state and passes it back.

Every operation is idempotent and keyed by the attempt's deterministic name
(:func:`attempt_name`, derived from the daemon's root, the job, the daemon's own submission id
and the attempt number), so a daemon killed at any moment and restarted finds what it made:

- ``start``: create if absent, never twice; returns at once (provisioning may take minutes).
  A create whose answer was lost is adopted, not repeated.
- ``poll``: read-only; an :class:`Observation` (queued, provisioning, running, succeeded,
  failed with a code, preempted by the provider, lost) with a reason and whether a new
  attempt is worth it.
- ``stop``: ask the attempt to stop by ``deadline`` (wall-clock seconds); called every cycle
  until the attempt is gone, so the runner owns the escalation (SIGTERM then SIGKILL at the
  deadline; ``docker kill``; a cloud delete) without the daemon knowing any signal.
- ``delete``: tear down whatever is left (files, containers, VMs); True only once verified gone.
- ``list_owned``: what this daemon owns (by name prefix or labels), for adoption and orphans.
- ``read_output``: the attempt's output from a byte offset: the daemon appends it to the job's
  log. Offsets are the daemon's to keep (it derives them from the log it wrote), so a runner
  keeps no cursor.

Runners are found by kind in a registry with lazy imports (like fsspec's protocols), so an SDK
that is not installed costs nothing until a job asks for that runner.
"""

from __future__ import annotations

import abc
import enum
import errno
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bastion.registry import Registry

Handle = dict[str, Any]  # JSON-able; opaque to the daemon


class AttemptPhase(enum.StrEnum):
    QUEUED = "QUEUED"  # waiting for capacity at the provider (queued resource, Slurm PENDING)
    PROVISIONING = "PROVISIONING"  # capacity granted, machines or containers being made
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # the command failed (exit_code) or the runner could not run it
    PREEMPTED = "PREEMPTED"  # the provider took the machines away: not the job's failure
    LOST = "LOST"  # nothing left to ask: host gone, record missing, worker stopped reporting

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = frozenset(
    {AttemptPhase.SUCCEEDED, AttemptPhase.FAILED, AttemptPhase.PREEMPTED, AttemptPhase.LOST}
)


@dataclass(frozen=True)
class Observation:
    """What ``poll`` saw. ``retryable``: a new attempt may succeed (stockout, preemption)."""

    phase: AttemptPhase
    reason: str = ""
    exit_code: int | None = None
    retryable: bool = False
    # Each worker's health for a multi-host attempt, one short stable word per worker
    # ("waiting", "running", "late", "lost", "exit 0", "preempted"); empty for one process.
    workers: tuple[str, ...] = ()
    # What the runner had to do at the attempt's end that its history must say ("killed 1
    # process left behind: sleep (pid 4242)"); "" for nothing. The daemon notes it once.
    note: str = ""
    # When the job's last checkpoint was written (epoch seconds, the "time" in its
    # BASTION_OUTPUT_DIR/.bastion/checkpoint.json), where the runner can see it; None: unknown.
    checkpoint: float | None = None

    @property
    def finished(self) -> bool:
        return self.phase.finished


@dataclass(frozen=True)
class Attempt:
    """Everything a runner needs to start one attempt (or one cleanup) of a job."""

    name: str  # deterministic, DNS-safe, unique per (root, job, submission, attempt, purpose)
    job: str
    attempt: int
    command: str
    env: Mapping[str, str]
    resources: Mapping[str, int] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)  # the spec's runner options
    labels: Mapping[str, str] = field(default_factory=dict)  # for the provider's own listing
    bundle: Mapping[str, Any] | None = None  # the job's code (bundlers.Bundle record), if any
    # The lease term of the daemon that asks (0: no lease). A runner that can, refuses a start
    # from a term older than one it has already seen (bastion/runners/fence.py): a daemon
    # frozen in the middle of a start never starts anything after its successor did.
    fence: int = 0
    # The quota tier the job was admitted on (0: within its project's quota; higher: borrowed).
    # Opaque to runners except as a key: a cloud runner maps it to spot or reserved capacity.
    tier: int | None = None


@dataclass(frozen=True)
class Owned:
    """Something a runner found that this daemon made: its attempt name and handle."""

    name: str
    handle: Handle
    finished: bool = False


class RunnerError(Exception):
    """A runner cannot do what was asked; the message is for the job's user (the attempt
    fails with it). Any other exception is taken as transient: the daemon tries again, backing
    off, and gives up after its ``start_give_up_seconds`` (bastion/daemon/effects.py)."""


class StartRefused(RunnerError):
    """A start that failed for a reason trying again will not change: ``exec`` refused the
    command's arguments or environment as too large (E2BIG), the interpreter or an image does
    not exist, a bundle does not verify. Its job ends FAILED with the message after the first
    try, and its quota is free for the next job."""


class Fenced(Exception):
    """A start was refused because a daemon with a newer lease term has started attempts on
    this host: the caller is a stale holder and must act no more."""


class TryAgain(Exception):
    """Transient: the same call may succeed next cycle (another process is starting this very
    attempt right now, an engine or API briefly unreachable). The daemon tries again with an
    exponential backoff per job and gives up after a bounded time, failing the job."""


class NoCapacity(TryAgain):
    """Transient, and not a failure of the start: the provider has no capacity (or quota) in
    any zone now. Waited for without the give-up bound, as a stockout is: it clears when it
    clears, and the runner already backs off each zone itself."""


class CannotStart(TryAgain):
    """The runner cannot start anything now, whatever the job: no credentials, an API not
    enabled, permission denied, a project that does not exist. Backed off as a transient
    failure; after the daemon's ``start_give_up_seconds`` the attempt ends and the job waits
    PENDING again with the reason (its quota free for others), rather than failing: nothing in
    the job is wrong. The message says what to fix."""


# Errors of exec(2) that no retry can cure: the same command, environment and host give the same.
_PERMANENT_EXEC = {
    errno.E2BIG: "E2BIG",
    errno.ENOENT: "ENOENT",
    errno.ENOEXEC: "ENOEXEC",
    errno.EACCES: "EACCES",
    errno.ENOTDIR: "ENOTDIR",
    errno.ENAMETOOLONG: "ENAMETOOLONG",
    errno.ELOOP: "ELOOP",
}


def exec_refusal(
    error: OSError, program: str, env: Mapping[str, str], args: Sequence[str]
) -> StartRefused | None:
    """The StartRefused for an ``exec`` of ``program`` that failed with ``error``, when the
    failure is one no retry cures (None: transient, e.g. EAGAIN or ENOMEM). For E2BIG it names
    the variable (or the sizes) over the kernel's limit, so the user knows what to shrink."""
    code = _PERMANENT_EXEC.get(error.errno or 0)
    if code is None:
        return None
    what = f"exec of {program} failed: {error.strerror or error} ({code})"
    if error.errno == errno.E2BIG:
        from bastion.jobspec import exec_limit_problem

        detail = exec_limit_problem(env, args) or (
            "the job's command and environment are over this host's limit for exec"
        )
        what = f"{what}: {detail}"
    return StartRefused(what)


class Runner(abc.ABC):
    kind: str = ""
    # The per-job options (a spec's runner object) this runner takes; None: not declared, so
    # a client cannot check them before submitting. Published by the daemon (capabilities).
    accepted_options: frozenset[str] | None = None
    # Whether ``poll`` and ``read_output`` only read this host's files and /proc (tens of
    # microseconds, no request): the daemon then makes them in its loop's thread. Threads do
    # not make such calls faster, they only fight over the GIL: 1,000 running local attempts
    # took 0.41 s a cycle to watch in the I/O pool and 0.17 s in one thread.
    cheap_polls: bool = False

    @abc.abstractmethod
    def start(self, attempt: Attempt) -> Handle:
        """Create the attempt if absent (never twice) and return its handle, at once."""

    @abc.abstractmethod
    def poll(self, handle: Handle) -> Observation:
        """Read-only: where the attempt is now."""

    @abc.abstractmethod
    def stop(self, handle: Handle, deadline: float) -> None:
        """Ask the attempt to end; force it once ``time.time() >= deadline``. Repeatable."""

    @abc.abstractmethod
    def delete(self, handle: Handle) -> bool:
        """Remove what the attempt left (its process group, container, files); True once gone."""

    @abc.abstractmethod
    def list_owned(self) -> list[Owned]:
        """Attempts this daemon made that still exist here (running or finished)."""

    @abc.abstractmethod
    def read_output(self, handle: Handle, offset: int, limit: int) -> bytes:
        """Up to ``limit`` bytes of the attempt's output starting at byte ``offset``."""

    def begin_cycle(self) -> None:  # noqa: B027 (optional: most runners keep nothing)
        """Optional: the daemon starts a cycle. A runner that shares one listing among all
        of a cycle's polls makes it afresh after this, however long the last cycle took."""

    def describe(self, handle: Handle) -> str | None:
        """Optional: what the attempt occupies, for the job's history ("TPU node X (v4-32,
        4 workers) in us-central2-b"); None when there is nothing to tell (a local process).
        Pure: no request is made."""
        return None

    def close(self) -> None:  # noqa: B027 (optional: most runners hold nothing)
        """Release clients and sockets when the daemon stops."""


# -- names -----------------------------------------------------------------------------------

_SLUG = re.compile(r"[^a-z0-9]+")
MAX_ATTEMPT_NAME = 63  # RFC 1035 label: GCE instances, TPU nodes, pods, containers


def root_tag(root_url: str) -> str:
    """A short id for the daemon's root, so two roots' attempts never share a name."""
    return hashlib.sha1(root_url.rstrip("/").encode()).hexdigest()[:6]


def attempt_name(root_url: str, job: str, submission: str, attempt: int, purpose: str) -> str:
    """``bst-<root>-<slug>-<hash>-a<N>[c]``: lowercase RFC 1035, at most 63 characters.

    The hash covers the full job name and the submission id, so equal slugs of different jobs
    and a resubmission of the same name never collide; ``c`` marks the cleanup command."""
    digest = hashlib.sha1(f"{job}\0{submission}".encode()).hexdigest()[:8]
    suffix = f"-{digest}-a{attempt}{'c' if purpose == 'cleanup' else ''}"
    head = f"bst-{root_tag(root_url)}-"
    slug = _SLUG.sub("-", job.lower()).strip("-")[: MAX_ATTEMPT_NAME - len(head) - len(suffix)]
    return f"{head}{slug.rstrip('-') or 'job'}{suffix}"


def attempt_number(name: str) -> int | None:
    """N of an attempt name (``...-a<N>`` or ``...-a<N>c``); None for any other name."""
    match = _ATTEMPT_SUFFIX.search(name)
    return int(match.group(1)) if match else None


_ATTEMPT_SUFFIX = re.compile(r"-a(\d+)c?$")


def name_prefix(root_url: str) -> str:
    """Every attempt name of this root starts with it (for runners that list by name)."""
    return f"bst-{root_tag(root_url)}-"


# -- registry --------------------------------------------------------------------------------

RunnerFactory = Callable[[Mapping[str, Any]], Runner]

RUNNERS: Registry[RunnerFactory] = Registry(
    "runner kind",
    group="bastion.runners",
    builtins={
        "local": "bastion.runners.local:from_settings",
        "docker": "bastion.runners.docker:from_settings",
        "fake": "bastion.runners.fake:from_settings",
        "tpu": "bastion.runners.google.tpu:from_settings",
        "tpu-qr": "bastion.runners.google.queued:from_settings",
        "gce": "bastion.runners.google.gce:from_settings",
        "slurm": "bastion.runners.slurm:from_settings",
        "gke": "bastion.runners.gke:from_settings",
    },
    error=RunnerError,
)


def register(kind: str, factory: RunnerFactory | str, clobber: bool = False) -> None:
    """Add a runner kind: a factory, or ``"module:function"`` to import on first use (a
    package can instead name it under the ``bastion.runners`` entry point group)."""
    RUNNERS.register(kind, factory, clobber=clobber)


def known_kinds() -> list[str]:
    return RUNNERS.names()


def factory_for(kind: str) -> RunnerFactory:
    return RUNNERS.get(kind)

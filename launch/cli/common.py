"""What every verb shares: the flags more than one verb takes, the Verb record, and the
small parsers of arguments (names, commands) that verbs use."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from absl import flags

from bastion.bucket.store import resolve_root
from bastion.jobstate import Status
from launch.api import Client, JobInfo, NoDaemon
from launch.status import RootProblem, check_root

FLAGS = flags.FLAGS
ABSL_FLAGS = set(FLAGS)  # absl's own (--helpfull, --verbosity, ...): never checked per verb

flags.DEFINE_string(
    "root",
    None,
    "Bucket URL or directory holding Bastion's state "
    "(default: $BASTION_ROOT, else ~/.local/share/bastion).",
)
flags.DEFINE_string(
    "image", None, "Container image (launch: for --runner=docker; vm: the daemon's image)."
)
flags.DEFINE_bool("json", False, "Print JSON (list, simulate, usage).")
flags.DEFINE_bool("follow", False, "Keep printing the log until the job is finished.")
flags.DEFINE_float("follow_poll_seconds", 1.0, "How often logs --follow polls the bucket.")
flags.DEFINE_float(
    "daemon_wait_seconds",
    30.0,
    "--follow: give up (exit 1) after this long with no daemon acting on the root.",
)
flags.DEFINE_string("project_id", "default", "Project the job is charged to (list: a filter).")
flags.DEFINE_string(
    "user_id", None, "User id (default: $BASTION_USER, else the login name; list: a filter)."
)
flags.DEFINE_string(
    "group", None, "An array's or sweep's name (list, cancel, launch --retry_failed)."
)
flags.DEFINE_string("state", None, "Only jobs in these states (PENDING,RUNNING,FAILED,...).")
flags.DEFINE_float(
    "grace_seconds",
    None,
    "Seconds from a stop's warning signal to SIGKILL: the daemon's default (start; 30), or this "
    "job's own (launch; default: the daemon's).",
)
DEFAULT_GRACE = 30.0  # start's --grace_seconds when not given
flags.DEFINE_bool(
    "yes", False, "Do not ask for confirmation (cancel of several jobs, outputs --delete)."
)
flags.DEFINE_string(
    "quota_file", None, "Quota TOML URL (default: ROOT/project-quotas/project-quotas.config)."
)


@dataclass(frozen=True)
class Verb:
    """One verb: what runs it and its help page (usage line, what it does, an example, and the
    flags it takes besides --root; any other flag given to it is an error)."""

    name: str
    run: Callable[[Sequence[str]], int]
    usage: str
    what: str
    example: str
    flags: tuple[str, ...]


class UsageError(Exception):
    """Bad command line; printed with the verb's usage."""


def client_of(reading: bool = True, name: str | None = None) -> Client:
    """The client of --root; RootProblem (one line) when the root is a file, unreachable or,
    for a verb that only reads (``reading``), does not exist (a typo'd --root). ``name``: the
    job the verb looks for, named in that line."""
    root = resolve_root(FLAGS.root)
    try:
        check_root(root, reading=reading)
    except RootProblem as e:
        raise RootProblem(f"no job {name!r}: {e}" if name else str(e)) from None
    return Client(root)


def command_of(args: Sequence[str], verb: str) -> str:
    if not args:
        raise UsageError(
            f"{verb}: give the command after --, e.g. bastion {verb} ... -- python train.py"
        )
    return args[0] if len(args) == 1 else shlex.join(args)


def one_name(args: Sequence[str], verb: str) -> str:
    if len(args) != 1:
        raise UsageError(f"{verb}: give exactly one job name, e.g. bastion {verb} NAME")
    return args[0]


def filtered(
    jobs: Sequence[Any],
    group: str | None = None,
    state: str | None = None,
    user_id: str | None = None,
    project_id: str | None = None,
) -> list[Any]:
    """The jobs (JobInfo) a list or cancel filter picks; ``state``: comma-separated states
    as `bastion list` shows them (RUNNING matches ACTIVE)."""
    states = {s.strip().upper() for s in (state or "").split(",") if s.strip()}
    states |= {"ACTIVE"} if "RUNNING" in states else set()
    picked = []
    for job in jobs:
        if group is not None and job.group != group:
            continue
        if states and job.status not in states:
            continue
        if user_id is not None and job.shown("user_id") != user_id:
            continue
        if project_id is not None and job.shown("project_id") != project_id:
            continue
        picked.append(job)
    return picked


def no_args(args: Sequence[str], verb: str) -> None:
    if args:
        raise UsageError(f"{verb} takes no arguments, got {' '.join(args)!r}")


class WaitNotes:
    """While a followed job has not started: what it waits for, on stderr, once, and again
    whenever that changes (a silent --follow looks hung). Queue positions, which change every
    cycle, are left out: ``bastion why NAME`` has them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.said = ""

    def seen(self, info: JobInfo) -> None:
        if info.state is None:
            waits = info.reason
        elif info.state.status is Status.PENDING:
            waits = info.state.reason or "waiting for the daemon's next decision"
        else:
            self.said = ""
            return
        if waits != self.said:
            print(f"bastion: {self.name} waits: {waits}", file=sys.stderr, flush=True)
            self.said = waits


def follow(client: Client, name: str, exit_status: bool) -> int:
    """Print the log until the job ends; with ``exit_status``, exit 0 only if it succeeded.
    Ctrl-C stops following only: the job goes on, and the user is told how to cancel it."""
    try:
        for text in client.follow_log(
            name,
            poll_seconds=FLAGS.follow_poll_seconds,
            no_daemon_timeout=FLAGS.daemon_wait_seconds,
            on_poll=WaitNotes(name).seen,
        ):
            sys.stdout.write(text)
            sys.stdout.flush()
    except NoDaemon as e:
        print(f"bastion: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"\nbastion: stopped following {name}; the job keeps running "
            f"(see it: bastion logs {name} --follow; stop it: bastion cancel {name})",
            file=sys.stderr,
        )
        return 130
    info = client.get(name)
    if info.status == "SUCCEEDED":
        return 0
    if exit_status:
        print(
            f"bastion: {name} {info.status}" + (f": {info.reason}" if info.reason else ""),
            file=sys.stderr,
        )
        code = info.state.exit_code if info.state else None
        return code if code and 0 < code < 256 else 1
    return 0

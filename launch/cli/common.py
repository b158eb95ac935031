"""What every verb shares: the flags more than one verb takes, the Verb record, and the
small parsers of arguments (names, commands) that verbs use."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from absl import flags

from bastion.bucket.store import resolve_root
from launch.api import Client, NoDaemon
from launch.status import RootProblem, check_root

FLAGS = flags.FLAGS
ABSL_FLAGS = set(FLAGS)  # absl's own (--helpfull, --verbosity, ...): never checked per verb

flags.DEFINE_string(
    "root",
    None,
    "Bucket URL or directory holding Bastion's state "
    "(default: $BASTION_ROOT, else ~/.local/share/bastion).",
)
flags.DEFINE_string("image", None, "launch: container image for --runner=docker.")
flags.DEFINE_bool("json", False, "list/simulate/usage: print JSON.")
flags.DEFINE_bool("follow", False, "logs/launch: keep printing until the job is finished.")
flags.DEFINE_float("follow_poll_seconds", 1.0, "How often logs --follow polls the bucket.")
flags.DEFINE_float(
    "daemon_wait_seconds",
    30.0,
    "logs/launch --follow: give up (exit 1) after this long with no daemon acting on the root.",
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


def no_args(args: Sequence[str], verb: str) -> None:
    if args:
        raise UsageError(f"{verb} takes no arguments, got {' '.join(args)!r}")


def follow(client: Client, name: str, exit_status: bool) -> int:
    """Print the log until the job ends; with ``exit_status``, exit 0 only if it succeeded."""
    try:
        for text in client.follow_log(
            name,
            poll_seconds=FLAGS.follow_poll_seconds,
            no_daemon_timeout=FLAGS.daemon_wait_seconds,
        ):
            sys.stdout.write(text)
            sys.stdout.flush()
    except NoDaemon as e:
        print(f"bastion: error: {e}", file=sys.stderr)
        return 1
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

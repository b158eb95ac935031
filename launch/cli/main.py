"""Parsing, per-verb flag checks, help pages and dispatch: what every verb goes through."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Sequence

from absl import app, flags

from bastion.bucket.store import resolve_root
from bastion.jobspec import ExecLimitError, SpecError
from bastion.suggest import did_you_mean
from launch.api import JobExists, NoDaemon, NotOwner, UnknownJob
from launch.checks import SpecMistake
from launch.cli import admin, outputs, status, submit, usage, view
from launch.cli.common import ABSL_FLAGS, FLAGS, UsageError, Verb
from launch.status import RootProblem, brief

VERB_MODULES = (admin, submit, view, status, usage, outputs)
_ORDER = ("start", "launch", "bundle", "list", "logs", "cancel", "history", "update", "why")
_ALL = {v.name: v for module in VERB_MODULES for v in module.VERBS}
# Help lists the verbs in the order a user meets them; verbs added later come after.
VERBS: dict[str, Verb] = {
    **{name: _ALL[name] for name in _ORDER if name in _ALL},
    **{name: v for name, v in _ALL.items() if name not in _ORDER},
}
OUR_FLAGS = set(FLAGS) - ABSL_FLAGS
COMMON_FLAGS = ("root",)


def _gist(what: str, width: int = 80) -> str:
    """A verb's first clause, one line wide, for the list of verbs."""
    depth, end = 0, len(what)
    for i, char in enumerate(what):  # the first ". " or "; " outside parentheses
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and what[i : i + 2] in (". ", "; "):
            end = i
            break
    gist = what[:end].rstrip(".")
    return gist if len(gist) <= width else gist[: width - 1].rstrip() + "…"


def usage(verb: str | None) -> str:
    if verb is None:
        lines = ["usage: bastion VERB [flags] [args]", "", "verbs:"]
        lines += [f"  {v:<9} {_gist(VERBS[v].what)}" for v in VERBS]
        lines += [
            "",
            "Every verb takes --root=URL (else $BASTION_ROOT, else ~/.local/share/bastion).",
            "bastion VERB --help: that verb's flags and an example; --helpfull: every flag.",
        ]
        return "\n".join(lines)
    v = VERBS[verb]
    lines = [f"usage: {v.usage}", "", v.what, "", "flags:"]
    for name in (*v.flags, *COMMON_FLAGS):
        flag = FLAGS[name]
        default = "" if flag.default in (None, "", [], False) else f" (default {flag.default})"
        lines.append(f"  --{name}: {flag.help}{default}")
    lines += ["", f"example: {v.example}"]
    return "\n".join(lines)


_HELP = ("-h", "--help", "-help", "--h", "-?")


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with a short usage for --help/-h (exit 0) and one-line flag errors."""
    args = argv[1:]
    before = args[: args.index("--")] if "--" in args else args
    if any(a in _HELP for a in before) or before[:1] == ["help"]:
        verb = next((a for a in before if a in VERBS), None)
        print(usage(verb))
        sys.exit(0)
    if "--helpfull" in before:  # absl prints every flag, then exits 1; asking for help is no error
        with contextlib.suppress(SystemExit):
            FLAGS(argv)
        sys.exit(0)
    try:
        return FLAGS(argv)
    except flags.Error as e:
        verb = next((a for a in before if a in VERBS), None)
        see = f"bastion {verb} --help" if verb else "bastion --help"
        print(f"bastion: {e}; see {see}", file=sys.stderr)
        sys.exit(2)


def check_verb_flags(verb: str) -> None:
    """A flag given to a verb that does not take it is an error, never silently ignored."""
    allowed = {*VERBS[verb].flags, *COMMON_FLAGS}
    for name in sorted(OUR_FLAGS):
        if FLAGS[name].present and name not in allowed:
            takers = [v for v in VERBS if name in VERBS[v].flags]
            hint = f" (it is a flag of: {', '.join(takers)})" if takers else ""
            raise UsageError(f"{verb} does not take --{name}{hint}; see bastion {verb} --help")


def quiet_libraries(verb: str) -> None:
    """Client verbs speak in their own lines only: a library's log record (gcsfs's cache INFO
    at every poll, retry tracebacks) never reaches the terminal unless BASTION_DEBUG=1. The
    daemon (``start``) keeps its log, which goes to its log file as well."""
    if verb != "start" and not os.environ.get("BASTION_DEBUG"):
        logging.disable(logging.CRITICAL)


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or argv[1] not in VERBS:
        got = f"unknown verb {argv[1]!r}{did_you_mean(argv[1], VERBS)}; " if len(argv) >= 2 else ""
        print(f"bastion: {got}give a verb\n\n{usage(None)}", file=sys.stderr)
        return 2
    verb = argv[1]
    quiet_libraries(verb)
    try:
        check_verb_flags(verb)
        return VERBS[verb].run(argv[2:])
    except UsageError as e:
        print(f"bastion: {e}", file=sys.stderr)
        return 2
    except NotOwner as e:  # refused before writing anything, as a usage error is
        print(f"bastion: error: {e.message('--force', '--user_id=')}", file=sys.stderr)
        return 2
    except SpecMistake as e:  # the daemon does not serve what was typed: said before writing
        for problem in e.problems:
            print(f"bastion: error: {problem}", file=sys.stderr)
        return 2
    except ExecLimitError as e:  # what was typed can never start: a usage error, said at once
        print(f"bastion: error: {e}", file=sys.stderr)
        return 2
    except (SpecError, UnknownJob, JobExists, RootProblem, NoDaemon) as e:
        print(f"bastion: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130
    except SystemExit:
        raise
    except Exception as e:  # one line, never a traceback; BASTION_DEBUG=1 shows it
        if os.environ.get("BASTION_DEBUG"):
            raise
        root = resolve_root(FLAGS.root)
        print(
            f"bastion: error: {verb} on {root}: {brief(e)} (BASTION_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


def run() -> None:
    app.run(main, flags_parser=parse_flags)

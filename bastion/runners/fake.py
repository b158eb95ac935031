"""The fake runner: attempts that are only a small JSON file and the clock.

Why: the daemon's lifecycle (queues, provisioning, preemption, restarts, stop escalation) must
be testable in milliseconds without processes, and the contract suite (tests/runner_contract.py)
needs a runner that is the contract and nothing more. Commands are a tiny language that is also
valid POSIX sh, so the same tests run on the real runners: ``echo WORDS...`` (a line of output),
``sleep SECONDS``, ``exit [N]``, ``true``, ``false``, and ``trap '' TERM`` or a ``# ignore-term``
comment (ignore SIGTERM), separated by ``;`` or newlines. Anything else fails the attempt at
once with 127 (sh's "not found"): the fake refuses rather than approximates.

Nothing runs: ``start`` stores a plan (output lines at offsets, a duration, an exit code) and
the start time; ``poll`` computes the phase from the clock, so it is read-only by construction
and a new FakeRunner on the same ``state_dir`` (a daemon restart) sees what the old one made.

Injections through ``attempt.options``, for the daemon's lifecycle tests (seconds, floats):

- ``fake_queued_seconds``: QUEUED that long first (the provider has no capacity yet);
- ``fake_provision_seconds``: then PROVISIONING that long; output starts only once RUNNING;
- ``fake_preempt_after``: PREEMPTED (retryable) that long after RUNNING begins;
- ``fake_lost_after``: LOST (not retryable) that long after ``start``, in whatever phase;
- ``fake_start_error``: ``start`` raises RunnerError with this text and records nothing.

Any other ``fake_*`` option is a RunnerError, so a typo cannot silently test nothing.

Stop before the deadline is SIGTERM: the attempt ends at once with 143, unless it ignores TERM;
then only a ``stop`` called at or after the deadline ends it (137). Like a real runner, the
fake escalates when the daemon calls stop again, so a daemon that stops calling is caught.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shlex
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from bastion.runners import base
from bastion.runners.base import Attempt, AttemptPhase, Handle, Observation, Owned, RunnerError

_SECONDS = frozenset(
    {"fake_queued_seconds", "fake_provision_seconds", "fake_preempt_after", "fake_lost_after"}
)
_KNOWN_OPTIONS = _SECONDS | {"fake_start_error"}
_IGNORE_TERM = re.compile(r"(^|\s)#[^\n]*(?<![\w-])ignore-term(?![\w-])", re.MULTILINE)
_SAFE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")  # attempt names; also safe as file names


def _simple_commands(source: str) -> list[list[str]]:
    """One line's simple commands as word lists; a word starting with ``#`` ends the line."""
    lexer = shlex.shlex(source, posix=True, punctuation_chars=";")
    lexer.whitespace_split, lexer.commenters = True, ""
    tokens = list(itertools.takewhile(lambda token: not token.startswith("#"), lexer))
    return [list(g) for sep, g in itertools.groupby(tokens, lambda t: t == ";") if not sep]


def _plan(command: str) -> dict[str, Any]:
    """Run ``command`` in the mind: output lines at their offsets, duration, exit code."""
    lines: list[tuple[float, str]] = []
    at, status, ignore_term = 0.0, 0, bool(_IGNORE_TERM.search(command))
    try:
        commands = [words for source in command.splitlines() for words in _simple_commands(source)]
    except ValueError:  # an unclosed quote
        return {"error": command.strip()}
    for name, *args in commands:
        if name == "echo":
            lines.append((at, " ".join(args)))
            status = 0
        elif name in ("true", "false") and not args:
            status = int(name == "false")
        elif name == "sleep" and len(args) == 1 and re.fullmatch(r"\d+(\.\d*)?", args[0]):
            at, status = at + float(args[0]), 0
        elif name == "trap" and args == ["", "TERM"]:
            ignore_term, status = True, 0
        elif name == "exit" and len(args) <= 1 and all(a.isdigit() for a in args):
            status = int(args[0]) % 256 if args else status
            break
        else:
            return {"error": " ".join([name, *args])}
    return {"lines": lines, "duration": at, "code": status, "ignore_term": ignore_term}


class FakeRunner(base.Runner):
    """Attempts as JSON files in ``state_dir``; phases computed from ``clock`` on each poll."""

    kind = "fake"
    accepted_options = _KNOWN_OPTIONS
    cheap_polls = True  # its state directory

    def __init__(self, root: str, state_dir: str, clock: Callable[[], float] = time.time) -> None:
        self.prefix = base.name_prefix(root)
        self.state_dir = state_dir
        self.clock = clock
        os.makedirs(state_dir, exist_ok=True)

    def start(self, attempt: Attempt) -> Handle:
        options = {k: v for k, v in attempt.options.items() if k.startswith("fake_")}
        unknown = sorted(set(options) - _KNOWN_OPTIONS)
        if unknown:
            raise RunnerError(f"unknown fake runner options: {', '.join(unknown)}")
        if "fake_start_error" in options:
            raise RunnerError(str(options["fake_start_error"]))
        handle = {"name": attempt.name}
        path = self._path(handle)
        if os.path.exists(path):
            return handle  # never twice: a start whose answer was lost is adopted
        try:
            numbers = {k: float(v) for k, v in options.items() if k in _SECONDS}
        except (TypeError, ValueError) as e:
            raise RunnerError(f"fake runner options must be seconds: {e}") from e
        record = {
            "command": attempt.command,
            "created": self.clock(),
            "queued": numbers.get("fake_queued_seconds", 0.0),
            "provision": numbers.get("fake_provision_seconds", 0.0),
            "preempt_after": numbers.get("fake_preempt_after"),
            "lost_after": numbers.get("fake_lost_after"),
            "stopped_at": None,  # when the stop that ended it came, and its exit code
            "stop_code": None,
            **_plan(attempt.command),
        }
        with contextlib.suppress(FileExistsError):  # another instance made it first
            self._write(path, record, exclusive=True)
        return handle

    def poll(self, handle: Handle) -> Observation:
        record = self._read(handle)
        if record is None:
            return Observation(AttemptPhase.LOST, f"no record of {handle['name']} (fake)")
        return self._observe(record, self.clock())[0]

    def stop(self, handle: Handle, deadline: float) -> None:
        record = self._read(handle)
        now = self.clock()
        if record is None or self._observe(record, now)[0].finished:
            return
        if now < deadline and record["ignore_term"] and now >= self._running_at(record):
            record["term_requested_at"] = record.get("term_requested_at") or now  # ignored
        else:
            record["stopped_at"], record["stop_code"] = now, 137 if now >= deadline else 143
        self._write(self._path(handle), record)

    def delete(self, handle: Handle) -> bool:
        path = self._path(handle)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return not os.path.exists(path)

    def list_owned(self) -> list[Owned]:
        owned, now = [], self.clock()
        for file in sorted(os.listdir(self.state_dir)):
            name = file.removesuffix(".json")
            if not (file.endswith(".json") and name.startswith(self.prefix)):
                continue
            record = self._read({"name": name})
            if record is not None:  # not deleted since the listing
                finished = self._observe(record, now)[0].finished
                owned.append(Owned(name, {"name": name}, finished))
        return owned

    def read_output(self, handle: Handle, offset: int, limit: int) -> bytes:
        record = self._read(handle)
        if record is None or record.get("error"):
            return b""
        ran = self._observe(record, self.clock())[1]
        # 1e-6: `created + duration - created` can round just below `duration`, and a line
        # echoed at the very end must not be lost.
        text = "".join(f"{line}\n" for at, line in record["lines"] if at <= ran + 1e-6)
        return text.encode()[offset : offset + limit]

    @staticmethod
    def _running_at(record: Mapping[str, Any]) -> float:
        return record["created"] + record["queued"] + record["provision"]

    def _observe(self, record: Mapping[str, Any], now: float) -> tuple[Observation, float]:
        """The observation at ``now``, and for how long the command ran (output up to then)."""
        if record.get("error"):
            reason = f"fake runner cannot run: {record['error']}"
            return Observation(AttemptPhase.FAILED, reason, exit_code=127), 0.0
        created, running_at = record["created"], self._running_at(record)
        code = record["code"]
        ended = AttemptPhase.SUCCEEDED if code == 0 else AttemptPhase.FAILED
        events = [(running_at + record["duration"], Observation(ended, exit_code=code))]
        if record["preempt_after"] is not None:
            reason = "preempted by the provider (fake)"
            preempted = Observation(AttemptPhase.PREEMPTED, reason, retryable=True)
            events.append((running_at + record["preempt_after"], preempted))
        if record["lost_after"] is not None:
            lost = Observation(AttemptPhase.LOST, "the fake attempt was lost (fake_lost_after)")
            events.append((created + record["lost_after"], lost))
        if record["stopped_at"] is not None:
            if record["stopped_at"] < running_at:
                stopped = Observation(AttemptPhase.FAILED, "stopped before it ran (fake)")
            else:
                how = "killed at the stop deadline" if record["stop_code"] == 137 else "terminated"
                stopped = Observation(AttemptPhase.FAILED, f"{how} (fake)", record["stop_code"])
            events.append((record["stopped_at"], stopped))
        at, observation = min(events, key=lambda event: event[0])  # ties: the first listed
        if at <= now:
            return observation, at - running_at
        queued, running = now < created + record["queued"], now >= running_at
        phase = (
            AttemptPhase.QUEUED
            if queued
            else AttemptPhase.RUNNING
            if running
            else AttemptPhase.PROVISIONING
        )
        return Observation(phase), now - running_at

    def _path(self, handle: Handle) -> str:
        name = handle.get("name") if isinstance(handle, Mapping) else None
        if not isinstance(name, str) or not _SAFE_NAME.match(name):
            raise RunnerError(f"not a fake runner handle: {handle!r}")
        return os.path.join(self.state_dir, f"{name}.json")

    def _read(self, handle: Handle) -> dict[str, Any] | None:
        try:
            with open(self._path(handle), encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def _write(self, path: str, record: Mapping[str, Any], exclusive: bool = False) -> None:
        """Atomically: readers see the old record or the new one, never half of one."""
        tmp = os.path.join(self.state_dir, f".{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
            if exclusive:
                os.link(tmp, path)  # fails if it exists: create-if-absent, atomically
            else:
                os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)


def from_settings(settings: Mapping[str, Any]) -> FakeRunner:
    """``root`` (the daemon's root URL), ``state_dir`` (or ``work_dir``), optional ``clock``."""
    if "root" not in settings:
        raise RunnerError("the fake runner needs settings['root'] (the daemon's root URL)")
    work_dir = settings.get("work_dir")
    state_dir = settings.get("state_dir") or (work_dir and os.path.join(work_dir, "fake-attempts"))
    if not state_dir:
        raise RunnerError("the fake runner needs settings['state_dir'] (or 'work_dir')")
    return FakeRunner(settings["root"], str(state_dir), settings.get("clock") or time.time)

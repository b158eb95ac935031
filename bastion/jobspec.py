"""The job spec: the wire format users write into ``ROOT/jobs/active/<name>``.

Schema version 1 is AXLearn's ``serialize_jobspec`` JSON. We keep fields we do not know
(so a newer client's spec round-trips through an older daemon) and reject wrong types with
an error that names the field, instead of skipping the spec silently as AXLearn does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
MAX_NAME_LENGTH = 63
# First character alphanumeric: names starting with "." or "_" are reserved for Bastion's own
# objects (temporary files, the daemon log), so they can never collide with a job.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Cleanup output lives at logs/<name>.cleanup, so no job may own that name.
_RESERVED_SUFFIX = ".cleanup"
_AXLEARN_TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 1, 5, 5
# Bounds on what a bucket writer can make the daemon parse. A real spec is a few KiB and nests
# a few levels; without them a deep spec crashed json (RecursionError) and a huge one cost
# memory every cycle.
MAX_SPEC_BYTES = 1 << 20
MAX_DEPTH = 32  # nested JSON objects and arrays
MAX_COUNT = 2**53  # resource counts and versions: exact as floats, which the scheduler uses
MAX_SHOWN = 80  # characters of a user's value that an error message echoes
MAX_MESSAGE = 1000


class SpecError(ValueError):
    """A spec that cannot be accepted; the message names the field and the fix.

    The message becomes a job's reason, shown by `bastion list` and stored in its state, so it
    is bounded whatever the user wrote (values are shortened by ``show`` where they are echoed;
    this cap is the backstop)."""

    def __init__(self, message: str) -> None:
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        super().__init__(message)


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """``text``, or its first ``limit`` characters and its length."""
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} characters)"


def show(value: Any, limit: int = MAX_SHOWN) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters plus its length."""
    try:
        text = repr(value)
    except ValueError:  # an integer over Python's 4,300-digit conversion limit
        return f"<an integer of {value.bit_length()} bits>"
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, str | bytes | list | dict) else len(text)
    return f"{text[:limit]}…({size} characters)"


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a safe job name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "job name must be a non-empty string"
    if len(name) > MAX_NAME_LENGTH:
        return (
            f"job name {show(name, MAX_NAME_LENGTH)} is {len(name)} characters long; "
            f"the limit is {MAX_NAME_LENGTH}"
        )
    if not _NAME_RE.fullmatch(name):
        return (
            f"job name {show(name)} is not a safe identifier: use letters, digits, '-', '_' "
            "and '.', starting with a letter or digit"
        )
    if name.endswith(_RESERVED_SUFFIX):
        return f"job name {show(name)} ends with the reserved suffix {_RESERVED_SUFFIX!r}"
    return None


def check_name(name: str) -> str:
    """Return ``name`` or raise SpecError saying why it is unsafe."""
    problem = name_problem(name)
    if problem:
        raise SpecError(problem)
    return name


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def parse_time(value: Any, field_name: str) -> dt.datetime:
    """Parse AXLearn's "%Y-%m-%d %H:%M:%S.%f" or any ISO-8601 time; naive means UTC."""
    if not isinstance(value, str):
        raise SpecError(f"field {field_name}: expected a time string, got {type(value).__name__}")
    try:
        try:
            parsed = dt.datetime.strptime(value, _AXLEARN_TIME_FORMAT)
        except ValueError:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        if parsed.tzinfo is not None:  # may leave the range of years 1..9999: OverflowError
            parsed = parsed.astimezone(dt.UTC).replace(tzinfo=None)
    except (ValueError, OverflowError):
        raise SpecError(
            f"field {field_name}: {show(value)} is not a time between years 1 and 9999 (UTC); "
            "write e.g. '2026-01-01 12:00:00.000000'"
        ) from None
    return parsed


def format_time(value: dt.datetime) -> str:
    """AXLearn's format; isoformat, unlike strftime's %Y, pads years before 1000 to 4 digits
    (so every time it writes parses back)."""
    return value.isoformat(sep=" ", timespec="microseconds")


def parse_resources(text: str) -> dict[str, int]:
    """Parse the CLI form ``v4=8,cpu=4`` into a resources mapping."""
    resources: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, count = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"resources: {item!r} is not TYPE=COUNT (e.g. v4=8,cpu=4)")
        try:
            resources[key.strip()] = int(count)
        except ValueError:
            raise SpecError(f"resources: {key.strip()}={count!r} is not an integer count") from None
    return _check_resources(resources, "metadata.resources")


def _check_resources(value: Any, field_name: str) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise SpecError(
            f"field {field_name}: expected an object of type -> count, e.g. {{'v4': 8}}"
        )
    for key, count in value.items():
        where = f"field {field_name}.{shorten(str(key))}"
        if not isinstance(count, int) or isinstance(count, bool):
            raise SpecError(f"{where}: expected an integer count, got {show(count)}")
        if count < 0:
            raise SpecError(f"{where}: count {show(count)} must not be negative")
        if count > MAX_COUNT:
            raise SpecError(f"{where}: count {show(count)} is over the limit of {MAX_COUNT}")
    return {str(k): int(v) for k, v in value.items() if v}


def _require(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], prefix: str) -> Any:
    if key not in data:
        raise SpecError(f"field {prefix}{key} is missing")
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        expected = (
            kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        )
        raise SpecError(
            f"field {prefix}{key}: expected {expected}, got {type(value).__name__} {show(value)}"
        )
    if isinstance(value, str):
        _check_text(value, prefix + key)
    return value


def _check_text(value: str, field_name: str) -> str:
    """Strings reach a shell, an environment or a container API: no NUL, valid Unicode."""
    if "\x00" in value:
        raise SpecError(f"field {field_name}: contains a NUL character; remove it")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise SpecError(
            f"field {field_name}: is not valid Unicode (an unpaired surrogate such as \\ud800)"
        ) from None
    return value


def _optional(data: Mapping[str, Any], key: str, kind: type, prefix: str) -> Any:
    if data.get(key) is None:
        return None
    return _require(data, key, kind, prefix)


@dataclass
class JobMetadata:
    user_id: str
    project_id: str
    creation_time: dt.datetime
    resources: dict[str, int] = field(default_factory=dict)
    priority: int = DEFAULT_PRIORITY
    job_id: str | None = None
    version: int | None = None
    # Who wrote this version with `bastion update` (None: the submitter, or a client that does
    # not say). Written only when set, so specs without it (AXLearn's, older clients') keep
    # their bytes and digest; AXLearn's reader drops it as an unknown metadata key.
    updated_by: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # fields we do not interpret, kept

    def to_json(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "project_id": self.project_id,
            "creation_time": format_time(self.creation_time),
            "resources": dict(self.resources),
            "priority": self.priority,
            "job_id": self.job_id,
            "version": self.version,
            **({"updated_by": self.updated_by} if self.updated_by is not None else {}),
            **self.extra,
        }

    @classmethod
    def from_json(cls, data: Any) -> JobMetadata:
        if not isinstance(data, Mapping):
            raise SpecError("field metadata: expected an object")
        p = "metadata."
        priority = _optional(data, "priority", int, p)
        priority = DEFAULT_PRIORITY if priority is None else priority
        if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise SpecError(
                f"field metadata.priority: {show(priority)} is out of range; "
                f"use {MIN_PRIORITY} (highest) to {MAX_PRIORITY} (lowest)"
            )
        known = {
            "user_id",
            "project_id",
            "creation_time",
            "resources",
            "priority",
            "job_id",
            "version",
            "updated_by",
        }
        version = _optional(data, "version", int, p)
        if version is not None and not 0 <= version <= MAX_COUNT:
            raise SpecError(f"field metadata.version: {show(version)} must be 0 to {MAX_COUNT}")
        return cls(
            user_id=_require(data, "user_id", str, p),
            project_id=_require(data, "project_id", str, p),
            creation_time=parse_time(_require(data, "creation_time", str, p), p + "creation_time"),
            resources=_check_resources(data.get("resources") or {}, p + "resources"),
            priority=priority,
            job_id=_optional(data, "job_id", str, p),
            version=version,
            updated_by=_optional(data, "updated_by", str, p),
            extra={k: v for k, v in data.items() if k not in known},
        )


@dataclass
class JobSpec:
    name: str
    command: str
    metadata: JobMetadata
    cleanup_command: str | None = None
    env_vars: dict[str, str] | None = None
    version: int = SCHEMA_VERSION
    runner: dict[str, Any] | None = None  # {"kind": "docker", "image": ...}; None: the default
    bundle: dict[str, Any] | None = None  # the code bundle's record (bundlers.Bundle.to_json)
    # The warning before every stop Bastion decides: the signal sent first ("TERM", "USR1",
    # ...; None: TERM) and the seconds until SIGKILL (None: the daemon's setting).
    stop_signal: str | None = None
    grace_seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def runner_kind(self) -> str | None:
        return (self.runner or {}).get("kind")

    @property
    def runner_options(self) -> dict[str, Any]:
        return {k: v for k, v in (self.runner or {}).items() if k != "kind"}

    def validate(self) -> JobSpec:
        """Raise SpecError if the spec could not be serialized and loaded back, or could never
        start (ExecLimitError: its command and environment are over exec's limits here). The
        daemon does not apply the second check to what it reads (its host's limit may differ):
        a spec written past it fails at its first start with the kernel's reason."""
        JobSpec.from_json(self.to_json())
        commands = [c for c in (self.command, self.cleanup_command) if c]
        problem = exec_limit_problem(
            self.env_vars or {},
            [max(commands, key=len, default="")],
            reserve=EXEC_RESERVE_BYTES,
            in_spec=True,
        )
        if problem:
            raise ExecLimitError(problem)
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "name": self.name,
            "command": self.command,
            "cleanup_command": self.cleanup_command,
            "env_vars": dict(self.env_vars) if self.env_vars is not None else None,
            "metadata": self.metadata.to_json(),
            **({"runner": dict(self.runner)} if self.runner else {}),
            **({"bundle": dict(self.bundle)} if self.bundle else {}),
            **({"stop_signal": self.stop_signal} if self.stop_signal is not None else {}),
            **({"grace_seconds": self.grace_seconds} if self.grace_seconds is not None else {}),
            **self.extra,
        }

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), indent=1, sort_keys=False).encode()

    def digest(self) -> str:
        """Identity of what would run: changes when the user updates the job."""
        canonical = json.dumps(self.to_json(), sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def identity(self) -> str:
        """Distinguishes this submission from an earlier job of the same name."""
        return self.metadata.job_id or format_time(self.metadata.creation_time)

    @classmethod
    def from_json(cls, data: Any) -> JobSpec:
        if not isinstance(data, Mapping):
            raise SpecError("spec: expected a JSON object at the top level")
        version = _require(data, "version", int, "")
        if version != SCHEMA_VERSION:
            raise SpecError(
                f"field version: schema version {show(version)} is not supported; this Bastion "
                f"reads version {SCHEMA_VERSION}"
            )
        env = _optional(data, "env_vars", dict, "")
        if env is not None:
            for key, value in env.items():
                where = f"env_vars.{shorten(str(key))}"
                if not key or "=" in key:
                    raise SpecError(f"field {where}: a variable name must be non-empty, no '='")
                _check_text(key, where)
                if not isinstance(value, str):
                    raise SpecError(f"field {where}: expected a string value, got {show(value)}")
                _check_text(value, where)
        known = {
            "version",
            "name",
            "command",
            "cleanup_command",
            "env_vars",
            "metadata",
            "runner",
            "bundle",
            "stop_signal",
            "grace_seconds",
        }
        return cls(
            name=check_name(_require(data, "name", str, "")),
            command=_check_command(_require(data, "command", str, ""), "command"),
            metadata=JobMetadata.from_json(_require(data, "metadata", dict, "")),
            cleanup_command=_check_command(
                _optional(data, "cleanup_command", str, ""), "cleanup_command"
            ),
            env_vars=env,
            version=version,
            runner=_check_runner(data.get("runner")),
            bundle=_check_bundle(data.get("bundle")),
            stop_signal=check_stop_signal(data.get("stop_signal"), "field stop_signal"),
            grace_seconds=check_grace_seconds(data.get("grace_seconds"), "field grace_seconds"),
            extra={k: v for k, v in data.items() if k not in known},
        )

    @classmethod
    def loads(cls, raw: bytes | str) -> JobSpec:
        """Parse a spec; any input at all either loads or raises SpecError with a short reason
        (the daemon rejects the job with it; anything else would be retried every cycle)."""
        text = _spec_text(raw)
        try:
            return cls.from_json(json.loads(text))
        except SpecError:
            raise
        except json.JSONDecodeError as e:
            raise SpecError(f"spec is not valid JSON: {e}") from None
        except (ValueError, TypeError, OverflowError, RecursionError) as e:
            # e.g. an integer over Python's 4,300-digit limit (ValueError)
            reason = str(e).split(";")[0].split(":")[0]
            raise SpecError(f"spec is not acceptable JSON: {shorten(reason, 200)}") from None


# A JSON string (with its escapes) or one bracket: enough to measure nesting without parsing.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _spec_text(raw: bytes | str) -> str:
    """The spec's text, refused before parsing when it is too large or nests too deeply."""
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode(errors="surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise SpecError(
            f"spec is {size:,} bytes; the limit is {MAX_SPEC_BYTES:,} bytes (1 MiB): "
            "keep large data elsewhere and pass its location"
        )
    if isinstance(raw, bytes):
        try:  # as json.loads decodes bytes (UTF-8, -16 or -32)
            raw = raw.decode(json.detect_encoding(raw), "surrogatepass")
        except UnicodeDecodeError as e:
            raise SpecError(f"spec is not valid JSON: not UTF-8 text ({e.reason})") from None
    if raw.count("[") + raw.count("{") > MAX_DEPTH:
        depth = 0
        for token in _JSON_TOKEN.finditer(raw):
            bracket = token.group()
            if bracket in ("[", "{"):
                depth += 1
                if depth > MAX_DEPTH:
                    raise SpecError(f"spec nests objects and arrays deeper than {MAX_DEPTH} levels")
            elif bracket in ("]", "}"):
                depth -= 1
    return raw


MAX_COMMAND_BYTES = 100 << 10  # one argv string may not exceed 128 KiB (MAX_ARG_STRLEN)
MAX_ARG_STRLEN = 131072  # Linux: the most bytes of one argv or environment string, NUL included
# Kept free of a spec's command and env_vars under the platform's ARG_MAX: what the daemon adds
# to a job's environment (its own environment, the BASTION_* variables, AXLearn's serialized
# spec of at most 64 KiB) and the wrapper's own arguments.
EXEC_RESERVE_BYTES = 256 << 10
_POINTER_BYTES = 8  # each argv and envp entry also costs its pointer


class ExecLimitError(SpecError):
    """The spec's command and environment are over what ``exec`` accepts (per string or in
    all): no start could ever succeed, so the client refuses it at submit."""


def exec_arg_max() -> int:
    """This host's ARG_MAX (``sysconf(SC_ARG_MAX)``: on Linux a quarter of the stack limit),
    or 2 MiB where the platform does not say."""
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError, AttributeError):
        value = -1
    return value if value > 0 else 2 << 20


def exec_limit_problem(
    env: Mapping[str, str],
    args: Sequence[str],
    reserve: int = 0,
    arg_max: int | None = None,
    in_spec: bool = False,
) -> str | None:
    """Why ``exec`` would refuse ``args`` with ``env`` (E2BIG), naming the variable; None when
    it fits. One string (``NAME=VALUE``, or an argument) may be at most MAX_ARG_STRLEN bytes;
    all strings and their pointers together at most ARG_MAX less ``reserve``. ``in_spec``:
    name variables as fields of the spec (``env_vars.NAME``)."""

    def name(key: str) -> str:
        key = shorten(key, 40)
        return f"field env_vars.{key}" if in_spec else f"environment variable {key}"

    fix = (
        "put large data in a file (in the job's bundle or the bucket) and pass its path in "
        "the variable instead"
    )
    sizes = {
        key: len(key.encode(errors="replace")) + len(value.encode(errors="replace")) + 2
        for key, value in env.items()
    }
    for key, size in sizes.items():
        if size > MAX_ARG_STRLEN:
            return (
                f"{name(key)}: {size:,} bytes (NAME=VALUE); exec takes at most "
                f"{MAX_ARG_STRLEN:,} bytes for one environment variable (Linux's "
                f"MAX_ARG_STRLEN): {fix}"
            )
    arg_sizes = [len(arg.encode(errors="replace")) + 1 for arg in args]
    for size in arg_sizes:
        if size > MAX_ARG_STRLEN:
            return (
                f"an argument of {size:,} bytes (the command) is over exec's limit of "
                f"{MAX_ARG_STRLEN:,} bytes for one (Linux's MAX_ARG_STRLEN): put the long part "
                "in a file of the bundle and run that"
            )
    total = sum(sizes.values()) + sum(arg_sizes) + _POINTER_BYTES * (len(sizes) + len(args) + 2)
    arg_max = arg_max or exec_arg_max()
    limit = arg_max - reserve
    if total <= limit:
        return None
    largest = sorted(sizes, key=lambda k: -sizes[k])[:3]
    named = ", ".join(f"{name(k).removeprefix('field ')} ({sizes[k]:,} bytes)" for k in largest)
    kept = f", less {reserve:,} kept for what the daemon adds" if reserve else ""
    return (
        f"{'field env_vars: ' if in_spec else ''}"
        f"the command and environment are {total:,} bytes in all; exec takes at most "
        f"{limit:,} (this host's ARG_MAX of {arg_max:,}{kept}); the largest: "
        f"{named or 'none'}: {fix}"
    )


def _check_command(value: str | None, field_name: str) -> str | None:
    """A command is one argument of ``bash -c``: the kernel refuses one over 128 KiB, so a
    longer one could never start. Refused at submit, with its size and the fix."""
    if value is not None and len(value.encode(errors="replace")) > MAX_COMMAND_BYTES:
        raise SpecError(
            f"field {field_name}: the command is {len(value.encode(errors='replace')):,} bytes; "
            f"the limit is {MAX_COMMAND_BYTES:,}: put the long part in a file of the bundle "
            "(or in env_vars) and run that"
        )
    return value


def _check_bundle(value: Any) -> dict[str, Any] | None:
    """The optional ``bundle`` record: kind, uri and a ``sha256:`` digest at least."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError("field bundle: expected the bundle record object that launch writes")
    for key in ("kind", "uri", "digest"):
        if not isinstance(value.get(key), str) or not value.get(key):
            raise SpecError(f"field bundle.{key}: missing; relaunch to make the bundle again")
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", value["digest"]):
        raise SpecError(
            f"field bundle.digest: {show(value['digest'])} is not sha256:<64 hex digits>"
        )
    return dict(value)


def _check_runner(value: Any) -> dict[str, Any] | None:
    """The optional ``runner`` object: ``{"kind": KIND, OPTION: VALUE, ...}`` (JSON values)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError('field runner: expected an object such as {"kind": "docker", "image": IMG}')
    kind = value.get("kind")
    if not isinstance(kind, str) or not re.fullmatch(r"[a-z][a-z0-9-]{0,31}", kind):
        raise SpecError(
            f"field runner.kind: {show(kind)} is not a runner kind; use e.g. 'local' or 'docker'"
        )
    for key in value:
        if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", key):
            raise SpecError(f"field runner: option name {show(key)} must be lower_snake_case")
    return dict(value)


# Signals a job may choose to be warned with (bash's names, without "SIG"); KILL and STOP
# cannot be caught, so they would be no warning at all.
STOP_SIGNALS = ("TERM", "INT", "HUP", "QUIT", "USR1", "USR2")
MAX_GRACE_SECONDS = 24 * 3600.0


def check_stop_signal(value: Any, where: str) -> str | None:
    """``TERM``, ``SIGUSR1``, ``usr1`` -> the bare upper-case name; SpecError naming ``where``."""
    if value is None:
        return None
    name = str(value).upper().removeprefix("SIG") if isinstance(value, str) else ""
    if name not in STOP_SIGNALS:
        raise SpecError(
            f"{where}: {show(value)} is not a signal a job can be warned with; use one of "
            f"{', '.join(STOP_SIGNALS)} (KILL and STOP cannot be caught)"
        )
    return name


def check_grace_seconds(value: Any, where: str) -> float | None:
    """Seconds between the stop signal and SIGKILL: a number from 0 to a day."""
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not 0 <= float(value) <= MAX_GRACE_SECONDS:
        raise SpecError(
            f"{where}: {show(value)} is not a grace period; give seconds from 0 to "
            f"{MAX_GRACE_SECONDS:g} (e.g. 60)"
        )
    return float(value)


def new_jobspec(
    *,
    name: str,
    command: str,
    user_id: str,
    project_id: str,
    resources: Mapping[str, int] | None = None,
    priority: int = DEFAULT_PRIORITY,
    cleanup_command: str | None = None,
    env_vars: Mapping[str, str] | None = None,
    creation_time: dt.datetime | None = None,
    runner: Mapping[str, Any] | None = None,
    bundle: Mapping[str, Any] | None = None,
    stop_signal: str | None = None,
    grace_seconds: float | None = None,
) -> JobSpec:
    """Build and validate a spec; raises SpecError naming the bad field."""
    spec = JobSpec(
        name=name,
        command=command,
        cleanup_command=cleanup_command,
        env_vars=dict(env_vars) if env_vars else None,
        runner=dict(runner) if runner else None,
        bundle=dict(bundle) if bundle else None,
        stop_signal=check_stop_signal(stop_signal, "stop_signal"),
        grace_seconds=check_grace_seconds(grace_seconds, "grace_seconds"),
        metadata=JobMetadata(
            user_id=user_id,
            project_id=project_id,
            creation_time=creation_time or utcnow(),
            resources=dict(resources or {}),
            priority=priority,
            job_id=str(uuid.uuid4()),
        ),
    )
    return spec.validate()


# -- who asked: requests and updates ---------------------------------------------------------
#
# A cancel request (``ROOT/jobs/user_states/<name>``) is AXLearn's user state (only
# ``"status": "CANCELLING"`` matters) plus fields AXLearn ignores: ``job_identity``
# (the submission it targets), ``requested_by`` (who asked), ``user_id`` (the same, for daemons
# that predate ``requested_by``) and ``time``. An update says who made it in the spec itself
# (``metadata.updated_by``). Nothing in the bucket is authenticated: these name who a client
# said it was, for the history; the ownership check is the client's (launch/api.py).

UNKNOWN_USER = "unknown"
MAX_USER_SHOWN = 64


def user_label(value: Any) -> str:
    """A user id from the bucket as one short printable word for a history line: a writer of
    the bucket must not be able to forge history lines with a newline in their name."""
    if not isinstance(value, str) or not value.strip():
        return UNKNOWN_USER
    text = "".join(c if c.isprintable() else "?" for c in value.strip())
    return shorten(text, MAX_USER_SHOWN)


def requester(request: Mapping[str, Any]) -> str:
    """Who asked for a request: ``requested_by``, else ``user_id`` (what clients wrote before
    ``requested_by``), else ``unknown`` (AXLearn's requests say nobody)."""
    return user_label(request.get("requested_by") or request.get("user_id"))


def cancel_request(job_identity: str, requested_by: str, now: float) -> dict[str, Any]:
    """The cancel request a client writes (see above); AXLearn's daemon honours it too."""
    return {
        "status": "CANCELLING",
        "job_identity": job_identity,
        "requested_by": requested_by,
        "user_id": requested_by,
        "time": now,
    }


_NOT_CHANGES = {"version", "updated_by"}  # bookkeeping of an update, not what it changed


def spec_changes(old: JobSpec, new: JobSpec) -> list[str]:
    """The fields that differ between two versions of a spec (``command``, ``env_vars``,
    ``metadata.resources``, ...), for the history's "spec updated by ...: command changed"."""
    before, after = old.to_json(), new.to_json()
    changed = [
        key
        for key in dict.fromkeys([*before, *after])
        if key != "metadata" and before.get(key) != after.get(key)
    ]
    meta_before, meta_after = before["metadata"], after["metadata"]
    changed += [
        f"metadata.{key}"
        for key in dict.fromkeys([*meta_before, *meta_after])
        if key not in _NOT_CHANGES and meta_before.get(key) != meta_after.get(key)
    ]
    return [shorten(str(key), 40) for key in changed]

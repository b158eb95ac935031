"""The job spec: the wire format users write into ``ROOT/jobs/active/<name>``.

Schema version 1 is AXLearn's ``serialize_jobspec`` JSON. We keep fields we do not know
(so a newer client's spec round-trips through an older daemon) and reject wrong types with
an error that names the field, instead of skipping the spec silently as AXLearn does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bastion.exec_limits import (
    EXEC_RESERVE_BYTES,
    MAX_ARG_STRLEN,
    ExecLimitError,
    exec_arg_max,
    exec_limit_problem,
)
from bastion.interning import interned, shared_counts
from bastion.spec_errors import MAX_MESSAGE, MAX_SHOWN, SpecError, shorten, show
from bastion.spec_fields import (
    MAX_COMMAND_BYTES,
    MAX_COUNT,
    MAX_DEPTH,
    MAX_SPEC_BYTES,
    check_bundle,
    check_command,
    check_grace_seconds,
    check_resources,
    check_runner,
    check_stop_signal,
    check_text,
    format_time,
    optional,
    parse_resources,
    parse_time,
    require,
    spec_text,
    utcnow,
)
from bastion.spec_names import MAX_NAME_LENGTH, check_name, name_problem
from bastion.spec_scheduling import (
    check_after,
    check_after_any,
    check_group,
    check_spec_time_limit,
)
from bastion.timelimits import parse_time_limit

__all__ = [  # re-exported: callers name these from the spec's module
    "EXEC_RESERVE_BYTES",
    "MAX_ARG_STRLEN",
    "MAX_COMMAND_BYTES",
    "MAX_DEPTH",
    "MAX_MESSAGE",
    "MAX_NAME_LENGTH",
    "MAX_SHOWN",
    "MAX_SPEC_BYTES",
    "ExecLimitError",
    "SpecError",
    "check_name",
    "exec_arg_max",
    "exec_limit_problem",
    "format_time",
    "name_problem",
    "parse_resources",
    "parse_time",
    "show",
    "utcnow",
]

SCHEMA_VERSION = 1
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 1, 5, 5


# The fields each object interprets; any other key is kept as it came (``extra``).
_METADATA_KEYS = frozenset(
    {
        "user_id",
        "project_id",
        "creation_time",
        "resources",
        "priority",
        "job_id",
        "version",
        "updated_by",
    }
)
_SPEC_KEYS = frozenset(
    {
        "version",
        "name",
        "command",
        "cleanup_command",
        "env_vars",
        "metadata",
        "runner",
        "bundle",
        "time_limit",
        "after",
        "after_any",
        "group",
        "stop_signal",
        "grace_seconds",
    }
)


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
        priority = optional(data, "priority", int, p)
        priority = DEFAULT_PRIORITY if priority is None else priority
        if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise SpecError(
                f"field metadata.priority: {show(priority)} is out of range; "
                f"use {MIN_PRIORITY} (highest) to {MAX_PRIORITY} (lowest)"
            )
        version = optional(data, "version", int, p)
        if version is not None and not 0 <= version <= MAX_COUNT:
            raise SpecError(f"field metadata.version: {show(version)} must be 0 to {MAX_COUNT}")
        return cls(
            user_id=require(data, "user_id", str, p),
            project_id=require(data, "project_id", str, p),
            creation_time=parse_time(require(data, "creation_time", str, p), p + "creation_time"),
            resources=shared_counts(check_resources(data.get("resources") or {}, p + "resources")),
            priority=priority,
            job_id=optional(data, "job_id", str, p),
            version=version,
            updated_by=optional(data, "updated_by", str, p),
            extra={k: v for k, v in data.items() if k not in _METADATA_KEYS},
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
    # Slurm's job semantics (bastion/spec_scheduling.py): seconds of running time allowed;
    # the jobs it waits for (to succeed, or with after_any to end at all); its array or sweep.
    time_limit: float | None = None
    after: list[str] | None = None
    after_any: bool = False
    group: dict[str, Any] | None = None
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
            **self._scheduling_json(),
            **({"stop_signal": self.stop_signal} if self.stop_signal is not None else {}),
            **({"grace_seconds": self.grace_seconds} if self.grace_seconds is not None else {}),
            **self.extra,
        }

    def _scheduling_json(self) -> dict[str, Any]:
        """The scheduling fields that are set (unset ones are not written: older specs keep
        their bytes and digest)."""
        data: dict[str, Any] = {}
        if self.time_limit is not None:
            data["time_limit"] = self.time_limit
        if self.after:
            data["after"] = list(self.after)
        if self.after_any:
            data["after_any"] = True
        if self.group:
            data["group"] = dict(self.group)
        return data

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
        version = require(data, "version", int, "")
        if version != SCHEMA_VERSION:
            raise SpecError(
                f"field version: schema version {show(version)} is not supported; this Bastion "
                f"reads version {SCHEMA_VERSION}"
            )
        env = optional(data, "env_vars", dict, "")
        if env is not None:
            for key, value in env.items():
                where = f"env_vars.{shorten(str(key))}"
                if not key or "=" in key:
                    raise SpecError(f"field {where}: a variable name must be non-empty, no '='")
                check_text(key, where)
                if not isinstance(value, str):
                    raise SpecError(f"field {where}: expected a string value, got {show(value)}")
                check_text(value, where)
        return cls(
            name=check_name(require(data, "name", str, "")),
            command=check_command(require(data, "command", str, ""), "command"),
            metadata=JobMetadata.from_json(require(data, "metadata", dict, "")),
            cleanup_command=check_command(
                optional(data, "cleanup_command", str, ""), "cleanup_command"
            ),
            env_vars=env,
            version=version,
            runner=check_runner(data.get("runner")),
            bundle=check_bundle(data.get("bundle")),
            time_limit=check_spec_time_limit(data.get("time_limit")),
            after=check_after(data.get("after")),
            after_any=check_after_any(data.get("after_any")),
            group=check_group(data.get("group")),
            stop_signal=check_stop_signal(data.get("stop_signal"), "field stop_signal"),
            grace_seconds=check_grace_seconds(data.get("grace_seconds"), "field grace_seconds"),
            extra={k: v for k, v in data.items() if k not in _SPEC_KEYS},
        )

    @classmethod
    def loads(cls, raw: bytes | str) -> JobSpec:
        """Parse a spec; any input at all either loads or raises SpecError with a short reason
        (the daemon rejects the job with it; anything else would be retried every cycle)."""
        text = spec_text(raw)
        try:
            return cls.from_json(interned(json.loads(text)))
        except SpecError:
            raise
        except json.JSONDecodeError as e:
            raise SpecError(f"spec is not valid JSON: {e}") from None
        except (ValueError, TypeError, OverflowError, RecursionError) as e:
            # e.g. an integer over Python's 4,300-digit limit (ValueError)
            reason = str(e).split(";")[0].split(":")[0]
            raise SpecError(f"spec is not acceptable JSON: {shorten(reason, 200)}") from None


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
    time_limit: float | str | None = None,
    after: str | list[str] | None = None,
    after_any: bool = False,
    group: Mapping[str, Any] | None = None,
    stop_signal: str | None = None,
    grace_seconds: float | None = None,
) -> JobSpec:
    """Build and validate a spec; raises SpecError naming the bad field. ``time_limit``:
    seconds, or text as ``--time`` takes it ("2h", "1-00:00:00"); ``after``: a name, a
    comma-separated list or a list of names."""
    if isinstance(time_limit, str):
        time_limit = parse_time_limit(time_limit, "time_limit")
    if isinstance(after, str):
        after = [part.strip() for part in after.split(",") if part.strip()]
    spec = JobSpec(
        name=name,
        command=command,
        cleanup_command=cleanup_command,
        env_vars=dict(env_vars) if env_vars else None,
        runner=dict(runner) if runner else None,
        bundle=dict(bundle) if bundle else None,
        time_limit=time_limit,
        after=list(after) if after else None,
        after_any=after_any,
        group=dict(group) if group else None,
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

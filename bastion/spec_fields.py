"""Checks and parsers for a spec's fields: times, resources, text, commands, the runner and
bundle objects, and the raw bytes before JSON parses them. Each raises SpecError naming the
field and the fix."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any

from bastion.spec_errors import SpecError, shorten, show

_AXLEARN_TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
# Exactly what format_time writes: fromisoformat reads it as strptime does, 20x faster (a
# `bastion list` of 10,000 jobs spent half a second in strptime).
_CANONICAL_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}")
# Bounds on what a bucket writer can make the daemon parse. A real spec is a few KiB and nests
# a few levels; without them a deep spec crashed json (RecursionError) and a huge one cost
# memory every cycle.
MAX_SPEC_BYTES = 1 << 20
MAX_DEPTH = 32  # nested JSON objects and arrays
MAX_COUNT = 2**53  # resource counts and versions: exact as floats, which the scheduler uses
MAX_COMMAND_BYTES = 100 << 10  # one argv string may not exceed 128 KiB (MAX_ARG_STRLEN)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def parse_time(value: Any, field_name: str) -> dt.datetime:
    """Parse AXLearn's "%Y-%m-%d %H:%M:%S.%f" or any ISO-8601 time; naive means UTC."""
    if not isinstance(value, str):
        raise SpecError(f"field {field_name}: expected a time string, got {type(value).__name__}")
    if _CANONICAL_TIME.fullmatch(value):
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError:
            pass  # out of range (a 13th month): reported below, as strptime would
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
    return check_resources(resources, "metadata.resources")


def check_resources(value: Any, field_name: str) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise SpecError(
            f"field {field_name}: expected an object of type -> count, e.g. {{'v4': 8}}"
        )
    for key, count in value.items():
        if type(count) is int and 0 <= count <= MAX_COUNT:
            continue  # (the common case, checked first: a restart checks every spec)
        where = f"field {field_name}.{shorten(str(key))}"
        if not isinstance(count, int) or isinstance(count, bool):
            raise SpecError(f"{where}: expected an integer count, got {show(count)}")
        if count < 0:
            raise SpecError(f"{where}: count {show(count)} must not be negative")
        if count > MAX_COUNT:
            raise SpecError(f"{where}: count {show(count)} is over the limit of {MAX_COUNT}")
    return {str(k): int(v) for k, v in value.items() if v}


def require(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], prefix: str) -> Any:
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
        check_text(value, prefix + key)
    return value


def check_text(value: str, field_name: str) -> str:
    """Strings reach a shell, an environment or a container API: no NUL, valid Unicode."""
    if "\x00" in value:
        raise SpecError(f"field {field_name}: contains a NUL character; remove it")
    if value.isascii():  # no surrogate possible: nothing to encode
        return value
    try:
        value.encode()
    except UnicodeEncodeError:
        raise SpecError(
            f"field {field_name}: is not valid Unicode (an unpaired surrogate such as \\ud800)"
        ) from None
    return value


def optional(data: Mapping[str, Any], key: str, kind: type, prefix: str) -> Any:
    if data.get(key) is None:
        return None
    return require(data, key, kind, prefix)


# A JSON string (with its escapes) or one bracket: enough to measure nesting without parsing.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def spec_text(raw: bytes | str) -> str:
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


def check_command(value: str | None, field_name: str) -> str | None:
    """A command is one argument of ``bash -c``: the kernel refuses one over 128 KiB, so a
    longer one could never start. Refused at submit, with its size and the fix."""
    if value is not None and len(value.encode(errors="replace")) > MAX_COMMAND_BYTES:
        raise SpecError(
            f"field {field_name}: the command is {len(value.encode(errors='replace')):,} bytes; "
            f"the limit is {MAX_COMMAND_BYTES:,}: put the long part in a file of the bundle "
            "(or in env_vars) and run that"
        )
    return value


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_RUNNER_KIND = re.compile(r"[a-z][a-z0-9-]{0,31}")
_OPTION_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def check_bundle(value: Any) -> dict[str, Any] | None:
    """The optional ``bundle`` record: kind, uri and a ``sha256:`` digest at least."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError("field bundle: expected the bundle record object that launch writes")
    for key in ("kind", "uri", "digest"):
        if not isinstance(value.get(key), str) or not value.get(key):
            raise SpecError(f"field bundle.{key}: missing; relaunch to make the bundle again")
    if not _DIGEST.fullmatch(value["digest"]):
        raise SpecError(
            f"field bundle.digest: {show(value['digest'])} is not sha256:<64 hex digits>"
        )
    return dict(value)


def check_runner(value: Any) -> dict[str, Any] | None:
    """The optional ``runner`` object: ``{"kind": KIND, OPTION: VALUE, ...}`` (JSON values)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError('field runner: expected an object such as {"kind": "docker", "image": IMG}')
    kind = value.get("kind")
    if not isinstance(kind, str) or not _RUNNER_KIND.fullmatch(kind):
        raise SpecError(
            f"field runner.kind: {show(kind)} is not a runner kind; use e.g. 'local' or 'docker'"
        )
    for key in value:
        if not isinstance(key, str) or not _OPTION_NAME.fullmatch(key):
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

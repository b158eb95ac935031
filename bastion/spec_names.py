"""Job names: what makes one safe as a key in the bucket, a file name and a label."""

from __future__ import annotations

import re

from bastion.spec_errors import SpecError, show

MAX_NAME_LENGTH = 63
# First character alphanumeric: names starting with "." or "_" are reserved for Bastion's own
# objects (temporary files, the daemon log), so they can never collide with a job.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Cleanup output lives at logs/<name>.cleanup, so no job may own that name.
_RESERVED_SUFFIX = ".cleanup"


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

"""The spec's scheduling fields, Slurm's job semantics: ``time_limit`` (``--time``),
``after``/``after_any`` (``--dependency=afterok``/``afterany``) and ``group`` (an array's or
a sweep's membership and its ``%N`` limit). Each check raises SpecError naming the field and
the fix; each field is written only when set, so specs without them keep their bytes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bastion.spec_errors import SpecError, show
from bastion.spec_names import name_problem
from bastion.timelimits import check_time_limit

MAX_AFTER = 100  # dependencies of one job
MAX_GROUP_SIZE = 10_000  # members of one array or sweep
_GROUP_KEYS = {"name", "index", "size", "max_running", "kind"}


def check_after(value: Any) -> list[str] | None:
    """``after``: the names this job waits for (each must end; see ``after_any``)."""
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise SpecError(
            f"field after: expected a non-empty list of job names, got {show(value)}; "
            'e.g. ["train"]'
        )
    if len(value) > MAX_AFTER:
        raise SpecError(f"field after: {len(value)} names; a job may wait for at most {MAX_AFTER}")
    for name in value:
        problem = name_problem(name)
        if problem:
            raise SpecError(f"field after: {problem}")
    if len(set(value)) != len(value):
        raise SpecError(f"field after: {show(value)} names a job twice; give each name once")
    return list(value)


def check_after_any(value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise SpecError(f"field after_any: expected true or false, got {show(value)}")
    return value


def check_spec_time_limit(value: Any) -> float | None:
    return None if value is None else check_time_limit(value, "field time_limit")


def check_group(value: Any) -> dict[str, Any] | None:
    """``group``: ``{"name", "index", "size", "max_running", "kind"}`` of an array or sweep
    member (``max_running``: at most that many members hold capacity at once; None: no
    limit)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError(
            'field group: expected an object such as {"name": "sweep1", "index": 0, "size": 8}'
        )
    unknown = sorted(set(value) - _GROUP_KEYS)
    if unknown:
        keys = ", ".join(sorted(_GROUP_KEYS))
        raise SpecError(f"field group: unknown key {show(unknown[0])}; the keys are {keys}")
    problem = name_problem(value.get("name"))
    if problem:
        raise SpecError(f"field group.name: {problem}")
    for key in ("index", "size", "max_running"):
        number = value.get(key)
        if key == "max_running" and number is None:
            continue
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise SpecError(f"field group.{key}: expected a whole number >= 0, got {show(number)}")
        if number > MAX_GROUP_SIZE * 1000:
            raise SpecError(f"field group.{key}: {number} is out of range")
    if value.get("max_running") == 0:
        raise SpecError("field group.max_running: 0 would never run a member; give 1 or more")
    kind = value.get("kind", "array")
    if kind not in ("array", "sweep"):
        raise SpecError(f"field group.kind: {show(kind)}; use 'array' or 'sweep'")
    return dict(value)

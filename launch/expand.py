"""Arrays and sweeps, expanded in the client: one spec per member, all in one group.

``--array=0-99%8`` (also ``1,3,5``, ``0-9:2``, mixed: ``1,4-8:2%2``) gives members
``NAME-0`` .. ``NAME-99``, each with ``BASTION_ARRAY_INDEX`` (Slurm's
``SLURM_ARRAY_TASK_ID``), ``BASTION_ARRAY_ID`` (the group), ``BASTION_ARRAY_SIZE``; ``%8`` is
the group's limit, which the daemon enforces (at most 8 members hold capacity at once).

``--sweep=sweep.toml`` gives one member per point, each with the point's values as
environment variables (as Caliban's and AXLearn's sweeps pass them)::

    max_running = 4                # optional, as %N
    [axes]                         # every combination (cartesian)
    LR = [0.1, 0.01]
    BATCH = [32, 64]

or a list of points (``[[points]]`` tables, each ``NAME = value``). Every error names the
file or flag, the key and the fix, before anything is written.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import re
import tomllib
import uuid
from collections.abc import Mapping
from typing import Any

from bastion.jobspec import JobSpec, SpecError, name_problem
from bastion.spec_errors import show
from bastion.spec_scheduling import MAX_GROUP_SIZE

_PIECE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SWEEP_KEYS = ("axes", "points", "max_running")
ARRAY_FORMS = "0-99, 0-99%8, 1,3,5 or 0-9:2"


@dataclasses.dataclass(frozen=True)
class Member:
    """One member of a group: its index and the variables it gets besides the group's."""

    index: int
    env: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Expansion:
    kind: str  # "array" or "sweep"
    members: list[Member]
    max_running: int | None


def parse_array(text: str) -> Expansion:
    """``--array``'s indices and ``%N`` limit; SpecError (naming --array, the piece and the
    forms it takes) for a malformed range or one over MAX_GROUP_SIZE members, counted before
    any index is made (a range of a million costs nothing to refuse)."""
    body, _, limit_text = text.strip().partition("%")
    limit = _max_running(limit_text, "--array") if limit_text else None
    ranges = []
    total = 0
    for piece in body.split(","):
        match = _PIECE.fullmatch(piece.strip())
        if not match:
            raise SpecError(f"--array: {show(piece)} is not an index or range; write {ARRAY_FORMS}")
        first, last, step = (int(g) if g is not None else None for g in match.groups())
        last = first if last is None else last
        step = step or 1
        if last < first:
            raise SpecError(f"--array: {piece} runs backwards; write it {last}-{first}")
        total += (last - first) // step + 1
        if total > MAX_GROUP_SIZE:
            raise SpecError(
                f"--array: {text} has {total:,}+ members; the limit is {MAX_GROUP_SIZE:,} per "
                "group: split it into several arrays"
            )
        ranges.append(range(first, last + 1, step))
    indices = sorted(set(itertools.chain.from_iterable(ranges)))
    return Expansion("array", [Member(i, {}) for i in indices], limit)


def _max_running(text: Any, where: str) -> int:
    value = text
    if isinstance(text, str):
        value = int(text) if text.strip().isdigit() else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(
            f"{where}: the limit {show(text)} must be a whole number of at least 1 "
            "(at most that many members run at once)"
        )
    return value


def load_sweep(path: str) -> Expansion:
    """A sweep file's points; SpecError naming the file, the key and the fix."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise SpecError(f"--sweep={path}: cannot read it ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"--sweep={path}: not valid TOML ({e})") from None
    for key in data:
        if key not in SWEEP_KEYS:
            near = difflib.get_close_matches(key, SWEEP_KEYS, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise SpecError(
                f"{path}: unknown key {show(key)}; {hint}a sweep file has {', '.join(SWEEP_KEYS)}"
            )
    if ("axes" in data) == ("points" in data):
        raise SpecError(
            f"{path}: give either [axes] (every combination) or [[points]] (a list), not "
            f"{'both' if 'axes' in data else 'neither'}"
        )
    limit = data.get("max_running")
    limit = None if limit is None else _max_running(limit, f"{path}: max_running")
    points = _axes(path, data["axes"]) if "axes" in data else _points(path, data["points"])
    return Expansion("sweep", [Member(i, p) for i, p in enumerate(points)], limit)


def _axes(path: str, axes: Any) -> list[dict[str, str]]:
    if not isinstance(axes, Mapping) or not axes:
        raise SpecError(f"{path}: [axes] must be a table of NAME = [values], e.g. LR = [0.1, 0.01]")
    values = []
    count = 1
    for name, options in axes.items():
        _check_var(path, f"axes.{name}", name)
        if not isinstance(options, list) or not options:
            raise SpecError(
                f"{path}: axes.{name} must be a non-empty list of values, e.g. {name} = [1, 2]"
            )
        values.append([_value(path, f"axes.{name}", v) for v in options])
        count *= len(options)
        if count > MAX_GROUP_SIZE:
            raise SpecError(
                f"{path}: [axes] make {count:,}+ combinations; the limit is {MAX_GROUP_SIZE:,} "
                "per group: fewer values, or several sweeps"
            )
    names = list(axes)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]


def _points(path: str, points: Any) -> list[dict[str, str]]:
    if not isinstance(points, list) or not points or len(points) > MAX_GROUP_SIZE:
        raise SpecError(
            f"{path}: points must be 1 to {MAX_GROUP_SIZE:,} [[points]] tables of NAME = value"
        )
    out = []
    for i, point in enumerate(points):
        if not isinstance(point, Mapping) or not point:
            raise SpecError(f"{path}: points[{i}] must be a table of NAME = value")
        for name in point:
            _check_var(path, f"points[{i}].{name}", name)
        out.append({k: _value(path, f"points[{i}].{k}", v) for k, v in point.items()})
    return out


def _check_var(path: str, where: str, name: str) -> None:
    if not _ENV_NAME.fullmatch(name) or name.startswith("BASTION_"):
        raise SpecError(
            f"{path}: {where}: {show(name)} is not a variable name a job can read; use letters, "
            "digits and '_', not starting with a digit or BASTION_"
        )


def _value(path: str, where: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise SpecError(f"{path}: {where}: {show(value)} must be a string, number or boolean")


def expand(template: JobSpec, expansion: Expansion) -> list[JobSpec]:
    """One spec per member: ``NAME-INDEX``, the group record and the member's variables; the
    template's job id is not reused (each member is a submission of its own)."""
    group = template.name
    size = len(expansion.members)
    specs = []
    for member in expansion.members:
        name = f"{group}-{member.index}"
        problem = name_problem(name)
        if problem:
            raise SpecError(f"--name: member {problem}; pick a shorter --name for the group")
        env = {
            **(template.env_vars or {}),
            **member.env,
            "BASTION_ARRAY_ID": group,
            "BASTION_ARRAY_INDEX": str(member.index),
            "BASTION_ARRAY_SIZE": str(size),
        }
        record = {"name": group, "index": member.index, "size": size, "kind": expansion.kind}
        if expansion.max_running is not None:
            record["max_running"] = expansion.max_running
        specs.append(member_spec(template, name, env, record))
    return specs


def member_spec(
    template: JobSpec, name: str, env: dict[str, str], group: dict[str, Any]
) -> JobSpec:
    """The template as one member: its own name, variables, group and submission id."""
    metadata = dataclasses.replace(template.metadata, job_id=str(uuid.uuid4()))
    return dataclasses.replace(template, name=name, env_vars=env, group=group, metadata=metadata)

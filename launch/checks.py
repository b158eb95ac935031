"""A spec checked against what the root's daemon serves, before it is written.

The daemon publishes its runner kinds and their options, the pool and the projects
(``ROOT/history/capabilities``, bastion/daemon/publish.py). A spec that names something the
daemon does not serve would be REJECTED one cycle later; here it is refused at once, naming the
flag, what was typed and the nearest thing that exists. With nothing published (no daemon ever
ran on the root) nothing is checked: the job is submitted with the usual warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bastion.bucket.store import Store
from bastion.jobspec import JobSpec
from bastion.suggest import did_you_mean
from quota.config import compile_membership


@dataclass(frozen=True)
class Flags:
    """How the user typed the spec's parts, so a problem names the flag to change."""

    instance_type: str | None = None


def spec_problems(spec: JobSpec, caps: Mapping[str, Any], typed: Flags = Flags()) -> list[str]:
    """Every way ``spec`` differs from what the daemon serves; empty when it fits."""
    return [
        *_runner_problems(spec, caps),
        *_project_problems(spec, caps),
        *_resource_problems(spec, caps, typed),
    ]


def _runner_problems(spec: JobSpec, caps: Mapping[str, Any]) -> list[str]:
    runners = caps.get("runners")
    if not isinstance(runners, Mapping):
        return []
    kind = spec.runner_kind or caps.get("default_runner")
    if not isinstance(kind, str):
        return []
    if kind not in runners:
        return [
            f"--runner={kind}: not a runner kind the daemon takes"
            f"{did_you_mean(kind, runners)}; use one of {', '.join(sorted(runners))}"
        ]
    accepted = (runners[kind] or {}).get("options")
    if accepted is None:
        return []  # the runner declares no options: the daemon checks them at start
    problems = []
    for option, value in sorted(spec.runner_options.items()):
        if option not in accepted:
            takes = ", ".join(accepted) if accepted else "no options"
            problems.append(
                f"--runner_option={option}={value}: the {kind} runner has no option {option!r}"
                f"{did_you_mean(option, accepted)}; it takes {takes}"
            )
    return problems


def _project_problems(spec: JobSpec, caps: Mapping[str, Any]) -> list[str]:
    projects = caps.get("projects")
    if not isinstance(projects, Mapping):
        return []
    project, user = spec.metadata.project_id, spec.metadata.user_id
    if project not in projects:
        return [
            f"--project_id={project}: no such project in the daemon's quota"
            f"{did_you_mean(project, projects)}; projects: {', '.join(sorted(projects))}"
        ]
    patterns = projects[project] or []
    try:
        member = any(compile_membership(p).fullmatch(user) for p in patterns)
    except Exception:  # a pattern this client cannot compile: the daemon judges
        return []
    if member:
        return []
    return [
        f"--user_id={user}: not a member of project {project} (members: "
        f"{', '.join(patterns) or 'none'}); pick a project of yours with --project_id or ask "
        "for membership in the quota file"
    ]


def _resource_problems(spec: JobSpec, caps: Mapping[str, Any], typed: Flags) -> list[str]:
    pool = caps.get("pool")
    if not isinstance(pool, Mapping):
        return []
    flag = f"--instance_type={typed.instance_type}" if typed.instance_type else "--resources"
    have = ", ".join(f"{r}={n}" for r, n in sorted(pool.items()))
    problems = []
    for resource, amount in sorted(spec.metadata.resources.items()):
        if amount <= 0:
            continue
        if resource not in pool:
            near = did_you_mean(resource, pool)
            if typed.instance_type and not near:
                near = _instance_hint(typed.instance_type, resource, pool)
            problems.append(
                f"{flag}: asks for {resource}={amount}, a resource type the pool does not have"
                f"{near}; the pool has {have}"
            )
        elif amount > pool[resource]:
            problems.append(
                f"{flag}: asks for {resource}={amount}, more than the whole pool "
                f"({resource}={pool[resource]}); it could never start"
            )
    return problems


def _instance_hint(instance_type: str, resource: str, pool: Mapping[str, Any]) -> str:
    """``tpu-v9-32`` when the pool has v4: the instance type with a type the pool has."""
    tpus = sorted(r for r in pool if r.startswith("v") and r[1:2].isdigit())
    if not tpus or f"-{resource}-" not in f"-{instance_type}-":
        return ""
    return f" (the pool's TPU types: {', '.join(f'tpu-{t}-N' for t in tpus)})"


def outlook(spec: JobSpec, queue: Mapping[str, Any] | None) -> str:
    """What the job would wait for, from the last published queue summary: free capacity
    now and the project's jobs waiting ahead of it."""
    if not queue:
        return "no queue published yet: the daemon decides when it first sees the job"
    free = queue.get("free") or {}
    short = {
        r: (n, free.get(r, 0))
        for r, n in sorted(spec.metadata.resources.items())
        if n > free.get(r, 0)
    }
    project = (queue.get("projects") or {}).get(spec.metadata.project_id) or {}
    waiting = int(project.get("waiting") or 0)
    ahead = f"; {waiting} job(s) of {spec.metadata.project_id} wait ahead of it" if waiting else ""
    if not short:
        return f"would start now: the free capacity covers it{ahead}"
    needs = ", ".join(f"{r}={n} (free now {f})" for r, (n, f) in short.items())
    return f"would wait for capacity: {needs}{ahead}"


class SpecMistake(Exception):
    """The spec names what the daemon does not serve: refused before anything is written
    (exit 2, as a usage error). One problem per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def refuse_mistakes(store: Store, spec: JobSpec, typed: Flags = Flags()) -> bool:
    """Raise SpecMistake when the spec does not fit what the root's daemon published; False
    when nothing is published (nothing could be checked), True when it fits."""
    caps = store.capabilities.read()
    if caps is None:
        return False
    problems = spec_problems(spec, caps, typed)
    if problems:
        raise SpecMistake(problems)
    return True

"""Submitting more than one spec, and what must hold before anything is written: every job a
spec waits for (``after``) exists and no wait goes round in a cycle; no member's name is
taken. A group's specs are written in parallel (a 1,000-member sweep in a few seconds on a
bucket; ``benchmarks/bench_submit_group.py``)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence

from bastion.bucket.store import Store
from bastion.dependencies import find_cycle
from bastion.jobspec import JobSpec, SpecError, utcnow
from launch import expand
from launch.jobinfo import JobInfo

WRITERS = 16  # parallel spec writes of one group


class SubmitRefused(SpecError):
    """What the spec asks cannot be submitted here (a dependency that no job has, a cycle, a
    name taken): refused before anything is written; the CLI's exit status 2."""


def check_dependencies(store: Store, specs: Sequence[JobSpec]) -> None:
    """SpecError when a spec waits for a name no job has (active or finished) or when its
    wait would close a cycle; nothing is written in either case."""
    submitting = {spec.name for spec in specs}
    after_of: dict[str, list[str]] = {}
    known: dict[str, bool] = {}
    for spec in specs:
        for name in spec.after or ():
            if name in submitting:
                raise SubmitRefused(
                    f"field after: {spec.name} waits for {name}, a member of the same "
                    "submission; submit that one first"
                )
            if name not in known:
                known[name] = _exists(store, name, after_of)
            if not known[name]:
                raise SubmitRefused(
                    f"--after: no job named {name!r} in {store.root_url} (`bastion list "
                    "--all` shows every job); submit it first or fix the name"
                )
    for spec in specs:
        cycle = find_cycle(spec.name, spec.after or (), _Lazy(store, after_of))
        if cycle:
            raise SubmitRefused(
                f"--after: {spec.name} would wait for itself: {' -> '.join(cycle)}; a "
                "dependency cycle never starts: drop one of these waits"
            )


def _exists(store: Store, name: str, after_of: dict[str, list[str]]) -> bool:
    raw = store.specs.read(name)
    if raw is not None:
        try:
            after_of[name] = JobSpec.loads(raw).after or []
        except SpecError:
            after_of[name] = []
        return True
    return store.complete.read(name) is not None


class _Lazy(dict):
    """Active jobs' ``after`` lists, read as the cycle search reaches them."""

    def __init__(self, store: Store, known: dict[str, list[str]]) -> None:
        super().__init__(known)
        self.store = store

    def get(self, name: str, default=None):  # type: ignore[override]
        if name not in self:
            raw = self.store.specs.read(name)
            try:
                self[name] = (JobSpec.loads(raw).after or []) if raw else []
            except SpecError:
                self[name] = []
        return super().get(name, default)


def check_names_free(store: Store, specs: Sequence[JobSpec]) -> None:
    """SpecError naming the members whose names an active job holds already."""
    active = set(store.specs.list())
    taken = sorted(spec.name for spec in specs if spec.name in active)
    if taken:
        shown = ", ".join(taken[:5]) + (f" and {len(taken) - 5} more" if len(taken) > 5 else "")
        raise SubmitRefused(
            f"--name: {len(taken)} member name(s) are active jobs already ({shown}); pick "
            "another --name, or cancel them first"
        )


def write_all(specs: Sequence[JobSpec], write: Callable[[JobSpec], bool]) -> list[JobSpec]:
    """Write every spec in parallel; the ones ``write`` refused (a name taken meanwhile)."""
    with concurrent.futures.ThreadPoolExecutor(min(WRITERS, max(1, len(specs)))) as pool:
        written = list(pool.map(write, specs))
    return [spec for spec, ok in zip(specs, written, strict=True) if not ok]


def failed_again(members: Sequence[JobInfo]) -> list[JobSpec]:
    """New submissions of the members that ended FAILED or TIMEOUT: each its own spec with
    a new job id and creation time (a member still active, or one that succeeded, is left)."""
    failed = [j for j in members if j.finished and j.status in ("FAILED", "TIMEOUT")]
    specs = []
    for job in failed:
        if job.spec is None or not job.spec.group:
            continue
        env = dict(job.spec.env_vars or {})
        spec = expand.member_spec(job.spec, job.name, env, dict(job.spec.group))
        spec.metadata.creation_time = utcnow()
        specs.append(spec)
    return specs

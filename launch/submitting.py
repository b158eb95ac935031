"""Submitting more than one spec, and what must hold before anything is written: every job a
spec waits for (``after``) exists and no wait goes round in a cycle; no member's name is
taken. A group's specs are written a thousand at a time, each thousand in one call (GCS and S3
keep 64 requests in flight from one event loop; a local root writes in the calling thread),
and then their submission markers likewise (``benchmarks/bench_submit_group.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bastion.bucket.specwatch import MARKERS_PER_LOOK
from bastion.bucket.store import Store
from bastion.dependencies import find_cycle
from bastion.jobspec import JobSpec, SpecError, utcnow
from launch import expand
from launch.jobinfo import JobInfo

# Members written per call: their markers follow each call, so the daemon takes the first
# thousand in (a look lists that many markers) while the rest are written
CHUNK = MARKERS_PER_LOOK


class GroupPartlyWritten(OSError):
    """Some members' specs could not be written (the bucket failed them, after its retries);
    the others are submitted and run. The message names how many of each, and the error."""


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


def some(names: Sequence[str], most: int = 5) -> str:
    """The first ``most`` names for a message, and how many more: "a, b and 3 more"."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def check_names_free(store: Store, specs: Sequence[JobSpec]) -> None:
    """SpecError naming the members whose names an active job holds already."""
    active = set(store.specs.list())
    taken = sorted(spec.name for spec in specs if spec.name in active)
    if taken:
        raise SubmitRefused(
            f"--name: {len(taken)} member name(s) are active jobs already ({some(taken)}); pick "
            "another --name, or cancel them first"
        )


@dataclass
class GroupWrite:
    """What ``write_group`` did: the members refused (an active job took the name meanwhile),
    the members whose spec write failed (with the first error), the names whose marker did."""

    refused: list[JobSpec] = field(default_factory=list)
    failed: list[JobSpec] = field(default_factory=list)
    error: Exception | None = None
    unmarked: list[str] = field(default_factory=list)


def write_group(store: Store, specs: Sequence[JobSpec]) -> GroupWrite:
    """Write every member's spec, then its submission marker, ``CHUNK`` members per call.
    Every member is tried whatever the others' fate: a failure is reported, never raised."""
    out = GroupWrite()
    for start in range(0, len(specs), CHUNK):
        chunk = specs[start : start + CHUNK]
        created = store.specs.submit_many([(spec.name, spec.dumps()) for spec in chunk])
        written = []
        for spec, answer in zip(chunk, created, strict=True):
            if isinstance(answer, Exception):
                out.failed.append(spec)
                out.error = out.error or answer
            elif answer:
                written.append(spec.name)
            else:
                out.refused.append(spec)
        marked = store.requests.write_markers(written)
        out.unmarked += [
            n for n, m in zip(written, marked, strict=True) if isinstance(m, Exception)
        ]
    return out


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

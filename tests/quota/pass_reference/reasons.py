"""Why a pending job waits, in absolute units, from the final state of a pass."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pass_reference.capacity import add, fmt_ratio, fmt_units
from quota.model import JobRequest

if TYPE_CHECKING:
    from pass_reference.engine import _Pass


_FULL = ("full", None)


def _jobs(n: int) -> str:
    return f"{n} job{'' if n == 1 else 's'}"


def wait_reason(
    ps: _Pass, j: JobRequest, ahead: int, q: Mapping[str, float], used: Mapping[str, int]
) -> str:
    """`q`, `used`: the project's quota and usage after the pass."""
    p, need = j.project_id, j.resources
    kind, detail = ps.waits.get(j.name, _FULL)
    tail = f"; {_jobs(ahead)} ahead in {p}"
    if kind == "full":
        return full_reason(ps, j, used, q) + tail
    if kind == "behind":
        text = ps.reason_cache.get(detail)
        if text is None:
            text = ps.reason_cache[detail] = (
                f"waiting behind {detail}, a job of project {p} that fits {p}'s quota and "
                f"waits for it: other jobs of {p} do not take that quota first"
            )
        return text + tail
    with_it = dict(used)
    add(with_it, need)
    within = f"within quota ({p} at {fmt_ratio(with_it, q, need)} with this job)"
    if kind == "releasing":
        return f"{within}; waiting for stopping jobs to release {fmt_units(detail)}{tail}"
    if kind == "reclaiming":
        grace = ps.knobs.preemption_grace_seconds
        return (
            f"{within}; preempting borrower(s) {', '.join(detail)}; starts when they exit "
            f"(at most {grace:g}s){tail}"
        )
    return _protected(ps, within, detail) + tail


def _protected(ps: _Pass, within: str, detail: Any) -> str:
    after, qshort, until = detail
    parts = []
    if after:
        parts.append(f"needs {fmt_units(after)} more than is free or being released")
    if qshort:
        parts.append(f"needs {fmt_units(qshort)} of its own quota from lower-priority jobs")
    when = (
        f"borrowers become preemptible at t={until:.0f} (minimum runtime "
        f"{ps.knobs.min_runtime_seconds:g}s)"
        if until is not None
        else "nothing preemptible holds it (pool over-committed or all in quota)"
    )
    return f"{within}; {' and '.join(parts)}; {when}"


def full_reason(ps: _Pass, j: JobRequest, used: Mapping[str, int], q: Mapping[str, float]) -> str:
    key = (j.project_id, tuple(j.resources.items()))
    text = ps.reason_cache.get(key)
    if text is None:  # most waiting jobs share a shape: format each shape once per pass
        need = {r: n for r, n in j.resources.items() if n > 0}
        free = {r: ps.cap.total.get(r, 0) for r in need}
        text = (
            f"needs {fmt_units(need)}, {fmt_units(free, zeros=True)} free; project "
            f"{j.project_id} at quota {fmt_ratio(used, q, need)}"
        )
        held = {r: ps.held_total.get(r, 0) for r in need}
        if any(held.values()):
            text += f"; {fmt_units(held)} held for within-quota or older jobs"
        ps.reason_cache[key] = text
    return text


def stable_wait(ps: _Pass, j: JobRequest) -> str:
    """The part of a waiting job's reason that is its own: what it needs, and the borrowers it
    is preempting if it reclaims. Nothing that depends on other jobs (free capacity, its
    project's usage, whether stopping jobs release room, which job it waits behind), because
    one job moving changes those for thousands of waiting jobs at once. The daemon stores this
    text in the job's state; the shared facts go to one queue summary per cycle."""
    kind, detail = ps.waits.get(j.name, _FULL)
    if kind == "reclaiming":
        return f"within quota; preempting borrower(s) {', '.join(detail)}; starts when they exit"
    key = ("stable", tuple(j.resources.items()))
    text = ps.reason_cache.get(key)
    if text is None:  # one text per shape of job: 50,000 of these must stay cheap
        need = {r: n for r, n in j.resources.items() if n > 0}
        text = ps.reason_cache[key] = f"waiting for capacity: needs {fmt_units(need)}"
    return text

"""`bastion quota check` and `bastion simulate`: the only code in quota/ that reads files.

Files are opened with fsspec, so a quota file or trace may be a local path or a bucket URL
(gs://, s3://). Both commands print problems and return 1 instead of raising.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

import fsspec

from quota.config import QuotaConfig, QuotaError, parse_quota
from quota.simulate import simulate as run_simulation
from quota.trace import TraceError, parse_trace


def check(quota_file: str, out: TextIO) -> int:
    """Print every problem (exit 1) or the effective per-project quota in absolute units."""
    config = _load_quota(quota_file, out)
    if config is None:
        return 1
    print(f"{quota_file}: OK", file=out)
    print(quota_table(config), file=out)
    return 0


def simulate(
    quota_file: str,
    trace_file: str,
    poll_seconds: float,
    as_json: bool,
    events_file: str | None,
    out: TextIO,
) -> int:
    """Replay a trace under a quota file and print the metrics (one JSON object with --json)."""
    config = _load_quota(quota_file, out)
    text = _read(trace_file, out)
    if config is None or text is None:
        return 1
    try:
        trace = parse_trace(text, trace_file)
    except TraceError as e:
        for p in e.problems:
            print(p, file=out)
        return 1
    if not poll_seconds > 0:
        print(f"--poll_seconds must be > 0, got {poll_seconds}", file=out)
        return 1
    result = run_simulation(config, trace, poll_seconds)
    if events_file:
        try:
            with fsspec.open(events_file, "w") as f:
                for e in result.events:
                    f.write(json.dumps(e, sort_keys=True) + "\n")
        except OSError as e:
            print(f"cannot write events to {events_file}: {e}", file=out)
            return 1
    if as_json:
        print(json.dumps(result.metrics, sort_keys=True), file=out)
    else:
        print(metrics_table(result.metrics), file=out)
    return 0


def _read(path: str, out: TextIO) -> str | None:
    try:
        with fsspec.open(path, "r", encoding="utf-8") as f:
            return str(f.read())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        print(f"cannot read {path}: {e}", file=out)
        return None


def _load_quota(path: str, out: TextIO) -> QuotaConfig | None:
    text = _read(path, out)
    if text is None:
        return None
    try:
        return parse_quota(text, path)
    except QuotaError as e:
        for p in e.problems:
            print(p, file=out)
        return None


def _num(x: float) -> str:
    return f"{x:g}" if float(x).is_integer() else f"{x:.1f}"


def quota_table(config: QuotaConfig) -> str:
    """Per-project guaranteed quota in absolute units (share in brackets), pool, knobs, notes."""
    pool = config.pool
    resources = sorted(pool)
    lines = ["pool: " + ", ".join(f"{pool[r]} {r}" for r in resources)]
    if len(config.tiers) > 1:
        lines += [
            f"  tier {i}{' (reserved)' if i == 0 else ''}: "
            + ", ".join(f"{n} {r}" for r, n in sorted(t.items()))
            for i, t in enumerate(config.tiers)
        ]
    projects = sorted(set(config.membership) | set(config.shares))
    rows = [["project", *resources, "members"]]
    for p in projects:
        q = config.quota_of(p)
        cells = [
            f"{_num(q.get(r, 0.0))} ({100 * config.shares.get(p, {}).get(r, 0.0):.0f}%)"
            for r in resources
        ]
        rows.append([p, *cells, ", ".join(config.membership.get(p, ())) or "(nobody)"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    k = config.scheduling
    lines.append(
        f"scheduling: min runtime {k.min_runtime_seconds:g}s, preemption grace "
        f"{k.preemption_grace_seconds:g}s, usage half-life "
        f"{k.usage_half_life_seconds:g}s, preempt within project "
        f"{'on' if k.preempt_within_project else 'off'}, reserve after "
        f"{k.reserve_after_seconds:g}s, reclaim after {k.reclaim_after_seconds:g}s"
    )
    lines += [f"note: {n}" for n in config.notes]
    return "\n".join(lines)


def metrics_table(m: dict[str, Any]) -> str:
    jobs = m["jobs"]
    if jobs["started"] == 0:  # 100% utilization and attainment of nothing would mislead
        return (
            f"no job ran: {jobs['total']} in the trace, {jobs['rejected']} rejected (the "
            "events file, --events=FILE, has each rejection's reason); no utilization, wait "
            "or attainment to report"
        )
    w = m["wait_seconds"]
    lines = [
        "utilization (while jobs wait): "
        + ", ".join(f"{r} {v:.1%}" for r, v in m["utilization"].items()),
        "share attainment: "
        + (", ".join(f"{p} {v:.1%}" for p, v in m["share_attainment"].items()) or "-"),
        f"wait: mean {w['mean']:.0f}s, p95 {w['p95']:.0f}s; by project: "
        + (", ".join(f"{p} {v:.0f}s" for p, v in w["by_project"].items()) or "-"),
        f"preemptions: {m['preemptions']} (max {m['max_preemptions_per_job']} per job), "
        f"lost {m['lost_resource_seconds']:.0f} resource-seconds",
        f"idle while a job fits: {m['idle_while_fit_fraction']:.2%} of the waiting time; "
        f"within-quota preemptions: {m['within_quota_preemptions']}; max deprivation: "
        + (", ".join(f"{p} {v:.0f}s" for p, v in m["max_deprivation_seconds"].items()) or "-"),
        "attainment: " + (", ".join(f"{p} {v:.1%}" for p, v in m["attainment"].items()) or "-"),
        f"makespan: {m['makespan_seconds']:.0f}s; jobs: {m['jobs']['total']} total, "
        f"{m['jobs']['started']} started, {m['jobs']['rejected']} rejected",
    ]
    return "\n".join(lines)

"""Frozen decisions of the scheduling pass: the quota tests' oracle.

The pass is tuned for 50,000 pending jobs (early exits once nothing more can fit, reasons
built per shape of job, waiting jobs' decisions made on reading). Whether a change of the
pass keeps every decision is checked against these golden files: a fixed set of scenarios
(random worlds from a fixed seed list, large queues over mostly full pools included, and
bench_policy.py's world at 3,000 pending jobs), each with the whole plan the pass made when
the files were written: every decision (verdict, tier, reason text, stable wait, queue
position, backfill marks, preemptor), the held capacity, what is left free, usage, the
within-quota set and each project's waiting order. Before they replaced it, the plain pass
the tuned one was derived from (tests/quota/pass_reference, deleted since) was run on every
one of these scenarios and decided exactly as the frozen plans say.

A deliberate change of policy changes decisions: regenerate the files, review their diff,
and commit them with the change:

    .venv/bin/python -m tests.quota.golden --write

tests/quota/test_quota_golden.py recomputes every plan and names the scenario, the job and
the field that differ; it fails (never regenerates) when a golden file is missing.
"""

from __future__ import annotations

from tests.quota.golden.scenarios import (
    GOLDEN_DIR,
    Scenario,
    golden_path,
    groups,
    plan_record,
    read_golden,
    write_golden,
)

__all__ = [
    "GOLDEN_DIR",
    "Scenario",
    "golden_path",
    "groups",
    "plan_record",
    "read_golden",
    "write_golden",
]

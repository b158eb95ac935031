"""`bastion quota check` and `bastion simulate` on real files (local paths and memory:// URLs)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import fsspec

from quota.commands import check, simulate

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "project-quotas.toml"


def test_example_config_passes_check_with_absolute_units() -> None:
    out = io.StringIO()
    assert check(str(EXAMPLE), out) == 0
    text = out.getvalue()
    assert text.startswith(f"{EXAMPLE}: OK\n")
    assert "pool: 1024 v4, 256 v5p" in text
    assert "tier 0 (reserved): 768 v4, 256 v5p" in text
    assert "research  614.4 (60%)  192 (75%)" in text
    assert "interns   51.2 (5%)    0 (0%)" in text
    assert "min runtime 300s" in text


def test_check_prints_every_problem_and_fails(tmp_path: Path) -> None:
    bad = tmp_path / "q.toml"
    bad.write_text(
        EXAMPLE.read_text()
        .replace("v4 = 0.6", "v4 = -1")
        .replace('"intern-[0-9]+"', '"intern-[0-9"')
    )
    out = io.StringIO()
    assert check(str(bad), out) == 1
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{bad}: [project_membership] interns[0]: regular expression")
    assert lines[1].startswith(f"{bad}: [project_resources.research] v4: fraction must be >= 0")


def test_check_missing_file(tmp_path: Path) -> None:
    out = io.StringIO()
    assert check(str(tmp_path / "nope.toml"), out) == 1
    assert out.getvalue().startswith(f"cannot read {tmp_path / 'nope.toml'}")


def test_check_reads_bucket_urls() -> None:
    with fsspec.open("memory://bucket/project-quotas.config", "w") as f:
        f.write(EXAMPLE.read_text())
    out = io.StringIO()
    assert check("memory://bucket/project-quotas.config", out) == 0


def test_simulate_json_and_events(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    # (r1 outlasts p1's reclaim delay: 400 + 240 s)
    rows = [
        {
            "name": "r1",
            "project_id": "research",
            "user_id": "alice",
            "submit": 0,
            "duration": 1200,
            "resources": {"v4": 1024},
            "priority": 3,
        },
        {
            "name": "p1",
            "project_id": "product",
            "user_id": "carol",
            "submit": 400,
            "duration": 100,
            "resources": {"v4": 256},
        },
    ]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    events = tmp_path / "events.jsonl"
    out = io.StringIO()
    assert simulate(str(EXAMPLE), str(trace), 30, True, str(events), out) == 0
    metrics = json.loads(out.getvalue())
    assert {
        "utilization",
        "share_attainment",
        "wait_seconds",
        "preemptions",
        "lost_resource_seconds",
        "max_preemptions_per_job",
        "makespan_seconds",
    } <= set(metrics)
    assert metrics["preemptions"] == 1  # r1 borrowed; product reclaims after the min runtime
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    assert [e["event"] for e in lines][:2] == ["start", "preempt"]
    assert set(lines[0]) == {
        "time",
        "event",
        "name",
        "project_id",
        "resources",
        "tier",
        "reason",
        "backfill_for",
    }
    assert lines[0]["backfill_for"] == [] and lines[1]["preempted_by"] == "p1"
    assert "preempted by p1 of project product" in lines[1]["reason"]
    out = io.StringIO()
    assert simulate(str(EXAMPLE), str(trace), 30, False, None, out) == 0
    assert "preemptions: 1 (max 1 per job)" in out.getvalue()


def test_simulate_reports_bad_trace_lines(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"name": "x"}\n')
    out = io.StringIO()
    assert simulate(str(EXAMPLE), str(trace), 30, True, None, out) == 1
    assert out.getvalue().startswith(f"{trace}:1: field project_id: must be a non-empty string")


def test_simulate_of_a_trace_where_no_job_ran_says_so_instead_of_full_utilization(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "t.jsonl"
    rows = [  # a project the quota file does not have: every job is rejected
        {
            "name": f"j{i}",
            "project_id": "nobody",
            "user_id": "x",
            "submit": i,
            "duration": 10,
            "resources": {"v4": 8},
        }
        for i in range(3)
    ]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = io.StringIO()
    assert simulate(str(EXAMPLE), str(trace), 10.0, False, None, out) == 0
    text = out.getvalue()
    assert "no job ran: 3 in the trace, 3 rejected" in text, text
    assert "100.0%" not in text and "utilization (while" not in text

"""Issue 13's rules measured from event logs: a log worked out by hand, and `bastion simulate
--json` against figures recomputed here from its own --events file."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from quota.commands import simulate
from quota.rules import measure


def _job(p: str, submit: float, v4: int, prio: int = 3) -> dict:
    return {"project_id": p, "submit": submit, "resources": {"v4": v4}, "priority": prio}


def _ev(t: float, kind: str, name: str, **extra: object) -> dict:
    return {"time": t, "event": kind, "name": name, "reason": "", **extra}


def test_rules_on_a_log_worked_out_by_hand() -> None:
    # Pool 4, quotas a 2 and b 2. x (a, 4) borrows the pool at 0; y (b, 1) and z (b, 2) wait.
    # y reclaims at 100 (x releases at 110, grace 10), y starts at 110; z fits the 3 idle
    # units from 110 but starts at 200; x waits until 400.
    jobs = {"x": _job("a", 0, 4), "y": _job("b", 0, 1), "z": _job("b", 0, 2)}
    events = [
        _ev(0, "start", "x", backfill_for=[]),
        _ev(100, "preempt", "x", preempted_by="y"),
        _ev(110, "start", "y"),
        _ev(200, "start", "z"),
        _ev(300, "finish", "y"),
        _ev(400, "finish", "z"),
        _ev(400, "start", "x"),
        _ev(500, "finish", "x"),
    ]
    m = measure({"v4": 4}, {"a": {"v4": 2.0}, "b": {"v4": 2.0}}, jobs, events, grace=10, period=50)
    # Something waits over [0, 400); z fits idle capacity over [110, 200): 30 s past 60 s.
    assert m["idle_while_fit_fraction"] == pytest.approx(30 / 400)
    # b has a job fitting its quota over [0, 110) (z never fits beside y): one episode.
    assert m["max_deprivation_seconds"] == {"a": 0.0, "b": 110.0}
    assert m["attainment"] == {"a": 1.0, "b": pytest.approx(1 - 60 / 110)}
    assert m["within_quota_preemptions"] == 0  # a held 4 of its 2
    assert m["within_project_violations"] == 0
    assert (m["preemptions"], m["max_preemptions_per_job"]) == (1, 1)
    assert m["lost_resource_seconds"] == 400  # 4 units x 100 s


def test_within_quota_and_within_project_preemptions_are_counted() -> None:
    # a (quota 2) runs a1 and a2 (1 each) within quota; b's job takes both at 100: the second
    # removal finds a at 1 of 2. Inside b, b-low (priority 3, not a backfill) is preempted
    # for b-same (priority 3): a violation; b-bf ran as backfill after b-same waited: fine.
    jobs = {
        "a1": _job("a", 0, 1),
        "a2": _job("a", 0, 1),
        "b1": _job("b", 50, 2),
        "b-low": _job("b", 0, 1),
        "b-bf": _job("b", 60, 1),
        "b-same": _job("b", 50, 2),
    }
    events = [
        _ev(0, "start", "a1"),
        _ev(0, "start", "a2"),
        _ev(0, "start", "b-low"),
        _ev(70, "start", "b-bf", backfill_for=["b-same"]),
        _ev(100, "preempt", "a1", preempted_by="b1"),
        _ev(100, "preempt", "a2", preempted_by="b1"),
        _ev(100, "preempt", "b-low", preempted_by="b-same"),
        _ev(100, "preempt", "b-bf", preempted_by="b-same"),
    ]
    m = measure({"v4": 6}, {"a": {"v4": 2.0}, "b": {"v4": 4.0}}, jobs, events, grace=10, period=50)
    assert m["within_quota_preemptions"] == 2  # a at 2 of 2 before the first removal
    assert m["within_project_violations"] == 1
    assert m["max_preemptions_per_job"] == 1 and m["preemptions"] == 4


def test_simulate_json_reports_the_rules_as_recomputed_from_its_events(tmp_path: Path) -> None:
    # Pool 10: a owns 6, b 4. b1 (6) borrows at 0; a1 (6, within quota) arrives at 10 and
    # holds the 4 free units; b2 (2) runs in them as a1's backfill. At 100 (b1's minimum
    # runtime) a1 reclaims: b1 alone is enough (b2 stays); a1 starts at 120 after the grace.
    quota = tmp_path / "q.toml"
    quota.write_text(
        '[toml-schema]\nversion = "1"\n[total_resources]\nv4 = 10\n'
        '[project_membership]\na = [".*"]\nb = [".*"]\n'
        "[project_resources.a]\nv4 = 0.6\n[project_resources.b]\nv4 = 0.4\n"
        "[scheduling]\nmin_runtime_seconds = 100\npreemption_grace_seconds = 20\n"
        "reserve_after_seconds = 1e9\nreclaim_after_seconds = 0\n"
    )
    rows = [
        {
            "name": "b1",
            "project_id": "b",
            "user_id": "u",
            "submit": 0,
            "duration": 1000,
            "resources": {"v4": 6},
        },
        {
            "name": "a1",
            "project_id": "a",
            "user_id": "u",
            "submit": 10,
            "duration": 300,
            "resources": {"v4": 6},
        },
        {
            "name": "b2",
            "project_id": "b",
            "user_id": "u",
            "submit": 10,
            "duration": 200,
            "resources": {"v4": 2},
        },
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    events_file = tmp_path / "e.jsonl"
    out = io.StringIO()
    assert simulate(str(quota), str(trace), 10, True, str(events_file), out) == 0
    got = json.loads(out.getvalue())
    events = [json.loads(x) for x in events_file.read_text().splitlines()]
    assert [
        (e["time"], e["event"], e["name"], e.get("backfill_for"), e.get("preempted_by"))
        for e in events[:4]
    ] == [
        (0, "start", "b1", [], None),
        (10, "start", "b2", ["a1"], None),
        (100, "preempt", "b1", None, "a1"),
        (120, "start", "a1", [], None),
    ]
    # Recomputed here from the events alone.
    preempts = [e for e in events if e["event"] == "preempt"]
    start_of: dict[str, float] = {}
    lost = 0.0
    for e in events:
        if e["event"] == "start":
            start_of[e["name"]] = e["time"]
        elif e["event"] == "preempt":
            lost += sum(e["resources"].values()) * (e["time"] - start_of[e["name"]])
    assert got["lost_resource_seconds"] == lost == 600
    assert got["max_preemptions_per_job"] == 1 == len(preempts)
    # b held 8 of its 4 when b1 was taken; nothing inside a project was preempted.
    assert got["within_quota_preemptions"] == 0 and got["within_project_violations"] == 0
    # a's job fit its quota from 10 to its start at 120 (period 100 + 20 + 2 x 10 = 140);
    # b never had a job fitting its 4 units beside what it ran.
    assert got["max_deprivation_seconds"] == {"a": 110.0, "b": 0.0}
    assert got["attainment"] == {"a": 1.0, "b": 1.0}
    # Nothing that waited fit the idle units: b1 (6) waits from 120 beside 2 idle, then 4.
    assert got["idle_while_fit_fraction"] == 0.0

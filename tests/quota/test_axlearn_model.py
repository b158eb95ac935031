"""benchmarks/axlearn_model.py reproduces what the reference observed of AXLearn's scheduler
(/work/shared/reference/axlearn-bastion.md, sections 3.3 and 9.2), so that the preemption
counts bench_fairness.py compares ours with (issue 13, rule 5) are AXLearn's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "axlearn_model.py"


def _model():
    mod = sys.modules.get("_axlearn_model_test")
    if mod is None:
        spec = importlib.util.spec_from_file_location("_axlearn_model_test", _PATH)
        assert spec and spec.loader
        mod = sys.modules["_axlearn_model_test"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


def _job(name, project, res, submit=0.0, duration=10_000.0, prio=5, user="u"):
    return {
        "name": name,
        "project_id": project,
        "user_id": user,
        "submit": submit,
        "duration": duration,
        "resources": res,
        "priority": prio,
    }


def test_tier_scheduler_verdicts_match_axlearns_test_init():
    """scheduler_test.py test_init (section 9.2): a (p1, v4 12) rejected, b, c run, d (p2,
    v5 4) rejected, e and f (no quota) run; smaller ratio first, then creation time."""
    m = _model()
    jobs = [
        m._Job(n, p, "u", float(i), 1.0, res, 5)
        for i, (n, p, res) in enumerate(
            [
                ("a", "p1", {"v4": 12}),
                ("b", "p2", {"v4": 5}),
                ("c", "p2", {"v3": 6}),
                ("d", "p2", {"v5": 4}),
                ("e", "p3", {"v5": 2}),
                ("f", "", {"v3": 2}),
            ]
        )
    ]
    shares = {"p1": {"v4": 10, "v5": 5}, "p2": {"v4": 5, "v3": 5}, "p3": {"v3": 3}}
    pool = {"v4": 15, "v3": 8, "v5": 5}
    quota = {
        p: {r: f / sum(s.get(r, 0) for s in shares.values()) * pool[r] for r, f in s.items()}
        for p, s in shares.items()
    }
    verdicts = m._schedule([pool], quota, jobs)
    assert {n: v is not None for n, v in verdicts.items()} == {
        "a": False,
        "b": True,
        "c": True,
        "d": False,
        "e": True,
        "f": True,
    }


def test_returning_owner_demotes_and_preempts_borrowers_in_one_cycle():
    """Section 3.3: p2 runs b1, b2 (tier 0) and b3 (tier 1) of 8 chips on [16, 8]; a1 of p1
    arrives: b1 and a1 take tier 0, b2 is restarted on tier 1, b3 is killed."""
    m = _model()
    long = 100_000.0  # (b1 and a1 outlast b2 and b3: no promotion to tier 0 afterwards)
    trace = [
        _job("b1", "p2", {"v4": 8}, 0, long),
        _job("b2", "p2", {"v4": 8}, 0, 1000.0),
        _job("b3", "p2", {"v4": 8}, 0, 1000.0),
        _job("a1", "p1", {"v4": 8}, 30, long),
    ]
    out = m.replay(
        [{"v4": 16}, {"v4": 8}], {"p1": {"v4": 0.5}, "p2": {"v4": 0.5}}, trace, interval=30.0
    )
    assert out.per_job == {"b2": 1, "b3": 1}
    assert out.tier_restarts == 1


def test_no_stickiness_a_borrower_is_killed_as_soon_as_it_orders_behind():
    """Section 4.4: no minimum runtime; the job of the project that would be further over its
    quota stops in the cycle the other's job arrives (a tie goes to the older job)."""
    m = _model()
    trace = [
        _job("b", "p2", {"v4": 4}, 0, duration=1000.0),
        _job("a", "p1", {"v4": 2}, 31, duration=100.0),
    ]
    out = m.replay([{"v4": 4}], {"p1": {"v4": 0.5}, "p2": {"v4": 0.5}}, trace, interval=30.0)
    assert out.per_job == {"b": 1}

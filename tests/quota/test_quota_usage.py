"""The decayed usage ledger (Slurm-style half-life) that orders users inside a project."""

from __future__ import annotations

import math

import pytest
from quota_helpers import pend, running

from quota.model import Phase
from quota.usage import UsageLedger


def test_usage_halves_every_half_life() -> None:
    ledger = UsageLedger(10.0, 0.0, {"alice": 100.0})
    assert ledger.advance([], 10.0).by_user == {"alice": pytest.approx(50.0)}
    assert ledger.advance([], 30.0).by_user == {"alice": pytest.approx(12.5)}


def test_running_jobs_accrue_decayed_resource_seconds() -> None:
    h = 100.0
    job = running("j", "p", {"v4": 2, "cpu": 1}, start=0.0, user="bob")
    got = UsageLedger(h, 0.0).advance([job], 50.0).by_user["bob"]
    assert got == pytest.approx(3 * h / math.log(2) * (1 - 0.5**0.5))
    assert got < 3 * 50  # older seconds weigh less


def test_advancing_in_steps_equals_one_step() -> None:
    jobs = [running("a", "p", 4, start=0.0, user="a"), running("b", "p", 1, start=30.0, user="b")]
    once = UsageLedger(60.0, 0.0, {"c": 10.0}).advance(jobs, 100.0)
    steps = UsageLedger(60.0, 0.0, {"c": 10.0})
    for t in range(10, 101, 10):
        steps = steps.advance(jobs, float(t))
    assert steps.by_user == pytest.approx(once.by_user)
    assert set(once.by_user) == {"a", "b", "c"}


def test_only_time_since_start_counts_and_pending_jobs_do_not() -> None:
    late = running("late", "p", 1, start=90.0, user="late")
    releasing = running("rel", "p", 1, start=0.0, user="rel", phase=Phase.RELEASING)
    waiting = pend("w", "p", 5, user="waiting")
    ledger = UsageLedger(1e12, 0.0).advance([late, releasing, waiting], 100.0)
    assert ledger.by_user == {"late": pytest.approx(10.0), "rel": pytest.approx(100.0)}


def test_time_going_backwards_changes_nothing() -> None:
    ledger = UsageLedger(10.0, 50.0, {"a": 1.0})
    assert ledger.advance([running("j", "p", 1, start=0.0, user="a")], 40.0) is ledger


def test_negligible_usage_is_forgotten() -> None:
    ledger = UsageLedger(1.0, 0.0, {"old": 1.0, "big": 1e9})
    assert set(ledger.advance([], 30.0).by_user) == {"big"}


def test_json_round_trip_and_malformed_records() -> None:
    ledger = UsageLedger(604800.0, 123.0, {"a": 1.5, "b": 2.0})
    assert UsageLedger.from_json(ledger.to_json()) == ledger
    with pytest.raises(ValueError, match="malformed usage ledger"):
        UsageLedger.from_json({"half_life_seconds": 1.0, "as_of": "x", "by_user": {}})
    with pytest.raises(ValueError, match="malformed usage ledger"):
        UsageLedger.from_json({"as_of": 1.0})

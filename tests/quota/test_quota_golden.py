"""The pass decides exactly what the frozen golden files say (tests/quota/golden).

Every scenario's whole plan is recomputed and compared: every decision (verdict, tier, reason
text, stable wait, queue position, backfill marks, preemptor), the verdict lists, held and free
capacity, usage, the within-quota set and the waiting order. A deliberate change of policy is
a regeneration (`python -m tests.quota.golden --write`) whose diff is reviewed; a missing
golden file fails here, it is never written by a test.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

import pytest

from quota.policy import schedule
from tests.quota.golden.scenarios import (
    DECISION_FIELDS,
    Scenario,
    compute,
    differences,
    golden_path,
    groups,
    read_golden,
)

CASES = [(group, s) for group, scenarios in groups().items() for s in scenarios]


@cache
def _golden(group: str) -> dict[str, Any]:
    return dict(read_golden(group))


@pytest.mark.parametrize("group", sorted(groups()))
def test_every_group_has_its_golden_file_with_exactly_its_scenarios(group: str) -> None:
    frozen = _golden(group)  # (FileNotFoundError names the command that writes it)
    assert sorted(frozen) == sorted(s.name for s in groups()[group]), golden_path(group)


@pytest.mark.parametrize(("group", "scenario"), CASES, ids=[s.name for _, s in CASES])
def test_pass_decides_as_the_golden_file_says(group: str, scenario: Scenario) -> None:
    frozen = _golden(group).get(scenario.name)
    assert frozen is not None, f"{scenario.name} is not in {golden_path(group)}"
    diff = differences(scenario.name, frozen, compute(scenario))
    assert not diff, "\n".join(diff[:20]) + (
        f"\n... {len(diff) - 20} more" if len(diff) > 20 else ""
    )


def test_a_missing_golden_file_fails_and_names_the_command_that_writes_it() -> None:
    with pytest.raises(FileNotFoundError, match=r"python -m tests\.quota\.golden --write"):
        read_golden("no_such_group")
    assert not golden_path("no_such_group").exists()  # (read, never written)


def test_a_changed_decision_is_reported_with_its_scenario_job_and_field() -> None:
    group, scenario = CASES[0]
    frozen = _golden(group)[scenario.name]
    name, row = next((n, r) for n, r in frozen["decisions"].items() if r[0] == "WAIT")
    changed = {**frozen, "decisions": {**frozen["decisions"], name: [*row[:2], "other", *row[3:]]}}
    diff = differences(scenario.name, frozen, changed)
    assert diff == [f"{scenario.name}, job {name}: reason\n  frozen: {row[2]!r}\n  now:    'other'"]
    assert DECISION_FIELDS[2] == "reason"


def test_changed_inputs_are_told_apart_from_changed_decisions() -> None:
    group, scenario = CASES[0]
    frozen = _golden(group)[scenario.name]
    diff = differences(scenario.name, frozen, {**frozen, "inputs": "0" * 16})
    assert len(diff) == 1 and "its inputs changed" in diff[0] and scenario.name in diff[0]


@pytest.mark.parametrize("shared", [False, True], ids=["own_mappings", "interned_mappings"])
@pytest.mark.parametrize(("group", "scenario"), CASES[::4], ids=[s.name for _, s in CASES[::4]])
def test_waits_in_bulk_are_wait_text_for_every_job(
    group: str, scenario: Scenario, shared: bool
) -> None:
    """The daemon compares every stored wait with Plan.by_wait; it must say what wait_text
    says name by name, whether or not jobs of one shape share a resources mapping (the
    daemon interns them; the jobs are gathered by the mapping)."""
    config, jobs, usage, now = scenario.make()
    if shared:
        one: dict[tuple, dict[str, int]] = {}
        jobs = [
            dataclasses.replace(
                j, resources=one.setdefault(tuple(j.resources.items()), dict(j.resources))
            )
            for j in jobs
        ]
    grouped = schedule(config, jobs, usage, now).by_wait()
    bulk = sorted((name, text or "") for text, names in grouped.items() for name in names)
    plan = schedule(config, jobs, usage, now)
    one_by_one = sorted((name, plan.wait_text(name) or "") for name in plan.decisions)
    assert bulk == one_by_one
    assert any(text is not None for text in grouped) or not plan.waits()


@pytest.mark.parametrize("count", [1, 3, 1000])
@pytest.mark.parametrize(("group", "scenario"), CASES[::3], ids=[s.name for _, s in CASES[::3]])
def test_first_waits_are_the_decisions_read_one_by_one(
    group: str, scenario: Scenario, count: int
) -> None:
    """The queue summary reads each project's first waiting jobs' decisions through
    Plan.first_waits (no map of every job's position): the same decisions, in queue order."""
    config, jobs, usage, now = scenario.make()
    plan = schedule(config, jobs, usage, now)
    fresh = schedule(config, jobs, usage, now)  # (read one by one on a plan of its own)
    for project, names in plan.waiting.items():
        expected = [fresh.decisions[n] for n in list(names)[:count]]
        assert plan.first_waits(project, count) == expected
    assert plan.first_waits("no-such-project", count) == []

"""Issue 27: a running job's label ("within quota" / "borrowing idle capacity") is decided when
it starts and goes stale; `bastion list` says which running jobs a reclaim would take first now.

The case seen on main: two `default` jobs, the one labelled "within quota" at its start was
the one a reclaim took (lower priority), while the one labelled "borrowing" kept running."""

from __future__ import annotations

import json

from quota.model import JobRequest, Phase
from quota.reclaim import first_to_go
from tests.harness import wait_for

QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
cpu = 4
[project_membership]
default = [".*"]
research = ["alice"]
[project_resources.default]
cpu = 0.5
[project_resources.research]
cpu = 0.5
"""


def running(name: str, priority: int, start: float, checkpoint: float | None = None) -> JobRequest:
    return JobRequest(
        name=name,
        project_id="default",
        user_id="u",
        resources={"cpu": 2},
        priority=priority,
        submit_time=start - 1,
        phase=Phase.RUNNING,
        start_time=start,
        tier=0,
        last_checkpoint=checkpoint,
    )


def test_first_to_go_takes_the_lowest_priority_then_the_least_work_lost():
    usage, quotas = {"default": {"cpu": 4}}, {"default": {"cpu": 2}}
    older_low, newer_high = running("a", 5, 100.0), running("b", 3, 200.0)
    assert first_to_go([older_low, newer_high], usage, quotas, 300.0) == {"default": ["a"]}
    # Equal priority: the one that loses least goes first (b checkpointed a moment ago).
    a, b = running("a", 5, 100.0), running("b", 5, 200.0, checkpoint=299.0)
    assert first_to_go([a, b], usage, quotas, 300.0) == {"default": ["b"]}
    # Within quota: nobody is first to go.
    assert first_to_go([a], {"default": {"cpu": 2}}, quotas, 300.0) == {}


def test_list_says_which_running_job_a_reclaim_takes_first_whatever_its_start_label(
    local_bastion,
):
    b = local_bastion
    b.put("project-quotas", "project-quotas.config", data=QUOTA)
    try:
        b.cli("launch", "--name=low", "--resources=cpu=2", "--priority=5", "--", "sleep 120")
        b.once()
        b.cli("launch", "--name=high", "--resources=cpu=2", "--priority=3", "--", "sleep 120")
        b.once()
        b.once()  # a pass over both running: the queue summary names who goes first

        def labels() -> dict[str, str]:
            rows = b.cli("list").stdout.splitlines()[1:]
            return {row.split()[0]: row for row in rows}

        def labelled() -> dict[str, str] | None:
            rows = labels()
            return rows if "now" in rows.get("low", "") else None

        rows = wait_for(labelled, timeout=30, what="the running labels")
        assert "now borrowing: among the first a reclaim takes from default" in rows["low"]
        assert "now within default's quota" in rows["high"]
        reasons = {j["name"]: j["reason"] for j in json.loads(b.cli("list", "--json").stdout)}
        assert "started: within quota" in reasons["low"]  # its start label, kept after
        assert "started: borrowing idle capacity" in reasons["high"]
    finally:
        b.cli("cancel", "low", check=False)
        b.cli("cancel", "high", check=False)
        b.once()

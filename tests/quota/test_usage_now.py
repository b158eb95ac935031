"""quota.usage.usage_now: the one way the daemon and `bastion why` turn the saved ledger into
the usage a pass sees."""

from quota.model import JobRequest, Phase
from quota.usage import UsageLedger, usage_now


def _running(user: str, start: float) -> JobRequest:
    return JobRequest(
        name=f"{user}-job",
        project_id="p",
        user_id=user,
        resources={"cpu": 2},
        priority=0,
        submit_time=start,
        phase=Phase.RUNNING,
        start_time=start,
    )


def test_a_saved_ledger_decays_under_the_quota_files_current_half_life():
    """A half-life changed in the quota file since the ledger was saved weighs from now on."""
    saved = UsageLedger(half_life_seconds=100.0, as_of=0.0, by_user={"alice": 8.0})
    got = usage_now(saved, 50.0, [], now=50.0)
    assert got.half_life_seconds == 50.0
    assert abs(got.by_user["alice"] - 4.0) < 1e-9  # one half-life of the new value, not half


def test_without_a_saved_ledger_usage_starts_at_zero_now_and_accrues_running_jobs():
    got = usage_now(None, float("inf"), [_running("bob", 0.0)], now=10.0)
    assert got.as_of == 10.0 and got.by_user == {}
    later = usage_now(got, float("inf"), [_running("bob", 0.0)], now=20.0)
    assert later.by_user == {"bob": 20.0}  # 2 cpu for the 10 s since the ledger's as_of


def test_waiting_jobs_accrue_nothing():
    pending = JobRequest(
        name="w",
        project_id="p",
        user_id="carol",
        resources={"cpu": 4},
        priority=0,
        submit_time=0.0,
        phase=Phase.PENDING,
    )
    got = usage_now(UsageLedger(60.0, 0.0, {}), 60.0, [pending], now=30.0)
    assert got.by_user == {}

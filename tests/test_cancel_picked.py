"""`bastion cancel --group=G` (or --state, --project_id): a job the filter picked that has
finished by the time its cancel is asked is passed over, and the others are still cancelled.

A sweep's short jobs finish between the listing and the cancels (the README's example met it:
`cancel --group=grid --yes` failed on its first member, which had just SUCCEEDED, and left the
rest running). The race's outcome is made for real: the daemon in-process, on the fake runner,
runs one job to its end and archives it; the other waits behind a long one.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bastion.daemon.start import build_daemon
from launch.api import AlreadyFinished, Client, UnknownJob
from launch.cli.submit import cancel_each
from tests.test_job_index import submit


@pytest.fixture
def one_finished_one_waiting(tmp_path: Path) -> Client:
    root, work = tmp_path / "root", tmp_path / "work"
    (root / "project-quotas").mkdir(parents=True)
    (root / "project-quotas" / "project-quotas.config").write_text(
        '[toml-schema]\nversion = "1"\n[total_resources]\ncpu = 1\n'
        '[project_membership]\ndefault = [".*"]\n'
    )
    client = Client(str(root), expect_daemon=False)
    settings = {"default_runner": "fake", "runners": {"fake": {"state_dir": str(work / "f")}}}
    daemon = build_daemon(str(root), work_dir=str(work), gpus=[], settings=settings)
    try:
        submit(client, "g-0", resources={"cpu": 1})
        deadline = time.monotonic() + 30
        while not (root / "jobs" / "complete" / "g-0").exists():
            assert time.monotonic() < deadline, "g-0 did not finish"
            daemon.cycle(time.time())
            daemon.settle()
            time.sleep(0.02)
        submit(client, "long", seconds=600, resources={"cpu": 1})  # holds the one cpu
        submit(client, "g-1", resources={"cpu": 1})
        for _ in range(3):
            daemon.cycle(time.time())
            daemon.settle()
    finally:
        daemon.close()
    assert client.get("g-1").status == "PENDING"
    return client


def test_a_picked_job_that_finished_meanwhile_is_passed_over_and_the_rest_cancelled(
    one_finished_one_waiting: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    client = one_finished_one_waiting
    cancel_each(client, ["g-0", "g-1"], "tester", force=False, named=False)
    out = capsys.readouterr().out
    assert "g-0 finished meanwhile (SUCCEEDED); nothing to cancel" in out
    assert "cancel requested for g-1" in out
    assert client.store.requests.read("g-1")  # the daemon's next cycle stops it


def test_a_named_job_that_has_finished_is_an_error_that_says_so(
    one_finished_one_waiting: Client,
) -> None:
    client = one_finished_one_waiting
    with pytest.raises(AlreadyFinished, match=r"job 'g-0' has already finished \(SUCCEEDED\)"):
        cancel_each(client, ["g-0", "g-1"], "tester", force=False, named=True)
    assert isinstance(AlreadyFinished("x", "FAILED"), UnknownJob)  # the CLI's error for it
    assert not client.store.requests.read("g-1")  # (named: stopped at the first, as before)

"""Between cycles the acting daemon glances at the submissions: a job submitted during a long
poll starts within about a glance, not at the next poll (issue 26: submit to running)."""

from __future__ import annotations

import time

from bastion.daemon.loop import WAKE_SECONDS
from tests.harness import Bastion, wait_for

POLL = 120.0  # far longer than the test waits: only a glance can start the job in time


def test_a_job_submitted_between_cycles_starts_before_the_next_poll(tmp_path):
    b = Bastion(tmp_path)
    try:
        b.start(poll=POLL)
        wait_for(lambda: b.exists("history", "daemon"), 60, what="the daemon to act")
        time.sleep(2 * WAKE_SECONDS)  # its first cycle is over: the next is a poll away
        ran = tmp_path / "ran"
        submitted = time.monotonic()
        b.cli("launch", "--name=quick", "--", f"touch {ran}")
        # the CLI's own start counts too: on a loaded machine that alone can take 10 s
        wait_for(ran.exists, POLL / 3, what="the job to run before the next poll")
        waited = time.monotonic() - submitted
        assert waited < POLL / 3, waited
        print(f"submit -> running {waited:.2f}s with --poll_seconds={POLL:g}")
    finally:
        b.close()

"""The page's publisher on a real root: it renders only when due and when something changed
(or the page is getting old), one render at a time, and keeps its queue-length samples across
daemons in status.json."""

from __future__ import annotations

import dataclasses
import time

from bastion.bucket.status_paths import PAGE_OP
from bastion.bucket.store import Store
from bastion.jobspec import new_jobspec
from bastion.jobstate import JobState, Status
from bastion.status import publisher
from bastion.status.publisher import PagePublisher


def _jobs(count: int) -> list:
    return [
        (
            f"j{i}",
            new_jobspec(name=f"j{i}", command="x", user_id="u", project_id="p"),
            JobState(status=Status.PENDING, submit_time=time.time()),
        )
        for i in range(count)
    ]


def test_the_page_is_rewritten_only_when_due_and_changed(tmp_path, monkeypatch):
    store = Store(str(tmp_path / "root"))
    page = PagePublisher(store, every_cycles=5)
    jobs = _jobs(3)
    now = time.time()
    assert not page.offer(4, jobs, None, [], now)  # not a publishing cycle
    assert page.offer(5, jobs, None, [], now)
    page.wait()
    assert store.reports.read_page_data()["counts"]["waiting"] == 3
    assert store.ops[PAGE_OP] == 2 and store.ops["write"] == 0  # counted apart from writes
    assert not page.offer(10, jobs, None, [], now + 1)  # nothing changed
    changed = [*jobs[:2], (jobs[2][0], jobs[2][1], dataclasses.replace(jobs[2][2]))]
    assert page.offer(15, changed, None, [], now + 2)  # a job's state is a new object
    page.wait()
    monkeypatch.setattr(publisher, "REFRESH_SECONDS", 0.0)
    assert page.offer(20, changed, None, [], now + 3)  # unchanged, but the page's age is due
    page.wait()
    assert page.renders == 3 and page.last_bytes > 0


def test_one_render_at_a_time_and_a_busy_publisher_declines(tmp_path):
    store = Store(str(tmp_path / "root"))
    page = PagePublisher(store, every_cycles=1)
    jobs = _jobs(2000)
    started = page.offer(1, jobs, None, [], time.time())
    declined = page.offer(2, _jobs(1), None, [], time.time())  # while the first one renders
    page.wait()
    assert started and not declined and page.renders == 1


def test_queue_length_samples_outlive_the_daemon_that_took_them(tmp_path):
    store = Store(str(tmp_path / "root"))
    now = time.time()
    first = PagePublisher(store, every_cycles=1)
    first.offer(1, _jobs(4), None, [], now - 600)
    first.wait()
    second = PagePublisher(store, every_cycles=1)  # a new daemon
    second.offer(1, _jobs(1), None, [], now)
    second.wait()
    lengths = store.reports.read_page_data()["queue_lengths"]
    assert [n for _, n in lengths] == [4.0, 1.0]

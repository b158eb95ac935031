"""The page's publisher on a real root: it renders only when due and when something changed
(or the page is getting old), one render at a time, and keeps its queue-length samples across
daemons in status.json."""

from __future__ import annotations

import dataclasses
import threading
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
    assert not page.offer(4, 1, lambda: jobs, None, [], now)  # not a publishing cycle
    assert page.offer(5, 1, lambda: jobs, None, [], now)
    page.wait()
    assert store.reports.read_page_data()["counts"]["waiting"] == 3
    assert store.ops[PAGE_OP] == 2 and store.ops["write"] == 0  # counted apart from writes
    assert not page.offer(10, 1, lambda: jobs, None, [], now + 1)  # nothing changed
    changed = [*jobs[:2], (jobs[2][0], jobs[2][1], dataclasses.replace(jobs[2][2]))]
    assert page.offer(15, 2, lambda: changed, None, [], now + 2)  # a job changed
    page.wait()
    monkeypatch.setattr(publisher, "REFRESH_SECONDS", 0.0)
    assert page.offer(20, 2, lambda: changed, None, [], now + 3)  # unchanged, but age is due
    page.wait()
    assert page.renders == 3 and page.last_bytes > 0


def test_a_refresh_for_age_alone_does_not_list_the_jobs_and_still_ages_the_running(
    tmp_path, monkeypatch
):
    """A quiet queue's page is remade from the last view of its jobs: no pass over them, but
    the running jobs' times move on with the clock."""
    store = Store(str(tmp_path / "root"))
    page = PagePublisher(store, every_cycles=1)
    now = time.time()
    running = dataclasses.replace(_jobs(1)[0][2], status=Status.ACTIVE, start_time=now - 60)
    jobs = [*_jobs(2), ("r", _jobs(1)[0][1], running)]
    assert page.offer(1, 7, lambda: jobs, None, [], now)
    page.wait()
    monkeypatch.setattr(publisher, "REFRESH_SECONDS", 0.0)

    def listed_again() -> list:
        raise AssertionError("the jobs did not change: they must not be listed again")

    assert page.offer(2, 7, listed_again, None, [], now + 540)
    page.wait()
    data = store.reports.read_page_data()
    assert data["counts"] == {"jobs": 3, "waiting": 2, "running": 1}
    assert [row["name"] for row in data["running"]] == ["r"]
    assert data["running"][0]["running_for"] == 600.0
    assert page.renders == 2


def test_one_render_at_a_time_and_a_busy_publisher_declines(tmp_path, monkeypatch):
    store = Store(str(tmp_path / "root"))
    page = PagePublisher(store, every_cycles=1)
    rendering, finish = threading.Event(), threading.Event()
    render = publisher.render

    def held_render(data):  # the first render lasts until the second offer was made
        rendering.set()
        finish.wait(30)
        return render(data)

    monkeypatch.setattr(publisher, "render", held_render)
    started = page.offer(1, 1, lambda: _jobs(2000), None, [], time.time())
    assert rendering.wait(30)
    declined = page.offer(2, 2, lambda: _jobs(1), None, [], time.time())  # while it renders
    finish.set()
    page.wait()
    assert started and not declined and page.renders == 1


def test_queue_length_samples_outlive_the_daemon_that_took_them(tmp_path):
    store = Store(str(tmp_path / "root"))
    now = time.time()
    first = PagePublisher(store, every_cycles=1)
    first.offer(1, 1, lambda: _jobs(4), None, [], now - 600)
    first.wait()
    second = PagePublisher(store, every_cycles=1)  # a new daemon
    second.offer(1, 1, lambda: _jobs(1), None, [], now)
    second.wait()
    lengths = store.reports.read_page_data()["queue_lengths"]
    assert [n for _, n in lengths] == [4.0, 1.0]

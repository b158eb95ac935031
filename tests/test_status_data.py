"""The status page's pure parts: the data it shows (bounded whatever the queue's length), the
plot's figures, the links to logs, and escaping of everything a spec can say."""

from __future__ import annotations

import re

from bastion.bucket.status_paths import log_url
from bastion.jobspec import new_jobspec
from bastion.jobstate import AttemptRecord, JobState, Status
from bastion.status.data import (
    PLOT_POINTS,
    QUEUE_SHOWN,
    page_data,
    plot_series,
    pool_rows,
)
from bastion.status.html import render
from bastion.usage.report import Attempt

NOW = 1_800_000_000.0
LINK = "../logs/{}".format


def _job(name: str, project: str, status: Status = Status.PENDING, user: str = "u"):
    spec = new_jobspec(
        name=name, command="x", user_id=user, project_id=project, resources={"cpu": 1}
    )
    state = JobState(status=status, submit_time=NOW - 100, reason="waiting")
    if status is Status.ACTIVE:
        state = JobState(
            status=status, attempt=1, start_time=NOW - 50, run_attempt=AttemptRecord("local", "a1")
        )
    return (name, spec, state)


def test_borrowed_is_use_beyond_quota_and_lent_is_the_idle_quota_it_occupies():
    queue = {
        "projects": {
            "owner": {"quota": {"cpu": 4}, "usage": {"cpu": 1}, "waiting": 0},
            "borrower": {"quota": {"cpu": 2}, "usage": {"cpu": 4}, "waiting": 3},
        }
    }
    rows = {r["project"]: r for r in pool_rows(queue)}
    assert rows["borrower"]["borrowed"] == {"cpu": 2} and rows["borrower"]["lent"] == {"cpu": 0}
    assert rows["owner"]["borrowed"] == {"cpu": 0} and rows["owner"]["lent"] == {"cpu": 2}
    assert rows["borrower"]["waiting"] == 3


def test_ten_thousand_waiting_jobs_list_the_first_hundred_in_queue_order_and_count_the_rest():
    jobs = [_job(f"j{i:05d}", "big") for i in range(10_000)]
    order = [f"j{i:05d}" for i in reversed(range(10_000))][:1000]  # the policy's order
    queue = {"projects": {"big": {"waiting": 10_000, "order": order, "reasons": {}}}}
    data = page_data(root_url="/r", log_link=LINK, jobs=jobs, queue=queue, attempts=[], now=NOW)
    (big,) = data["queue"]
    assert [j["name"] for j in big["jobs"]] == order[:QUEUE_SHOWN]
    assert [j["position"] for j in big["jobs"]][:3] == [1, 2, 3]
    assert big["more"] == 10_000 - QUEUE_SHOWN and big["waiting"] == 10_000
    page = render(data)
    assert len(page) < 200_000 and f"… and {10_000 - QUEUE_SHOWN} more waiting" in page


def test_jobs_the_summary_has_not_ordered_follow_its_order_oldest_first():
    """New jobs (and those past the summary's 1,000) come after the policy's order, by when
    the daemon saw them, equal times in the order the daemon holds them; all are counted."""
    jobs = []
    for i in range(200):  # j199 was seen first; j000..j099 at the same moment
        name, spec, state = _job(f"j{i:03d}", "big")
        state.submit_time = NOW - (i if i >= 100 else 0)
        jobs.append((name, spec, state))
    queue = {"projects": {"big": {"waiting": 150, "order": ["j050", "gone"], "reasons": {}}}}
    data = page_data(root_url="/r", log_link=LINK, jobs=jobs, queue=queue, attempts=[], now=NOW)
    (big,) = data["queue"]
    names = [j["name"] for j in big["jobs"]]
    expected = ["j050", *[f"j{i:03d}" for i in range(199, 99, -1)][: QUEUE_SHOWN - 1]]
    assert names == expected
    assert big["waiting"] == 200 and big["more"] == 200 - QUEUE_SHOWN
    few = [j for j in jobs if j[0] < "j003"]  # fewer than shown: all of them, in that order
    data = page_data(root_url="/r", log_link=LINK, jobs=few, queue=None, attempts=[], now=NOW)
    assert [j["name"] for j in data["queue"][0]["jobs"]] == ["j000", "j001", "j002"]


def test_the_plot_stacks_each_projects_use_at_each_instant():
    a = Attempt("a/s/1", "a", "p1", "u", {"cpu": 2}, 0, start=NOW - 3600 * 6, end=NOW - 3600 * 3)
    b = Attempt("b/s/1", "b", "p2", "u", {"cpu": 1}, 0, start=NOW - 3600 * 5)  # still running
    plot = plot_series([a, b], {"projects": {"p1": {"quota": {"cpu": 2}}}}, NOW)
    p1, p2 = plot["series"]["cpu"]["p1"], plot["series"]["cpu"]["p2"]
    assert len(p1) == PLOT_POINTS and plot["quotas"] == {"p1": {"cpu": 2}}
    at = {round((NOW - t) / 3600, 2): i for i, t in enumerate(plot["times"])}
    assert p1[at[4.0]] == 2 and p1[at[6.0]] == 2 and p1[at[3.0]] == 0 and p1[at[7.0]] == 0
    assert p2[at[5.0]] == 1 and p2[-1] == 1 and p2[at[5.25]] == 0


def test_log_links_work_from_the_bucket_and_from_a_local_copy():
    assert log_url("gs://b/root", "j 1", relative=True) == "../logs/j%201"
    assert log_url("gs://b/root", "j", relative=False) == (
        "https://storage.cloud.google.com/b/root/logs/j"
    )
    assert log_url("s3://b/root", "j", relative=False) == "https://b.s3.amazonaws.com/root/logs/j"
    assert log_url("s3://b", "j", relative=False) == "https://b.s3.amazonaws.com/logs/j"
    assert log_url("/tmp/root", "j", relative=False) == "file:///tmp/root/logs/j"


def test_everything_from_a_spec_is_escaped_and_only_the_pages_own_script_is_allowed():
    hostile = "<script>alert(1)</script>"
    jobs = [
        _job("w", hostile, user='"><img src=x onerror=alert(2)>'),
        _job("r", "p", Status.ACTIVE, user=hostile),
    ]
    jobs[0][2].reason = "</td><script>alert(3)</script>"
    queue = {"projects": {hostile: {"waiting": 1, "order": ["w"], "quota": {"cpu": 1}}}}
    finished = [
        {
            "name": hostile,
            "project": "?",
            "user": "?",
            "what": "REJECTED",
            "reason": hostile,
            "time": NOW - 5,
        }
    ]
    page = render(
        page_data(
            root_url="/r",
            log_link=LINK,
            jobs=jobs,
            queue=queue,
            attempts=[],
            finished=finished,
            now=NOW,
        )
    )
    assert page.count("<script") == 1 and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    assert "&lt;/td&gt;&lt;script&gt;alert(3)" in page
    (csp,) = re.findall(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert "default-src &#x27;none&#x27;" in csp and "script-src &#x27;sha256-" in csp
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")  # nothing external

"""``Job.policy_request``: the policy's view of a job, remembered between passes.

Building every waiting job's request took half of each policy pass, so the daemon keeps the
request built from a state and spec until the lifecycle table replaces either. What must hold:
the remembered request is always the one ``job_request`` would build now, a view that depends
on ``now`` (a running job not yet reported running) is never kept, and any replaced state or
spec is seen at once.
"""

from __future__ import annotations

import dataclasses

from bastion.daemon.context import Job
from bastion.jobstate import JobState, Status
from bastion.policy_inputs import job_request, timeless
from launch.api import new_jobspec
from quota.model import Phase


def _spec(cpus: int = 1):
    return new_jobspec(
        name="j", command="true", user_id="u", project_id="p", resources={"cpu": cpus}
    )


def test_a_waiting_jobs_request_is_built_once_while_state_and_spec_stay() -> None:
    job = Job(name="j", state=JobState(submit_time=100.0), spec=_spec())
    first = job.policy_request(200.0)
    assert first == job_request("j", job.spec, job.state, 200.0)
    assert job.policy_request(900.0) is first  # the same view at any later time


def test_a_replaced_state_or_spec_is_seen_at_once() -> None:
    job = Job(name="j", state=JobState(submit_time=100.0), spec=_spec())
    job.policy_request(200.0)
    job.state = dataclasses.replace(job.state, preemptions=2, pending_since=150.0)
    request = job.policy_request(300.0)
    assert request is not None and request.preemptions == 2 and request.pending_since == 150.0
    job.spec = _spec(cpus=4)
    request = job.policy_request(300.0)
    assert request is not None and dict(request.resources) == {"cpu": 4}
    assert request == job_request("j", job.spec, job.state, 300.0)


def test_a_view_that_depends_on_now_is_built_anew_each_time() -> None:
    admitted = JobState(status=Status.ACTIVE, submit_time=100.0, attempt=1)  # not yet RUNNING
    job = Job(name="j", state=admitted, spec=_spec())
    assert not timeless(job.state)
    first, later = job.policy_request(400.0), job.policy_request(500.0)
    assert first is not None and later is not None
    assert (first.phase, first.start_time, later.start_time) == (Phase.RUNNING, 400.0, 500.0)
    job.state = dataclasses.replace(admitted, running_since=450.0)
    assert timeless(job.state)
    reported = job.policy_request(600.0)
    assert reported is not None and reported.start_time == 450.0
    assert job.policy_request(700.0) is reported


def test_a_job_the_policy_does_not_see_has_no_request() -> None:
    job = Job(name="j", state=JobState(status=Status.COMPLETED, submit_time=1.0), spec=_spec())
    assert job.policy_request(5.0) is None
    assert Job(name="k", state=JobState(submit_time=1.0)).policy_request(5.0) is None  # no spec

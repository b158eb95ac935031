"""The cloud path through the daemon, the faults: GPU VMs (the Compute stand-in, runner kind
``gce``) from submit to deleted, a worker that stops heartbeating, a spot preemption, a quota
403, and 429/5xx bursts on every kind of call (GCE and TPU) within and beyond the retry budget.

The real daemon in-process (``cycle`` then ``settle``), the real googleapiclient, the stand-ins
(tests/standins) and the real agents started by the stand-ins' ``on_ready`` hook
(tests/test_cloud_runners.py ``Guests``), on a local-directory root; the harness is
tests/test_cloud_daemon.py ``Cloud``. The stand-ins' own ``rate_limit(n)``/``transient_5xx(n)``
refuse the next n requests of any route; :class:`Bursts` (below) refuses the next n requests of
one kind of call (the insert, the listing, ...) so that each call's retries can be counted.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bastion.daemon import Daemon
from bastion.daemon.start import build_daemon
from bastion.runners.google.zonal import ZonalRunner
from tests.standins.common import ApiError
from tests.standins.compute import ComputeServer
from tests.standins.tpu import TpuServer
from tests.test_cloud_daemon import LOOP, Cloud, assert_attempt_output_has_no_gap, attempt_section
from tests.test_cloud_runners import ZA, ZB, Guests

QUOTA = """[toml-schema]
version = "1"
[total_resources]
v4 = 256
gpu = 64
cpu = 64
[project_membership]
default = [".*"]
[project_resources.default]
v4 = 1.0
gpu = 1.0
cpu = 1.0
"""
RA, RB = ZA.rsplit("-", 1)[0], ZB.rsplit("-", 1)[0]  # us-central2, europe-west4


# -- the stand-ins, with bursts aimed at one kind of call and every answer's status ------------


class Bursts:
    """``burst(n, status, method, path)``: the next ``n`` requests whose method is ``method``
    and whose path matches ``path`` (a regex, searched) answer ``status`` (429: the API's rate
    limit envelope, 503: its unavailable envelope, or ``error``) before reaching any route, so
    a refused create creates nothing; with ``lost=True`` the request is carried out first and
    only its answer is the error (an answer lost on the way back). ``answers`` holds
    (method, path, status) for every request."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._bursts: list[list[Any]] = []
        self.answers: list[tuple[str, str, int]] = []

    def burst(
        self,
        n: int,
        status: int,
        method: str,
        path: str,
        lost: bool = False,
        error: ApiError | None = None,
    ) -> None:
        with self.lock:  # type: ignore[attr-defined]
            self._bursts.append([n, status, method, re.compile(path), lost, error])

    def _refusal(self, method: str, path: str) -> tuple[bool, ApiError] | None:
        with self.lock:  # type: ignore[attr-defined]
            for item in self._bursts:
                n, status, m, rx, lost, error = item
                if n > 0 and m == method and rx.search(path):
                    item[0] -= 1
                    if error is None:
                        server: Any = self  # a StandinServer: its API's own envelopes
                        make = (
                            server._rate_limit_error if status == 429 else server._unavailable_error
                        )
                        error = make()
                    return lost, error
        return None

    def _dispatch(self, method, path, query, body):
        refusal = self._refusal(method, path)
        if refusal is not None and not refusal[0]:
            with self.lock:  # type: ignore[attr-defined]
                self.requests.append((method, path, query, body))  # type: ignore[attr-defined]
                self.answers.append((method, path, refusal[1].status))
            raise refusal[1]
        try:
            status, obj = super()._dispatch(method, path, query, body)  # type: ignore[misc]
        except ApiError as e:
            with self.lock:  # type: ignore[attr-defined]
                self.answers.append((method, path, e.status))
            raise
        if refusal is not None:  # done, but the answer is lost
            status = refusal[1].status
        with self.lock:  # type: ignore[attr-defined]
            self.answers.append((method, path, status))
        if refusal is not None:
            raise refusal[1]
        return status, obj

    def answered(self, method: str, path: str) -> list[int]:
        """The statuses of the requests of one kind of call, in order."""
        rx = re.compile(path)
        with self.lock:  # type: ignore[attr-defined]
            return [s for m, p, s in self.answers if m == method and rx.search(p)]


class BurstyCompute(Bursts, ComputeServer):
    pass


class BurstyTpu(Bursts, TpuServer):
    pass


# -- the two clouds behind one harness ---------------------------------------------------------


class Faults(Cloud):
    """tests/test_cloud_daemon.py ``Cloud`` for either runner: ``kind`` is "tpu" (one-host
    v4-8 nodes) or "gce" (a3-highgpu-8g VMs); ``calls`` are the path regexes of its create,
    list, get and delete; every runner's backoff sleeps are recorded instead of slept."""

    def __init__(self, tmp: Path, server: Any, guests: Guests, kind: str) -> None:
        super().__init__(tmp, server, guests)
        (self.root / "project-quotas" / "project-quotas.config").write_text(QUOTA)
        self.kind = kind
        self.sleeps: list[float] = []
        if kind == "gce":
            self.tpu_settings["max_run_seconds"] = 86400
            coll = r"/zones/[^/]+/instances"
        else:
            coll = r"/locations/[^/]+/nodes"
        self.calls = {
            "create": ("POST", coll + "$"),
            "list": ("GET", coll + "$"),
            "get": ("GET", coll + "/[^/]+$"),
            "delete": ("DELETE", coll + "/[^/]+$"),
        }

    def daemon(self, work: str = "work", **more: Any) -> Daemon:
        if self.kind == "tpu":
            daemon = super().daemon(work, **more)
        else:
            settings = {
                "default_runner": "local",
                "runners": {"gce": {**self.tpu_settings, **more}},
            }
            daemon = build_daemon(
                str(self.root), work_dir=str(self.tmp / work), gpus=[], settings=settings
            )
            self.daemons.append(daemon)
        self.runner(daemon).sleep = self.sleeps.append
        return daemon

    def runner(self, daemon: Daemon) -> ZonalRunner:  # type: ignore[override]
        runner = daemon.runners.get(getattr(self, "kind", "tpu"))
        assert isinstance(runner, ZonalRunner)
        return runner

    def submit(self, name: str, command: str, **options: Any) -> None:  # type: ignore[override]
        if self.kind == "tpu":
            super().submit(name, command, acc="v4-8", **options)
            return
        from launch.api import new_jobspec

        self.client.submit(
            new_jobspec(
                name=name,
                command=command,
                user_id="tester",
                project_id="default",
                resources={"gpu": 8},
                runner={"kind": "gce", "machine_type": "a3-highgpu-8g", **options},
            )
        )

    def creates(self) -> list[tuple]:
        method, path = self.calls["create"]
        return [r for r in self.server.requests if r[0] == method and re.search(path, r[1])]

    def answered(self, call: str) -> list[int]:
        return self.server.answered(*self.calls[call])

    def node_names(self) -> list[str]:
        if self.kind == "tpu":
            return super().node_names()
        with self.server.lock:
            return sorted(key[2] for key in self.server.instances)

    def history(self, name: str) -> list[tuple[str, int, str]]:
        return [(e["event"], e["attempt"], e["reason"]) for e in self.client.history(name)]


def make_faults(tmp_path: Path, kind: str) -> Iterator[Faults]:
    guests = Guests(tmp_path)

    def on_ready(resource: dict, worker: int, metadata: dict) -> None:
        if "startup-script" in metadata:
            guests.on_ready(resource, worker, metadata)

    server_class = BurstyCompute if kind == "gce" else BurstyTpu
    with server_class(on_ready=on_ready) as server:
        cloud = Faults(tmp_path, server, guests, kind)
        try:
            yield cloud
        finally:
            cloud.close()
            guests.close()


@pytest.fixture
def gce(tmp_path: Path) -> Iterator[Faults]:
    yield from make_faults(tmp_path, "gce")


@pytest.fixture(params=["gce", "tpu"])
def either(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Faults]:
    yield from make_faults(tmp_path, request.param)


def wait_until_running(cloud: Faults, daemon: Daemon, name: str) -> str:
    """Drive until the attempt's one worker reports running; its VM's name."""
    cloud.drive(
        daemon,
        lambda: cloud.runner_record(name).get("workers") == ["running"],
        "the worker running",
    )
    return str(cloud.runner_record(name)["name"])


# -- 1. happy path: a GPU VM from submit to deleted ----------------------------------------------


def test_gce_job_succeeds_and_its_vm_is_deleted_before_the_job_is_recorded_finished(
    gce: Faults,
) -> None:
    gce.submit("gpu", 'echo "gpu $BASTION_WORKER of $BASTION_NUM_WORKERS"')
    daemon = gce.daemon()
    gce.drive(daemon, lambda: gce.finished("gpu"), "gpu to finish")
    info = gce.info("gpu")
    assert (info.status, info.state.attempt, info.state.exit_code) == ("SUCCEEDED", 1, 0)
    assert attempt_section(gce.log("gpu"), 1) == "gpu 0 of 1\n"
    assert "attempt 1 exited with status 0" in gce.log("gpu")
    ((_, path, query, body),) = gce.creates()
    assert path.split("/")[6] == ZA and query["requestId"]
    name = body["name"]
    assert body["machineType"] == f"zones/{ZA}/machineTypes/a3-highgpu-8g"
    assert body["labels"]["bastion-job"] == "gpu" and name.endswith("-a1")
    assert gce.guests.wait(name) == [0]
    # finished only once the VM is verified gone: deleted once, then absent from the zone's
    # listing in a later cycle (no GET per VM)
    assert gce.node_names() == []
    assert gce.answered("delete") == [200]
    assert gce.answered("get") == []
    history = gce.history("gpu")
    events = [e for e, _, _ in history]
    assert ("PLACED", 1, f"attempt 1 on VM {name} (1 worker) in {ZA}") in history
    assert ("DELETED", 1, f"deleted VM {name} (1 worker) in {ZA}") in history
    assert events.index("PLACED") < events.index("SUCCEEDED") < events.index("DELETED")
    assert gce.sleeps == []  # no fault, no backoff


# -- 2. a worker that stops heartbeating ----------------------------------------------------------


def test_gce_worker_silent_past_heartbeat_timeout_is_lost_and_requeued_on_a_new_vm(
    gce: Faults, tmp_path: Path
) -> None:
    mark = tmp_path / "first-attempt-ran"
    gce.submit("beat", f"if [ -e {mark} ]; then echo second; else touch {mark}; sleep 600; fi")
    timeout = 3.0
    daemon = gce.daemon(heartbeat_timeout=timeout)
    first = wait_until_running(gce, daemon, "beat")
    assert mark.exists()
    ((proc, _),) = gce.guests.workers[first]
    proc.kill()  # the agent dies without an exit record; its VM stays RUNNING
    killed = time.monotonic()
    seen_lost: list[float] = []
    statuses: set[str] = set()  # the VM's, while attempt 1 was the job's

    def lost() -> bool:
        if gce.info("beat").state.attempt == 2:
            seen_lost.append(time.monotonic())
            return True
        with gce.server.lock:
            statuses.add(gce.server.instances[("proj", ZA, first)]["status"])
        return False

    gce.drive(daemon, lost, "attempt 2")
    # not before the heartbeat timeout (the last beat was at most 0.3 s before the kill),
    # while the VM itself was running all along: the silence alone made it lost
    assert timeout - 0.5 <= seen_lost[0] - killed <= timeout + 15
    assert statuses == {"RUNNING"}
    gce.drive(daemon, lambda: gce.finished("beat"), "attempt 2 to finish")
    info = gce.info("beat")
    assert (info.status, info.state.attempt, info.state.exit_code) == ("SUCCEEDED", 2, 0)
    assert info.state.provider_preemptions == 0
    history = gce.history("beat")
    (lost_event,) = [(a, r) for e, a, r in history if e == "LOST"]
    assert lost_event[0] == 1
    assert (
        "worker 0 stopped heartbeating" in lost_event[1]
        and "requeued as attempt 2" in (lost_event[1])
    )
    placed = [r.split()[4] for e, _, r in history if e == "PLACED"]  # attempt N on VM x
    assert placed[0] == first and placed[1] != first and placed[1].endswith("-a2")
    deleted = [r.split()[2] for e, _, r in history if e == "DELETED"]
    assert sorted(deleted) == sorted(placed)  # the lost VM too, not just attempt 2's
    assert gce.node_names() == []
    assert [b["name"] for _, _, _, b in gce.creates()] == placed  # one VM per attempt
    assert "attempt 1 was lost (worker 0 stopped heartbeating" in gce.log("beat")
    assert attempt_section(gce.log("beat"), 2) == "second\n"


# -- 3. spot preemption --------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["DELETE", "STOP"])
def test_gce_spot_preemption_requeues_on_a_new_vm_without_failing_the_job(
    gce: Faults, action: str
) -> None:
    """DELETE: what the runner asks for (the preempted VM is gone at once); STOP: a VM left
    TERMINATED (the API's default action), which the daemon itself must delete."""
    gce.submit("spot", LOOP, spot=True)
    daemon = gce.daemon()
    gce.drive(daemon, lambda: "line 5\n" in gce.log("spot"), "output of attempt 1")
    first = str(gce.runner_record("spot")["name"])
    with gce.server.lock:
        inst = gce.server.instances[("proj", ZA, first)]
        assert inst["scheduling"]["instanceTerminationAction"] == "DELETE"
        inst["scheduling"]["instanceTerminationAction"] = action
    gce.guests.preempt(first)  # the metadata notice, then the VM is preempted
    gce.server.preempt(first)
    with gce.server.lock:
        left = gce.server.instances.get(("proj", ZA, first))
        assert (left or {}).get("status") == ("TERMINATED" if action == "STOP" else None)
    gce.drive(daemon, lambda: gce.info("spot").state.attempt == 2, "attempt 2")
    gce.drive(
        daemon,
        lambda: (
            gce.runner_record("spot").get("phase") == "RUNNING" and first not in gce.node_names()
        ),
        "attempt 2 running and the preempted VM gone",
    )
    second = str(gce.runner_record("spot")["name"])
    assert second != first and second.endswith("-a2")
    info = gce.info("spot")
    assert info.status == "ACTIVE" and info.state.provider_preemptions == 1
    assert info.state.exit_code is None
    history = gce.history("spot")
    events = [e for e, _, _ in history]
    assert "PROVIDER_PREEMPTED" in events and "FAILED" not in events and "LOST" not in events
    assert ("DELETED", 1, f"deleted VM {first} (1 worker) in {ZA}") in history
    deletes = [p for m, p, _ in gce.server.answers if m == "DELETE" and p.endswith("/" + first)]
    assert len(deletes) == (1 if action == "STOP" else 0)  # the TERMINATED one: by the daemon
    log = gce.log("spot")
    assert "attempt 1 was preempted by the provider" in log
    assert_attempt_output_has_no_gap(log, 1)
    assert gce.node_names() == [second]
    gce.client.cancel("spot", user_id="tester")
    gce.drive(daemon, lambda: gce.finished("spot"), "the cancel")
    assert gce.info("spot").status == "CANCELLED" and gce.node_names() == []


# -- 4. 429 and 5xx bursts -----------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
def test_bursts_within_the_retry_budget_on_every_call_are_absorbed_with_one_create(
    either: Faults, status: int
) -> None:
    cloud, n = either, 3  # num_retries 5: every call gets through on its 4th try
    for call in ("create", "list", "delete"):
        cloud.server.burst(n, status, *cloud.calls[call])
    cloud.submit("burst", "echo through")
    daemon = cloud.daemon()
    cloud.drive(daemon, lambda: cloud.finished("burst"), "burst to finish")
    info = cloud.info("burst")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 1)
    assert attempt_section(cloud.log("burst"), 1) == "through\n"
    # the create was retried until it got through, and created exactly one VM/node
    assert cloud.answered("create") == [status] * n + [200]
    assert (
        len({body.get("name") or query.get("nodeId") for _, _, query, body in cloud.creates()}) == 1
    )
    assert cloud.node_names() == []
    # each kind of call was refused n times, each refusal retried once after a backoff
    for call in ("list", "delete"):
        answers = cloud.answered(call)
        assert answers[:n] == [status] * n and status not in answers[n:], (call, answers)
    assert cloud.answered("delete") == [status] * n + [200]  # one delete, retried
    assert cloud.answered("get") == []  # gone is seen in the zone's listing
    assert len(cloud.sleeps) == 3 * n
    assert all(0 <= s <= 2**5 for s in cloud.sleeps)
    events = [e for e, _, _ in cloud.history("burst")]
    assert events.count("PLACED") == 1 and "PROVISIONING_FAILED" not in events


@pytest.mark.parametrize("status", [429, 503])
def test_create_burst_beyond_the_retry_budget_defers_the_start_to_the_next_cycle(
    either: Faults, status: int
) -> None:
    cloud, budget = either, 2
    cloud.server.burst(budget + 1 + 1, status, *cloud.calls["create"])  # one try into cycle 2
    cloud.submit("long", "echo patient")
    daemon = cloud.daemon(num_retries=budget)
    cloud.step(daemon)  # the state is written, the start handed to the pool and settled:
    assert cloud.answered("create") == [status] * (budget + 1)  # bounded: 1 + num_retries
    cloud.step(daemon)  # the job says why it waits; the start is tried again
    info = cloud.info("long")
    assert (info.status, info.state.attempt) == ("STARTING", 1)  # as `bastion list` shows it
    assert info.reason.startswith("attempt 1 waits to start: creating ")
    assert str(status) in info.reason
    assert cloud.answered("create") == [status] * (budget + 2) + [200]
    cloud.drive(daemon, lambda: cloud.finished("long"), "long to finish")
    info = cloud.info("long")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 1)
    assert attempt_section(cloud.log("long"), 1) == "patient\n"
    assert cloud.answered("create") == [status] * (budget + 2) + [200]  # one VM/node
    assert cloud.node_names() == []
    events = [e for e, _, _ in cloud.history("long")]
    assert events.count("PLACED") == 1 and "PROVISIONING_FAILED" not in events


@pytest.mark.parametrize("status", [429, 503])
def test_listing_burst_beyond_the_retry_budget_is_watched_again_next_cycle(
    either: Faults, status: int
) -> None:
    cloud, budget = either, 2
    cloud.submit("watch", LOOP)
    daemon = cloud.daemon(num_retries=budget)
    name = wait_until_running(cloud, daemon, "watch")
    before = len(cloud.answered("list"))
    cloud.server.burst(budget + 1, status, *cloud.calls["list"])  # the next poll's listing
    cloud.step(daemon)
    info = cloud.info("watch")
    assert info.status == "ACTIVE" and info.state.attempt == 1
    assert info.reason.startswith("could not watch attempt 1: ") and str(status) in info.reason
    answers = cloud.answered("list")[before:]
    assert answers[: budget + 1] == [status] * (budget + 1)  # bounded: 1 + num_retries
    # On every SWEEP_EVERY_CYCLES-th cycle the orphan sweep lists too, after the burst.
    assert all(code == 200 for code in answers[budget + 1 :]), answers
    lines = cloud.log("watch").count("\n")
    cloud.drive(daemon, lambda: cloud.log("watch").count("\n") > lines + 5, "output copied again")
    assert cloud.runner_record("watch")["name"] == name and cloud.node_names() == [name]
    assert cloud.info("watch").state.attempt == 1
    cloud.client.cancel("watch", user_id="tester")
    cloud.drive(daemon, lambda: cloud.finished("watch"), "the cancel")
    assert len(cloud.creates()) == 1 and cloud.node_names() == []


def test_a_watch_that_recovers_no_longer_reports_the_failed_watch(gce: Faults) -> None:
    budget = 2
    gce.submit("stale", LOOP)
    daemon = gce.daemon(num_retries=budget)
    wait_until_running(gce, daemon, "stale")
    healthy = gce.info("stale").reason
    gce.server.burst(budget + 1, 429, *gce.calls["list"])
    gce.step(daemon)
    assert gce.info("stale").reason.startswith("could not watch attempt 1: ")
    lines = gce.log("stale").count("\n")
    gce.drive(daemon, lambda: gce.log("stale").count("\n") > lines + 5, "output copied again")
    reason = gce.info("stale").reason
    assert "could not watch" not in reason and "429" not in reason, (healthy, reason)


@pytest.mark.parametrize("status", [429, 503])
def test_delete_burst_beyond_the_retry_budget_is_retried_before_the_job_is_finished(
    either: Faults, status: int
) -> None:
    cloud, budget = either, 2
    cloud.server.burst(budget + 1, status, *cloud.calls["delete"])
    cloud.submit("gone", "echo bye")
    daemon = cloud.daemon(num_retries=budget)
    cloud.drive(daemon, lambda: len(cloud.answered("delete")) >= budget + 1, "the refused delete")
    assert cloud.answered("delete") == [status] * (budget + 1)  # bounded: 1 + num_retries
    assert not cloud.finished("gone")  # its outcome is known, but its VM/node is still there
    name = str(cloud.creates()[0][3].get("name") or cloud.creates()[0][2]["nodeId"])
    assert cloud.node_names() == [name]
    cloud.drive(daemon, lambda: cloud.finished("gone"), "gone to finish")
    assert (cloud.info("gone").status, cloud.info("gone").state.attempt) == ("SUCCEEDED", 1)
    assert cloud.answered("delete") == [status] * (budget + 1) + [200]  # asked again, once
    assert cloud.node_names() == []
    events = [e for e, _, _ in cloud.history("gone")]
    assert events.count("DELETED") == 1 and events.index("SUCCEEDED") < events.index("DELETED")


# -- 5. quota 403 on the insert -------------------------------------------------------------------


def test_gce_quota_403_waits_with_a_reason_naming_the_quota_and_no_hot_loop(gce: Faults) -> None:
    block = 8.0
    gce.server.quota()  # every zone: a synchronous 403 quotaExceeded on insert
    gce.submit("quota", "echo finally")
    daemon = gce.daemon(zone_block_seconds=block)
    began, steps = time.monotonic(), 0
    while steps < 10 and time.monotonic() - began < block / 2:
        gce.step(daemon)
        steps += 1
    elapsed = time.monotonic() - began
    assert steps >= 4 and elapsed < block, (steps, elapsed)
    info = gce.info("quota")
    assert (info.status, info.state.attempt) == ("STARTING", 1)  # as `bastion list` shows it
    assert info.reason.startswith("attempt 1 waits to start: waiting for capacity: ")
    assert f"quota NVIDIA_H100_GPUS exhausted in region {RA}" in info.reason
    assert f"quota NVIDIA_H100_GPUS exhausted in region {RB}" in info.reason
    assert [p.split("/")[6] for _, p, _, _ in gce.creates()] == [ZA, ZB]  # one per region
    assert gce.answered("create") == [403, 403] and gce.node_names() == []
    assert gce.sleeps == []  # a quota is a block, never a retried rate limit
    gce.server.lift_quota()
    gce.drive(daemon, lambda: gce.finished("quota"), "quota to finish after the lift")
    info = gce.info("quota")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 1)
    assert attempt_section(gce.log("quota"), 1) == "finally\n"
    assert gce.answered("create") == [403, 403, 200]


def test_create_whose_answer_is_lost_is_retried_into_the_same_vm_or_node(either: Faults) -> None:
    """The create is carried out but its answer is a 503: the retry must find the one that
    exists (GCE: the same requestId gets the first operation; TPU: 409, adopted)."""
    cloud = either
    cloud.server.burst(1, 503, *cloud.calls["create"], lost=True)
    cloud.submit("lost", "echo once")
    daemon = cloud.daemon()
    cloud.drive(daemon, lambda: cloud.finished("lost"), "lost to finish")
    info = cloud.info("lost")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 1)
    assert attempt_section(cloud.log("lost"), 1) == "once\n"
    first, again = cloud.creates()
    assert first[1] == again[1] and first[3] == again[3] and first[2] == again[2]
    if cloud.kind == "gce":  # the retried insert was answered with the first operation
        assert cloud.answered("create") == [503, 200] and first[2]["requestId"]
        assert len([o for o in cloud.server.ops.values() if o["operationType"] == "insert"]) == 1
    else:
        assert cloud.answered("create") == [503, 409]
    events = [e for e, _, _ in cloud.history("lost")]
    assert events.count("PLACED") == 1 and events.count("DELETED") == 1
    assert cloud.node_names() == []


def test_gce_insert_403_rate_limit_exceeded_is_retried_not_a_failed_job(gce: Faults) -> None:
    """Compute answers some rate limits with 403 ``rateLimitExceeded`` (as Google documents), which
    googleapiclient retries like a 429; it is no quota and no error of the job."""
    limited = ApiError(
        403,
        {
            "error": {
                "code": 403,
                "message": "Rate Limit Exceeded",
                "errors": [
                    {
                        "message": "Rate Limit Exceeded",
                        "domain": "usageLimits",
                        "reason": "rateLimitExceeded",
                    }
                ],
            }
        },
    )
    gce.server.burst(2, 403, *gce.calls["create"], error=limited)
    gce.submit("rate", "echo eventually")
    daemon = gce.daemon()
    gce.drive(daemon, lambda: gce.finished("rate"), "rate to finish")
    info = gce.info("rate")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 1), info.reason
    assert gce.answered("create") == [403, 403, 200]

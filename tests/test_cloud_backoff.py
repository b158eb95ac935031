"""A create that fails in a zone for a reason that may pass (an operation error such as code 13
INTERNAL, not a stockout nor a quota) backs that zone off exponentially, so that the daemon's
requeued attempts try the next zone and then wait, instead of a hot loop of create calls; and
a queued resource that the service never expires fails at a client-side deadline, its zone
backing off the same way.

The runners (TPU VM, queued resources, GCE) against the stand-ins (tests/standins) through the
real googleapiclient. The loop in ``_drive`` does what the daemon does with an attempt: start
it (a TryAgain means: again next cycle), poll it until it is finished, requeue a failed one as
the next attempt. The zone blocks' clock is the test's (``Clock``), so an hour of backoff takes
no wall time; the API's clock is the stand-in's virtual one."""

from __future__ import annotations

import itertools
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest

from bastion.runners.base import Attempt, AttemptPhase, TryAgain, attempt_name
from bastion.runners.google.gce import GceRunner
from bastion.runners.google.queued import QueuedRunner
from bastion.runners.google.tpu import TpuRunner
from bastion.runners.google.zonal import ZonalRunner
from tests.standins.compute import ComputeServer
from tests.standins.tpu import TpuServer

P, ZA, ZB = "proj", "us-central2-b", "europe-west4-a"
T0 = 1_790_000_000.0  # the blocks' wall clock at the test clock's 0
UNTIL = re.compile(r"blocked until \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ")


class Clock:
    """The zone blocks' clocks (monotonic and wall), moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return T0 + self.now


@dataclass
class Case:
    server: type
    runner: type[ZonalRunner]
    options: dict[str, Any]
    code: Any  # the operation error's code, as the API writes it
    message: str
    collection: str  # the path's last part for a create request
    up_ticks: int  # ticks from create to READY / ACTIVE / RUNNING


CASES = {
    "tpu": Case(
        TpuServer,
        TpuRunner,
        {"accelerator_type": "v4-8"},
        13,
        "Internal error encountered.",
        "nodes",
        2,
    ),
    "tpu-qr": Case(
        TpuServer,
        QueuedRunner,
        {"accelerator_type": "v4-8"},
        13,
        "Internal error encountered.",
        "queuedResources",
        4,
    ),
    "gce": Case(
        ComputeServer,
        GceRunner,
        {"machine_type": "a3-highgpu-8g"},
        "INTERNAL_ERROR",
        "Internal error. Please try again or contact Google Support.",
        "instances",
        2,
    ),
}


def settings(root: str, endpoint: str, **more: Any) -> dict[str, Any]:
    return {
        "root": root,
        "project": P,
        "zones": [ZA, ZB],
        "api_endpoint": endpoint,
        "python": sys.executable,
        "listing_ttl": 0,
        "publish_package": False,
        **more,
    }


def attempt(root: str, n: int, options: dict[str, Any]) -> Attempt:
    return Attempt(
        name=attempt_name(root, "train", "sub1", n, "run"),
        job="train",
        attempt=n,
        command="true",
        env={},
        options=options,
    )


def creates(server: Any, collection: str) -> list[str]:
    """The zone of every create request, in order, from the stand-in's request log."""
    return [
        path.split("/")[path.split("/").index("zones" if "/zones/" in path else "locations") + 1]
        for method, path, _, _ in server.requests
        if method == "POST" and path.endswith("/" + collection)
    ]


@pytest.fixture(params=sorted(CASES))
def cloud(request: pytest.FixtureRequest, tmp_path):
    case = CASES[request.param]
    clock = Clock()
    with case.server() as server:
        runner = case.runner(settings(str(tmp_path / "root"), server.endpoint))
        runner.sleep = lambda _s: None
        runner.blocks.clock, runner.blocks.wall = clock.monotonic, clock.wall
        try:
            yield case, server, runner, clock
        finally:
            runner.close()


Made = list[tuple[float, str]]  # (time, zone) of each create call


def _drive(
    case: Case,
    server: Any,
    runner: ZonalRunner,
    clock: Clock,
    root: str,
    n: int,
    rounds: int,
    step: float = 10.0,
) -> tuple[int, list[str], Made]:
    """The daemon's handling of one job for ``rounds`` cycles ``step`` seconds apart, from
    attempt ``n``: (an attempt number not used yet, each TryAgain's message, (time, zone) of
    every create call)."""
    handle, waits, made = None, [], []
    for _ in range(rounds):
        if handle is None:
            before = len(creates(server, case.collection))
            try:
                handle = runner.start(attempt(root, n, case.options))
            except TryAgain as e:
                waits.append(str(e))
            made += [(clock.now, z) for z in creates(server, case.collection)[before:]]
        else:
            server.tick()
            seen = runner.poll(handle)
            if seen.finished:
                assert (seen.phase, seen.retryable, seen.exit_code) == (
                    AttemptPhase.FAILED,
                    True,
                    None,
                )
                assert f"error code {case.code}: {case.message}" in seen.reason, seen.reason
                handle, n = None, n + 1  # requeued as the next attempt
        clock.now += step
    return n + 1, waits, made


def most_creates(seconds: float, base: float = 30, cap: float = 1800) -> int:
    """Creates in one zone within ``seconds`` if each came the moment its block ended."""
    n, t = 1, 0.0
    while (t := t + min(base * 2 ** (n - 1), cap)) <= seconds:
        n += 1
    return n


def test_a_create_failing_with_an_internal_error_everywhere_makes_a_bounded_number_of_creates(
    cloud, tmp_path
):
    case, server, runner, clock = cloud
    root = runner.root
    server.fail_creates(case.code, case.message)  # every create, in every zone
    _, waits, made = _drive(case, server, runner, clock, root, 1, rounds=720)  # 2 hours
    # Without backoff: a create every other cycle, 360 of them. With it (30 s doubling up to
    # 30 min per zone): a handful per zone.
    zones = [z for _, z in made]
    assert zones[:2] == [ZA, ZB], made  # the first failure moves the next attempt on
    assert most_creates(7200) == 9  # 30, 60, ..., 960 s, then 1800 s apart
    assert 2 * 6 <= len(made) <= 2 * most_creates(7200), made
    for zone in (ZA, ZB):
        times = [t for t, z in made if z == zone]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(b >= a - 20 for a, b in itertools.pairwise(gaps)), (zone, gaps)
        assert gaps[0] < 90 and gaps[3] >= 240 and 1800 <= gaps[-1] <= 1800 + 60, (zone, gaps)
    # While every zone is blocked the start says why and until when, without a call.
    assert len(waits) > 500
    last = waits[-1]
    assert last.startswith("waiting for capacity: ")
    assert f"error code {case.code}: {case.message}" in last
    assert f"failed creates in a row in {ZA}" in last and f"in a row in {ZB}" in last
    assert len(UNTIL.findall(last)) == 2, last


def test_a_create_whose_workers_start_resets_its_zones_backoff(cloud, tmp_path):
    """Machines that come up are not yet a success (a broken image brings VMs up whose
    workers never start, and its retries must keep backing off); the workers' start is."""
    case, server, runner, clock = cloud
    root = runner.root
    server.fail_creates(case.code, case.message)
    n, _, _ = _drive(case, server, runner, clock, root, 1, rounds=200)
    assert runner.blocks.failures(ZA) >= 4 and runner.blocks.failures(ZB) >= 4
    server.fail_creates(None, "")  # the trouble passes
    clock.now += 3600  # every block is over
    handle = runner.start(attempt(root, n, case.options))
    assert handle["zone"] == ZA
    for _ in range(case.up_ticks):
        server.tick()
    seen = runner.poll(handle)
    assert (seen.phase, seen.reason) == (
        AttemptPhase.RUNNING,
        "waiting for workers to start (0 of 1)",
    )
    assert runner.blocks.failures(ZA) >= 4
    runner.store.agents.claim("train", handle["name"], 0, {"time": time.time()})
    seen = runner.poll(handle)
    assert (seen.phase, seen.reason) == (AttemptPhase.RUNNING, "1 of 1 workers running")
    assert runner.blocks.failures(ZA) == 0 and runner.blocks.failures(ZB) >= 4
    server.fail_creates(case.code, case.message, zone=ZA)
    handle = runner.start(attempt(root, n + 1, case.options))
    assert handle["zone"] == ZA
    seen = runner.poll(handle)
    for _ in range(case.up_ticks + 2):
        if seen.finished:
            break
        server.tick()
        seen = runner.poll(handle)
    assert (seen.phase, seen.retryable) == (AttemptPhase.FAILED, True)
    why = runner.blocks.reason(ZA)
    assert why is not None and f"(1 failed create in {ZA}: backing off 30 s)" in why
    assert UNTIL.search(why)


# -- queued resources: a client-side deadline ----------------------------------------------------


@pytest.fixture
def tpu_server():
    with TpuServer() as server:
        yield server


def test_a_queued_resource_the_service_never_expires_fails_at_its_client_side_deadline(
    tpu_server, tmp_path
):
    root = str(tmp_path / "root")
    options = {"accelerator_type": "v4-8", "queue_seconds": 1}
    runner = QueuedRunner(settings(root, tpu_server.endpoint, queue_margin_seconds=0))
    patient = QueuedRunner(settings(root, tpu_server.endpoint))  # the default margin: 300 s
    runner.sleep = patient.sleep = lambda _s: None
    try:
        h1 = runner.start(attempt(root, 1, options))
        assert h1["zone"] == ZA and h1["queue_seconds"] == 1 and h1["created"] <= time.time()
        tpu_server.tick()  # ACCEPTED
        tpu_server.stuck(h1["name"])  # no advance, no expiry: only the client's deadline is left
        assert runner.poll(h1).phase is AttemptPhase.QUEUED
        time.sleep(max(0.0, h1["created"] + 1.2 - time.time()))
        assert patient.poll(h1).phase is AttemptPhase.QUEUED  # within queue_seconds + its margin
        seen = runner.poll(h1)
        assert (seen.phase, seen.retryable, seen.exit_code) == (AttemptPhase.FAILED, True, None)
        assert seen.reason == f"queued resource waited past its deadline of 1 s in {ZA}"
        assert runner.delete(h1) is False  # force delete of the stuck request
        tpu_server.tick()
        assert runner.delete(h1) is True and not tpu_server.qrs
        h2 = runner.start(attempt(root, 2, options))  # the requeue: ZA backs off
        assert h2["zone"] == ZB
        tpu_server.stuck(h2["name"])
        time.sleep(max(0.0, h2["created"] + 1.2 - time.time()))
        assert runner.poll(h2).phase is AttemptPhase.FAILED
        with pytest.raises(TryAgain) as e:
            runner.start(attempt(root, 3, options))
        message = str(e.value)
        for zone in (ZA, ZB):
            assert f"queued resource waited past its deadline of 1 s in {zone}" in message
        assert len(UNTIL.findall(message)) == 2
        made = [r for r in tpu_server.requests if r[0] == "POST"]
        assert len(made) == 2  # the third attempt waits without a create
    finally:
        runner.close()
        patient.close()

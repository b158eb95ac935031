"""The lease under the daemon's own load: its renewals never wait behind the daemon's other
requests, and a start refused while the lease was uncertain is made once the daemon holds it
again (found with benchmarks/bench_scale.py on the GCS emulator: during a burst of 1,000
starts a renewal waited over 35 s behind the burst's requests, the lease lapsed, and 136 starts
were refused and never made)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from bastion.bucket.store import Store
from bastion.daemon.start import build_daemon
from bastion.jobstate import Status
from bastion.lease import Lease
from launch.api import Client
from tests.conftest import fresh_gcs_root
from tests.test_snapshot import QUOTA, _submit


@pytest.mark.usefixtures("gcs_emulator")
def test_a_renewal_completes_while_the_stores_own_requests_are_stuck(tmp_path: Path) -> None:
    """The daemon's store's event loop is held up (as by thousands of queued requests);
    the lease, on connections of its own, is still taken and renewed meanwhile."""
    root = fresh_gcs_root()
    store = Store(root)
    own = store.own_connection("test-lease")
    assert own.bucket.fs.loop is not store.bucket.fs.loop
    released = threading.Event()

    async def stuck() -> None:
        released.wait(30)  # blocks the loop itself: nothing else on it runs meanwhile

    blocked = asyncio.run_coroutine_threadsafe(stuck(), store.bucket.fs.loop)
    try:
        lease = Lease(own, "tester", duration=30)
        assert lease.hold() and lease.renew() and lease.valid(need=10)
        assert not blocked.done(), "the store's loop was free all along: nothing was tested"
        lease.release()
    finally:
        released.set()
        blocked.result(timeout=30)
    assert store.lease.read() is not None  # the same object, seen through the daemon's store


@pytest.mark.usefixtures("gcs_emulator")
def test_the_daemons_lease_has_connections_of_its_own_on_a_bucket(tmp_path: Path) -> None:
    daemon = build_daemon(
        fresh_gcs_root(), work_dir=str(tmp_path / "work"), gpus=[], lease_seconds=60
    )
    try:
        assert daemon.ctx.lease is not None
        lease_fs, store_fs = daemon.ctx.lease.store.bucket.fs, daemon.ctx.store.bucket.fs
        assert lease_fs is not store_fs and lease_fs.loop is not store_fs.loop
        assert lease_fs.loop.is_running()
    finally:
        daemon.close()
    # and closing the daemon stops that loop's thread (a closed daemon leaves none behind)
    assert not lease_fs.loop.is_running()
    assert store_fs.loop.is_running()  # fsspec's shared loop is not ours to stop


def test_a_local_root_needs_no_connection_of_its_own(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "root"))
    assert store.own_connection("test-lease") is store


def test_a_start_refused_for_an_uncertain_lease_is_made_once_the_daemon_holds_it_again(
    tmp_path: Path,
) -> None:
    """The lease is uncertain exactly while the first start is carried out (its renewal
    late): the start is not made then, and not lost either; the daemon stands down, takes
    the lease again, recovers, and makes it, once."""
    root = str(tmp_path / "root")
    quota = Path(root, "project-quotas", "project-quotas.config")
    quota.parent.mkdir(parents=True)
    quota.write_text(QUOTA)
    _submit(Client(root, expect_daemon=False), ["train"])
    daemon = build_daemon(
        root,
        work_dir=str(tmp_path / "work"),
        gpus=[],
        lease_seconds=60,
        settings={"default_runner": "fake", "runners": {"fake": {"state_dir": str(tmp_path)}}},
    )
    lease = daemon.ctx.lease
    assert lease is not None
    clock, lapsed = lease.clock, threading.Event()

    def late_renewal_clock() -> float:
        """Past the lease's validity for the effects in flight while ``lapsed`` is set."""
        in_effects = threading.current_thread().name.startswith("bastion-effects")
        return clock() + (10 * lease.duration if lapsed.is_set() and in_effects else 0.0)

    lease.clock = late_renewal_clock
    try:
        lapsed.set()
        for _ in range(3):  # recovery, then the cycle that admits the job and starts it
            daemon.run(poll_seconds=0.05, once=True)
            daemon.settle()
        job = daemon.ctx.jobs.get("train")
        assert job is None or job.state.run_attempt is None or job.state.run_attempt.unstarted
        assert daemon.runners.get("fake").list_owned() == []  # nothing started meanwhile
        lapsed.clear()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            daemon.run(poll_seconds=0.05, once=True)
            daemon.settle()
            job = daemon.ctx.jobs.get("train")
            if job is not None and job.state.status is Status.ACTIVE:
                record = job.state.run_attempt
                if record is not None and not record.unstarted:
                    break
        else:
            raise AssertionError("the refused start was never made")
        owned = daemon.runners.get("fake").list_owned()
        assert [o.name for o in owned] == [record.name]  # made once, under its recorded name
    finally:
        daemon.close()


class _SlowLeaseObject:
    """The root's real lease object, each write taking ``seconds`` first (a loaded bucket)."""

    def __init__(self, store: Store, seconds: float) -> None:
        self._lease, self._seconds = store.lease, seconds
        self.writes: list[float] = []  # when each write was sent (monotonic)

    def read(self) -> object:
        return self._lease.read()

    def write(self, record: dict, expected: str | None) -> str:
        self.writes.append(time.monotonic())
        time.sleep(self._seconds)
        return self._lease.write(record, expected)


def test_a_renewal_as_slow_as_a_third_of_the_term_never_lets_the_lease_lapse(
    tmp_path: Path,
) -> None:
    """Renewals are sent every third of the term from when the last one was sent: counted
    from its answer instead, each slow renewal would spend its validity waiting twice (sent
    every 2 s, each valid for 2.25 s from its sending, answered 1 s later: a lapse)."""
    store = Store(str(tmp_path / "root"))
    slow = _SlowLeaseObject(store, seconds=1.0)
    slowed = type("SlowStore", (), {"lease": slow, "root_url": store.root_url})()
    lease = Lease(slowed, "tester", duration=3.0)  # type: ignore[arg-type]
    assert lease.hold()
    try:
        deadline, lapsed = time.monotonic() + 6.0, 0
        while time.monotonic() < deadline:
            lapsed += not lease.valid()
            time.sleep(0.02)
        assert lapsed == 0, f"the lease lapsed in {lapsed} of its checks"
        gaps = [b - a for a, b in zip(slow.writes[1:], slow.writes[2:], strict=False)]
        assert gaps and all(0.9 <= gap <= 1.5 for gap in gaps), gaps
    finally:
        lease.release()

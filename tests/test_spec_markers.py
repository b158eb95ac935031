"""Submission markers: a busy queue's cycle reads the specs users marked, not every spec.

The daemon lists every spec only now and then (bastion/bucket/specwatch.py); in between, the
Client's
markers in jobs/user_states/ say which specs to read. These tests put the daemon in that mode
on a small root (``every_cycle_below = 0``: the listing is never "cheap enough to run every
cycle"), drive its cycles with explicit times, and check that nothing users write is lost: a
Client submission is taken in at once without the spec listing; what plain tools write, replace
or delete is seen by the full listing within its interval; markers that name nothing, or are no
markers Bastion writes, are reported and removed. Real daemon, fake runner, real bucket (a local
directory and the GCS emulator).
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bastion.bucket.jobs import is_marker, marked_job, marker_name
from bastion.bucket.specwatch import FULL_LISTING_SECONDS, Look
from bastion.bucket.store import Store
from bastion.daemon import Daemon, ingest
from bastion.daemon.ingest import INTAKE_PER_CYCLE
from bastion.daemon.prefetch import Prefetched
from bastion.daemon.start import build_daemon
from bastion.jobstate import Status
from launch.api import Client, new_jobspec
from tests.conftest import fresh_gcs_root
from tests.flakyfs import FailurePlan, FlakyFileSystem

QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
cpu = 2
[project_membership]
default = [".*"]
[project_resources.default]
cpu = 1.0
"""


@pytest.fixture(params=["local", "gcs"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "gcs":
        request.getfixturevalue("gcs_emulator")
        return fresh_gcs_root()
    return str(tmp_path / "root")


def _spec(name: str, command: str = "sleep 60") -> bytes:
    spec = new_jobspec(
        name=name,
        command=command,
        user_id="u",
        project_id="default",
        resources={"cpu": 1},
        runner={"kind": "fake"},
    )
    return spec.dumps()


class Rig:
    """A daemon in marker mode on ``root``, driven one cycle at a time on a clock we move."""

    def __init__(self, root: str, tmp_path: Path) -> None:
        self.store = Store(root)
        self.store.quota.write_default(QUOTA)
        self.client = Client(store=Store(root), expect_daemon=False)
        self.daemon: Daemon = build_daemon(
            root,
            work_dir=str(tmp_path / "work"),
            gpus=[],
            settings={
                "default_runner": "fake",
                "runners": {"fake": {"state_dir": str(tmp_path / "fake")}},
            },
        )
        self.daemon.specwatch.every_cycle_below = 0  # never "cheap enough for every cycle"
        self.now = time.time()
        self.step()  # the first cycle lists everything (recovery); the next ones need not

    def step(self, seconds: float = 1.0) -> dict[str, int]:
        self.now += seconds
        report = self.daemon.cycle(self.now)
        self.daemon.settle()
        return report.ops

    def submit(self, name: str, command: str = "sleep 60") -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no daemon loop holds the lease: we drive it
            self.client.submit(
                new_jobspec(
                    name=name,
                    command=command,
                    user_id="u",
                    project_id="default",
                    resources={"cpu": 1},
                    runner={"kind": "fake"},
                )
            )

    def status(self, name: str) -> Status | None:
        job = self.daemon.jobs.get(name)
        return job.state.status if job else None

    def complete_record(self, name: str, cycles: int = 5) -> dict | None:
        """Step until the daemon has let the job go (at most ``cycles``), then its record."""
        for _ in range(cycles):
            if name not in self.daemon.jobs:
                break
            self.step()
        return self.store.complete.read(name)

    def inbox(self) -> list[str]:
        return sorted(self.store.requests.list())

    def close(self) -> None:
        self.daemon.close()


@pytest.fixture
def rig(root: str, tmp_path: Path) -> Iterator[Rig]:
    r = Rig(root, tmp_path)
    yield r
    r.close()


def test_a_client_submission_is_taken_in_without_listing_the_specs(rig: Rig) -> None:
    for i in range(3):
        rig.store.specs.submit(f"old-{i}", _spec(f"old-{i}", "sleep 600"))  # plain tools
    rig.step(FULL_LISTING_SECONDS)  # the full listing takes the plain ones in
    assert {"old-0", "old-1", "old-2"} <= set(rig.daemon.jobs)
    rig.submit("new")
    assert len(rig.inbox()) == 1 and marked_job(rig.inbox()[0]) == "new"
    ops = rig.step()
    assert ops["list"] == 1, ops  # jobs/user_states/ only: jobs/active/ was not listed
    assert rig.status("new") is Status.PENDING
    assert rig.inbox() == []  # the marker is consumed
    # The token read with the spec is the listing's: the next full listing reads nothing.
    assert rig.daemon.jobs["new"].token == rig.store.specs.list()["new"].token
    reads = rig.step(FULL_LISTING_SECONDS).get("read", 0)
    assert reads == 0


def test_an_update_through_the_client_is_taken_in_at_once(rig: Rig) -> None:
    rig.submit("job", "sleep 600")
    rig.step()
    version = rig.daemon.jobs["job"].state.spec_digest
    rig.client.update("job", "sleep 601", user_id="u")
    rig.step()
    assert rig.daemon.jobs["job"].spec.command == "sleep 601"
    assert rig.daemon.jobs["job"].state.spec_digest != version or rig.status("job") in (
        Status.ACTIVE,
        Status.CANCELLING,
    )
    assert rig.inbox() == []


def test_plain_tool_writes_are_seen_within_the_full_listing_interval(rig: Rig) -> None:
    """Copied in, replaced, deleted without a marker: seen once the full listing runs, which
    is at most FULL_LISTING_SECONDS after the last one."""
    rig.submit("keep", "sleep 600")
    rig.submit("doomed", "sleep 600")
    rig.step()
    assert rig.status("keep") is not None and rig.status("doomed") is not None
    rig.store.specs.submit("copied", _spec("copied"))  # `gsutil cp`
    rig.store.specs.replace("keep", _spec("keep", "sleep 700"))
    rig.store.specs.delete("doomed")  # `gsutil rm`
    for _ in range(3):  # within the interval: not seen yet
        rig.step(FULL_LISTING_SECONDS / 10)
    assert "copied" not in rig.daemon.jobs
    assert rig.daemon.jobs["keep"].spec.command == "sleep 600"
    assert not rig.daemon.jobs["doomed"].gone_from_bucket
    rig.step(FULL_LISTING_SECONDS)
    assert rig.status("copied") is not None
    assert rig.daemon.jobs["keep"].spec.command == "sleep 700"
    doomed = rig.daemon.jobs.get("doomed")
    assert doomed is None or doomed.gone_from_bucket
    record = rig.complete_record("doomed")
    assert record is not None and record["state"]["outcome"] == "CANCELLED", record
    assert "spec deleted" in record["state"]["reason"]


def test_what_a_full_listing_finds_beyond_one_cycle_is_read_next_cycle_not_next_listing(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain-tool writes beyond one cycle's intake: the cycles right after the listing read
    the rest by name (no marker names them), oldest listing first, with the client's marked
    specs after them; they did wait for the next full listing, 30 s or more each thousand."""
    monkeypatch.setattr(ingest, "INTAKE_PER_CYCLE", 3)
    copied = [f"c{i}" for i in range(7)]
    for name in copied:
        rig.store.specs.submit(name, _spec(name))  # `gsutil cp`, no marker
    reads = rig.step(FULL_LISTING_SECONDS).get("read", 0)  # the full listing: 3 in, 4 left
    assert len(set(copied) & set(rig.daemon.jobs)) == 3
    assert rig.daemon.ctx.intake_backlog == 4
    rig.submit("marked")
    reads += rig.step(0.1).get("read", 0)  # no full listing: the next 3 of the listing's
    assert "marked" not in rig.daemon.jobs
    assert len(set(copied) & set(rig.daemon.jobs)) == 6
    reads += rig.step(0.1).get("read", 0)
    assert set(copied) | {"marked"} <= set(rig.daemon.jobs)
    assert reads == 8  # each read once (some ahead, by the prefetch)
    assert rig.daemon.ctx.intake_backlog == 0 and rig.daemon.ctx.listed_backlog == {}
    assert all(rig.status(n) in (Status.PENDING, Status.ACTIVE) for n in [*copied, "marked"])


def test_a_cancel_for_a_job_not_seen_yet_is_applied_not_dropped(rig: Rig) -> None:
    """A spec copied in by hand and cancelled before the full listing found it: the request
    makes the daemon read the spec, so the job is cancelled and never starts."""
    rig.store.specs.submit("hand", _spec("hand"))
    rig.client.cancel("hand", user_id="u")
    rig.step()
    record = rig.complete_record("hand")
    assert record is not None and record["state"]["outcome"] == "CANCELLED", record
    assert record["state"]["attempt"] == 0  # never started
    assert rig.inbox() == []


def test_markers_that_name_nothing_or_are_malformed_are_reported_and_lose_nothing(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.store.requests.write_marker("ghost")  # a marker whose spec was never written
    rig.store.requests.write("_submitted-garbage", b"{}")  # no marker Bastion writes
    rig.store.specs.submit("broken", b"{not json")  # a malformed spec, marked
    rig.store.requests.write_marker("broken")
    rig.submit("fine")
    with caplog.at_level(logging.WARNING, logger="bastion"):
        rig.step()
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "ghost: a submission marker names it but" in messages, messages
    assert "_submitted-garbage is not a submission marker Bastion writes" in messages, messages
    assert "ghost" not in rig.daemon.jobs
    assert rig.status("fine") is not None  # the good one beside them is taken in
    record = rig.complete_record("broken")
    assert record is not None and record["state"]["outcome"] == "REJECTED", record
    assert "spec rejected" in record["state"]["reason"]
    assert rig.inbox() == []  # every marker consumed, good or bad


def test_a_marker_whose_spec_read_fails_is_kept_for_the_next_cycle(rig: Rig) -> None:
    """A failed read keeps its marker: the spec is read next cycle, not left to the full
    listing."""
    rig.submit("later")
    real = rig.daemon.store.specs.read_many_with_token
    calls = []

    def failing_once(names: list[str], pool: Any) -> list[Any]:
        calls.append(names)
        if len(calls) == 1:  # (a failed read is its exception, in its place)
            return [OSError("simulated 503") for _ in names]
        return real(names, pool)

    rig.daemon.store.specs.read_many_with_token = failing_once  # type: ignore[method-assign]
    rig.step()
    assert "later" not in rig.daemon.jobs
    assert len(rig.inbox()) == 1  # kept
    rig.step()
    assert rig.status("later") is not None
    assert rig.inbox() == []


def test_a_marker_does_not_bring_back_a_finished_job(rig: Rig) -> None:
    rig.submit("quick", "true")
    for _ in range(10):
        rig.step()
        if rig.store.complete.read("quick"):
            break
    assert rig.store.complete.read("quick")["state"]["outcome"] == "SUCCEEDED"
    rig.store.requests.write_marker("quick")  # late or duplicated: its spec is gone
    rig.step()
    assert "quick" not in rig.daemon.jobs
    assert rig.inbox() == []


def test_marker_names_round_trip_and_refuse_what_clients_do_not_write() -> None:
    marker = marker_name("my-job.v2", now=1_700_000_000.123)
    assert marker.startswith("_submitted-1700000000123-")
    assert is_marker(marker) and marked_job(marker) == "my-job.v2"
    assert marker_name("a") != marker_name("a")  # each write its own marker
    for bad in (
        "_submitted-",
        "_submitted-12-abcdef01-x",
        "_submitted-1700000000123-xyz-a",
        "_submitted-1700000000123-abcdef01-",
    ):
        assert marked_job(bad) is None, bad
    body = json.dumps({"name": "x"})
    assert not is_marker("x") and body  # cancel requests are named by their job


def test_a_marker_whose_delete_fails_is_not_taken_in_again_and_is_deleted_next_cycle(
    tmp_path: Path,
) -> None:
    """The bucket refuses the marker's delete (twice: the batch call and the single retry):
    the next cycle neither reads its spec again (it was taken in) nor leaves it behind: it is
    handed to that cycle's delete, which succeeds."""
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    plan = FailurePlan(ops={"rm_file"}, where="/_submitted-", first_calls=2, when="before")
    rig = Rig(FlakyFileSystem.install(str(bucket), plan), tmp_path)
    try:
        reads: list[str] = []
        real = rig.daemon.store.specs.read_many_with_token

        def counted(names: list[str], pool: Any) -> list[Any]:
            reads.extend(names)
            return real(names, pool)

        rig.daemon.store.specs.read_many_with_token = counted  # type: ignore[method-assign]
        rig.submit("sticky")
        rig.step()
        assert rig.status("sticky") in (Status.PENDING, Status.ACTIVE)
        assert reads == ["sticky"]
        assert len(rig.inbox()) == 1 and plan.failures["rm_file:before"] == 2  # not deleted
        rig.step()
        assert reads == ["sticky"]  # not read again
        assert rig.inbox() == []  # retried, and deleted
        rig.step()
        assert reads == ["sticky"]
    finally:
        rig.close()
        FlakyFileSystem.uninstall(str(bucket))


def test_a_burst_is_taken_in_over_bounded_cycles_oldest_first_without_waiting(tmp_path):
    """A cycle takes in at most INTAKE_PER_CYCLE marked specs, the oldest markers first (and
    reads the next window ahead meanwhile); the rest keep their markers, and the loop runs the
    next cycle at once instead of after its poll."""
    rig = Rig(str(tmp_path / "root"), tmp_path)
    try:
        count = INTAKE_PER_CYCLE * 2 + INTAKE_PER_CYCLE // 2
        for i in range(count):
            rig.submit(f"b{i:05d}")
        stamp = {marked_job(m): m.split("-")[1] for m in rig.inbox() if is_marker(m)}
        taken: list[set[str]] = []
        reads = 0
        for _ in range(3):
            reads += rig.step().get("read", 0)  # its own, and the next window's ahead
            taken.append(set(rig.daemon.jobs) - set().union(*taken))
            assert len(taken[-1]) <= INTAKE_PER_CYCLE
            if len(taken) == 1:
                assert rig.daemon.ctx.intake_backlog == count - INTAKE_PER_CYCLE
                started = time.monotonic()
                rig.daemon.wait_for_work(started + 60)  # a poll of a minute: not waited
                assert time.monotonic() - started < 1
        assert [len(t) for t in taken] == [INTAKE_PER_CYCLE, INTAKE_PER_CYCLE, count // 5]
        assert max(stamp[n] for n in taken[0]) <= min(stamp[n] for n in taken[1] | taken[2])
        assert rig.daemon.ctx.intake_backlog == 0
        assert all(rig.status(f"b{i:05d}") is not None for i in range(count))
        assert count <= reads <= count + 20  # each spec read once, ahead or in its cycle
    finally:
        rig.close()


def test_while_a_burst_waits_a_look_lists_only_its_oldest_window_and_the_cancels(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a look saw a window's worth of markers, the next ones list only the oldest window
    (and the cancel requests around it), not every marker: listing 100,000 markers a cycle to
    take 1,000 in made a large intake quadratic. The backlog still runs cycles at once, a
    cancel request is still seen, and once the burst is in, one plain listing again."""
    window = 10
    monkeypatch.setattr("bastion.daemon.ingest.INTAKE_PER_CYCLE", window)
    watch = rig.daemon.specwatch
    watch.markers_per_look = window
    full: list[int] = []
    plain_list = rig.daemon.store.requests.list
    monkeypatch.setattr(
        rig.daemon.store.requests, "list", lambda: full.append(1) or plain_list()
    )  # a spy that counts full listings of jobs/user_states/ and lists as before
    for i in range(35):
        rig.submit(f"w{i:03d}")
    taken: list[int] = []
    seen: set[str] = set()
    for cycle in range(5):
        full.clear()
        rig.step()
        taken.append(len(set(rig.daemon.jobs) - seen))
        seen |= set(rig.daemon.jobs)
        assert len(full) == (1 if cycle in (0, 4) else 0), cycle
        if cycle == 1:
            assert rig.daemon.ctx.intake_backlog and watch.glance()  # no wait, no listing
            assert not full
            rig.client.cancel("w000", user_id="u")  # a cancel among the waiting markers
    assert taken == [10, 10, 10, 5, 0]
    assert rig.daemon.ctx.intake_backlog == 0
    assert [m for m in rig.inbox() if is_marker(m)] == []
    record = rig.complete_record("w000")
    assert record is not None and record["state"]["outcome"] == "CANCELLED", record


def test_a_spec_updated_after_the_prefetch_read_it_ends_with_the_update(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefetch reads the next window while a burst waits; a spec updated after that read
    has a newer marker, so whatever cycle takes the older bytes in, the update follows: the job
    ends up with the new command, as if nothing had been read ahead."""
    names = _burst_read_ahead(rig, monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rig.client.update("b4", "sleep 700", user_id="u")
    for _ in range(4):
        rig.step(0.1)
    assert set(names) <= set(rig.daemon.jobs)
    assert rig.daemon.jobs["b4"].spec.command == "sleep 700"
    assert rig.daemon.jobs["b3"].spec.command == "sleep 600"


def test_a_prefetched_read_is_used_only_when_the_look_has_no_newer_marker_for_it() -> None:
    """``Prefetched.usable``: a job whose every marker in the look was listed by the prefetch
    takes the read as it is (an absent spec too); a newer marker, or a failed read, means the
    cycle reads it again; what no look asks for is never taken."""
    prefetched = Prefetched(
        markers={"m1": "a", "m2": "b", "m3": "c", "m4": "d"},
        reads={"a": (b"A", "t1"), "b": (b"B", "t2"), "c": OSError("503"), "d": None},
    )
    look = Look(
        requests={},
        markers={"m1": "a", "m2": "b", "m9": "b", "m3": "c", "m4": "d"},
        specs=None,
        now=0.0,
    )
    assert prefetched.usable(look) == {"a": (b"A", "t1"), "d": None}


def test_a_full_listing_takes_what_was_read_ahead_unless_the_spec_changed_since(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle that lists every spec uses the prefetch's reads whose tokens the listing
    shows (taking those first), and reads again one rewritten since by a plain tool."""
    names = _burst_read_ahead(rig, monkeypatch)
    rig.store.specs.replace("b4", _spec("b4", "sleep 700"))  # `gsutil cp`, no marker
    reads = rig.step(FULL_LISTING_SECONDS).get("read", 0)  # lists every spec
    assert {"b3", "b5"} <= set(rig.daemon.jobs)  # read ahead: taken first
    assert len({"b4", "b6"} & set(rig.daemon.jobs)) == 1  # then the listing's order
    # b4 or b6 now, and ahead for the next cycle b4 (not as it was) and b6 by its marker;
    # never b3 or b5 again (5 and more, had the full listing read all it took in)
    assert reads <= 3
    rig.step(0.1)
    assert set(names) <= set(rig.daemon.jobs)
    assert rig.daemon.jobs["b4"].spec.command == "sleep 700"


def _burst_read_ahead(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Seven jobs b0-b6 submitted in that order, cycles of 3 (the look's window too), one
    cycle run: b0-b2 taken in, b3-b5 read ahead. The names."""
    monkeypatch.setattr(ingest, "INTAKE_PER_CYCLE", 3)
    rig.daemon.specwatch.markers_per_look = 3
    names = [f"b{i}" for i in range(7)]
    for name in names:
        rig.submit(name, "sleep 600")
        time.sleep(0.002)  # markers sort by their writer's clock, in ms
    rig.step(0.1)
    prefetched = rig.daemon.ctx.prefetch.peek()
    assert prefetched is not None and set(prefetched.reads) == {"b3", "b4", "b5"}
    assert set(rig.daemon.jobs) == {"b0", "b1", "b2"}
    return names

"""A restarted daemon reads the snapshot and what changed since, never trusting a shard over
the bucket: each entry is used only where the listed token is the one it was taken from."""

from __future__ import annotations

import time
import warnings
import zlib
from pathlib import Path

import pytest

from bastion.bucket.snapshot import SHARDS, Entry, SnapshotError, decode, encode, shard_of
from bastion.bucket.store import Store
from bastion.daemon import Daemon, snapshot
from bastion.daemon.snapshot import SNAPSHOT_SECONDS
from bastion.daemon.start import build_daemon
from bastion.jobstate import JobState
from launch.api import Client, new_jobspec

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
JOBS = 300


def _submit(client: Client, names: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tests drive the daemon's cycles themselves
        for name in names:
            spec = new_jobspec(
                name=name,
                command="sleep 600",
                user_id="u",
                project_id="default",
                resources={"cpu": 1},
                runner={"kind": "fake"},
            )
            client.submit(spec)


@pytest.fixture
def root(tmp_path: Path) -> str:
    root = str(tmp_path / "root")
    quota = Path(root, "project-quotas", "project-quotas.config")
    quota.parent.mkdir(parents=True)
    quota.write_text(QUOTA)
    _submit(Client(root, expect_daemon=False), [f"j{i:04d}" for i in range(JOBS)])
    return root


def _daemon(root: str, tmp_path: Path) -> Daemon:
    return build_daemon(
        root,
        work_dir=str(tmp_path / "work"),
        gpus=[],
        settings={
            "default_runner": "fake",
            "runners": {"fake": {"state_dir": str(tmp_path / "fake")}},
        },
    )


def _cycle(daemon: Daemon, now: float | None = None) -> dict[str, int]:
    report = daemon.cycle(time.time() if now is None else now)
    daemon.settle()
    return report.ops


def _settled(daemon: Daemon) -> dict[str, tuple[str, int, str]]:
    """Cycles until two in a row write nothing; each job's status, attempt and identity."""
    for _ in range(20):
        if not _cycle(daemon).get("write") and not _cycle(daemon).get("write"):
            break
    return {
        n: (j.state.status.value, j.state.attempt, j.state.job_identity)
        for n, j in daemon.jobs.items()
    }


def _written_snapshot(daemon: Daemon) -> None:
    """A cycle past the snapshot's period, and its shards written."""
    _cycle(daemon, time.time() + 2 * SNAPSHOT_SECONDS)
    future = daemon.ctx.snapshots.inflight
    assert future is not None, "no shard was written"
    future.result(timeout=60)


def _restarted(root: str, tmp_path: Path) -> tuple[Daemon, dict[str, int]]:
    daemon = _daemon(root, tmp_path)
    return daemon, _cycle(daemon)


def test_a_shard_round_trips_and_anything_else_is_refused():
    entries = {
        "a": Entry("1", "2", b'{"status": "PENDING"}', b'{"name": "a"}'),
        "b": Entry("", "3", b"x"),
        # strings whose header needs escapes: read by the JSON decoder, not the plain pattern
        'q"uote': Entry("back\\slash", "\u00e9t\u00e9", b"s", b"p", b"r"),
        "ctl\x01": Entry("1", "tab\t", b"", b"", b""),
    }
    assert decode(encode(entries.items())) == entries
    for foreign in (b"", b"not compressed", encode([])[:-3], b"x\x9c" + b"\x00" * 8):
        with pytest.raises(SnapshotError):
            decode(foreign)
    assert {shard_of(f"j{i}") for i in range(1000)} == set(range(SHARDS))


@pytest.mark.parametrize(
    "entry",
    [
        b'["a","1","2",5,0,0]',  # no end of header line
        b'["a","1","2",50,0,0]\nshort',  # sizes past the end
        b'["a","1","2",-1,3,0]\nxyz',  # a negative size
        b'["a","1","2","x",0,0]\n',  # a size that is no number
        b'["a","1",2,0]\n',  # too few fields
        b'["a","1","2",0,0]\n',  # a version 1 header in a version 2 shard
        b'["a","1","2",0,0,0,0]\n',  # too many fields
        b'{"name":"a"}\n',  # not a list
        b"not json\n",
    ],
)
def test_a_torn_entry_inside_a_whole_shard_is_refused(entry):
    good = zlib.decompress(encode([("ok", Entry("1", "2", b"s", b"p", b"r"))]))
    with pytest.raises(SnapshotError):
        decode(zlib.compress(good + entry))


def test_a_restart_reads_the_snapshot_instead_of_every_spec_and_state(root, tmp_path):
    first = _daemon(root, tmp_path)
    before = _settled(first)
    assert sum(s == "ACTIVE" for s, _, _ in before.values()) == 2
    _written_snapshot(first)
    first.close()

    second, ops = _restarted(root, tmp_path)
    try:
        # 64 shards and a handful of records (lease, quota, capabilities): not 2 per job
        assert ops.get("read", 0) < SHARDS + 20, ops
        assert _settled(second) == before
        for name, job in second.jobs.items():
            assert job.spec is not None and job.spec == first.jobs[name].spec, name
    finally:
        second.close()


def test_what_changed_after_the_snapshot_is_read_from_the_bucket(root, tmp_path):
    first = _daemon(root, tmp_path)
    before = _settled(first)
    _written_snapshot(first)
    running = sorted(n for n, (status, _, _) in before.items() if status == "ACTIVE")
    client = Client(root, expect_daemon=False)
    client.cancel(running[0], user_id="u")  # it ends, and a waiting job starts in its place
    _submit(client, ["late"])  # a job the snapshot has never seen
    after = _settled(first)
    assert running[0] not in after and after["late"][0] == "PENDING"
    started = [n for n, (status, _, _) in after.items() if status == "ACTIVE" and n not in running]
    assert len(started) == 1, after
    first.close()

    second, ops = _restarted(root, tmp_path)
    try:
        assert ops.get("read", 0) < SHARDS + 20, ops
        assert _settled(second) == after
        assert second.jobs["late"].spec is not None
    finally:
        second.close()


def test_a_quiet_queue_visits_no_shard_and_the_next_visit_writes_a_change(root, tmp_path):
    """A visit looks only at the shards of jobs whose key may have moved: none while the
    queue is quiet (its running jobs are attended, their keys unmoved), and the shards of
    the jobs a cancel ended and started, which the next visit writes."""
    first = _daemon(root, tmp_path)
    try:
        before = _settled(first)
        _written_snapshot(first)
        _settled(first)
        book = first.ctx.snapshots
        assert snapshot.changed_shards(first.ctx, book) == set()
        running = sorted(n for n, (status, _, _) in before.items() if status == "ACTIVE")
        Client(root, expect_daemon=False).cancel(running[0], user_id="u")
        after = _settled(first)
        started = [n for n, (st, _, _) in after.items() if st == "ACTIVE" and n not in running]
        assert len(started) == 1, after
        written = book.inflight
        _cycle(first, time.time() + 10 * SNAPSHOT_SECONDS)  # past the next visit
        assert book.inflight is not written, "the change was not written"
        book.inflight.result(timeout=60)
        entries = Store(root).snapshot.read_all(map)
        assert entries[started[0]].state_token == first.jobs[started[0]].state_token
        assert running[0] not in entries
        assert snapshot.changed_shards(first.ctx, book) == set()
    finally:
        first.close()


def test_a_foreign_or_torn_shard_costs_reads_never_a_wrong_state(root, tmp_path):
    first = _daemon(root, tmp_path)
    before = _settled(first)
    _written_snapshot(first)
    first.close()
    store = Store(root)
    for shard in range(0, SHARDS, 2):
        store.objects.write(f"{store.root}/history/snapshot/{shard:02d}", b"garbage")
    # an entry that names a state token the bucket no longer has is not used either
    shard = shard_of("j0001")
    forged = {"j0001": Entry("no-such-token", "no-such-token", b'{"status": "COMPLETED"}')}
    store.snapshot.write(shard, encode(forged.items()))

    second, ops = _restarted(root, tmp_path)
    try:
        assert ops.get("read", 0) > JOBS / 2, ops  # half the shards unusable: their jobs read
        assert _settled(second) == before
    finally:
        second.close()


def test_list_reads_the_snapshot_and_sees_what_changed_since(root, tmp_path):
    first = _daemon(root, tmp_path)
    _settled(first)
    _written_snapshot(first)
    Client(root, expect_daemon=False).cancel(
        "j0003", user_id="u"
    )  # its state changes after the snapshot
    _settled(first)
    first.close()
    client = Client(root, expect_daemon=False)
    listed = {j.name: j for j in client.list_jobs()}
    assert client.store.ops.get("read", 0) < SHARDS + 10, client.store.ops
    store = Store(root)
    assert set(listed) == set(store.specs.list())
    for name, job in listed.items():
        raw = store.states.read(name)
        assert raw is not None and job.state is not None and not job.problem, name
        assert job.state.dumps() == JobState.loads(raw).dumps(), name


def test_a_settled_burst_is_written_before_due_once_per_period(root, tmp_path, monkeypatch):
    """An intake of 300 jobs (the threshold set to 100) is in the snapshot as soon as it has
    settled, not SNAPSHOT_SECONDS later; a second burst in the same period waits for the
    write when due, which comes as it would have."""
    monkeypatch.setattr(snapshot, "SETTLED_BURST_JOBS", 100)
    daemon = _daemon(root, tmp_path)
    try:
        _settled(daemon)
        book = daemon.ctx.snapshots
        assert book.early and book.inflight is not None, "the settled intake was not written"
        book.inflight.result(timeout=60)
        assert time.time() < book.due
        assert set(Store(root).snapshot.read_all(map)) == set(daemon.jobs)
        early = book.inflight
        more = [f"k{i:04d}" for i in range(150)]
        _submit(Client(root, expect_daemon=False), more)
        _settled(daemon)
        assert book.inflight is early, "a second early write in one period"
        assert not set(more) & set(Store(root).snapshot.read_all(map))
        _written_snapshot(daemon)
        assert not book.early
        assert set(more) <= set(Store(root).snapshot.read_all(map))
    finally:
        daemon.close()


@pytest.mark.parametrize(
    ("touched", "changes", "backlog", "early", "written"),
    [
        (1000, 100, 0, False, True),
        (999, 0, 0, False, False),  # too few jobs went quiet: the write when due will do
        (1000, 101, 0, False, False),  # still going: written once it has settled
        (1000, 0, 1, False, False),  # an intake still has specs to take in
        (5000, 0, 0, True, False),  # this period's early write is spent
    ],
)
def test_a_burst_counts_as_settled_by_its_size_the_last_cycle_and_the_intake(
    touched, changes, backlog, early, written
):
    book = snapshot.SnapshotBook(touched={f"j{i}" for i in range(touched)}, early=early)
    assert snapshot.settled_burst(book, changes, backlog) is written

"""`bastion list` from the rows the daemon publishes in its snapshot (bastion/jobrow.py): a job
listed from its row shows exactly what its parsed spec and state show, its bytes are parsed
only when something needs them, and a row that is not ours is never believed."""

from __future__ import annotations

import json
import time
import warnings
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bastion.bucket.snapshot import Entry, decode, encode, read_active, shard_of
from bastion.bucket.store import Store
from bastion.jobrow import ROW_V3, JobRow
from bastion.jobspec import JobSpec
from bastion.jobstate import JobState
from bastion.policy_inputs import Standing, job_request
from launch.api import Client
from launch.cli.common import filtered
from launch.cli.view import _row
from launch.jobinfo import JobInfo, parsed, placed
from launch.why import _request
from quota.model import Phase
from tests.test_snapshot import QUOTA, _daemon, _settled, _written_snapshot


def _spec(name: str, user: str = "u", **more: Any) -> JobSpec:
    from launch.api import new_jobspec

    return new_jobspec(
        name=name,
        command="sleep 600",
        user_id=user,
        project_id="default",
        resources={"cpu": 1},
        runner={"kind": "fake"},
        **more,
    )


@pytest.fixture
def root(tmp_path: Path) -> str:
    """60 jobs of every kind a list shows: waiting (in and past the queue summary's first),
    running, time-limited, members of an array, waiting on another job, cancelled."""
    root = str(tmp_path / "root")
    quota = Path(root, "project-quotas", "project-quotas.config")
    quota.parent.mkdir(parents=True)
    quota.write_text(QUOTA)
    client = Client(root, expect_daemon=False)
    specs = [_spec(f"j{i:03d}", user=f"u{i % 3}") for i in range(50)]
    specs += [_spec("limited", time_limit="2h"), _spec("after", after="j001")]
    specs += [_spec(f"arr-{i}", group={"name": "arr", "index": i, "size": 4}) for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tests drive the daemon's cycles themselves
        for spec in specs:
            client.submit(spec)
    return root


def _listed(root: str, tmp_path: Path) -> tuple[Client, list[JobInfo]]:
    daemon = _daemon(root, tmp_path)
    _settled(daemon)
    Client(root, expect_daemon=False).cancel("j040", user_id="u1")
    _settled(daemon)
    _written_snapshot(daemon)
    daemon.close()
    client = Client(root, expect_daemon=False)
    return client, client.list_jobs()


def _from_bytes(client: Client, store: Store) -> dict[str, JobInfo]:
    """Every active job parsed from its objects, placed as list places it: the old way."""
    names = sorted(store.specs.list())
    jobs = [parsed(n, store.specs.read(n), store.states.read(n)) for n in names]
    return {j.name: j for j in placed([j for j in jobs if j is not None], client.queue())}


def test_a_job_listed_from_its_row_shows_what_its_spec_and_state_show(root, tmp_path):
    client, jobs = _listed(root, tmp_path)
    # listed from rows, placed in the queue, filtered: only the running jobs were parsed
    assert [j.name for j in jobs if j._listed is None] == [
        j.name for j in jobs if j.phase == "ACTIVE"
    ]
    expected = _from_bytes(client, Store(root))
    assert [j.name for j in jobs] == sorted(expected)
    for job in jobs:
        old = expected[job.name]
        assert (job.status, job.reason, job.group, job.phase) == (
            old.status,
            old.reason,
            old.group,
            old.phase,
        ), job.name
        assert job.log_start == old.log_start and job.workers == old.workers, job.name
        assert (job.time_left() is None) == (old.time_left() is None), job.name
        assert json.loads(job.json_text()) == json.loads(json.dumps(old.to_json())), job.name
        assert _row(job)[:6] + _row(job)[7:] == _row(old)[:6] + _row(old)[7:], job.name
    olds = list(expected.values())
    for picks in ({"user_id": "u1"}, {"project_id": "default"}, {"group": "arr"}):
        names = [j.name for j in filtered(jobs, **picks)]
        assert names and names == [j.name for j in filtered(olds, **picks)], picks
    assert {"PENDING", "ACTIVE"} <= {j.status for j in jobs}
    # the rows answered all of it but a time limit's countdown and the running jobs' workers
    waiting = [j for j in jobs if j.status == "PENDING" and j.name != "limited"]
    assert len(waiting) > 40 and all(j._listed is not None for j in waiting)


def test_a_row_that_is_not_ours_is_not_believed(root, tmp_path):
    _listed(root, tmp_path)
    store = Store(root)
    shard = shard_of("j010")
    raw = store.objects.read(f"{store.root}/history/snapshot/{shard:02d}")
    entries = decode(raw)
    entry = entries["j010"]
    assert entry.row, "the daemon wrote no row"
    forgeries = [b"garbage", b'{"phase": 1}', b"[]", json.dumps({"spec": []}).encode()]
    forgeries += [ROW_V3 + b'["PENDING"]\n{}', ROW_V3 + b'{"a": 1}\n{}', ROW_V3 + b"[1,2"]
    forgeries += [ROW_V3 + json.dumps(["PENDING"] * 12).encode() + b"\n{}"]  # wrong types
    for forged in forgeries:
        entries["j010"] = Entry(
            entry.spec_token, entry.state_token, entry.state, entry.spec, forged
        )
        store.objects.write(f"{store.root}/history/snapshot/{shard:02d}", encode(entries.items()))
        (job,) = [j for j in Client(root, expect_daemon=False).list_jobs() if j.name == "j010"]
        assert job._listed is None and job.spec is not None and not job.problem, forged
        assert job.status == "PENDING", forged


def test_a_row_of_the_first_version_is_still_read_and_shows_the_same(root, tmp_path):
    """A snapshot written before ``row 3`` (one JSON object per row) lists as it did."""
    _, jobs = _listed(root, tmp_path)
    store = Store(root)
    before = {j.name: j for j in jobs}
    shard = shard_of("j010")
    path = f"{store.root}/history/snapshot/{shard:02d}"
    entries = decode(store.objects.read(path))
    for name, entry in list(entries.items()):
        row = JobRow.loads(entry.row)
        first = {
            "phase": row.phase,
            "status": row.status,
            "reason": row.reason,
            "log_start": row.log_start,
            "spec": row.spec,
            "standing": row.standing_json,
        }
        old_row = json.dumps(first, separators=(",", ":")).encode()
        entries[name] = replace(entry, row=old_row)
    store.objects.write(path, encode(entries.items()))
    (job,) = [j for j in Client(root, expect_daemon=False).list_jobs() if j.name == "j010"]
    assert job._listed is not None and job._listed.spec_text is None
    assert json.loads(job.json_text()) == json.loads(before["j010"].json_text())
    assert (job.status, job.reason, job.group, _row(job)[:6]) == (
        before["j010"].status,
        before["j010"].reason,
        before["j010"].group,
        _row(before["j010"])[:6],
    )


def test_a_snapshot_of_version_1_is_read_without_rows():
    entries = {"a": Entry("1", "2", b'{"status": "PENDING"}', b'{"name": "a"}')}
    assert decode(_version_1(entries)) == entries
    assert decode(encode(entries.items())) == entries


def _version_1(entries: dict[str, Entry]) -> bytes:
    """A shard as the daemons before rows wrote it."""
    body = [b"bastion-snapshot 1\n"]
    for name, e in entries.items():
        header = [name, e.spec_token, e.state_token, len(e.state), len(e.spec)]
        body += [json.dumps(header).encode(), b"\n", e.state, e.spec]
    return zlib.compress(b"".join(body))


def test_a_snapshot_an_older_daemon_wrote_without_rows_is_rewritten_with_them(root, tmp_path):
    _listed(root, tmp_path)
    store = Store(root)
    shards = sorted(store.objects.list(f"{store.root}/history/snapshot"))
    for shard in shards:
        path = f"{store.root}/history/snapshot/{shard}"
        store.objects.write(path, _version_1(decode(store.objects.read(path))))
    assert all(j._listed is None for j in Client(root, expect_daemon=False).list_jobs())

    daemon = _daemon(root, tmp_path)  # an upgraded daemon's restart
    try:
        _settled(daemon)
        _written_snapshot(daemon)
    finally:
        daemon.close()
    jobs = Client(root, expect_daemon=False).list_jobs()
    assert sum(j._listed is not None for j in jobs) > 40


def test_why_sees_from_the_rows_the_jobs_the_policy_sees_from_specs_and_states(root, tmp_path):
    _listed(root, tmp_path)
    store = Store(root)
    active = read_active(store)
    assert sum(bool(a.row) for a in active) == len(active) > 50
    now = time.time()
    for job in active:
        spec, state = JobSpec.loads(job.spec), JobState.loads(job.state)
        assert JobRow.loads(job.row).standing == Standing.of(state), job.name
        assert _request(job, now) == job_request(job.name, spec, state, now), job.name
        assert _request(replace(job, row=b"not ours"), now) == _request(job, now), job.name
    phases = {r.phase for a in active if (r := _request(a, now)) is not None}
    assert {Phase.PENDING, Phase.RUNNING} <= phases

"""A group's members (an array or a sweep) are written a thousand per call, specs then their
markers (launch/submitting.py ``write_group``): every member is tried whatever happens to the
others, and what the bucket refused is said, never lost. On the GCS emulator behind the fault
proxy, and on a local root."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.bucket.jobs import marked_job
from bastion.bucket.store import Store
from launch import expand, submitting
from launch.api import Client, JobExists, new_jobspec
from tests.conftest import BUCKET, fresh_gcs_root
from tests.faultproxy import FaultProxy
from tests.gcs_emulator import GcsEmulator


@pytest.fixture
def proxy(gcs_emulator: GcsEmulator) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_emulator.endpoint, lifetime=120) as p:
        yield p


def members(name: str, count: int) -> list:
    template = new_jobspec(name=name, command="true", user_id="u", project_id="default")
    return expand.expand(template, expand.parse_array(f"0-{count - 1}"))


def marked(store: Store) -> list[str]:
    return sorted(marked_job(m) or "" for m in store.requests.list_markers(100_000))


def test_a_spec_the_bucket_refuses_is_named_and_every_other_member_is_submitted(
    proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(submitting, "CHUNK", 50)  # three calls for 120 members
    root = fresh_gcs_root().removeprefix(f"gs://{BUCKET}/")
    store = Store(f"gs://{BUCKET}/{root}", endpoint_url=proxy.endpoint, token="anon")
    client = Client(store=store, expect_daemon=False)
    specs = members("g", 120)
    proxy.fail_next(r"POST \S*upload\S*", kind="403")  # the first spec sent
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no daemon runs here)
        with pytest.raises(submitting.GroupPartlyWritten) as raised:
            client.submit_group(specs)
    written = sorted(store.specs.list())
    assert len(written) == 119
    (lost,) = {s.name for s in specs} - set(written)
    message = str(raised.value)
    assert "119 of 120 members submitted; 1 could not be written" in message
    assert lost in message and "403" in message and "submit them again" in message
    assert marked(store) == written  # each written spec got its marker, the lost one none
    client.submit(next(s for s in specs if s.name == lost))  # its name is free
    assert store.specs.read(lost) is not None


def test_markers_that_cannot_be_written_warn_and_the_specs_stay_submitted(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "root"))
    markers = tmp_path / "root" / "jobs" / "user_states"
    if markers.exists():
        markers.rmdir()
    markers.parent.mkdir(parents=True, exist_ok=True)
    markers.write_text("not a directory")
    client = Client(store=store, expect_daemon=False)
    with pytest.warns(UserWarning, match=r"3 member.* submission markers could not be written"):
        client.submit_group(members("g", 3))
    assert sorted(store.specs.list()) == ["g-0", "g-1", "g-2"]


def test_a_name_taken_meanwhile_is_refused_and_the_rest_of_the_group_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(submitting, "CHUNK", 2)
    store = Store(str(tmp_path / "root"))
    specs = members("g", 5)
    store.specs.submit("g-3", b"another writer's")  # after the group's checks passed
    wrote = submitting.write_group(store, specs)
    assert [s.name for s in wrote.refused] == ["g-3"] and not wrote.failed
    assert store.specs.read("g-3") == b"another writer's"
    assert marked(store) == ["g-0", "g-1", "g-2", "g-4"]


def test_a_group_with_a_name_taken_meanwhile_raises_job_exists_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(str(tmp_path / "root"))
    client = Client(store=store, expect_daemon=False)
    specs = members("g", 4)
    real_write_group = submitting.write_group

    def another_writer_first(store: Store, group: list) -> submitting.GroupWrite:
        store.specs.submit("g-1", b"another writer's")  # between the checks and the writes
        return real_write_group(store, group)

    monkeypatch.setattr(submitting, "write_group", another_writer_first)
    with pytest.raises(JobExists, match=r"1 member.* taken meanwhile, not submitted: g-1"):
        client.submit_group(specs)
    assert sorted(store.specs.list()) == ["g-0", "g-1", "g-2", "g-3"]
    assert marked(store) == ["g-0", "g-2", "g-3"]

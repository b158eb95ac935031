"""``Objects.delete_many``: one call deletes many objects and names the ones it could not.

The daemon deletes the submission markers it consumed in one call per cycle; what it needs from
every backend is the same contract: every present path is deleted, an absent path is no error,
and a path that could not be deleted is returned (never raised), so it can be retried. Checked on
a local directory, on the generic fsspec backend (tests/flakyfs.py over a real directory), and on
GCS (the emulator, behind tests/faultproxy.py to count and fail requests); S3's DeleteObjects is
in tests/test_s3.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fsspec.asyn import sync

from bastion.bucket.gcs import GcsObjects
from bastion.bucket.objects import Objects
from bastion.bucket.store import Store
from tests.conftest import fresh_gcs_root
from tests.faultproxy import FaultProxy
from tests.flakyfs import FailurePlan, FlakyFileSystem
from tests.gcs_emulator import GcsEmulator


@pytest.fixture
def proxy(gcs_emulator: GcsEmulator) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_emulator.endpoint, lifetime=120) as p:
        yield p


@pytest.fixture(params=["local", "generic", "gcs"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Objects, str]]:
    """(the backend, a directory path in its namespace) for each kind of root."""
    if request.param == "gcs":
        endpoint = request.getfixturevalue("proxy").endpoint
        store = Store(fresh_gcs_root(), endpoint_url=endpoint, token="anon")
        yield store.objects, f"{store.root}/markers"
        return
    root = tmp_path / "root"
    if request.param == "local":
        store = Store(str(root))
        yield store.objects, f"{store.root}/markers"
        return
    root.mkdir()
    store = Store(FlakyFileSystem.install(str(root), FailurePlan(0.0)))
    yield store.objects, f"{store.root}/markers"
    FlakyFileSystem.uninstall(str(root))


def _put(objects: Objects, directory: str, names: list[str]) -> list[str]:
    paths = [f"{directory}/{name}" for name in names]
    for path in paths:
        objects.write(path, b"{}")
    return paths


def test_delete_many_deletes_every_path_and_takes_absent_ones_as_deleted(
    backend: tuple[Objects, str],
) -> None:
    objects, directory = backend
    doomed = _put(objects, directory, [f"_submitted-{i:03d}" for i in range(130)])
    _put(objects, directory, ["keep"])
    failed = objects.delete_many([*doomed, f"{directory}/absent", f"{directory}/gone/deeper"])
    assert failed == []
    assert sorted(objects.list(directory)) == ["keep"]


def test_delete_many_of_nothing_or_only_absent_paths_is_no_error(
    backend: tuple[Objects, str],
) -> None:
    objects, directory = backend
    assert objects.delete_many([]) == []
    assert objects.delete_many([f"{directory}/absent-{i}" for i in range(3)]) == []


def test_the_generic_backend_returns_the_paths_a_failing_bucket_did_not_delete(
    tmp_path: Path,
) -> None:
    """fs.rm of the list stops at the first failure without saying which paths it deleted: the
    generic backend then deletes each on its own and returns exactly the ones that failed."""
    root = tmp_path / "root"
    root.mkdir()
    plan = FailurePlan(ops={"rm_file"}, where="/stuck-", first_calls=2, when="before")
    store = Store(FlakyFileSystem.install(str(root), plan))
    try:
        directory = f"{store.root}/markers"
        names = ["a", "stuck-1", "b", "stuck-2", "c"]
        paths = _put(store.objects, directory, names)
        failed = store.objects.delete_many([*paths, f"{directory}/absent"])
        assert failed == [f"{directory}/stuck-1", f"{directory}/stuck-2"]
        assert sorted(store.objects.list(directory)) == ["stuck-1", "stuck-2"]
        assert store.objects.delete_many(failed) == []  # the bucket recovered: deleted now
        assert store.objects.list(directory) == {}
    finally:
        FlakyFileSystem.uninstall(str(root))


def test_gcs_returns_the_paths_whose_delete_failed_and_deletes_the_rest(
    proxy: FaultProxy,
) -> None:
    """The emulator gets single deletes (its batch endpoint refuses gcsfs's batches): a delete
    that keeps failing (403, which gcsfs does not retry) is returned; the others happen."""
    store = Store(fresh_gcs_root(), endpoint_url=proxy.endpoint, token="anon")
    objects = store.objects
    assert isinstance(objects, GcsObjects)
    directory = f"{store.root}/markers"
    paths = _put(objects, directory, [f"m{i:02d}" for i in range(20)])
    proxy.fail_next(r"^DELETE .*markers%2Fm07", kind="403", count=1)
    proxy.reset_counts()
    failed = objects.delete_many([*paths, f"{directory}/absent"])
    assert failed == [f"{directory}/m07"]
    assert sorted(objects.list(directory)) == ["m07"]
    assert proxy.stats()["requests"].get("DELETE") == 21  # one each, none retried
    assert objects.delete_many(failed) == []
    assert objects.list(directory) == {}


def test_gcs_batches_the_bucket_refuses_return_every_path_they_held(proxy: FaultProxy) -> None:
    """The batch path (used on Google) against the emulator, whose batch endpoint answers 400
    to every part of gcsfs's batches: nothing is deleted, and every path is returned, none
    reported deleted. Two batches: 100 paths and 30."""
    store = Store(fresh_gcs_root(), endpoint_url=proxy.endpoint, token="anon")
    objects = store.objects
    assert isinstance(objects, GcsObjects)
    directory = f"{store.root}/markers"
    paths = _put(objects, directory, [f"m{i:03d}" for i in range(130)])
    proxy.reset_counts()
    failed = sync(objects.fs.loop, objects._delete_batches, paths)
    assert proxy.stats()["requests"] == {"POST": 2}  # one batch request per 100 paths
    assert failed == paths
    assert len(objects.list(directory)) == 130

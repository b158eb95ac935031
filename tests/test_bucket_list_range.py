"""``Objects.list_range``: the names of a directory in [start, end), the first ``limit`` by name.

The daemon lists only the oldest window of submission markers while a burst waits, and the
cancel requests around them; every backend must give what a full ``list`` would, restricted to
the range, in name order, tokens included. Checked on a local directory, the generic fsspec
backend (tests/flakyfs.py over a real directory), GCS (the emulator behind tests/faultproxy.py,
pages of 5 names so that the limit stops paging) and S3 (moto).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.bucket.gcs import GcsObjects
from bastion.bucket.jobs import MARKER_PREFIX, MARKERS_END, marker_name
from bastion.bucket.objects import Objects
from bastion.bucket.store import Store
from tests.conftest import fresh_gcs_root
from tests.faultproxy import FaultProxy
from tests.flakyfs import FailurePlan, FlakyFileSystem
from tests.gcs_emulator import GcsEmulator
from tests.s3_server import S3_BUCKET


@pytest.fixture
def proxy(gcs_emulator: GcsEmulator) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_emulator.endpoint, lifetime=120) as p:
        yield p


@pytest.fixture(params=["local", "generic", "gcs", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Objects, str]]:
    """(the backend, a directory path in its namespace) for each kind of root."""
    if request.param == "gcs":
        endpoint = request.getfixturevalue("proxy").endpoint
        store = Store(fresh_gcs_root(), endpoint_url=endpoint, token="anon")
        assert isinstance(store.objects, GcsObjects)
        store.objects.PAGE = 5  # the limit must stop paging, and paging must go on to it
        yield store.objects, f"{store.root}/inbox"
        return
    if request.param == "s3":
        request.getfixturevalue("s3_server")
        store = Store(f"s3://{S3_BUCKET}/{tmp_path.name}")
        yield store.objects, f"{store.root}/inbox"
        return
    root = tmp_path / "root"
    if request.param == "local":
        store = Store(str(root))
        yield store.objects, f"{store.root}/inbox"
        return
    root.mkdir()
    store = Store(FlakyFileSystem.install(str(root), FailurePlan(0.0)))
    yield store.objects, f"{store.root}/inbox"
    FlakyFileSystem.uninstall(str(root))


MARKERS = [marker_name(f"job-{i:02d}", now=1_700_000_000 + i) for i in range(23)]
AROUND = ["0-digits-first", "a-cancel", "zz-last", "_submitted", "_submitted.later"]


@pytest.fixture
def inbox(backend: tuple[Objects, str]) -> tuple[Objects, str]:
    objects, directory = backend
    for name in [*reversed(MARKERS), *AROUND, ".hidden-part", "nested/deeper"]:
        objects.write(f"{directory}/{name}", name.encode())
    return objects, directory


def test_a_limited_range_is_the_oldest_markers_in_order_with_the_listing_tokens(
    inbox: tuple[Objects, str],
) -> None:
    objects, directory = inbox
    listed = objects.list(directory)
    first = objects.list_range(directory, MARKER_PREFIX, MARKERS_END, limit=12)
    assert list(first) == MARKERS[:12]
    assert all(first[name] == listed[name] for name in first)


def test_the_ranges_around_the_markers_hold_everything_else_and_nothing_hidden(
    inbox: tuple[Objects, str],
) -> None:
    """What ``list`` gives (a local root also lists the subdirectory, to reject it), split."""
    objects, directory = inbox
    listed = objects.list(directory)
    below = objects.list_range(directory, end=MARKER_PREFIX)
    above = objects.list_range(directory, start=MARKERS_END)
    assert list(below) == ["0-digits-first", "_submitted"]
    assert [n for n in above if n != "nested"] == ["_submitted.later", "a-cancel", "zz-last"]
    assert below | above == {n: i for n, i in listed.items() if n not in MARKERS}
    everything = objects.list_range(directory)
    assert everything == listed and list(everything) == sorted(listed)
    assert {*MARKERS, *AROUND} <= set(everything) and ".hidden-part" not in everything


def test_a_limit_beyond_the_range_or_an_empty_range_or_directory_lists_what_there_is(
    inbox: tuple[Objects, str],
) -> None:
    objects, directory = inbox
    assert list(objects.list_range(directory, MARKER_PREFIX, MARKERS_END, limit=100)) == MARKERS
    assert objects.list_range(directory, "m", "n") == {}
    assert objects.list_range(f"{directory}-absent", MARKER_PREFIX, MARKERS_END, limit=5) == {}


def test_a_ranged_look_on_gcs_asks_only_for_the_range_and_stops_at_the_limit(
    proxy: FaultProxy,
) -> None:
    store = Store(fresh_gcs_root(), endpoint_url=proxy.endpoint, token="anon")
    objects = store.objects
    assert isinstance(objects, GcsObjects)
    objects.PAGE = 5
    directory = f"{store.root}/inbox"
    objects.fs.pipe({f"{directory}/{name}": b"{}" for name in [*MARKERS, *AROUND]})
    proxy.reset_counts()
    assert len(objects.list_range(directory, MARKER_PREFIX, MARKERS_END, limit=7)) == 7
    listings = [r for r in proxy.recent if "/o?" in r and "startOffset=" in r]
    assert len(listings) == 2, listings  # two pages of 5, not all five pages of the markers

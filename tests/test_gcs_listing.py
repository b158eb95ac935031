"""GCS listings split into name ranges fetched in parallel (GcsObjects.list), on the emulator.

The ranges come from the names seen by the previous listing, so what matters is that they
still cover every name after objects were added and deleted in between, that hidden and
nested names stay out, and that a range whose request fails is retried, not dropped. The
reference is a plain paginated listing through fsspec (the generic ``Objects.list``). Pages
are 50 names here instead of GCS's 1,000 (ranges of 40 instead of 800), so a few hundred
objects make many ranges.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from bastion.bucket.gcs import GcsObjects
from bastion.bucket.objects import Objects, PreconditionFailed, UnacceptableObject
from bastion.bucket.store import Store
from tests.conftest import BUCKET, fresh_gcs_root
from tests.faultproxy import FaultProxy
from tests.gcs_emulator import GcsEmulator

RANGED = re.compile(r"startOffset=|endOffset=")


@pytest.fixture
def proxy(gcs_emulator: GcsEmulator) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_emulator.endpoint, lifetime=120) as p:
        yield p


@pytest.fixture
def directory(gcs_emulator: GcsEmulator) -> str:
    return fresh_gcs_root(f"{uuid.uuid4().hex[:12]}/specs").removeprefix("gs://")


def _objects(endpoint: str) -> GcsObjects:
    objects = Store(f"gs://{BUCKET}/x", endpoint_url=endpoint, token="anon").objects
    assert isinstance(objects, GcsObjects)
    objects.PAGE, objects.SPLIT_EVERY = 50, 40
    return objects


def _put(objects: GcsObjects, directory: str, names: list[str]) -> None:
    objects.fs.pipe({f"{directory}/{name}": name.encode() for name in names})


def test_ranged_listing_covers_every_name_across_additions_and_deletions(
    proxy: FaultProxy, directory: str
) -> None:
    objects = _objects(proxy.endpoint)
    plain = Objects(objects.fs)
    _put(objects, directory, [f"job-{i:05d}" for i in range(250)])
    _put(objects, directory, [".hidden.part", "nested/deeper"])  # never listed as jobs
    assert objects.list(directory) == plain.list(directory)
    assert len(objects.list(directory)) == 250

    # Before each listing: delete some names (across range boundaries) and add others before,
    # between and after the old ones, so every range and both open ends change.
    for round_ in range(3):
        objects.fs.rm([f"{directory}/job-{i:05d}" for i in range(round_ * 70, round_ * 70 + 90)])
        _put(objects, directory, [f"a{round_}-{i}" for i in range(30)])  # before all
        _put(objects, directory, [f"job-{i:05d}x" for i in range(round_, 250, 7)])  # between
        _put(objects, directory, [f"z{round_}-{i}" for i in range(120)])  # after all: 3 pages
        proxy.reset_counts()
        listed = objects.list(directory)
        assert listed == plain.list(directory)
        assert all(not n.startswith(".") and "/" not in n for n in listed)
    ranged = [r for r in proxy.recent if RANGED.search(r)]
    assert len(ranged) >= 3, "listings after the first should go out as ranges"


def test_listing_tokens_match_the_tokens_of_conditional_writes(
    gcs_emulator: GcsEmulator, directory: str
) -> None:
    objects = _objects(gcs_emulator.endpoint)
    _put(objects, directory, [f"s{i:04d}" for i in range(150)])
    objects.list(directory)  # learn the ranges
    token = objects.write_if(f"{directory}/s0042", b"new", objects.list(directory)["s0042"].token)
    listed = objects.list(directory)["s0042"]
    assert listed.token == token and listed.size == 3


def test_a_failed_range_is_retried_not_dropped(proxy: FaultProxy, directory: str) -> None:
    objects = _objects(proxy.endpoint)
    _put(objects, directory, [f"j{i:05d}" for i in range(300)])
    expected = objects.list(directory)
    assert len(expected) == 300
    proxy.fail_next(r"startOffset=", kind="503", count=2)  # two of the ranges fail once
    assert objects.list(directory) == expected
    assert proxy.stats()["faults"].get("503") == 2


def test_listing_a_missing_prefix_is_empty(gcs_emulator: GcsEmulator, directory: str) -> None:
    assert _objects(gcs_emulator.endpoint).list(directory) == {}


def test_listing_a_missing_bucket_is_empty(gcs_emulator: GcsEmulator) -> None:
    objects = _objects(gcs_emulator.endpoint)
    assert objects.list(f"no-such-bucket-{uuid.uuid4().hex[:8]}/jobs/active") == {}


def test_a_small_directory_keeps_no_ranges(gcs_emulator: GcsEmulator, directory: str) -> None:
    objects = _objects(gcs_emulator.endpoint)
    _put(objects, directory, [f"j{i:03d}" for i in range(100)])
    assert len(objects.list(directory)) == 100 and (directory, False) in objects._splits
    objects.fs.rm([f"{directory}/j{i:03d}" for i in range(70)])
    assert len(objects.list(directory)) == 30 and (directory, False) not in objects._splits


def test_a_read_with_token_is_one_request_and_gives_the_listing_token(
    proxy: FaultProxy, directory: str
) -> None:
    """A spec named by a submission marker is read with its token in one GET (the download's
    generation header), equal to the token a listing gives, so the next full listing does not
    read it again. Absent: None; over the limit: refused; an empty object: its token too."""
    objects = _objects(proxy.endpoint)
    _put(objects, directory, ["spec", "big"])
    objects.write(f"{directory}/empty", b"")
    listed = objects.list(directory)
    proxy.reset_counts()
    data, token = objects.read_with_token(f"{directory}/spec", limit=100)
    assert proxy.total() == 1, proxy.stats()
    assert (data, token) == (b"spec", listed["spec"].token)
    for limit in (None, 100):  # a range request on an empty object is refused (416)
        empty = objects.read_with_token(f"{directory}/empty", limit=limit)
        assert empty == (b"", listed["empty"].token)
    assert objects.read_with_token(f"{directory}/absent") is None
    with pytest.raises(UnacceptableObject, match="the limit is 2 bytes"):
        objects.read_with_token(f"{directory}/big", limit=2)


def test_delete_many_deletes_present_and_absent_objects(proxy: FaultProxy, directory: str) -> None:
    """Consumed submission markers go in one call (batch requests on GCS itself; the emulator,
    whose batch endpoint refuses gcsfs's batches, gets one request each): an absent one is no
    error (tests/test_bucket_delete_many.py has the failures)."""
    objects = _objects(proxy.endpoint)
    _put(objects, directory, ["a", "b", "keep"])
    assert objects.delete_many([f"{directory}/a", f"{directory}/b", f"{directory}/absent"]) == []
    assert sorted(objects.list(directory)) == ["keep"]


def test_reading_many_is_one_get_each_from_one_call_and_keeps_a_failure_in_its_place(
    proxy: FaultProxy, directory: str
) -> None:
    """A burst's specs in one call (``read_many_with_token``): one GET per object, sent from
    gcsfs's event loop, each answered as ``read_with_token`` answers it (bytes and the
    listing's token, None when absent, the empty object through its fallback, a too-large one
    refused); a GET the bucket refuses is that object's exception, the others are read."""
    objects = _objects(proxy.endpoint)
    names = [f"spec-{i:03d}" for i in range(150)]  # more than READS_IN_FLIGHT
    _put(objects, directory, [*names, "refused"])
    objects.write(f"{directory}/empty", b"")
    objects.write(f"{directory}/big", b"x" * 100)
    listed = objects.list(directory)
    asked = [*names, "absent", "empty", "big", "refused"]
    proxy.reset_counts()
    proxy.fail_next(r"GET \S*refused", kind="403")
    reads = objects.read_many_with_token([f"{directory}/{n}" for n in asked], limit=10)
    assert reads[: len(names)] == [(n.encode(), listed[n].token) for n in names]
    absent, empty, big, refused = reads[len(names) :]
    assert absent is None
    assert empty == (b"", listed["empty"].token)
    assert isinstance(big, UnacceptableObject) and "the limit is 10 bytes" in str(big)
    assert isinstance(refused, Exception) and not isinstance(refused, UnacceptableObject)
    assert proxy.stats()["faults"].get("403") == 1
    # one download per object, and one more for the empty one's generic fallback (with the
    # metadata requests that fallback and the big one's size make)
    assert proxy.stats()["routes"]["GET media"] == len(asked) + 1, proxy.stats()


def test_writing_many_is_one_conditional_upload_each_and_keeps_a_loss_in_its_place(
    proxy: FaultProxy, directory: str
) -> None:
    """A burst's states in one call (``write_many_if``): one upload per object under its
    generation precondition, from gcsfs's event loop; each answers as ``write_if`` does (the
    generation the listing then shows), a lost precondition is PreconditionFailed in its
    place, and a refused upload is its error, while the others are written."""
    objects = _objects(proxy.endpoint)
    names = [f"state-{i:03d}" for i in range(100)]  # more than WRITES_IN_FLIGHT
    old = objects.write_if(f"{directory}/old", b"v1", None)
    objects.write_if(f"{directory}/taken", b"theirs", None)
    writes = [(f"{directory}/{n}", n.encode(), None) for n in names]
    writes += [
        (f"{directory}/old", b"v2", old),
        (f"{directory}/taken", b"mine", None),
        (f"{directory}/refused", b"x", None),
    ]
    proxy.reset_counts()
    proxy.fail_next(r"POST \S*upload\S*", kind="403")  # the first upload to come in
    answers = objects.write_many_if(writes)
    listed = objects.list(directory)
    by_name = {w[0].rsplit("/", 1)[1]: (w[1], a) for w, a in zip(writes, answers, strict=True)}
    lost = [n for n, (_, a) in by_name.items() if isinstance(a, PreconditionFailed)]
    failed = [a for _, a in by_name.values() if isinstance(a, Exception)]
    # "taken" lost its precondition; one of the first uploads in flight was refused ("taken"
    # goes out only once one of them is answered)
    assert lost == ["taken"] and len(failed) == 2
    assert proxy.stats()["faults"].get("403") == 1
    for name, (data, answer) in by_name.items():
        if isinstance(answer, str):
            assert answer == listed[name].token and objects.read(f"{directory}/{name}") == data
    assert objects.read(f"{directory}/taken") == b"theirs"


def test_creating_many_is_one_upload_each_that_the_object_be_absent(
    proxy: FaultProxy, directory: str
) -> None:
    """A group's specs in one call (``create_many``): one upload each under
    ifGenerationMatch=0, from gcsfs's event loop; a name another object holds is False in its
    place, a refused upload is its error, and the others are created."""
    objects = _objects(proxy.endpoint)
    objects.write_if(f"{directory}/taken", b"theirs", None)
    items = [(f"{directory}/m{i:03d}", f"m{i}".encode()) for i in range(80)]  # > in flight
    items.insert(40, (f"{directory}/taken", b"mine"))
    proxy.reset_counts()
    proxy.fail_next(r"POST \S*upload\S*", kind="403")
    answers = objects.create_many(items)
    refused = [i for i, a in enumerate(answers) if isinstance(a, Exception)]
    assert len(refused) == 1 and answers[40] is False
    assert proxy.stats()["faults"].get("403") == 1
    for (path, data), answer in zip(items, answers, strict=True):
        if answer is True:
            assert objects.read(path) == data
    assert objects.read(items[refused[0]][0]) is None  # refused: nothing there
    assert objects.read(f"{directory}/taken") == b"theirs"

"""The bucket store against a real local directory: tokens, atomicity, create-if-absent, counts.

A few contracts that the daemon relies on whatever the backend is (tokens that agree between a
listing and a conditional write) are also checked on the generic object-store code path, through
the ``flaky://`` filesystem of tests/flakyfs.py with no failures.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from bastion.bucket.jobs import marked_job
from bastion.bucket.logs import job_log_name
from bastion.bucket.objects import UnacceptableObject
from bastion.bucket.store import PreconditionFailed, Store
from tests.flakyfs import FailurePlan, FlakyFileSystem

T = TypeVar("T")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def store(root: Path) -> Store:
    return Store(str(root))


@pytest.fixture(params=["local", "generic"])
def any_store(request: pytest.FixtureRequest, root: Path) -> Iterator[Store]:
    """The same directory through the local backend or through the generic object-store one."""
    if request.param == "local":
        yield Store(str(root))
        return
    root.mkdir(parents=True, exist_ok=True)
    url = FlakyFileSystem.install(str(root), FailurePlan(0.0))
    yield Store(url)
    FlakyFileSystem.uninstall(str(root))


def run_threads(*targets: Callable[[], None]) -> None:
    """Run the targets concurrently; re-raise the first exception any of them raised."""
    errors: list[BaseException] = []

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as e:
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


def hidden_files(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(".") and n != ".lock")


# -- listings and tokens ----------------------------------------------------------------------


def test_list_tokens_change_on_every_rewrite_even_at_the_same_size(store: Store) -> None:
    store.specs.replace("job", b"A" * 100)
    seen = [store.specs.list()["job"].token]
    for i in range(200):
        store.specs.replace("job", (b"B" if i % 2 == 0 else b"A") * 100)  # same size every time
        info = store.specs.list()["job"]
        assert info.size == 100 and info.name == "job"
        seen.append(info.token)
    assert len(set(seen)) == len(seen)  # never the same token twice, not even A-B-A


def test_list_tokens_stay_the_same_when_untouched(store: Store) -> None:
    store.specs.replace("a", b"1")
    store.specs.replace("b", b"22")
    first = store.specs.list()
    store.specs.replace("c", b"333")  # a neighbour changing does not change the others
    store.specs.read("a")  # neither does reading
    second = store.specs.list()
    assert set(first) == {"a", "b"} and set(second) == {"a", "b", "c"}
    assert {n: second[n] for n in first} == first
    assert store.specs.list() == second


def test_a_state_token_from_a_write_equals_the_listing_token(any_store: Store) -> None:
    """The daemon seeds its compare-and-swap from the listing after a restart."""
    token = any_store.states.write("job", b'{"status": "PENDING"}')
    assert any_store.states.list()["job"].token == token
    token = any_store.states.write("job", b'{"status": "ACTIVE"}', token)
    assert any_store.states.list()["job"].token == token
    token = any_store.states.write("job", b'{"status": "ACTIVE"}', token)  # same bytes again
    assert any_store.states.list()["job"].token == token


def test_temp_files_of_atomic_writes_never_appear_in_listings(store: Store, root: Path) -> None:
    stop = threading.Event()
    seen: set[str] = set()

    def writer() -> None:
        token = None
        try:
            for i in range(150):
                store.specs.replace("spec", json.dumps({"i": i}).encode() * 50)
                token = store.states.write("state", json.dumps({"i": i}).encode() * 50, token)
                store.specs.submit(f"new-{i}", b"{}")
        finally:
            stop.set()

    def lister() -> None:
        while not stop.is_set():
            seen.update(store.specs.list())
            seen.update(store.states.list())

    run_threads(writer, lister)
    names = {"spec", "state"} | {f"new-{i}" for i in range(150)}
    assert seen <= names and "spec" in seen and "state" in seen
    assert hidden_files(root / "jobs" / "active") == []  # nothing left behind either
    assert hidden_files(root / "jobs" / "states") == []


def test_listing_a_missing_directory_is_empty(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "never-created"))
    assert store.specs.list() == {}
    assert store.states.list() == {}
    assert store.requests.list() == {}
    assert store.complete.list() == {}


# -- create-if-absent ---------------------------------------------------------------------------


def test_submit_spec_is_create_if_absent(store: Store) -> None:
    assert store.specs.submit("job", b"first") is True
    assert store.specs.submit("job", b"second") is False
    assert store.specs.read("job") == b"first"
    store.specs.delete("job")
    assert store.specs.submit("job", b"third") is True  # the name is free again
    assert store.specs.read("job") == b"third"


def race(n: int, call: Callable[[int], T]) -> dict[int, T]:
    """``call(i)`` from ``n`` threads released at the same instant; their results by ``i``."""
    barrier = threading.Barrier(n)
    results: dict[int, T] = {}

    def one(i: int) -> None:
        barrier.wait()
        results[i] = call(i)

    run_threads(*(functools.partial(one, i) for i in range(n)))
    assert len(results) == n
    return results


def test_submit_spec_under_a_race_has_exactly_one_winner(store: Store, root: Path) -> None:
    for round_ in range(20):
        name = f"race-{round_}"
        results = race(8, lambda i, name=name: store.specs.submit(name, b"by %d" % i))
        winners = [i for i, won in results.items() if won]
        assert len(winners) == 1, results
        assert store.specs.read(name) == b"by %d" % winners[0]
    assert hidden_files(root / "jobs" / "active") == []


# -- atomic replace and compare-and-swap -------------------------------------------------------


def big_json(version: int) -> bytes:
    return json.dumps({"version": version, "payload": [version] * 50_000}).encode()


@pytest.mark.parametrize("kind", ["spec", "state"])
def test_readers_never_see_a_partial_object(store: Store, kind: str) -> None:
    versions = 30
    sizes = {len(big_json(v)) for v in range(versions)}
    assert len(sizes) > 1  # versions differ in size: a torn read could not hide
    done = threading.Event()
    reads: list[int] = []

    def writer() -> None:
        token = None
        try:
            for v in range(versions):
                if kind == "spec":
                    store.specs.replace("big", big_json(v))
                else:
                    token = store.states.write("big", big_json(v), token)
        finally:
            done.set()

    def reader() -> None:
        read = store.specs.read if kind == "spec" else store.states.read
        while not done.is_set():
            raw = read("big")
            if raw is None:
                continue  # not written yet
            data = json.loads(raw)  # raises on a torn read
            assert data["payload"] == [data["version"]] * 50_000
            reads.append(data["version"])

    run_threads(writer, reader, reader)
    assert reads  # the readers did read while the writer wrote
    assert (
        json.loads(store.specs.read("big") if kind == "spec" else store.states.read("big") or b"")[
            "version"
        ]
        == versions - 1
    )


def test_write_state_is_compare_and_swap(any_store: Store) -> None:
    first = any_store.states.write("job", b"v1")  # expected None: only if absent
    with pytest.raises(PreconditionFailed):
        any_store.states.write("job", b"not me", None)
    second = any_store.states.write("job", b"v2", first)
    assert second != first
    with pytest.raises(PreconditionFailed):
        any_store.states.write("job", b"stale", first)  # a daemon that missed a write
    assert any_store.states.read("job") == b"v2"


def test_write_state_race_from_one_token_has_exactly_one_winner(store: Store) -> None:
    token = store.states.write("job", b"start")

    def attempt(data: bytes, expected: str) -> str | None:
        try:
            return store.states.write("job", data, expected)
        except PreconditionFailed:
            return None

    for round_ in range(10):
        results = race(8, lambda i, r=round_, t=token: attempt(b"%d:%d" % (r, i), t))
        winners = [i for i, new in results.items() if new is not None]
        assert len(winners) == 1, results
        assert store.states.read("job") == b"%d:%d" % (round_, winners[0])
        token = results[winners[0]] or ""


# -- logs and history -------------------------------------------------------------------------


def test_append_log_and_read_from_offsets(store: Store) -> None:
    assert store.logs.size("job") == 0
    store.logs.append("job", b"hello ")
    store.logs.append("job", b"world\n")
    store.logs.append("job", b"")
    assert store.logs.read("job") == b"hello world\n"
    assert store.logs.size("job") == 12
    assert store.logs.read("job", 6) == b"world\n"
    assert store.logs.read("job", 12) == b""
    assert store.logs.read("job", 100) == b""
    assert store.logs.size("other") == 0  # logs are per name
    store.logs.append("job.cleanup", b"cleanup\n")
    assert store.logs.read("job") == b"hello world\n"
    assert store.logs.read(job_log_name("job", cleanup=True)) == b"cleanup\n"


def test_concurrent_appends_lose_no_bytes(store: Store) -> None:
    def appender(i: int) -> Callable[[], None]:
        return lambda: [store.logs.append("job", f"{i}:{n}\n".encode()) for n in range(200)]

    run_threads(*(appender(i) for i in range(4)))
    lines = store.logs.read("job").decode().splitlines()
    assert sorted(lines) == sorted(f"{i}:{n}" for i in range(4) for n in range(200))


def test_history_append_and_read(store: Store) -> None:
    assert list(store.history.read("job")) == []
    events = [{"event": "PENDING", "n": 1}, {"event": "STARTED", "n": 2, "reason": "ü ok"}]
    store.history.save("job", "000000000002-b", events[1:])
    store.history.save("job", "000000000001-a", events[:1])
    store.history.save("job", "000000000002-b", events[1:])  # saving again is harmless
    assert list(store.history.read("job")) == events
    assert list(store.history.read("other")) == []


# -- what is missing, and what it costs --------------------------------------------------------


def test_missing_objects_are_none_or_empty(store: Store) -> None:
    assert store.specs.read("nope") is None
    assert store.states.read("nope") is None
    assert store.requests.read("nope") is None
    assert store.complete.read("nope") is None
    assert store.logs.read("nope") == b""
    assert store.logs.read("nope", 10) == b""
    assert store.logs.size("nope") == 0
    assert list(store.history.read("nope")) == []
    store.specs.delete("nope")  # deleting what is not there is not an error
    store.states.delete("nope")
    store.requests.delete("nope")


def test_op_counters_count_each_call_kind(store: Store) -> None:
    assert sum(store.ops.values()) == 0
    store.specs.list()
    store.states.list()
    store.requests.list()
    store.specs.submit("job", b"{}")
    store.specs.replace("job", b"{}")
    store.states.write("job", b"{}")
    store.requests.write("job", b"{}")
    store.complete.write("job", {"state": {}})
    store.specs.read("job")
    store.states.read("job")
    store.logs.read("job")
    store.logs.append("job", b"x")
    store.history.save("job", "1", [{"event": "E"}])
    store.logs.size("job")
    store.specs.delete("job")
    store.requests.delete("job")
    assert dict(store.ops) == {
        "list": 3,
        "write": 6,
        "read": 3,
        "append": 1,
        "info": 1,
        "delete": 2,
    }


# -- the quota file, wherever it lives ---------------------------------------------------------


def test_url_token_and_read_url_for_a_file_in_another_directory(
    store: Store, tmp_path: Path
) -> None:
    quota = tmp_path / "elsewhere" / "quota.toml"
    assert store.quota.token(str(quota)) is None  # absent: no token, no exception
    quota.parent.mkdir()
    quota.write_text("[pool]\n")
    token = store.quota.token(str(quota))
    assert token is not None
    assert store.quota.token(str(quota)) == token  # untouched: unchanged
    assert store.quota.read(str(quota)) == b"[pool]\n"
    tmp = quota.with_name("quota.tmp")
    tmp.write_text("[pool]\n")  # same bytes, new object (how editors save)
    os.replace(tmp, quota)
    assert store.quota.token(str(quota)) != token
    token = store.quota.token(str(quota))
    quota.write_text("[pool]\ncpu = 4\n")  # rewritten in place
    assert store.quota.token(str(quota)) != token
    assert store.quota.read(str(quota)) == b"[pool]\ncpu = 4\n"
    assert store.quota.token(f"file://{quota}") == store.quota.token(str(quota))
    assert store.ops["info"] == 8 and store.ops["read"] == 2
    with pytest.raises(FileNotFoundError):  # QuotaSource tells "absent" by url_token first
        store.quota.read(str(quota.with_name("missing.toml")))


@pytest.fixture(params=["local", "generic"])
def store_failing_one_spec(request: pytest.FixtureRequest, root: Path) -> Iterator[Store]:
    """As ``any_store``, where reading the spec ``broken`` always fails: on the generic path
    every request for it (a 503), on a local root by being a directory, not a file."""
    (root / "jobs" / "active").mkdir(parents=True)
    if request.param == "local":
        (root / "jobs" / "active" / "broken").mkdir()
        yield Store(str(root))
        return
    plan = FailurePlan(where="/jobs/active/broken", first_calls=1000)
    url = FlakyFileSystem.install(str(root), plan)
    yield Store(url)
    FlakyFileSystem.uninstall(str(root))


@pytest.mark.parametrize("pooled", [False, True])
def test_reading_many_specs_gives_each_what_its_own_read_gives_and_a_failure_in_its_place(
    store_failing_one_spec: Store, pooled: bool
) -> None:
    """``read_many_with_token`` (a burst's specs in one call) answers each name as
    ``read_with_token`` does, in order: bytes and the listing's token, None when absent, a
    too-large spec refused; a read that fails is its exception in its place, the others read."""
    store = store_failing_one_spec
    store.specs.submit("a", b'{"a": 1}')
    store.specs.submit("b", b"")
    store.specs.submit("big", b"x" * ((1 << 20) + 1))
    names = ["b", "missing", "broken", "a", "big"]
    reads_before = store.ops["read"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        reads = store.specs.read_many_with_token(names, pool if pooled else None)
    assert store.ops["read"] - reads_before == len(names)  # a read counted per name
    listed = store.specs.list()
    assert reads[0] == (b"", listed["b"].token)
    assert reads[1] is None
    assert isinstance(reads[2], Exception) and "broken" in str(reads[2]), reads[2]
    assert reads[3] == (b'{"a": 1}', listed["a"].token) == store.specs.read_with_token("a")
    assert isinstance(reads[4], UnacceptableObject) and "limit" in str(reads[4])


@pytest.mark.parametrize("pooled", [False, True])
def test_writing_many_states_is_compare_and_swap_for_each_and_a_loss_stays_in_its_place(
    any_store: Store, pooled: bool
) -> None:
    """``write_many`` (a burst's states in one call) writes each state as ``write`` does: only
    at its expected token (None: absent), giving the new token the listing shows; a write
    whose precondition fails is PreconditionFailed in its place, and the others are written."""
    first = any_store.states.write("old", b"v1")
    any_store.states.write("taken", b"someone else's")
    writes_before = any_store.ops["write"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = any_store.states.write_many(
            [("new", b"n1", None), ("old", b"v2", first), ("taken", b"mine", None)],
            pool if pooled else None,
        )
    assert any_store.ops["write"] - writes_before == 3  # a write counted per state
    listed = any_store.states.list()
    assert answers[0] == listed["new"].token and any_store.states.read("new") == b"n1"
    assert answers[1] == listed["old"].token and any_store.states.read("old") == b"v2"
    assert isinstance(answers[2], PreconditionFailed)
    assert any_store.states.read("taken") == b"someone else's"


@pytest.mark.parametrize("pooled", [False, True])
def test_submitting_many_specs_creates_each_and_a_taken_name_is_false_in_its_place(
    any_store: Store, pooled: bool
) -> None:
    """``submit_many`` (a group's specs in one call) creates each spec as ``submit`` does:
    True when written, False in its place when a job of that name is active already (its
    spec untouched), and the others are written."""
    any_store.specs.submit("taken", b"someone else's")
    writes_before = any_store.ops["write"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = any_store.specs.submit_many(
            [("a", b"A"), ("taken", b"mine"), ("b", b"B")], pool if pooled else None
        )
    assert answers == [True, False, True]
    assert any_store.ops["write"] - writes_before == 3  # a write counted per spec
    assert [any_store.specs.read(n) for n in ("a", "taken", "b")] == [b"A", b"someone else's", b"B"]


def test_a_group_s_markers_name_each_job_and_the_marker_listing_finds_them(
    any_store: Store,
) -> None:
    """``write_markers`` writes one new marker per job name in one call, each as
    ``write_marker`` would (the daemon's marker listing gives the job back from its name)."""
    answers = any_store.requests.write_markers(["j1", "j2", "j1"])
    assert answers == [True, True, True]
    markers = any_store.requests.list_markers(10)
    assert sorted(marked_job(m) for m in markers) == ["j1", "j1", "j2"]
    assert all(json.loads(any_store.requests.read(m))["name"] == marked_job(m) for m in markers)

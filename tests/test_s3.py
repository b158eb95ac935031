"""s3:// through s3fs against moto's S3 server on 127.0.0.1: the primitives, then the whole loop.

The server is a separate process (tests/s3_server.py); endpoint and credentials reach every
client, the CLI and daemon subprocesses included, only through the standard AWS environment
variables, so ``Store("s3://bucket/prefix")`` is used exactly as a user would use it.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from bastion.bucket.objects import PreconditionFailed
from bastion.bucket.s3 import MIN_PART, S3Objects
from bastion.bucket.store import Store, UnacceptableObject
from tests.harness import Bastion
from tests.local_server import free_port
from tests.s3_server import S3_BUCKET, ResponseDropper

# The foundation's end-to-end tests, run unchanged with ROOT on s3:// (the ``bastion`` fixture
# below replaces conftest's local/gcs one in this module): launch, logs --follow, list --all,
# cancel (running and pending), and a kill -9 daemon restart that adopts the running job.
from tests.test_end_to_end import (  # noqa: F401
    test_cancel_pending_job_and_unknown_name,
    test_cancel_running_job_kills_whole_group_after_grace,
    test_kill_9_daemon_adopts_running_job,
    test_launch_logs_follow_list_history,
)

BUCKET = S3_BUCKET  # s3_server (conftest) creates it; one moto server for the session


@pytest.fixture
def root(s3_server) -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(root) -> Store:
    return Store(root)


@pytest.fixture
def bastion(root, tmp_path):
    b = Bastion(tmp_path, root=root)  # after s3_server set the AWS_* variables: inherited
    yield b
    b.close()


@pytest.fixture
def dropper(s3_server):
    proxy = ResponseDropper(s3_server.port)
    yield proxy
    proxy.close()


def path(store: Store, *parts: str) -> str:
    return "/".join((store.root, *parts))


# -- configuration ---------------------------------------------------------------------------


def test_s3_root_gets_s3objects_with_timeouts_and_retries(store, root):
    assert isinstance(store.objects, S3Objects)
    assert store.objects.list(store.root) == {}  # connects, through the environment's endpoint
    config = store.fs.s3.meta.config
    assert (config.connect_timeout, config.read_timeout) == (5, 20)
    assert config.retries == {"mode": "standard", "total_max_attempts": 5}
    # What a caller passes wins over our defaults; the rest still applies.
    custom = Store(root, config_kwargs={"read_timeout": 7})
    custom.objects.list(custom.root)
    config = custom.fs.s3.meta.config
    assert config.read_timeout == 7 and config.retries["mode"] == "standard"


def test_unreachable_endpoint_is_an_oserror_after_retries(root):
    """Transport failures surface as OSError (what the daemon's handlers catch), not hangs."""
    retries = {"mode": "standard", "total_max_attempts": 2}
    dead = Store(
        root,
        endpoint_url=f"http://127.0.0.1:{free_port()}",  # nothing listens there
        config_kwargs={"connect_timeout": 1, "retries": retries},
    )
    started = time.monotonic()
    for call in (
        lambda o: o.info(path(dead, "x")),
        lambda o: o.read(path(dead, "x")),
        lambda o: o.list(dead.root),
        lambda o: o.write(path(dead, "x"), b"x"),
        lambda o: o.create(path(dead, "x"), b"x"),
        lambda o: o.write_if(path(dead, "x"), b"x", None),
        lambda o: o.append(path(dead, "x"), b"x"),
        lambda o: o.delete(path(dead, "x")),
    ):
        with pytest.raises(OSError):
            call(dead.objects)
    assert time.monotonic() - started < 40


# -- primitives ------------------------------------------------------------------------------


def test_create_is_idempotent_and_reports_conflicts(store):
    o, p = store.objects, path(store, "jobs", "active", "a")
    assert o.create(p, b"spec-1")
    assert o.create(p, b"spec-1")  # same bytes: a retried create of our own
    assert not o.create(p, b"spec-2")  # someone else's object is there
    assert o.read(p) == b"spec-1"


def test_write_if_is_compare_and_swap_on_the_etag(store):
    o, p = store.objects, path(store, "jobs", "states", "s")
    t1 = o.write_if(p, b"state-1", None)
    assert o.list(path(store, "jobs", "states"))["s"].token == t1 == o.info(p).token
    with pytest.raises(PreconditionFailed):
        o.write_if(p, b"other", None)  # must not exist, but does
    t2 = o.write_if(p, b"state-2", t1)
    assert t2 != t1
    listed = o.list(path(store, "jobs", "states"))["s"]
    assert (listed.token, listed.size) == (t2, len(b"state-2"))
    with pytest.raises(PreconditionFailed):
        o.write_if(p, b"stale", t1)  # based on a read that is no longer current
    assert o.read(p) == b"state-2"
    o.delete(p)
    with pytest.raises(PreconditionFailed):
        o.write_if(p, b"stale", t2)  # it was deleted since
    assert o.read(p) is None
    assert o.write_if(p, b"state-3", None) == o.info(p).token


def test_listing_tokens_change_on_rewrite_and_skip_folders_and_dot_names(store):
    o, d = store.objects, path(store, "jobs", "active")
    o.write(f"{d}/x", b"one")
    o.write(f"{d}/.x.part", b"temporary")
    o.write(f"{d}/sub/y", b"nested")
    first = o.list(d)
    assert set(first) == {"x"}
    o.write(f"{d}/x", b"two")
    second = o.list(d)
    assert second["x"].token != first["x"].token
    assert o.list(path(store, "jobs", "nothing-here")) == {}


def test_listing_pages_through_more_than_1000_objects(store):
    o, d = store.objects, path(store, "many")
    client = store.fs.s3  # not through Objects: only the listing is under test here
    names = {f"n{i:04d}" for i in range(1005)}
    bucket, key, _ = store.fs.split_path(d)

    async def put_all():
        import asyncio

        sem = asyncio.Semaphore(32)

        async def put(name):
            async with sem:
                await client.put_object(Bucket=bucket, Key=f"{key}/{name}", Body=b"")

        await asyncio.gather(*(put(n) for n in names))

    from fsspec.asyn import sync

    sync(store.fs.loop, put_all)
    assert set(o.list(d)) == names


def test_read_ranges(store):
    o, p = store.objects, path(store, "logs", "job")
    assert o.read(p) is None and o.read(p, start=3) is None
    o.write(p, b"abcdef")
    assert o.read(p) == b"abcdef"
    assert o.read(p, start=2) == b"cdef"
    assert o.read(p, start=6) == b""  # at the end: nothing new, not an error
    assert o.read(p, start=60) == b""
    o.write(p, b"")
    assert o.read(p) == b"" and o.read(p, start=0) == b""


def test_append_small_objects(store):
    o, p = store.objects, path(store, "history", "jobs", "h")
    o.append(p, b"one\n")  # creates
    o.append(p, b"two\n")
    o.append(p, b"")
    o.append(p, b"three\n")
    assert o.read(p) == b"one\ntwo\nthree\n"
    assert o.info(p).size == len(b"one\ntwo\nthree\n")


def test_append_large_object_by_server_side_copy(store):
    o, p = store.objects, path(store, "logs", "big")
    big = os.urandom(MIN_PART + 123)
    o.write(p, big)
    o.append(p, b"tail 1\n")
    o.append(p, b"tail 2\n")
    assert o.read(p, start=len(big)) == b"tail 1\ntail 2\n"
    assert o.read(p) == big + b"tail 1\ntail 2\n"
    token = o.info(p).token
    assert token.endswith("-2")  # a multipart object of [copy of the old, new bytes]
    assert o.list(path(store, "logs"))["big"].token == token


def test_delete_is_quiet_when_missing(store):
    o, p = store.objects, path(store, "jobs", "user_states", "gone")
    o.delete(p)
    o.write(p, b"cancel")
    o.delete(p)
    assert o.read(p) is None and o.info(p) is None
    o.delete(p)


# -- what a busy queue pays: requests per primitive ----------------------------------------


def test_read_with_token_is_one_get_and_its_token_is_the_listings(store, root, dropper):
    """A spec named by a submission marker is read with its token in one request."""
    via = Store(root, endpoint_url=dropper.endpoint)
    o, p = via.objects, path(via, "jobs", "active", "spec")
    o.write(p, b"spec v1")
    assert o.read_with_token(p) == (b"spec v1", o.list(path(via, "jobs", "active"))["spec"].token)
    assert dropper.statuses("GET") == ["200", "200"] and dropper.statuses("HEAD") == []
    assert o.read_with_token(path(via, "jobs", "active", "absent")) is None
    with pytest.raises(UnacceptableObject, match="is 7 bytes"):
        o.read_with_token(p, limit=3)
    o.write(p, b"")  # an empty object refuses a range: answered all the same
    assert o.read_with_token(p, limit=10) == (b"", o.info(p).token)


def test_delete_many_sends_a_thousand_keys_per_request(store, root, dropper):
    """Consumed submission markers go in batches: 1,001 keys (and an absent one) in two."""
    folder = path(store, "jobs", "user_states")
    paths = [f"{folder}/_m{i:04d}" for i in range(1001)]
    for p in paths:
        store.objects.write(p, b"")
    via = Store(root, endpoint_url=dropper.endpoint)
    failed = via.objects.delete_many(
        [p.replace(store.root, via.root) for p in paths] + [f"{folder}/x"]
    )
    assert failed == []
    assert dropper.statuses("POST") == ["200", "200"]
    assert store.objects.list(folder) == {}


def test_appending_to_a_log_known_to_be_new_is_one_request(store, root, dropper):
    via = Store(root, endpoint_url=dropper.endpoint)
    o, p = via.objects, path(via, "logs", "job")
    o.append(p, b"=== admitted ===\n", size=0)
    assert dropper.statuses("PUT") == ["200"] and dropper.statuses("HEAD") == []
    o.append(p, b"output\n", size=0)  # a wrong belief still appends, never replaces
    assert o.read(p) == b"=== admitted ===\noutput\n"


# -- failing requests: transient ones are retried, permanent ones fail at once -----------------


def test_transient_errors_are_retried(store, root, dropper):
    via = Store(root, endpoint_url=dropper.endpoint)
    o, p = via.objects, path(via, "jobs", "states", "s")
    dropper.arm("PUT", "if-none-match", reply=(409, "ConditionalRequestConflict"))
    assert o.create(p, b"v1")  # AWS asks clients to retry a racing conditional write
    dropper.arm("PUT", "if-match", reply=(429, "TooManyRequests"))  # a code botocore won't retry
    t2 = o.write_if(p, b"v2", o.info(p).token)
    assert dropper.statuses("PUT") == ["409", "200", "429", "200"]
    dropper.arm("GET", "list-type=2", reply=(500, "InternalError"))
    assert o.list(path(via, "jobs", "states"))["s"].token == t2
    dropper.arm("GET", "/s ", reply=(503, "SlowDown"))
    assert o.read(p) == b"v2"
    assert dropper.statuses("GET") == ["500", "200", "503", "200"]
    assert store.objects.read(p) == b"v2"


def test_permanent_errors_fail_at_once(root, dropper):
    via = Store(root, endpoint_url=dropper.endpoint)
    dropper.arm("GET", "", reply=(403, "AccessDenied"))
    with pytest.raises(PermissionError):
        via.objects.read(path(via, "anything"))
    assert dropper.statuses("GET") == ["403"]


# -- answers lost after the server acted: the client's retry must not be a conflict -----------


def test_write_if_whose_answer_was_lost(store, root, dropper):
    via = Store(root, endpoint_url=dropper.endpoint)
    p = path(via, "jobs", "states", "s")
    t1 = via.objects.write_if(p, b"v1", None)
    dropper.arm("PUT", "if-match")
    t2 = via.objects.write_if(p, b"v2", t1)
    # The server applied it, the answer was lost, botocore sent it again and met our own write.
    assert [status for _, status in dropper.dropped] == ["HTTP/1.1 200 OK"]
    assert dropper.statuses("PUT") == ["200", "200", "412"]
    assert t2 == store.objects.info(p).token != t1
    assert store.objects.read(p) == b"v2"
    dropper.arm("PUT", "if-match")
    with pytest.raises(PreconditionFailed):  # a real conflict still is one
        via.objects.write_if(p, b"v3", t1)
    assert store.objects.read(p) == b"v2"


def test_create_whose_answer_was_lost(store, root, dropper):
    via = Store(root, endpoint_url=dropper.endpoint)
    p = path(via, "jobs", "active", "a")
    dropper.arm("PUT", "if-none-match")
    assert via.objects.create(p, b"spec")
    assert len(dropper.dropped) == 1
    assert dropper.statuses("PUT") == ["200", "412"]
    assert store.objects.read(p) == b"spec"


def test_append_whose_answer_was_lost_appends_once(store, root, dropper):
    via = Store(root, endpoint_url=dropper.endpoint)
    small, big = path(via, "logs", "small"), path(via, "logs", "big")
    via.objects.append(small, b"first\n")
    dropper.arm("PUT", "if-match")
    via.objects.append(small, b"second\n")
    assert len(dropper.dropped) == 1
    assert dropper.statuses("PUT") == ["200", "200", "412"]
    assert store.objects.read(small) == b"first\nsecond\n"

    head = b"x" * MIN_PART
    via.objects.write(big, head)
    dropper.arm("POST", "uploadId=")  # CompleteMultipartUpload
    via.objects.append(big, b"more\n")
    assert len(dropper.dropped) == 2
    assert store.objects.read(big) == head + b"more\n"
    assert store.objects.info(big).token.endswith("-2")


# -- the whole loop through the CLI and daemon subprocesses ---------------------------------


def test_large_job_log_on_s3(bastion):
    """A log past 5 MiB keeps growing by server-side copy; every line arrives once, in order."""
    bastion.start()
    lines = 100_000  # 'row NNNNNN' + newline: about 1.1 MB per 100,000
    command = f"seq -f 'row %06g' 1 {lines * 5}; sleep 2; echo end"
    bastion.cli("launch", "--name=chatty", "--", command)
    record = bastion.wait_complete("chatty", timeout=60)
    assert record["state"]["outcome"] == "SUCCEEDED"
    log = bastion.log("chatty")
    rows = [ln for ln in log.splitlines() if ln.startswith("row ")]
    assert rows == [f"row {i:06d}" for i in range(1, lines * 5 + 1)]
    assert f"row {lines * 5:06d}\nend\n" in log
    assert bastion.store.objects.info(f"{bastion.store.root}/logs/chatty").token.count("-") == 1
    follow = bastion.cli("logs", "chatty")
    assert follow.stdout.count("row ") == lines * 5


def test_read_spec_fetches_at_most_the_limit_and_says_the_size(store):
    store.objects.write(path(store, "jobs", "active", "big"), b"x" * (3 << 20))
    store.objects.write(path(store, "jobs", "active", "empty"), b"")
    with pytest.raises(UnacceptableObject, match="jobs/active/big is 3 MiB; the limit is 1 MiB"):
        store.specs.read("big")
    assert store.specs.read("empty") == b""


# -- a cycle's reads and writes in one call ----------------------------------------------------


def test_reading_many_is_one_get_each_and_a_refused_get_is_sent_again_alone(store, root, dropper):
    """A burst's specs in one call: one GetObject per object, each answered as
    ``read_with_token`` answers it (the listing's token, None when absent, a too-large one
    refused); a GET the front end refused (AccessDenied, once) is sent again alone, through
    ``read_with_token``, and read."""
    via = Store(root, endpoint_url=dropper.endpoint)
    folder = path(via, "jobs", "active")
    names = [f"spec-{i:02d}" for i in range(20)]
    for name in names:
        via.objects.write(f"{folder}/{name}", name.encode())
    via.objects.write(f"{folder}/big", b"x" * 100)
    via.objects.write(f"{folder}/denied", b"secret")
    listed = via.objects.list(folder)
    dropper.exchanges.clear()
    dropper.arm("GET", "/denied ", reply=(403, "AccessDenied"))
    asked = [*names, "absent", "big", "denied"]
    reads = via.objects.read_many_with_token([f"{folder}/{n}" for n in asked], limit=10)
    assert reads[: len(names)] == [(n.encode(), listed[n].token) for n in names]
    absent, big, denied = reads[len(names) :]
    assert absent is None
    assert isinstance(big, UnacceptableObject) and "is 100 bytes" in str(big)
    assert denied == (b"secret", listed["denied"].token)
    # one GET each; the denied one twice (refused in the batch, then answered alone)
    statuses = dropper.statuses("GET")
    assert len(statuses) == len(asked) + 1 and statuses.count("403") == 1, statuses


def test_writing_many_is_compare_and_swap_each_and_a_lost_answer_is_still_ours(
    store, root, dropper
):
    """A burst's states in one call: a conditional PutObject each, at its ETag (or absent);
    a put whose answer was lost after the server applied it is sent again alone, meets our own
    bytes and is ours; a put someone else beat is PreconditionFailed in its place."""
    via = Store(root, endpoint_url=dropper.endpoint)
    folder = path(via, "jobs", "states")
    old = via.objects.write_if(f"{folder}/old", b"v1", None)
    via.objects.write_if(f"{folder}/taken", b"theirs", None)
    writes = [(f"{folder}/n{i:02d}", b"new", None) for i in range(10)]
    writes += [(f"{folder}/old", b"v2", old), (f"{folder}/taken", b"mine", None)]
    dropper.arm("PUT", "if-match")  # the one put under If-Match: "old"
    answers = via.objects.write_many_if(writes)
    assert [status for _, status in dropper.dropped] == ["HTTP/1.1 200 OK"]
    listed = store.objects.list(path(store, "jobs", "states"))
    for (p, data, _), answer in zip(writes[:-1], answers[:-1], strict=True):
        name = p.rsplit("/", 1)[1]
        assert (
            answer == listed[name].token
            and store.objects.read(path(store, "jobs", "states", name)) == data
        )
    assert isinstance(answers[-1], PreconditionFailed)
    assert store.objects.read(path(store, "jobs", "states", "taken")) == b"theirs"


def test_creating_many_creates_each_and_a_taken_name_is_false_in_its_place(store, root, dropper):
    """A group's specs in one call (``create_many``): a PutObject each under If-None-Match: *;
    one whose answer was lost after the server applied it is sent again alone and is ours; a
    name another object holds is False in its place."""
    via = Store(root, endpoint_url=dropper.endpoint)
    folder = path(via, "jobs", "active")
    via.objects.write_if(f"{folder}/taken", b"theirs", None)
    items = [(f"{folder}/m{i:02d}", f"m{i}".encode()) for i in range(10)]
    items.append((f"{folder}/taken", b"mine"))
    dropper.arm("PUT", "/m03 ")  # applied by the server, its answer lost
    answers = via.objects.create_many(items)
    assert [status for _, status in dropper.dropped] == ["HTTP/1.1 200 OK"]
    assert answers == [True] * 10 + [False]
    for p, data in items[:-1]:
        assert store.objects.read(p) == data
    assert store.objects.read(f"{folder}/taken") == b"theirs"

"""Incremental log upload on a real local root: new bytes only, across restarts and chunks."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

import bastion.bucket.logsync
from bastion.bucket.logsync import ADDED_NEWLINE, LogSync
from bastion.bucket.store import Store
from bastion.daemon.start import build_daemon
from launch.api import Client, new_jobspec

CHUNK = 8 << 20  # LogSync's documented per-sync bound


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(str(tmp_path / "root"))


def mirror_dir(tmp_path: Path) -> str:
    return str(tmp_path / "work" / "logs")


def add(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def remote(store: Store, log: str = "job") -> bytes:
    return store.logs.read(log)


def test_only_new_bytes_are_appended(store: Store, tmp_path: Path) -> None:
    logs = LogSync(store, mirror_dir(tmp_path))
    path = logs.path("job")
    assert logs.base("job") == 0
    assert logs.sync("job") == 0  # an empty mirror uploads nothing
    add(path, b"one\n")
    assert logs.sync("job") == 4
    assert remote(store) == b"one\n"
    appends = store.ops["append"]
    assert logs.sync("job") == 0
    assert store.ops["append"] == appends  # nothing new: not even an empty append
    add(path, b"two\n")
    logs.write("job", "=== marker ===")  # the daemon's own lines go through the same mirror
    assert logs.sync("job") == len(b"two\n=== marker ===\n")
    assert remote(store) == b"one\ntwo\n=== marker ===\n"
    assert store.ops["append"] == appends + 1


def test_a_restarted_daemon_uploads_nothing_twice(store: Store, tmp_path: Path) -> None:
    first = LogSync(store, mirror_dir(tmp_path))
    path = first.path("job")
    add(path, b"a" * 1000)
    assert first.sync("job") == 1000
    add(path, b"b" * 10)
    assert first.sync("job") == 10  # uploaded, but "crashed" before anyone else knew

    second = LogSync(store, mirror_dir(tmp_path))  # a new daemon on the same work dir
    assert second.mirrors() == ["job"]
    assert second.base("job") == 0
    appends = store.ops["append"]
    assert second.sync("job") == 0  # it asks the bucket how far the upload got
    assert store.ops["append"] == appends
    add(path, b"c" * 5)
    assert second.sync("job") == 5
    assert remote(store) == b"a" * 1000 + b"b" * 10 + b"c" * 5


def test_a_restart_resumes_a_partial_upload(store: Store, tmp_path: Path) -> None:
    first = LogSync(store, mirror_dir(tmp_path))
    path = first.path("job")
    add(path, b"x" * 300)
    assert first.sync("job") == 300
    add(path, b"y" * 200)  # written, never uploaded: the daemon died first
    second = LogSync(store, mirror_dir(tmp_path))
    assert second.sync("job") == 200
    assert remote(store) == b"x" * 300 + b"y" * 200


def test_a_mirror_created_after_an_earlier_job_of_that_name(store: Store, tmp_path: Path) -> None:
    old = b"output of an earlier job of the same name\n"
    store.logs.append("job", old)
    logs = LogSync(store, mirror_dir(tmp_path))
    path = logs.path("job")
    assert logs.base("job") == len(old)
    assert not os.path.exists(path)  # the mirror will hold only this job's bytes: none yet
    assert logs.total("job") == len(old) and logs.sync("job") == 0
    add(path, b"new\n")
    assert logs.sync("job") == 4
    assert remote(store) == old + b"new\n"
    assert store.logs.read("job", logs.base("job")) == b"new\n"
    # and a restart still lands after the old bytes, sending nothing twice
    again = LogSync(store, mirror_dir(tmp_path))
    assert again.base("job") == len(old)
    add(path, b"more\n")
    assert again.sync("job") == 5
    assert remote(store) == old + b"new\nmore\n"


def test_close_flushes_and_removes_the_mirror(store: Store, tmp_path: Path) -> None:
    logs = LogSync(store, mirror_dir(tmp_path))
    path = logs.path("job")
    add(path, b"never synced\n")
    logs.close("job")
    assert remote(store) == b"never synced\n"
    assert not os.path.exists(path) and not os.path.exists(path + ".base")
    assert logs.mirrors() == []
    logs.close("job")  # closing again is harmless and uploads nothing
    logs.close("never-opened")
    assert remote(store) == b"never synced\n"
    # the next job of that name starts a new mirror after everything uploaded so far
    path = logs.path("job")
    assert logs.base("job") == len(b"never synced\n")
    add(path, b"next job\n")
    logs.close("job")
    assert remote(store) == b"never synced\nnext job\n"


def test_chunks_past_8_mib_across_syncs_and_a_restart(store: Store, tmp_path: Path) -> None:
    data = os.urandom(CHUNK + 12345)
    logs = LogSync(store, mirror_dir(tmp_path))
    add(logs.path("big"), data)
    assert logs.sync("big") == CHUNK  # memory per sync is bounded; the rest waits
    assert store.logs.size("big") == CHUNK
    restarted = LogSync(store, mirror_dir(tmp_path))
    assert restarted.sync("big") == 12345
    assert restarted.sync("big") == 0
    assert remote(store, "big") == data


def test_flush_uploads_everything_in_bounded_chunks(store: Store, tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK + 7)
    logs = LogSync(store, mirror_dir(tmp_path))
    add(logs.path("big"), data)
    appends = store.ops["append"]
    logs.flush("big")
    assert store.ops["append"] == appends + 3
    assert remote(store, "big") == data
    logs.close("big")
    assert remote(store, "big") == data


def test_a_finished_jobs_state_is_written_after_its_whole_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon uploads at most one chunk per log per cycle; once a job has ended, the state
    that says so must still wait for the log's last byte (chunks made small to test it)."""
    monkeypatch.setattr(bastion.bucket.logsync, "_MAX_CHUNK", 1000)
    root = str(tmp_path / "root")
    client = Client(store=Store(root), expect_daemon=False)
    command = "head -c 20000 /dev/zero | tr '\\0' x; echo; echo done"
    client.submit(new_jobspec(name="chatty", command=command, user_id="u", project_id="default"))
    daemon = build_daemon(root, work_dir=str(tmp_path / "work"))
    remote_when_completed: list[int] = []
    write_state = daemon.store.states.write

    def observed(name: str, data: bytes, expected: str | None = None) -> str:
        if json.loads(data)["status"] == "COMPLETED":
            remote_when_completed.append(len(daemon.store.logs.read(name)))
        return write_state(name, data, expected)

    monkeypatch.setattr(daemon.store.states, "write", observed)
    deadline = time.monotonic() + 30
    while daemon.store.complete.read("chatty") is None:
        assert time.monotonic() < deadline, "the job did not complete"
        daemon.cycle(time.time())
        time.sleep(0.1)
    whole = daemon.store.logs.read("chatty")
    assert b"x" * 20000 + b"\ndone\n" in whole
    assert remote_when_completed == [len(whole)]


def test_a_marker_after_output_without_a_final_newline_starts_its_own_line(
    store: Store, tmp_path: Path
) -> None:
    logs = LogSync(store, mirror_dir(tmp_path))
    logs.append("job", b"progress 99%")  # a job's last output, no newline
    logs.write("job", "=== [bastion] attempt 1 exited with status 0 ===")
    logs.write("job", "=== next ===")
    logs.flush("job")
    assert remote(store) == (
        b"progress 99%\n=== [bastion] attempt 1 exited with status 0 "
        + ADDED_NEWLINE.encode()
        + b" ===\n=== next ===\n"
    )
    assert logs.total("job") == len(remote(store))


def test_the_daemons_own_lines_are_uploaded_from_memory_without_local_files(
    store: Store, tmp_path: Path
) -> None:
    """Admitting a job writes a line to its log: no file is made for it (a burst of a
    thousand admissions made two thousand files); a job's output later starts the mirror
    after the lines already uploaded, and a restart sends nothing twice."""
    old = b"an earlier job of this name\n"
    store.logs.append("job", old)
    logs = LogSync(store, mirror_dir(tmp_path))
    logs.write("job", "=== admitted ===")
    assert os.listdir(mirror_dir(tmp_path)) == []
    assert logs.total("job") == len(old) + len(b"=== admitted ===\n")
    assert logs.mirrors() == ["job"]
    assert logs.sync("job") == len(b"=== admitted ===\n")
    assert logs.sync("job") == 0
    assert os.listdir(mirror_dir(tmp_path)) == [] and logs.mirrors() == []
    assert logs.total("job") == len(remote(store))
    logs.append("job", b"output\n")  # the job's output makes the mirror, after our line
    assert sorted(os.listdir(mirror_dir(tmp_path))) == ["job", "job.base"]
    logs.write("job", "=== exited ===")
    assert logs.sync("job") == len(b"output\n=== exited ===\n")
    restarted = LogSync(store, mirror_dir(tmp_path))
    assert restarted.sync("job") == 0
    assert remote(store) == old + b"=== admitted ===\noutput\n=== exited ===\n"
    assert restarted.total("job") == len(remote(store))


def test_a_failed_upload_of_lines_in_memory_is_retried_once_and_only_once(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload that fails is retried next sync; one whose answer was lost (the bytes
    landed) is not sent again: the bucket's size says how far it got."""
    logs = LogSync(store, mirror_dir(tmp_path))
    real = store.logs.append
    outcomes = iter(["fail", "lost"])

    def flaky(name: str, data: bytes, size: int | None = None) -> None:
        outcome = next(outcomes, "ok")
        if outcome == "lost":
            real(name, data, size=size)
        if outcome != "ok":
            raise OSError(f"upload {outcome}")
        real(name, data, size=size)

    monkeypatch.setattr(store.logs, "append", flaky)
    logs.write("job", "line one")
    with pytest.raises(OSError, match="fail"):
        logs.sync("job")
    assert remote(store) == b"" and logs.total("job") == len(b"line one\n")
    with pytest.raises(OSError, match="lost"):
        logs.sync("job")
    logs.write("job", "line two")
    assert logs.sync("job") == len(b"line two\n")
    assert remote(store) == b"line one\nline two\n"
    logs.close("job")
    assert remote(store) == b"line one\nline two\n" and os.listdir(mirror_dir(tmp_path)) == []


def job_output(log: bytes) -> bytes:
    """The job's bytes in a one-attempt log, by the rule LogSync.write documents: what lies
    between the start and end markers, less a newline the end marker says bastion added."""
    start = log.index(b"===\n") + len(b"===\n")
    end = log.rindex(b"=== [bastion] attempt 1 ")
    output = log[start:end]
    if ADDED_NEWLINE.encode() in log[end:]:
        assert output.endswith(b"\n")
        output = output[:-1]
    return output


@pytest.mark.parametrize(
    "output", [b"last line without a newline", b"last line with a newline\n", b"\n\nno\n\nend"]
)
def test_the_bucket_log_holds_the_jobs_bytes_exactly_and_a_newline_only_it_says_is_ours(
    tmp_path: Path, output: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's output without a final newline gained one in the bucket log, silently. The
    end marker still starts a line of its own, and says so when the newline before it is
    bastion's; a job that ended its output with a newline gets no such note."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the attempts' directory
    root = str(tmp_path / "root")
    client = Client(store=Store(root), expect_daemon=False)
    (tmp_path / "output").write_bytes(output)
    command = f"cat {tmp_path / 'output'}"
    client.submit(new_jobspec(name="exact", command=command, user_id="u", project_id="default"))
    daemon = build_daemon(root, work_dir=str(tmp_path / "work"), gpus=[])
    deadline = time.monotonic() + 30
    while daemon.store.complete.read("exact") is None:
        assert time.monotonic() < deadline, "the job did not complete"
        daemon.cycle(time.time())
        time.sleep(0.1)
    daemon.close()
    log = daemon.store.logs.read("exact")
    added = not output.endswith(b"\n")
    end = rb"=== \[bastion\] attempt 1 exited with status 0 at [^\n]*"
    pattern = (
        rb"=== \[bastion\] attempt 1 of exact started [^\n]* ===\n"
        + re.escape(output)
        + (rb"\n" + end + re.escape(b" " + ADDED_NEWLINE.encode()) if added else end)
        + rb" ===\n"
    )
    assert re.fullmatch(pattern, log), log
    assert (ADDED_NEWLINE.encode() in log) == added
    assert job_output(log) == output

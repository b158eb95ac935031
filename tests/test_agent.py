"""The in-guest agent as a real subprocess against a real bucket (local directory and the GCS
emulator), with the metadata-server stand-in, and what RemoteRecords makes of its records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from bastion.agent import Agent
from bastion.bucket.runs import Runs, parse_run_name, run_name
from bastion.bucket.store import Store
from bastion.runners.base import AttemptPhase
from bastion.runners.kit.channel import AgentChannel
from bastion.runners.kit.records import RemoteRecords
from tests.conftest import fresh_gcs_root
from tests.harness import REPO, kill_all, processes_with_env, wait_for
from tests.standins.metadata import MetadataServer


@pytest.fixture(params=["local", "gcs"])
def root(request, tmp_path):
    if request.param == "gcs":
        request.getfixturevalue("gcs_emulator")
        return fresh_gcs_root()
    return str(tmp_path / "root")


@pytest.fixture
def metadata():
    with MetadataServer({}) as server:
        yield server


@pytest.fixture
def agents(tmp_path, metadata):
    """Start agents as subprocesses; whatever is left is killed at the end, commands too."""
    tag = uuid.uuid4().hex
    started: list[subprocess.Popen[bytes]] = []

    def start(root, *command, attempt="a1", worker=0, chunk=0.3, beat=0.3, **flags):
        args = [f"--root={root}", "--job=train", f"--attempt={attempt}"]
        if worker is not None:
            args.append(f"--worker={worker}")
        args += [f"--chunk_seconds={chunk}", f"--heartbeat_seconds={beat}"]
        args += [f"--{key}={value}" for key, value in flags.items()]
        env = dict(os.environ, GCE_METADATA_HOST=metadata.host, AGENT_TEST_TAG=tag)
        proc = subprocess.Popen(
            [sys.executable, "-m", "bastion.agent", *args, "--", *command],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    kill_all(processes_with_env("AGENT_TEST_TAG", tag))


def finished(proc: subprocess.Popen[bytes], timeout: float = 40) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out = proc.communicate(timeout=10)[0].decode(errors="replace")
        raise AssertionError(f"agent still running after {timeout}s:\n{out}") from None


def records(root: str, workers: int = 1, timeout: float = 30.0) -> RemoteRecords:
    return RemoteRecords(Store(root), "train", "a1", workers, heartbeat_timeout=timeout)


def output(remote: RemoteRecords, worker: int = 0) -> bytes:
    return remote.read_output(0, 1 << 20, worker=worker)


def test_output_in_chunks_while_running_and_whole_after_exit(root, agents, tmp_path):
    gate, marker = tmp_path / "gate", tmp_path / "marker"
    command = (
        f"echo run >> {marker}; echo first $BASTION_WORKER/$BASTION_NUM_WORKERS; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done; "
        "for i in $(seq 1 200); do echo line $i; done; echo to-stderr >&2; exit 5"
    )
    proc = agents(root, command, num_workers=1)
    remote = records(root)
    wait_for(lambda: b"first 0/1\n" in output(remote), timeout=30, what="the first chunk")
    assert proc.poll() is None, "output must arrive while the command still runs"
    listing = remote.list()
    assert remote.observe(listing, time.time()).phase == AttemptPhase.RUNNING
    gate.touch()
    assert finished(proc) == 5
    listing = remote.list()
    expected = "first 0/1\n" + "".join(f"line {i}\n" for i in range(1, 201)) + "to-stderr\n"
    whole = remote.read_output(0, 1 << 20, listing=listing)
    assert whole.decode() == expected
    chunks = list(Store(root).runs.list("train", "a1"))
    assert all(parse_run_name(name)[1] == "log" for name in chunks)
    assert len(chunks) >= 2, chunks  # the first line went up before the rest existed
    pieces, offset = [], 0  # small pieces (crossing chunk boundaries) equal the whole
    while piece := remote.read_output(offset, 7, listing=listing):
        pieces.append(piece)
        offset += len(piece)
    assert b"".join(pieces) == whole
    assert remote.read_output(len(whole), 10, listing=listing) == b""
    exit_record = Store(root).agents.read("train", "a1", 0, "exit")
    assert exit_record["code"] == 5 and exit_record["preempted"] is False
    assert exit_record["output_bytes"] == len(whole)  # the daemon knows the log is complete
    observed = remote.observe(listing, time.time())
    assert (observed.phase, observed.exit_code) == (AttemptPhase.FAILED, 5)
    assert observed.reason == "worker 0 exited with status 5"

    again = agents(root, command)  # the startup script runs again on the same attempt
    assert finished(again) == 0
    assert b"already started" in again.communicate(timeout=10)[0]
    assert marker.read_text() == "run\n"  # the command ran exactly once
    assert output(records(root)).decode() == expected
    Store(root).runs.delete("train", "a1")
    assert Store(root).runs.list("train", "a1") == {}


def test_sigterm_reaches_the_command_and_the_last_line_is_flushed(root, agents, tmp_path):
    ready = tmp_path / "ready"
    command = (
        "trap 'echo got TERM; exit 143' TERM; echo working; "
        f"touch {ready}; while true; do sleep 0.05; done"
    )
    proc = agents(root, command, chunk=60)  # only the flush at exit uploads after the start
    wait_for(ready.exists, timeout=30, what="the command to start")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert finished(proc) == 143
    assert time.monotonic() - started < 30  # inside the spot window
    remote = records(root)
    assert output(remote).decode().splitlines()[-1] == "got TERM"
    exit_record = Store(root).agents.read("train", "a1", 0, "exit")
    assert exit_record["code"] == 143 and exit_record["preempted"] is False
    assert exit_record["reason"] == "stopped by SIGTERM"
    assert remote.observe(remote.list(), time.time()).phase == AttemptPhase.FAILED


def test_preemption_notice_stops_and_marks_the_exit(root, agents, tmp_path, metadata):
    """The worker index comes from the metadata server when --worker is not given."""
    metadata.attributes["agent-worker-number"] = "1"
    ready = tmp_path / "ready"
    command = (
        "trap 'echo saving checkpoint; exit 143' TERM; echo worker $BASTION_WORKER; "
        f"touch {ready}; while true; do sleep 0.05; done"
    )
    proc = agents(root, command, worker=None, num_workers=2)
    wait_for(ready.exists, timeout=30, what="the command to start")
    metadata.preempt()
    assert finished(proc) == 143
    remote = records(root, workers=2)
    lines = output(remote, worker=1).decode().splitlines()  # bash may add "Terminated"
    assert (lines[0], lines[-1]) == ("worker 1", "saving checkpoint")
    exit_record = Store(root).agents.read("train", "a1", 1, "exit")
    assert exit_record["preempted"] is True and exit_record["code"] == 143
    observed = remote.observe(remote.list(), time.time())
    assert observed.phase == AttemptPhase.PREEMPTED and observed.retryable
    assert "worker 1" in observed.reason


def test_a_sigterm_on_a_preempted_vm_is_a_preemption_not_a_failure(
    root, agents, tmp_path, metadata
):
    """The shutdown's SIGTERM arrives before the watcher's long-poll hears of the notice."""
    ready = tmp_path / "ready"
    command = f"trap 'exit 143' TERM; touch {ready}; while true; do sleep 0.05; done"
    proc = agents(root, command)
    wait_for(ready.exists, timeout=30, what="the command to start")
    path = "/computeMetadata/v1/instance/preempted"  # a plain read, then the long-poll
    wait_for(lambda: metadata.requests.count(path) >= 2, timeout=30, what="the long-poll")
    metadata.preempt(answer_waiters=False)
    proc.send_signal(signal.SIGTERM)
    assert finished(proc) == 143
    exit_record = Store(root).agents.read("train", "a1", 0, "exit")
    assert exit_record["preempted"] is True
    assert exit_record["reason"] == "preempted by the provider"
    assert records(root).observe(records(root).list(), time.time()).phase == AttemptPhase.PREEMPTED


def test_a_failing_worker_fails_the_job_with_its_code(tmp_path, agents):
    root = str(tmp_path / "root")
    gate = tmp_path / "gate"
    remote = records(root, workers=2)
    assert remote.observe(remote.list(), time.time()) is None  # nothing started: ask the cloud
    w0 = agents(root, f"while [ ! -e {gate} ]; do sleep 0.05; done", worker=0, num_workers=2)
    wait_for(lambda: run_name(0, "started") in remote.list(), what="worker 0 to start")
    assert remote.observe(remote.list(), time.time()).phase == AttemptPhase.RUNNING
    w1 = agents(root, "echo bad input; exit 3", worker=1, num_workers=2)
    assert finished(w1) == 3
    observed = remote.observe(remote.list(), time.time())
    assert (observed.phase, observed.exit_code) == (AttemptPhase.FAILED, 3)
    assert observed.reason == "worker 1 exited with status 3"
    assert not observed.retryable
    gate.touch()
    assert finished(w0) == 0
    assert remote.observe(remote.list(), time.time()).reason == "worker 1 exited with status 3"
    assert output(remote, worker=1) == b"bad input\n"


def test_all_workers_exit_zero_is_success(tmp_path, agents):
    root = str(tmp_path / "root")
    procs = [agents(root, "echo ok", worker=w, num_workers=2) for w in (0, 1)]
    assert [finished(p) for p in procs] == [0, 0]
    remote = records(root, workers=2)
    assert remote.observe(remote.list(), time.time()).phase == AttemptPhase.SUCCEEDED


def escaped_sleep(pidfile: Path) -> int:
    """The pid of a ``sleep 300`` the command started in a session of its own."""
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="pid"))

    def settled() -> bool:
        try:
            return os.getsid(pid) == pid and psutil.Process(pid).name() == "sleep"
        except (OSError, psutil.Error):
            return False

    wait_for(settled, what="the escaped sleep")
    return pid


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("how", ["exits 0", "is stopped"])
def test_what_a_workers_command_left_behind_is_ended_and_named(tmp_path, agents, how):
    """A `setsid` child is out of the command's process group: it ran on after the agent had
    reported the worker's exit. Now the agent ends it by its marker and says so."""
    root = str(tmp_path / "root")
    pidfile, gate = tmp_path / "escaped.pid", tmp_path / "gate"
    command = f"setsid sleep 300 & echo $! > {pidfile}; while [ ! -e {gate} ]; do sleep 0.05; done"
    proc = agents(root, command)
    escaped = escaped_sleep(pidfile)
    if how == "exits 0":
        gate.touch()
        assert finished(proc) == 0
    else:
        proc.send_signal(signal.SIGTERM)
        assert finished(proc) == 143
    assert gone(escaped)
    said = f"killed 1 process left behind: sleep (pid {escaped})"
    assert Store(root).agents.read("train", "a1", 0, "exit")["left_behind"] == said
    observed = records(root).observe(records(root).list(), time.time())
    assert observed.finished and observed.note == said


def test_a_worker_that_stops_heartbeating_is_lost(tmp_path, agents):
    root = str(tmp_path / "root")
    proc = agents(root, "sleep 60", beat=0.2)
    remote = records(root, timeout=5.0)
    wait_for(lambda: run_name(0, "heartbeat") in remote.list(), what="a heartbeat")
    assert remote.observe(remote.list(), time.time()).phase == AttemptPhase.RUNNING
    proc.kill()  # the VM vanished: no exit record, the heartbeat goes stale
    proc.wait(10)
    listing = remote.list()
    assert remote.observe(listing, time.time() + 1).phase == AttemptPhase.RUNNING
    observed = remote.observe(listing, time.time() + 10)
    assert observed.phase == AttemptPhase.LOST and observed.retryable
    assert observed.reason.startswith("worker 0 stopped heartbeating")


def test_stale_records_written_directly(tmp_path):
    """Without an agent: a started worker that never heartbeat is silent from the moment the
    daemon first saw its claim, on the daemon's clock (the record's own time is not trusted:
    a worker's clock may be skewed)."""
    store = Store(str(tmp_path / "root"))
    store.agents.claim("train", "a1", 0, {"worker": 0, "time": 1000.0})
    remote = records(str(tmp_path / "root"), timeout=60)
    assert remote.observe(remote.list(), 1030.0).phase == AttemptPhase.RUNNING
    assert remote.observe(remote.list(), 1100.0).phase == AttemptPhase.LOST
    store.agents.write("train", "a1", 0, "heartbeat", {"worker": 0, "time": 1090.0})
    assert remote.observe(remote.list(), 1100.0).phase == AttemptPhase.RUNNING


def test_an_attempt_the_provider_ended_is_judged_from_its_records_now(tmp_path):
    """The cycle's listing may predate the agents' last records (a short job started, printed
    and exited between it and the provider's listing): judged from it, the attempt was LOST
    (requeued: run twice) or its output cut short."""
    store = Store(str(tmp_path / "root"))
    channel = AgentChannel(
        store, heartbeat_timeout=60, flush_seconds=0, start_timeout=60, listing_ttl=3600
    )
    handle = {"job": "train", "name": "a1", "workers": 1}
    assert channel.agents(handle) is None  # the cycle's listing: no agent yet
    store.agents.claim("train", "a1", 0, {"worker": 0, "time": time.time()})
    store.runs.write_chunk("train", "a1", 0, 0, b"first line\n")
    store.runs.write_chunk("train", "a1", 0, 1, b"second\n")
    store.agents.write("train", "a1", 0, "exit", {"code": 0, "preempted": False, "chunks": 2})
    assert channel.agents(handle) is None  # still the cycle's listing
    seen = channel.gone(handle, "the machines are gone")
    assert (seen.phase, seen.exit_code) == (AttemptPhase.SUCCEEDED, 0)
    assert channel.read_output(handle, 0, 100) == b"first line\nsecond\n"
    assert channel.agents(handle).phase is AttemptPhase.SUCCEEDED  # kept for later polls


def test_each_worker_health_is_one_stable_word(tmp_path):
    store = Store(str(tmp_path / "root"))
    remote = records(str(tmp_path / "root"), workers=4, timeout=60)
    for w in (0, 1, 2):
        store.agents.claim("train", "a1", w, {"worker": w, "time": 0.0})
    store.agents.write("train", "a1", 2, "exit", {"code": 0, "preempted": False})
    assert remote.observe(remote.list(), 1000.0).workers == (
        "running",
        "running",
        "exit 0",
        "waiting",
    )
    store.agents.write("train", "a1", 0, "heartbeat", {"time": 1.0})
    observed = remote.observe(remote.list(), 1040.0)  # worker 1 silent for 40 s of 60
    assert observed.workers == ("running", "late", "exit 0", "waiting")
    assert observed.phase == AttemptPhase.RUNNING and observed.reason == "2 of 4 workers running"
    observed = remote.observe(remote.list(), 1061.0)
    assert observed.workers[1] == "lost" and observed.phase == AttemptPhase.LOST
    assert observed.reason == "worker 1 stopped heartbeating (silent for 61s)"


def test_a_quiet_running_attempt_costs_no_reads(tmp_path):
    """Heartbeats are seen in the listing, not read; output is read only after its progress
    record changed, and each chunk once, by name."""
    store = Store(str(tmp_path / "root"))
    agent = Agent(store, "train", "a1", 0, 1, "true", spool_dir=str(tmp_path))
    store.agents.claim("train", "a1", 0, {"worker": 0, "time": 0.0})
    Path(agent.spool).write_bytes(b"hello\n")
    agent.flush(time.time() + 10)
    remote = RemoteRecords(store, "train", "a1", 1, 30)
    listing = remote.list()
    assert remote.read_output(0, 100, listing=listing) == b"hello\n"
    before = store.ops["read"]
    for beat in range(5):
        agent.heartbeat(time.time() + 10)
        listing = remote.list()
        assert remote.observe(listing, 100.0 + beat).phase == AttemptPhase.RUNNING
        assert remote.read_output(6, 100, listing=listing) == b""
    assert store.ops["read"] == before, "a heartbeat or an unchanged progress record was read"
    with open(agent.spool, "ab") as spool:
        spool.write(b"world\n")
    agent.flush(time.time() + 10)
    listing = remote.list()
    assert remote.read_output(6, 100, listing=listing) == b"world\n"
    assert store.ops["read"] == before + 2  # the new progress record, then the new chunk


def test_a_restarted_reader_resumes_in_the_middle_of_the_output(tmp_path):
    """A daemon restarted mid-attempt asks for output from where its log ends: the sizes of
    the chunks before come from one listing, and only the chunk holding the offset is read."""
    store = Store(str(tmp_path / "root"))
    agent = Agent(store, "train", "a1", 0, 1, "true", spool_dir=str(tmp_path))
    for text in (b"one\n", b"two\n", b"three\n"):
        with open(agent.spool, "ab") as spool:
            spool.write(text)
        agent.flush(time.time() + 10)
    remote = RemoteRecords(store, "train", "a1", 1, 30)
    assert remote.read_output(6, 100) == b"o\nthree\n"
    assert remote.read_output(4, 3) == b"two"


class LosesAnswers(Runs):
    """Writes a chunk, then fails as if the answer was lost: once per chunk."""

    def __init__(self, store: Store) -> None:
        super().__init__(store.bucket, store.agents)
        self.lost: set[int] = set()

    def write_chunk(self, job, attempt, worker, seq, data):
        super().write_chunk(job, attempt, worker, seq, data)
        if seq not in self.lost:
            self.lost.add(seq)
            raise TimeoutError("the answer was lost")


def test_a_chunk_whose_answer_was_lost_is_rewritten_under_the_same_name(tmp_path):
    store = Store(str(tmp_path / "root"))
    store.runs = LosesAnswers(store)
    agent = Agent(store, "train", "a1", 0, 1, "true", spool_dir=str(tmp_path))
    Path(agent.spool).write_bytes(b"one\n")
    agent.flush(time.time() + 10)
    with open(agent.spool, "ab") as spool:
        spool.write(b"two\n")
    agent.flush(time.time() + 10)
    agent.flush(time.time() + 10)  # nothing new: nothing written
    listing = store.runs.list("train", "a1")
    assert sorted(listing) == ["workers/0/log/00000000", "workers/0/log/00000001"]
    assert store.ops["write"] == 6  # each chunk twice, and a progress record after each
    assert store.agents.read("train", "a1", 0, "progress")["chunks"] == 2
    remote = RemoteRecords(store, "train", "a1", 1, 30)
    assert remote.read_output(0, 100) == b"one\ntwo\n"


def test_metadata_stand_in_behaves_like_the_server(metadata):
    import threading
    import urllib.error
    import urllib.request

    def get(path, flavor=True, timeout=5):
        headers = {"Metadata-Flavor": "Google"} if flavor else {}
        url = f"http://{metadata.host}/computeMetadata/v1/{path}"
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=timeout
            ) as r:
                assert r.headers["Metadata-Flavor"] == "Google"
                return r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code

    metadata.attributes["agent-worker-number"] = "3"
    assert get("instance/attributes/agent-worker-number") == "3"
    assert get("instance/attributes/agent-worker-number", flavor=False) == 403
    assert get("instance/attributes/missing") == 404
    assert get("project/project-id") == "bastion-test"
    assert get("instance/preempted") == "FALSE"
    assert get("instance/preempted?wait_for_change=true&timeout_sec=0.2") == "FALSE"
    threading.Timer(0.3, metadata.preempt).start()
    started = time.monotonic()
    assert get("instance/preempted?wait_for_change=true", timeout=10) == "TRUE"
    assert 0.2 < time.monotonic() - started < 5


def _tar_bundle(root: str, tmp_path) -> dict:
    from launch.bundling import bundler_for

    project = tmp_path / "project"
    project.mkdir()
    (project / "settings.txt").write_text("from the bundle\n")
    return bundler_for("tar").bundle(str(project), Store(root), {}).to_json()


def test_the_agent_runs_the_command_inside_its_verified_bundle(root, agents, tmp_path):
    bundle = _tar_bundle(root, tmp_path)
    proc = agents(root, "cat settings.txt", bundle=json.dumps(bundle))
    assert finished(proc) == 0
    remote = records(root)
    assert output(remote) == b"from the bundle\n"
    assert remote.observe(remote.list(), time.time()).phase == AttemptPhase.SUCCEEDED


def test_a_bundle_that_fails_its_digest_never_runs(tmp_path, agents):
    root = str(tmp_path / "root")
    bundle = _tar_bundle(root, tmp_path)
    (path,) = (tmp_path / "root" / "bundles").iterdir()
    path.write_bytes(path.read_bytes() + b"tampered")
    marker = tmp_path / "ran"
    proc = agents(root, f"touch {marker}", bundle=json.dumps(bundle))
    assert finished(proc) == 1
    assert not marker.exists()
    observed = records(root).observe(records(root).list(), time.time())
    assert observed.phase == AttemptPhase.FAILED and "does not match its digest" in observed.reason


def test_multislice_worker_without_a_slice_in_tpu_env_refuses_to_run(tmp_path, agents, metadata):
    """Workers of different slices would take the same numbers: without tpu-env's
    MEGASCALE_SLICE_ID the agent says why and claims nothing."""
    root = str(tmp_path / "root")
    metadata.attributes.update({"agent-worker-number": "1", "tpu-env": "WORKER_ID: '1'\n"})
    proc = agents(root, "echo ran", worker=None, num_workers=4, num_slices=2)
    assert finished(proc) == 2
    out = proc.stdout.read().decode()
    assert "tpu-env gives no MEGASCALE_SLICE_ID" in out
    assert Store(root).agents.list_all() == {}


def test_multislice_worker_numbers_itself_from_its_slice(tmp_path, agents, metadata):
    root = str(tmp_path / "root")
    metadata.attributes.update(
        {
            "agent-worker-number": "1",
            "tpu-env": (
                "MEGASCALE_SLICE_ID: '1'\nMEGASCALE_NUM_SLICES: '2'\nMEGASCALE_PORT: '8080'\n"
            ),
        }
    )
    proc = agents(
        root,
        'echo "$BASTION_WORKER $BASTION_SLICE/$BASTION_NUM_SLICES '
        '$MEGASCALE_SLICE_ID/$MEGASCALE_NUM_SLICES:$MEGASCALE_PORT"',
        worker=None,
        num_workers=4,
        num_slices=2,
    )
    assert finished(proc) == 0
    assert Store(root).runs.read_chunk("train", "a1", 3, 0) == b"3 1/2 1/2:8080\n"

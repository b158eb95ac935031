"""A real daemon on gs:// survives a faulty bucket and a bucket that goes away for a while.

Everything is real: fake-gcs-server (the Go emulator), the daemon and the CLI as subprocesses,
jobs as real processes. Between the daemon and the emulator sits tests/faultproxy.py, which
fails a seeded fraction of the daemon's requests (503s, answers lost after the request took
effect, slow answers); users talk to the emulator directly, as they would to a healthy bucket.

What a job did is recorded outside the bucket: each job appends its name to a marker file when
it starts, so "ran exactly once" is counted on the machine, not taken from the daemon's word.

gcsfs retries a failed request itself, after 1-2 s, then 2-3 s, ... (six tries, about 31 s in
all), so each injected 503 or lost answer costs the daemon a second or two, and a failure only
reaches the daemon's own code once the bucket has been unreachable for ~31 s. Both set the pace
of this file: the faulty run uses ``BASTION_FAULT_JOBS`` jobs (default 5; 30 take about two
minutes on two cores), and the outage lasts until the daemon has reported a failed cycle.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import http.client
import json
import os
import re
import signal
import socket
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import bastion.bucket.counted
from bastion.bucket.logs import daemon_log_name
from bastion.bucket.store import Store
from tests.conftest import BUCKET, fresh_gcs_root
from tests.faultproxy import FaultPlan, FaultProxy
from tests.gcs_emulator import GcsEmulator
from tests.harness import Bastion, gated, ticks_complete, wait_for
from tests.local_server import free_port

N_JOBS = int(os.environ.get("BASTION_FAULT_JOBS", "5"))
FAULTS = FaultPlan(fail_rate=0.2, slow_seconds=0.3, seed=20240601)
OUTPUT_LINES = 3


# -- helpers -----------------------------------------------------------------------------------


@pytest.fixture
def proxy(gcs_emulator: GcsEmulator) -> Iterator[FaultProxy]:
    """A proxy in front of the session emulator, healthy until a test sets a plan."""
    with FaultProxy(gcs_emulator.endpoint, lifetime=300) as p:
        yield p


@pytest.fixture
def rig(proxy: FaultProxy, tmp_path: Path) -> Iterator[Bastion]:
    """A fresh root on the session emulator; the CLI and ``rig.read`` go to it directly.

    Torn down before the proxy, healed first, so the daemons stop (and release) promptly."""
    b = Bastion(tmp_path, root=fresh_gcs_root())
    yield b
    proxy.set_plan(FaultPlan())
    proxy.release()
    b.close()


def via(proxy: FaultProxy) -> dict[str, str]:
    """Environment for a daemon whose every bucket request goes through ``proxy``."""
    return {"STORAGE_EMULATOR_HOST": proxy.endpoint}


def tick_count(log: str) -> int:
    return sum(1 for ln in log.splitlines() if ln.startswith("tick "))


def starts(marker: Path) -> collections.Counter[str]:
    return collections.Counter(marker.read_text().split() if marker.exists() else [])


def lost_and_repeated(log: str, expected: list[str]) -> tuple[list[str], dict[str, int]]:
    """Expected lines (given by their starts) missing from ``log`` or out of order, and those
    that appear more than once."""
    lines = log.splitlines()
    position = 0
    lost = []
    for want in expected:
        found = next((i for i in range(position, len(lines)) if lines[i].startswith(want)), None)
        if found is None:
            lost.append(want)
        else:
            position = found + 1
    counts = {want: sum(ln.startswith(want) for ln in lines) for want in expected}
    return lost, {want: c for want, c in counts.items() if c > 1}


def listing(prefix: str) -> str:
    """A pattern for the proxy: the daemon's listing of ROOT/<prefix>/ (not gcsfs's one-result
    listings that accompany an object lookup)."""
    return rf"^GET /storage/v1/b/[^/]+/o\?\S*prefix=[^&]*/{prefix}/&\S*maxResults=1000"


def parse_every_state(b: Bastion) -> int:
    """Read every state object now in the bucket; each must be whole JSON. Returns the count."""
    seen = 0
    for name in b.listdir("jobs", "states"):
        raw = b.read("jobs", "states", name)
        if raw is None:
            continue  # finalised between the listing and the read
        state = json.loads(raw)  # a half-written or corrupt state raises here
        assert state["status"] in ("PENDING", "ACTIVE", "CLEANING", "COMPLETED"), state
        seen += 1
    return seen


def test_the_proxy_forwards_and_fails_as_told(gcs_emulator: GcsEmulator, proxy: FaultProxy) -> None:
    """The instrument first: a 503 has no effect, a drop has its effect but no answer, a
    resumable upload (whose Location the emulator makes absolute) goes through, all counted."""
    key = f"proxy-check/{uuid.uuid4().hex[:8]}"

    def upload(name: str, data: bytes) -> int:
        request = urllib.request.Request(
            f"{proxy.endpoint}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={key}/{name}",
            data=data,
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status

    def exists(name: str) -> bool:
        url = f"{gcs_emulator.endpoint}/storage/v1/b/{BUCKET}/o/{key.replace('/', '%2F')}%2F{name}"
        try:
            urllib.request.urlopen(url, timeout=10).read()
            return True
        except urllib.error.HTTPError as e:
            assert e.code == 404
            return False

    proxy.fail_next(r"name=\S*/refused", "503")
    with pytest.raises(urllib.error.HTTPError) as refused:
        upload("refused", b"x")
    assert refused.value.code == 503 and not exists("refused")
    proxy.fail_next(r"name=\S*/dropped", "drop")
    with pytest.raises((ConnectionError, http.client.HTTPException, urllib.error.URLError)):
        upload("dropped", b"x")
    assert exists("dropped")  # it took effect; only the answer was lost
    assert upload("plain", b"x") == 200 and exists("plain")

    fs = Store(f"gs://{BUCKET}/{key}", endpoint_url=proxy.endpoint).fs  # gcsfs, as configured
    big = os.urandom(9 << 20)  # more than one chunk: a resumable upload
    with fs.open(f"{BUCKET}/{key}/big", "wb") as f:
        f.write(big)
    assert fs.cat(f"{BUCKET}/{key}/big") == big
    stats = proxy.stats()
    assert stats["faults"] == {"503": 1, "drop": 1}
    # The chunks went to the session URL the emulator returned, and that led through the proxy.
    assert any("upload_id=" in r for r in proxy.recent), list(proxy.recent)
    assert stats["requests"]["POST"] >= 4 and stats["requests"]["GET"] >= 1


# -- a fifth of the daemon's requests fail -------------------------------------------------------


def test_jobs_run_exactly_once_while_a_fifth_of_requests_fail(
    rig: Bastion, proxy: FaultProxy, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    names = [f"faulty-{i:02d}" for i in range(N_JOBS)]
    proxy.set_plan(FAULTS)
    daemon = rig.start("--lease_seconds=600", env=via(proxy))
    command = (
        f"echo $BASTION_JOB_NAME >> {marker}; "
        f"for i in $(seq 1 {OUTPUT_LINES}); do echo $BASTION_JOB_NAME out $i; sleep 0.2; done"
    )
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # users reach the emulator directly
        list(pool.map(lambda n: rig.cli("launch", f"--name={n}", "--", command), names))

    states_checked = 0

    def all_complete() -> bool:
        nonlocal states_checked
        states_checked += parse_every_state(rig)
        assert daemon.poll() is None, f"daemon exited:\n{rig.daemon_output()[-3000:]}"
        return all(rig.exists("jobs", "complete", n) for n in names)

    wait_for(all_complete, timeout=60 + 20 * N_JOBS, interval=0.5, what="every job complete")

    faults = proxy.stats()["faults"]
    assert all(faults.get(kind, 0) > 0 for kind in ("503", "drop", "slow")), faults
    assert daemon.poll() is None
    assert starts(marker) == collections.Counter(names), "each job must start exactly once"
    assert states_checked > 0  # the state files were read (and parsed) while jobs ran
    # A job's complete record is written before its spec and state are deleted: wait for those.
    wait_for(
        lambda: not rig.listdir("jobs", "states") and not rig.listdir("jobs", "active"),
        timeout=60,
        interval=0.5,
        what="every state and spec to be deleted",
    )

    for name in names:
        record = rig.complete(name)
        assert record is not None
        state = record["state"]
        assert (state["outcome"], state["attempt"], state["exit_code"]) == ("SUCCEEDED", 1, 0)
        assert state["reason"] == "command exited with status 0", state["reason"]
        expected = [
            f"=== [bastion] attempt 1 of {name} started",
            *(f"{name} out {i}" for i in range(1, OUTPUT_LINES + 1)),
            "=== [bastion] attempt 1 exited with status 0",
        ]
        log = rig.log(name)
        lost, twice = lost_and_repeated(log, expected)
        assert not lost, f"{name}: lines lost from its log: {lost}\n{log}"
        assert not twice, f"{name}: lines uploaded more than once: {twice}\n{log}"


def test_lost_compose_answer_does_not_duplicate_log_lines(
    rig: Bastion, proxy: FaultProxy, tmp_path: Path
) -> None:
    """The answer to a log append (a GCS compose) is lost after the compose took effect; the
    retry must not append the bytes again. (It did: gcsfs retried the compose and the emulator,
    unlike GCS, ignores ifGenerationMatch on it.)"""
    marker, gate = tmp_path / "started", tmp_path / "gate"
    rig.start("--lease_seconds=600", env=via(proxy))
    rig.cli("launch", "--name=composed", "--", gated(marker, gate))
    # The log exists once its first bytes are uploaded; from then on each sync is a compose.
    wait_for(lambda: "tick 3" in rig.log("composed"), what="first ticks uploaded")
    proxy.fail_next(r"^POST \S*logs(%2F|/)composed/compose", "drop")
    gate.touch()
    record = rig.wait_complete("composed")
    if proxy.pending_targeted():
        pytest.fail("the log was never composed again: the fault was not exercised")
    assert record["state"]["outcome"] == "SUCCEEDED"
    problems = ticks_complete(rig.log("composed"))
    assert not problems, problems


def test_restart_whose_first_listing_fails_does_not_start_a_running_job_again(
    rig: Bastion, proxy: FaultProxy, tmp_path: Path
) -> None:
    """Recovery must complete before a restarted daemon acts (a regression test: it once ran
    only in the first cycle, whether or not that cycle got through)."""
    marker, gate = tmp_path / "started", tmp_path / "gate"
    first = rig.start("--lease_seconds=600", env=via(proxy))
    rig.cli("launch", "--name=adoptee", "--", gated(marker, gate))
    wait_for(lambda: (rig.state("adoptee") or {}).get("status") == "ACTIVE", what="ACTIVE")
    first.send_signal(signal.SIGKILL)
    first.wait()
    # One listing of the states fails at once (a 403 is not retried by gcsfs; a 503 would be
    # the same after gcsfs's ~31 s of retries): the restarted daemon's first cycle fails.
    proxy.fail_next(listing("jobs/states"), "403")
    second = rig.start("--lease_seconds=600", env=via(proxy))
    wait_for(lambda: proxy.pending_targeted() == 0, what="the listing to fail")
    wait_for(lambda: "recovered in state ACTIVE" in rig.daemon_output(), what="recovery")
    gate.touch()
    record = rig.wait_complete("adoptee")
    assert second.poll() is None
    if not re.search(r"cycle \d+ failed", rig.daemon_output()):
        pytest.fail("the restarted daemon's first cycle did not fail: fault not exercised")
    assert record["state"]["outcome"] == "SUCCEEDED"
    assert starts(marker) == {"adoptee": 1}, "the running job was started a second time"
    problems = ticks_complete(rig.log("adoptee"))
    assert not problems, problems


def test_a_request_that_never_answers_ends_in_a_timeout(
    proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stalled connection (no answer, no reset) must cost one request timeout, not the daemon.

    The store's timeout is shortened for the test (the code path is the real one: the Store
    builds its gcsfs filesystem with it); a listing of the specs is then left unanswered."""
    monkeypatch.setattr(bastion.bucket.counted, "REQUEST_TIMEOUT_SECONDS", 2.0)
    store = Store(fresh_gcs_root(), endpoint_url=proxy.endpoint)
    assert store.specs.submit("waiting", b"{}")
    proxy.fail_next(listing("jobs/active"), "hang")
    result: dict[str, object] = {}

    def list_specs() -> None:
        try:
            result["specs"] = sorted(store.specs.list())
        except Exception as e:
            result["error"] = e

    thread = threading.Thread(target=list_specs, daemon=True)
    thread.start()
    thread.join(30)
    assert proxy.pending_targeted() == 0, "the listing never reached the proxy"
    assert not thread.is_alive(), "a request that never answers blocked the listing for good"
    # gcsfs retries a read timeout but not aiohttp's total timeout: either way the call ended,
    # and a failure says what happened (the daemon's next cycle lists again).
    if "error" in result:
        assert isinstance(result["error"], TimeoutError), result
    else:
        assert result == {"specs": ["waiting"]}, result
    assert sorted(store.specs.list()) == ["waiting"]  # the store is still usable


def test_a_stalled_quota_lookup_ends_in_a_timeout(
    proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bastion.bucket.counted, "REQUEST_TIMEOUT_SECONDS", 2.0)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)  # how the daemon is pointed
    store = Store(fresh_gcs_root())
    proxy.fail_next(r"^GET /storage/v1/b/[^/]+/o/[^?]*project-quotas\.config", "hang")

    def lookup() -> None:
        with contextlib.suppress(TimeoutError):  # ending in a timeout is the point
            store.quota.token(store.quota.default_url())

    thread = threading.Thread(target=lookup, daemon=True)
    thread.start()
    thread.join(6)  # the 2 s timeout, with room to spare
    assert proxy.pending_targeted() == 0, "the lookup never reached the proxy"
    assert not thread.is_alive(), "a quota lookup that never answers blocked for good"


# -- the bucket goes away for a while --------------------------------------------------------------


OUTAGE_REPORTED = re.compile(r"cycle \d+ failed|could not renew the lease|log upload failed")


def test_bucket_outage_keeps_running_jobs_and_catches_up(
    gcs_emulator: GcsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emulator (filesystem backend) is stopped until the daemon reports a failed cycle,
    then started again on the same port and data."""
    data = tmp_path / "gcs-data"
    data.mkdir()
    emulator = GcsEmulator(tmp_path, port=free_port(), root=data).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.endpoint)  # gcsfs reads it per call
    b = Bastion(tmp_path, root="gs://outage-bucket/root")
    marker, gate = tmp_path / "started", tmp_path / "gate"
    try:
        emulator.create_bucket("outage-bucket")
        daemon = b.start()  # the default lease (60 s) and a fast poll
        b.cli("launch", "--name=steady", "--", gated(marker, gate))
        wait_for(lambda: "tick 5" in b.log("steady"), what="ticks in the bucket")
        state = b.state("steady")
        assert state is not None and state["status"] == "ACTIVE"
        pid = state["runner"]["handle"]["pid"]

        emulator.stop()
        wait_for(
            lambda: OUTAGE_REPORTED.search(b.daemon_output()),
            timeout=120,
            interval=0.5,
            what="the daemon to report the outage",
        )
        assert daemon.poll() is None, "the daemon exited during the outage"
        assert psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        emulator.start()  # same port, same data
        uploaded = tick_count(b.log("steady"))
        wait_for(lambda: tick_count(b.log("steady")) > uploaded, timeout=90, what="uploads")
        gate.touch()
        record = b.wait_complete("steady", timeout=90)
        assert daemon.poll() is None
        assert record["state"]["outcome"] == "SUCCEEDED"
        assert record["state"]["attempt"] == 1
        assert starts(marker) == {"steady": 1}
        problems = ticks_complete(b.log("steady"))
        assert not problems, problems
        own_log = daemon_log_name(socket.gethostname(), os.path.abspath(b.work_dir))
        wait_for(
            lambda: OUTAGE_REPORTED.search(b.log(own_log)),
            what="the outage in the daemon's log in the bucket",
        )
    finally:
        b.close()
        emulator.stop()

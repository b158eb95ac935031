"""One daemon acts on a root at a time: the lease, with real daemons on a directory and on gs://.

Two daemons share a root but not a work directory (as two machines would). The job in each test
records its start in a marker file and prints numbered ticks until the test opens its gate, so a
job is running, deterministically, whenever a test needs it to be, and "started once" and "no
line lost" are checked on the machine and in the bucket, not taken from the daemon's word.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from launch.api import Client, new_jobspec
from tests.harness import (
    Bastion,
    NamespacedDaemon,
    gated,
    lease_names,
    ticks_complete,
    unshare_refused,
    wait_for,
)

SHORT = "--lease_seconds=3"
LONG = "--lease_seconds=60"  # longer than any wait here: a takeover cannot be an expiry
LOST = re.compile(r"acting no more")


def output(b: Bastion, index: int) -> str:
    """What the ``index``-th daemon started by ``b`` printed (its log, via the console)."""
    path = b.tmp / f"daemon-{index}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def lease(b: Bastion) -> dict[str, Any]:
    raw = b.read("lease")
    return json.loads(raw) if raw else {}


def held_by(b: Bastion, work_dir: str) -> bool:
    record = lease(b)
    return record.get("work_dir") == work_dir and not record.get("released")


def acting(b: Bastion) -> str | None:
    """Work dir of the daemon that last started acting (it publishes itself when it does)."""
    raw = b.read("history", "daemon")
    return json.loads(raw).get("work_dir") if raw else None


def job_alive(b: Bastion, name: str) -> bool:
    state = b.state(name) or {}
    pid = ((state.get("runner") or {}).get("handle") or {}).get("pid")
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_9(daemon: subprocess.Popen[bytes]) -> None:
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()


def finish(b: Bastion, name: str, marker: Path, gate: Path) -> dict[str, Any]:
    """Open the gate; the job must then complete, once, with its whole log."""
    gate.touch()
    record = b.wait_complete(name, timeout=60)
    state = record["state"]
    assert (state["outcome"], state["attempt"]) == ("SUCCEEDED", 1), state
    assert marker.read_text().split() == [name], "the job was started more than once"
    problems = ticks_complete(b.log(name))
    assert not problems, problems
    return record


def two_daemons(
    b: Bastion, lease_flag: str
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], str]:
    """The first daemon holding the lease, and a second (own work dir) waiting for it."""
    work2 = str(b.tmp / "work2")
    first = b.start(lease_flag)
    wait_for(lambda: held_by(b, b.work_dir), what="the first daemon to take the lease")
    second = b.start(lease_flag, work_dir=work2)
    wait_for(lambda: "holds the lease" in output(b, 1), what="the second one to wait")
    return first, second, work2


def test_second_daemon_waits_then_adopts_after_the_holder_is_killed(bastion, tmp_path):
    marker, gate = tmp_path / "started", tmp_path / "gate"
    work1 = bastion.work_dir
    first, second, work2 = two_daemons(bastion, SHORT)

    bastion.cli("launch", "--name=shared", "--", gated(marker, gate))
    wait_for(lambda: "tick 10" in bastion.log("shared"), what="the job's log in the bucket")
    # Several cycles (and lease renewals) have passed; the waiter has done nothing.
    state = bastion.state("shared")
    assert state["runner"]["handle"]["pid"] and state["runner"]["name"].startswith("bst-")
    assert acting(bastion) == work1
    assert "STARTED" in output(bastion, 0) and "STARTED" not in output(bastion, 1)
    assert "took the lease" not in output(bastion, 1)
    assert held_by(bastion, work1)

    kill_9(first)
    wait_for(lambda: acting(bastion) == work2, timeout=30, what="the second daemon to take over")
    assert "expired (unchanged for" in output(bastion, 1)
    assert job_alive(bastion, "shared"), "the job died with its daemon"
    wait_for(lambda: "recovered in state ACTIVE" in output(bastion, 1), what="adoption")
    finish(bastion, "shared", marker, gate)
    assert "STARTED" not in output(bastion, 1)  # adopted, never started again
    assert second.poll() is None


def test_a_paused_holder_that_lost_its_lease_stops_acting(bastion, tmp_path):
    """The holder is frozen (SIGSTOP) past its lease; on waking its renewal fails, so it stops."""
    marker, gate = tmp_path / "started", tmp_path / "gate"
    first, _, work2 = two_daemons(bastion, SHORT)
    bastion.cli("launch", "--name=paused", "--", gated(marker, gate))
    wait_for(lambda: "tick 5" in bastion.log("paused"), what="the job's log in the bucket")

    first.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: acting(bastion) == work2, timeout=30, what="takeover")
    finally:
        first.send_signal(signal.SIGCONT)
    wait_for(
        lambda: LOST.search(output(bastion, 0)),
        what="the woken holder to notice it lost the lease",
    )
    assert first.poll() is None  # it stops acting, not running: it waits for the lease again
    finish(bastion, "paused", marker, gate)
    assert held_by(bastion, work2)
    assert output(bastion, 0).count("took the lease") == 1  # never again after losing it


def test_sigterm_releases_the_lease_for_an_immediate_takeover(bastion, tmp_path):
    marker, gate = tmp_path / "started", tmp_path / "gate"
    first, _, work2 = two_daemons(bastion, LONG)
    bastion.cli("launch", "--name=handover", "--", gated(marker, gate))
    wait_for(lambda: marker.exists(), what="the job to start")

    first.send_signal(signal.SIGTERM)
    assert first.wait(20) == 0
    wait_for(lambda: acting(bastion) == work2, timeout=30, what="the second daemon to take over")
    assert "was released" in output(bastion, 1)
    assert "expired" not in output(bastion, 1)
    assert job_alive(bastion, "handover"), "a graceful stop must leave running jobs running"
    finish(bastion, "handover", marker, gate)


def test_restart_on_the_same_host_and_work_dir_takes_over_at_once(bastion, tmp_path):
    marker, gate = tmp_path / "started", tmp_path / "gate"
    first = bastion.start(LONG)
    bastion.cli("launch", "--name=restarted", "--", gated(marker, gate))
    wait_for(lambda: "tick 3" in bastion.log("restarted"), what="the job's log in the bucket")
    kill_9(first)
    assert not lease(bastion).get("released")  # a killed daemon cannot release its lease
    bastion.start(LONG)  # same work dir: it holds the flock, so its predecessor is dead
    wait_for(
        lambda: "recovered in state ACTIVE" in output(bastion, 1),
        timeout=30,
        what="the restarted daemon to adopt the job",
    )
    assert "expired" not in output(bastion, 1)
    assert "took the lease" in output(bastion, 1)
    finish(bastion, "restarted", marker, gate)


def flock_job(side: Path, seconds: float) -> str:
    """A job that records its start (and the PID namespace it runs in), then holds a lock of its
    own (``flock -n`` on a side file named after it) while it runs: a second copy running at the
    same time finds the lock held and records a violation."""
    return (
        f'echo "$BASTION_JOB_NAME $(stat -L -c %i /proc/self/ns/pid)" >> {side}/starts; '
        f'flock -n -E 75 {side}/"$BASTION_JOB_NAME".lock sleep {seconds:g}; '
        f'[ $? -ne 75 ] || echo "$BASTION_JOB_NAME" >> {side}/violations'
    )


def test_daemons_in_two_pid_namespaces_on_one_host_never_run_a_job_twice(bastion, tmp_path):
    """Two containers on one host (host networking): each daemon in its own PID namespace, with
    the same host name, boot id and default paths, each path its own directory behind it. The
    holder's pid proves nothing in the other namespace, so the other never takes a live lease
    at once: it waits a whole term. Then the holder is killed with -9 (its container ends, its
    jobs with it), twice, so the roles swap and swap back; no job ever runs twice."""
    refused = unshare_refused()
    if refused:
        pytest.skip(refused)
    side = tmp_path / "side"
    side.mkdir()
    (side / "starts").touch()
    (side / "violations").touch()
    shared = tmp_path / "container"  # the path each daemon sees, its own directory behind it
    shared.mkdir()
    env = {"XDG_STATE_HOME": str(shared / "state")}

    where: dict[int, int] = {}  # daemon pid -> which container (private directory) it is in

    def container(index: int) -> NamespacedDaemon:
        own = tmp_path / f"container-{index}"
        own.mkdir(exist_ok=True)
        daemon = bastion.start_namespaced(
            "--lease_seconds=2", work_dir=str(shared / "work"), env=env, private=(own, shared)
        )
        where[daemon.pid] = index
        return daemon

    def out(daemon: NamespacedDaemon) -> str:
        return output(bastion, bastion.daemons.index(daemon))

    def submit(prefix: str, count: int, seconds: float) -> list[str]:
        batch = [f"{prefix}{i}" for i in range(count)]
        client = Client(bastion.root)
        for name in batch:
            client.submit(
                new_jobspec(
                    name=name,
                    command=flock_job(side, seconds),
                    user_id="tester",
                    project_id="default",
                )
            )
        return batch

    def starts() -> list[tuple[str, int]]:
        lines = (side / "starts").read_text().splitlines()
        return [(name, int(ns)) for name, ns in (line.split() for line in lines)]

    killed: set[int] = set()  # the PID namespaces whose daemon was killed, and all in them

    def swap(live: list[NamespacedDaemon]) -> list[NamespacedDaemon]:
        """Kill the holder's container; the other takes over after a whole term; the killed
        one comes back (a new namespace, its own directory again) and waits in turn."""
        record = lease(bastion)
        old = next((d for d in live if lease_names(record, d)), None)
        assert old is not None, f"the lease {record} names none of the live daemons"
        standby = next(d for d in live if d is not old)
        taken = out(standby).count("took the lease")
        old.kill()
        old.wait()
        killed.add(old.pid_ns)
        wait_for(
            lambda: out(standby).count("took the lease") > taken,
            timeout=30,
            what="the standby to take over",
        )
        back = container(where[old.pid])
        wait_for(lambda: "holds the lease" in out(back), what="the restarted daemon to wait")
        return [standby, back]

    daemons = [container(0)]
    wait_for(lambda: "took the lease" in out(daemons[0]), what="the first daemon's lease")
    daemons.append(container(1))
    wait_for(
        lambda: re.search("holds the lease|took the lease", out(daemons[1])),
        what="the second daemon to see the lease",
    )
    names = submit("a", 8, 1.5)
    for name in names:
        bastion.wait_complete(name, timeout=60)
    violations = (side / "violations").read_text().split()
    assert not violations, f"jobs ran twice at the same time: {violations}"
    assert "took the lease" not in out(daemons[1]), "a live lease was taken across namespaces"

    for prefix in ("b", "c"):  # the roles swap, then swap back
        names += submit(prefix, 6, 1.0)
        wait_for(
            lambda p=prefix: sum(n.startswith(p) for n, _ in starts()) >= 2,
            timeout=60,
            what="the batch to start",
        )
        daemons = swap(daemons)
    for name in names:
        bastion.wait_complete(name, timeout=60)

    takeovers = re.findall(r"took the lease on \S+ \(term \d+\): (.*)", bastion.daemon_output())
    assert len(takeovers) == 3, takeovers
    assert all(why.startswith("lease of") and "expired" in why for why in takeovers[1:]), (
        f"a takeover across PID namespaces did not wait the lease term: {takeovers}"
    )
    violations = (side / "violations").read_text().split()
    assert not violations, f"jobs ran twice at the same time: {violations}"
    # A job may start again only when its earlier copy died with its container (the successor
    # cannot see into another namespace, and a start it cannot confirm is started again).
    seen = starts()
    again = {
        name: [ns for n, ns in seen if n == name]
        for name in {n for n, _ in seen}
        if len([n for n, _ in seen if n == name]) > 1
    }
    live_twice = {n: nss for n, nss in again.items() if not set(nss[:-1]) <= killed}
    assert not live_twice, f"jobs started again while their first copy could live: {live_twice}"
    assert sorted({n for n, _ in seen}) == sorted(names), "a job never started"
    outcomes = {n: (bastion.complete(n) or {})["state"]["outcome"] for n in names}
    assert all(outcomes[n] == "SUCCEEDED" for n in names if n.startswith("a")), outcomes

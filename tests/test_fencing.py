"""No job ever runs twice, whatever happens to the daemons: fencing under kill -9 and SIGSTOP.

Two real daemons share a root (each with its own work directory, as two installations would).
A chaos loop freezes the lease holder for longer than the lease (SIGSTOP), or kills either
daemon with -9 and starts it again, at random moments, while jobs are submitted and run. Each
job records its start and end with timestamps in a side file, so "never two attempts alive at
once" and "every job completes exactly once" are checked on the machine, not taken from the
daemons' word.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bastion.bucket.store import Store
from bastion.lease import Lease, process_identity, provably_gone
from launch.api import Client, new_jobspec
from tests.conftest import fresh_gcs_root
from tests.faultproxy import FaultPlan, FaultProxy
from tests.harness import (
    REPO,
    Bastion,
    NamespacedDaemon,
    PidNamespace,
    lease_names,
    unshare_refused,
    wait_for,
)

LEASE = 2.0
# kill -9s and SIGSTOPs per run: 25 in each variant (100 per suite run); a soak run sets
# more, and BASTION_CHAOS_SEED another draw.
EVENTS = int(os.environ.get("BASTION_CHAOS_EVENTS", "25"))
BURST = 150  # jobs submitted at once, frozen in the middle of being started


Daemon = subprocess.Popen[bytes] | NamespacedDaemon


def _holder(b: Bastion, daemons: list[Daemon]) -> Daemon:
    """The daemon process the lease names (by its pid in its own PID namespace)."""
    record = json.loads(b.read("lease") or b"{}")
    return next((d for d in daemons if lease_names(record, d)), daemons[0])


def _job_command(side: Path, seconds: float) -> str:
    return (
        f'echo "start $BASTION_JOB_NAME $(date +%s.%N)" >> {side}; sleep {seconds:.2f}; '
        f'echo "end $BASTION_JOB_NAME $(date +%s.%N)" >> {side}'
    )


def _intervals(side: Path) -> dict[str, list[tuple[str, float]]]:
    seen: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for line in side.read_text().splitlines():
        what, name, stamp = line.split()
        seen[name].append((what, float(stamp)))
    return seen


# Which root under which daemons. Each kind of root, and each way of placing the daemons, is
# in the suite's run; the whole product of the two (two more gcs runs, 7.5 minutes of CI) only
# where BASTION_CHAOS_MATRIX=full, as in a soak run.
VARIANTS = [
    ("local", False),
    ("local", True),
    ("gcs", False),
    ("gcs-faults", True),
]
if os.environ.get("BASTION_CHAOS_MATRIX") == "full":
    VARIANTS += [("gcs", True), ("gcs-faults", False)]


def _variant_id(variant: tuple[str, bool]) -> str:
    kind, namespaced = variant
    return f"{kind}-{'own-pid-namespace' if namespaced else 'one-namespace'}"


@pytest.fixture
def chaos_root(request, tmp_path) -> Iterator[tuple[Bastion, dict[str, str]]]:
    """A root, and the environment of its daemons: a local directory; gs:// on the emulator;
    gs:// with every daemon request through a proxy that fails 10% of them (503s, dropped
    connections, lost answers)."""
    if request.param == "local":
        b = Bastion(tmp_path)
        yield b, {}
        b.close()
        return
    emulator = request.getfixturevalue("gcs_emulator")
    b = Bastion(tmp_path, root=fresh_gcs_root())
    if request.param == "gcs":
        yield b, {}
        b.close()
        return
    plan = FaultPlan(fail_rate=0.1, weights=(("503", 1.0), ("drop", 1.0)), seed=3)
    with FaultProxy(emulator.endpoint, plan, lifetime=900) as proxy:
        yield b, {"STORAGE_EMULATOR_HOST": proxy.endpoint}
        proxy.set_plan(FaultPlan())
        b.close()


@pytest.mark.parametrize(
    ("chaos_root", "namespaced"), VARIANTS, indirect=["chaos_root"], ids=map(_variant_id, VARIANTS)
)
def test_kill_9_and_sigstop_chaos_never_runs_a_job_twice(chaos_root, tmp_path: Path, namespaced):
    """With ``namespaced``, the first daemon runs in a PID namespace of its own (a container on
    this host, whose supervisor restarts it there after a kill -9; its jobs live on)."""
    bastion, env = chaos_root
    # A burst of 150 job starts on two cores starves the CLI: its probe's 8 s bound is for an
    # unreachable bucket, which this test does not exercise.
    bastion.env["BASTION_PROBE_SECONDS"] = "60"
    rng = random.Random(int(os.environ.get("BASTION_CHAOS_SEED", "7")))
    side = tmp_path / "side"
    side.touch()
    flags = (f"--lease_seconds={LEASE:g}",)
    work = [str(tmp_path / "work-a"), str(tmp_path / "work-b")]
    namespace = None
    if namespaced:
        refused = unshare_refused()
        if refused:
            pytest.skip(refused)
        namespace = PidNamespace()

    def start(which: int) -> Daemon:
        if which == 0 and namespace is not None:
            return bastion.start_namespaced(*flags, work_dir=work[0], env=env, namespace=namespace)
        return bastion.start(*flags, work_dir=work[which], env=env)

    try:
        _chaos(bastion, side, rng, start, namespaced)
    finally:
        bastion.close()  # the daemons first, then the namespace and what is left in it
        if namespace is not None:
            namespace.close()


def _chaos(
    bastion: Bastion,
    side: Path,
    rng: random.Random,
    start: Callable[[int], Daemon],
    namespaced: bool,
) -> None:
    daemons = [start(0), start(1)]
    names: list[str] = []
    counts = {"sigstop": 0, "kill9": 0}

    def submit(count: int) -> None:
        for _ in range(count):
            name = f"j{len(names):03d}"
            names.append(name)
            # (on two cores busy with a burst's ending jobs and two daemons, a launch on gs://
            # once took over the CLI's default 60 s: liveness, not what this test checks)
            command = _job_command(side, rng.uniform(0.3, 3))
            bastion.cli("launch", f"--name={name}", "--", command, timeout=180)

    # A burst: the holder is frozen in the middle of starting it (the cycle that starts a
    # burst is the longest one, so it is where a stalled holder would act after a takeover).
    burst = [f"b{i:03d}" for i in range(BURST)]
    client = Client(bastion.root)
    for name in burst:
        client.submit(
            new_jobspec(
                name=name,
                command=_job_command(side, rng.uniform(2, 4)),
                user_id="tester",
                project_id="default",
            )
        )
    names.extend(burst)
    # Liveness under a 2 s lease, not safety: with 10% of requests failing, the burst's first
    # cycle (150 intakes and state writes) outlasts the lease, so the holder lets go and the
    # other daemon recovers and tries; on a busy machine that went on for over 60 s in CI.
    submitted = time.monotonic()
    try:
        wait_for(lambda: "start" in side.read_text(), timeout=240, what="the burst to start")
    except AssertionError as e:
        raise AssertionError(f"{e}\ndaemon output:\n{bastion.daemon_output()[-6000:]}") from None
    print(f"chaos: the burst started {time.monotonic() - submitted:.1f}s after its submission")
    holder = _holder(bastion, daemons)
    holder.send_signal(signal.SIGSTOP)
    time.sleep(LEASE + 1.5)
    holder.send_signal(signal.SIGCONT)
    counts["sigstop"] += 1

    for event in range(EVENTS - 1):
        which = rng.randrange(2)
        if rng.random() < 0.5:
            daemons[which].send_signal(signal.SIGSTOP)
            time.sleep(LEASE + rng.uniform(0.3, 1.5))
            daemons[which].send_signal(signal.SIGCONT)
            counts["sigstop"] += 1
        else:
            time.sleep(rng.uniform(0, 1.0))
            daemons[which].send_signal(signal.SIGKILL)
            daemons[which].wait()
            daemons[which] = start(which)
            counts["kill9"] += 1
        if event % 5 == 0:
            submit(2)

    lost = []
    outcomes: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            record = bastion.wait_complete(name, timeout=5 if lost else 180)
        except AssertionError:
            lost.append(name)
            continue
        outcomes[name] = record["state"]
    seen = _intervals(side)
    twice = {n: s for n, s in seen.items() if [w for w, _ in s].count("start") != 1}
    not_ok = {n: o for n, o in outcomes.items() if o["outcome"] != "SUCCEEDED"}
    # The local runner once knew an attempt only by its pid, which means nothing in another PID
    # namespace, so a successor there judged a job that ran to its end (its "end" line is in
    # the side file) "killed before it could report its status" (up to 19 a run). Its wrapper
    # now holds a liveness lock seen from every namespace, and both namespaced variants showed
    # none in this change's runs; the allowance (printed) stays until CI has shown the same.
    misjudged = {
        n
        for n, o in not_ok.items()
        if namespaced
        and "killed before it could report" in o.get("reason", "")
        and "end" in dict(seen.get(n, []))
    }
    print(
        f"chaos: {counts}, {len(names)} jobs, {len(twice)} started more than once, "
        f"{len(lost)} lost, {len(not_ok)} not SUCCEEDED ({len(misjudged)} of them ran to their "
        "end but were judged across PID namespaces)"
    )
    not_ok = {n: o for n, o in not_ok.items() if n not in misjudged}
    assert not lost, f"jobs never completed: {lost}"
    assert not twice, f"jobs started more than once: {twice}"
    assert not not_ok, f"jobs that did not succeed: {not_ok}"
    for name in names:
        events = dict(seen[name])
        assert set(events) == {"start", "end"} and events["start"] <= events["end"], name


def test_a_frozen_holder_of_a_conditional_write_lock_does_not_block_the_standby(tmp_path):
    """A local root's conditional writes take ROOT/.../.lock; a holder frozen while holding it
    (SIGSTOP) must not block everyone else forever: the write fails and is retried."""
    root = tmp_path / "root"
    objects = Store(str(root)).objects
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(root / '.lock')!r}, os.O_WRONLY | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        holder.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(OSError, match="held for over"):
            objects.write_if(str(root / "lease"), b"{}", None)
        assert time.monotonic() - started < 30
    finally:
        holder.kill()
        holder.wait()
    assert objects.write_if(str(root / "lease"), b"{}", None)  # free again: it works


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_holder_stops_acting_strictly_before_a_standby_may_take_over(tmp_path):
    """The lease module's argument, replayed with explicit clocks: after the holder's last
    successful renewal, the standby can take over only once the holder's own validity ended."""
    store = Store(str(tmp_path / "root"))
    holder_clock, standby_clock = _Clock(), _Clock()
    holder = Lease(store, {"owner": "holder"}, duration=10, clock=holder_clock)
    standby = Lease(store, {"owner": "standby"}, duration=10, clock=standby_clock)
    assert holder._try_acquire(holder_clock())
    assert holder.renew()  # the last renewal; then the holder freezes
    last_renewal = holder_clock.now
    # The standby first sees the new token some time after the write completed.
    standby_clock.now += 0.5
    assert not standby._try_acquire(standby_clock())
    took_over_at = None
    for _ in range(200):
        holder_clock.now += 0.1
        standby_clock.now += 0.1
        if took_over_at is None and standby._try_acquire(standby_clock()):
            took_over_at = holder_clock.now
        if took_over_at is not None:
            assert not holder.valid(), "holder still believes it holds the lease"
    assert took_over_at is not None and took_over_at >= last_renewal + 10
    assert not holder.renew()  # on waking, its renewal fails: the precondition names it stale


def test_a_clone_with_the_same_host_and_work_dir_waits_for_the_lease(tmp_path):
    """Identity is per process: a daemon with the same host name and work directory but
    another boot (a VM cloned from the holder's image) never takes a live lease at once."""
    store = Store(str(tmp_path / "root"))
    clock = _Clock()
    me = {**process_identity("/w"), "owner": "vm:1:a"}
    clone = {**me, "owner": "vm:1:b", "boot_id": "boot-2"}
    holder = Lease(store, me, duration=10, clock=clock)
    assert holder._try_acquire(clock())
    other = Lease(store, clone, duration=10, clock=clock)
    assert not other._try_acquire(clock())
    # The same boot, PID namespace and work dir, and the recorded pid no longer alive with its
    # start time: a restart of this installation, which may take over at once.
    dead = subprocess.Popen(["true"])
    dead.wait()
    restarted = {**me, "owner": "vm:2:c"}
    store.lease.write({**me, "pid": dead.pid, "renewed": 0, "duration": 10}, holder.token)
    again = Lease(store, restarted, duration=10, clock=clock)
    assert again._try_acquire(clock())


def test_an_old_lease_that_names_no_pid_namespace_is_never_taken_early(tmp_path):
    """A lease written before the PID namespace was recorded, by this host and boot and for this
    work dir, whose pid is not alive here: it may come from a container (its own PID namespace)
    whose daemon lives on, so it is taken only after a whole unchanged term."""
    store = Store(str(tmp_path / "root"))
    clock = _Clock()
    me = process_identity("/w")
    dead = subprocess.Popen(["true"])
    dead.wait()
    old = {k: me[k] for k in ("host", "boot_id", "work_dir")}
    old.update(owner=f"{me['host']}:{dead.pid}:old", pid=dead.pid, pid_started=0.0)
    store.lease.write({**old, "renewed": 0, "duration": 10, "term": 1}, None)
    standby = Lease(store, {**me, "owner": "new"}, duration=10, clock=clock)
    assert not standby._try_acquire(clock()), "an old-format lease was taken at once"
    clock.now += 9.9
    assert not standby._try_acquire(clock())
    clock.now += 0.2
    assert standby._try_acquire(clock())  # a whole term unchanged: expired


def test_a_holder_alive_in_its_pid_namespace_is_not_gone_from_another(tmp_path):
    """A daemon in another PID namespace (a container on this host: same host name, boot id and
    paths) records a pid that names nothing, or something else, in ours: never proof."""
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"]).returncode:
        pytest.skip("unshare --pid is refused here (needs root or user namespaces)")
    out = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-c",
            "import json; from bastion.lease import process_identity; "
            "print(json.dumps(process_identity('/w')))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    inside = json.loads(out.stdout)
    me = process_identity("/w")
    assert inside["pid"] == 1 and inside["pid_ns"] != me["pid_ns"]
    assert inside["pid_start_ticks"] and inside["boot_id"] == me["boot_id"]
    assert not provably_gone(inside, me)  # pid 1 here is alive with another start time
    assert not provably_gone({**inside, "pid": 2**22 + 7}, me)  # a pid absent from ours
    assert provably_gone({**me, "pid": 2**22 + 7}, me)  # the same namespace: absent is gone
    # The same pid alive with its recorded start time is the holder itself, alive.
    assert not provably_gone(me, {**me, "owner": "other"})
    assert provably_gone({**me, "pid_start_ticks": me["pid_start_ticks"] - 1}, me)

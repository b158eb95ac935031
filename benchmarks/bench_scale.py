"""A hundred thousand jobs on one daemon (issue 26): every row of the issue's table, measured.

The real daemon (``build_daemon``, lease included) runs in this process; its bucket is either a
local directory whose every request first waits ``--latency`` (20 ms) and is counted
(``LatencyBucket``, benchmarks/bench_bucket.py: the GCS model the other benchmarks use, on a
tmpfs), or with ``--gcs`` fake-gcs-server (tests/gcs_emulator.py) behind tests/faultproxy.py
adding ``--latency`` per request and counting them. Users write straight to the bucket (no
added latency), from 32 threads, through ``launch.api.Client`` (spec, then submission marker).
The N jobs run on the fake runner (they stay PENDING but for ``--running`` of them); the burst
and the probes run real processes on the local runner.

Per repeat, on a fresh root, in this order:

1. N specs written at once (``--jobs``), the daemon cycling every ``--poll`` s meanwhile:
   seconds from the first write until all N are known and PENDING (or admitted), and the
   longest cycle; the consumed submission markers' deletes (``SpecWatch.delete``, timed and
   counted: seconds in all, requests, and cycles whose listing still showed used-up markers).
2. first cycle after a restart (the daemon closed, a new one built on the root): seconds and
   bucket requests.
3. daemon CPU while nothing changes: cycles at ``--poll`` for ``--idle_seconds`` (60), CPU of
   this process (``time.process_time``: every thread) over the wall time.
4. policy pass when one job changes: one PENDING job is cancelled; the ``schedule`` phase of
   the cycle that takes the cancel in.
5. a burst of ``--burst`` (1,000) ``true`` jobs on the local runner, the daemon looping at
   ``--poll``: from the first write until the runner's start returned for every one (its
   process runs), and until every start was decided (an attempt recorded), which comes first.
6. submit → running: ``--probes`` single jobs at random moments of a ``--poll`` loop, from
   before the spec is written until the command runs (it writes the time); the median.
7. ``bastion list --json`` and ``bastion why`` (the CLI, in a subprocess whose store gets the
   same latency) at the root's job count.
8. memory per job: the daemon is rebuilt with tracemalloc on (no latency: memory does not depend
   on it) and takes the root in; Python memory it holds over the jobs it holds.
9. with ``--rows array`` only (it adds N jobs to the root): N more jobs as arrays of at most
   10,000 (``Client.launch(array=...)`` from another process, one after another: a sweep's
   path, specs then markers a thousand per call), the daemon cycling: from the first write
   until all are PENDING, the ``launch`` calls' own time, and the longest cycle.

    .venv/bin/python benchmarks/bench_scale.py [--jobs 10000] [--repeat 3] [--gcs]
        [--latency 0.02] [--poll 3] [--idle_seconds 60] [--burst 1000] [--probes 10]
        [--rows intake restart idle policy burst probes cli memory array]

Nothing is written directly: every state comes from the daemon's own intake (at 100,000 jobs
allow tens of minutes on a small machine).

Measured (2-core VM, nothing else running, one repeat each; local root, 20 ms): 10,000 jobs
(adcfbc4's parents): restart 3.4-3.5 s and 120 requests; idle 3.0-3.1% of a core; policy pass
0.12-0.15 s; 2.96 KB per job; all PENDING 36.5-40.3 s (the users' writes alone 14-18 s); burst
2.4-2.8 s; list 2.6-2.9 s, why 2.2-2.7 s. 100,000 jobs (adcfbc4): restart 22.9 s, 344 requests;
idle 35% of a core; policy pass 1.38 s; 2.95 KB per job; all PENDING 531 s (writes alone 155 s);
markers deleted in 101 calls, 1,001 requests; list 15.8 s, why 12.0 s. 100,000 jobs again
(3bc4aee; the users' writes from another process since ad45a61): restart 11.3 s (02c9c15: 10.4);
idle 5.4% (5.0%); policy pass 0.69 s; 2.95 KB per job; all PENDING 262 s (writes alone 71 s),
longest cycle 6.2 s; markers deleted in 101 calls, 1,001 requests; list 6.4 s, why 6.0 s;
submit -> running 2.4 s; burst 53.8 s in that run (2.6 s at 02c9c15, 2.3 s twice on a root
restarted the same way: not reproduced). 20,000 jobs (ad45a61): all PENDING 30.9 s (writes
alone 10.9 s), longest cycle 1.6 s; burst 2.0 s; submit -> running 1.2 s. 100,000 jobs, two runs
(41c54c0's code; the first before its key-order fix, which cost 0.58 KB a job): restart 9.8 and
10.6 s, 344 requests; idle 4.9-5.6%; policy pass 0.63-0.75 s; 2.98 KB per job; all PENDING
242-245 s (writes alone 65-66 s), longest cycle 5.0-5.7 s; burst 2.5-2.7 s; list 6.9 s, why
6.0 s; submit -> running 1.8 s. Every burst figure so far was until the starts were *decided*
(the row stopped at an attempt number). 100,000 jobs, min-max over 3 (50fc09f): restart 8.8-9.3
s, 344 requests; idle 4.0%; policy pass 0.50-0.56 s; 2.77 KB per job; all PENDING 208-211 s
(writes alone 59-65 s), longest cycle 4.0-4.8 s; markers 11.6-12.9 s; burst decided 2.3-2.4 s,
started 76-81 s (one Python supervisor per local attempt, 0.09-0.12 s of CPU each, on 2 cores);
list 5.2-5.7 s, why 5.2-5.4 s; submit -> running 1.7 s. 10,000 jobs, over 3: restart 1.0 s;
idle 0.5%; policy pass 0.06 s; 2.8 KB per job; all PENDING 15.8-16.2 s; burst decided 1.7-1.8
s, started 75-79 s; list 0.9-1.0 s, why 1.0-1.1 s; submit -> running 1.1 s. 100,000 jobs, over 3
(3a8a200: wrappers forked by the launcher; replans only at thresholds the plan depends on):
restart 8.6-9.0 s, 344 requests; idle 1.0-1.3% (5c37af3, the same hour: 3.4%, a pass every
20 s as each job's reclaim delay ended); policy pass 0.47-0.51 s; 2.77 KB per job; all PENDING
209-226 s (writes alone 60-66 s), longest cycle 4.5-6.0 s; markers 12.2-14.1 s; burst decided
2.2-2.3 s, started 10.0-12.0 s; list 5.5-6.1 s, why 5.1-5.4 s; submit -> running 1.5 s.
100,000 jobs, over 2 (f2e6fc6: the pass reads a job index instead of walking every job; the
waits of rows 1 and 5 read at cycle ends, b0724a0): restart 8.4-8.6 s, 344 requests; idle 1.1%;
policy pass 0.252-0.253 s (9937768, the same hour: 0.495 s); 2.8 KB per job; all PENDING
181.5-183.8 s (205.7), longest cycle 3.8-4.7 s; markers 11.3-12.2 s; burst decided 3.1 s,
started 9.7-10.9 s; list 5.0-5.1 s, why 4.9-5.0 s; submit -> running 1.17-1.31 s (1.39). 10,000
jobs, over 3: restart 1.0-1.1 s; idle 0.4%; policy pass 0.037-0.039 s; all PENDING 14.4-15.2 s;
burst started 9.1-11.1 s; list 0.8 s, why 0.9 s; submit -> running 1.02-1.09 s.
100,000 jobs, over 2 (53277ba: the CLI timed through cli_on_model.py, without this module's
imports; the collector paused and requests overlapped in list and why; an early snapshot after
a settled burst): restart 8.6-8.7 s, 344 requests; idle 1.2%; policy pass 0.289-0.312 s (bb5fe3d,
the same hour, one run: 0.244; the same restart, idle and passes from an aged root, before,
after and without the early snapshot: 0.254-0.266, 0.257-0.281, 0.252-0.275 s); 2.8 KB per
job; all PENDING 189.4-194.3 s (182.8; 184.4 in a later run of 53277ba); markers 12.6-14.5 s;
burst started 9.7-11.6 s; list 3.7 s, why 3.8-3.9 s (5.4, 5.2); submit -> running 1.26-1.27
s (1.31). 10,000 jobs, over 3: restart 1.0-1.1 s; idle 0.4%; policy pass 0.038-0.039 s; all
PENDING 15.4-15.5 s; burst started 9.2-12.7 s; list 0.6-0.7 s, why 0.6-0.7 s; submit ->
running 0.91-1.01 s. 20,000 jobs (a root the daemon took in, its snapshot written; 10 runs of
each side interleaved, cli_on_model.py for both): list 1.15-1.25 -> 0.91-1.00 s, why 1.20-1.30
-> 0.87-0.94 s. The bench at 20,000 jobs, over 3 (458610f): restart 1.8-2.0 s, 144 requests;
idle 0.6%; policy pass 0.060-0.075 s; 2.9 KB per job; all PENDING 29.1-29.9 s; burst started
9.0-12.4 s; list 0.97-1.02 s, why 0.92-0.97 s; submit -> running 1.04-1.08 s.
20,000 jobs, intake only, over 3 (96e9556: a cycle's spec reads and new jobs' state writes in
one call each; 8a49a87 the same hour): all PENDING 35.1-40.5 -> 29.1-30.9 s (the users' writes
alone 15.9-17.9 and 18.7-21.0 s), longest cycle 2.30-3.09 -> 1.53-1.64 s.
20,000 jobs, --rows intake array, over 3 interleaved (b003a6a -> 632001a: the next window's specs
read ahead while a cycle decides and writes): all PENDING 30.0-35.1 -> 22.9-25.1 s (writes alone
20.7-22.8 and 18.6-21.4 s), longest cycle 1.61-2.23 -> 1.39-1.51 s; as arrays 30.4-32.7 ->
22.0-27.0 s (the launch calls 5.7-6.3 and 4.6-6.3 s). 1db2af4 (the full listing's cycle takes
what was read ahead), 3 more: 24.3-27.4 s; arrays 26.4-32.2 s, their longest cycle 1.84-2.65 s.
The burst with the local runner's shared supervisor (the rig on /dev/shm for both trees, this
bench file on d4efead too), --rows burst, 3 interleaved at 1,000 jobs: all started 7.8-8.9 s
(d4efead) -> 5.0-5.2 s (shared) and 7.9-8.5 s (--supervisor forked), every command ran at the
same moments within 0.1 s, every start decided 2.6-2.8 s in all; at 10,000 jobs, 2 each:
9.5-9.7 -> 5.2-5.8 s.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import gc
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # before gcsfs loads

from bastion.bucket.jobs import is_marker  # noqa: E402
from bastion.bucket.store import Store  # noqa: E402
from bastion.daemon import CycleReport, Daemon, snapshot  # noqa: E402
from bastion.daemon.start import build_daemon  # noqa: E402
from bastion.jobstate import Status  # noqa: E402
from bastion.spec_scheduling import MAX_GROUP_SIZE  # noqa: E402
from benchmarks.bench_bucket import (  # noqa: E402
    BUCKET,
    QUOTA,
    LatencyBucket,
    Proxy,
    default_bucket_dir,
)
from benchmarks.bench_churn import kill_attempts, kill_descendants  # noqa: E402
from launch.api import Client, new_jobspec  # noqa: E402
from tests.gcs_emulator import GcsEmulator  # noqa: E402

VISIBLE = (Status.PENDING, Status.ACTIVE)
CLI_ON_MODEL = REPO / "benchmarks" / "cli_on_model.py"  # the CLI alone, on the model


# -- the bucket ----------------------------------------------------------------------------------


@dataclass
class Bucket:
    """Where the roots live, and what counts the daemon's requests there."""

    args: argparse.Namespace
    model_dir: Path
    emulator: GcsEmulator | None = None
    proxy: Proxy | None = None
    latency: LatencyBucket | None = None  # the daemon's, on the model

    def root(self, name: str) -> str:
        return f"gs://{BUCKET}/{name}" if self.emulator else str(self.model_dir / name)

    def users(self, root: str) -> Client:
        """Users write without added latency (straight to the emulator on --gcs)."""
        if self.emulator is None:
            return Client(store=Store(root), expect_daemon=False)
        store = Store(root, endpoint_url=self.emulator.endpoint, token="anon")
        return Client(store=store, expect_daemon=False)

    def requests(self) -> dict[str, int]:
        """The daemon's requests so far, by kind (the proxy's count includes the CLI's)."""
        if self.proxy is not None:
            return dict(self.proxy.stats()["requests"])
        return dict(self.latency.stats()["routes"]) if self.latency else {}

    def cli_env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        if self.proxy is not None:
            env["STORAGE_EMULATOR_HOST"] = self.proxy.endpoint
        return env


@contextlib.contextmanager
def bucket_for(args: argparse.Namespace, tmp: Path) -> Iterator[Bucket]:
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=args.bucket_dir) as model:
        bucket = Bucket(args, Path(model))
        try:
            if args.gcs:
                bucket.emulator = GcsEmulator(tmp)
                bucket.emulator.start()
                bucket.emulator.create_bucket(BUCKET)
                bucket.proxy = Proxy(bucket.emulator.endpoint, args.latency)
                os.environ["STORAGE_EMULATOR_HOST"] = bucket.proxy.endpoint  # the daemon's
            yield bucket
        finally:
            if bucket.proxy is not None:
                bucket.proxy.stop()
            if bucket.emulator is not None:
                bucket.emulator.stop()


def total(requests: dict[str, int]) -> int:
    return sum(requests.values())


def since(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


# -- the daemon ----------------------------------------------------------------------------------


@dataclass
class Rig:
    """One root, its users and the daemon acting on it."""

    bucket: Bucket
    root: str
    work: Path
    users: Client
    daemon: Daemon | None = None
    deletes: list[tuple[int, float]] = field(default_factory=list)  # (markers, seconds)

    @property
    def live(self) -> Daemon:
        assert self.daemon is not None
        return self.daemon


def start_daemon(rig: Rig, latency: bool = True) -> Daemon:
    """A daemon on the rig's root (N jobs on the fake runner, the rest on the local one), its
    bucket behind the latency model, its marker deletes timed."""
    daemon = build_daemon(
        rig.root,
        work_dir=str(rig.work / "work"),
        gpus=[],
        lease_seconds=120,
        settings={
            "runners": {
                "fake": {"state_dir": str(rig.work / "fake")},
                "local": {
                    "attempts_dir": str(rig.work / "attempts"),
                    "supervisor": rig.bucket.args.supervisor,
                },
            }
        },
    )
    if latency and rig.bucket.proxy is None:
        rig.bucket.latency = LatencyBucket(daemon.store.objects, rig.bucket.args.latency)
        daemon.store.bucket.objects = rig.bucket.latency
    watch, delete = daemon.specwatch, daemon.specwatch.delete

    def timed(markers: list[str]) -> None:
        t0 = time.perf_counter()
        delete(markers)
        rig.deletes.append((len(markers), time.perf_counter() - t0))

    watch.delete = timed  # type: ignore[method-assign]
    rig.daemon = daemon
    return daemon


def stop_daemon(rig: Rig) -> None:
    if rig.daemon is not None:
        # The effects in flight first, under the lease, as `bastion start`'s own stop does:
        # close() lets the lease go first, and the starts still queued were refused then.
        rig.daemon.settle()
        rig.daemon.close()
        kill_attempts(rig.daemon)
        rig.daemon = None


def step(daemon: Daemon) -> CycleReport:
    """One pass of the daemon's loop: the lease, then a cycle."""
    assert daemon.lease is None or daemon.lease.hold(), "the daemon lost its lease"
    return daemon.cycle(time.time())


@contextlib.contextmanager
def looping(daemon: Daemon, poll: float) -> Iterator[list[CycleReport]]:
    """The daemon's loop in a thread (a cycle every ``poll`` s); yields its reports so far."""
    reports: list[CycleReport] = []
    stop = threading.Event()

    def loop() -> None:
        try:
            while not stop.is_set():
                started = time.monotonic()
                reports.append(step(daemon))
                daemon.wait_for_work(started + poll)  # as `bastion start` waits: glancing
        except BaseException as e:  # the row waiting on it fails at once, saying why
            LOOP_FAILED.append(e)
            raise

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield reports
    finally:
        stop.set()
        thread.join()


def jobs_now(daemon: Daemon) -> dict[str, Any]:
    """A copy of the daemon's jobs, taken while its loop thread may be changing them."""
    while True:
        with contextlib.suppress(RuntimeError):  # changed size during the copy: again
            return {name: job.state for name, job in list(daemon.jobs.items())}


# Failures of the daemon's loop thread (``looping``): a row waiting on the daemon ends at once.
LOOP_FAILED: list[BaseException] = []


def wait_until(
    check: Callable[[], bool],
    limit: float,
    what: str,
    every: float = 0.05,
    limit_from: Callable[[], float | None] = lambda: 0.0,
) -> float:
    """Seconds until ``check()`` holds (polled ``every`` s); RuntimeError after ``limit``
    counted from ``limit_from()`` s in (None: not yet), or once the daemon's loop failed."""
    t0 = time.monotonic()
    while not check():
        if LOOP_FAILED:
            raise RuntimeError(f"{what}: the daemon's loop failed: {LOOP_FAILED.pop()!r}")
        start = limit_from()
        if start is not None and time.monotonic() - t0 - start > limit:
            raise RuntimeError(f"{what}: not within {limit:g} s")
        time.sleep(every)
    return time.monotonic() - t0


def until_all(
    daemon: Daemon, names: list[str], done: Callable[[Any], bool], cycles: list[CycleReport]
) -> Callable[[], bool]:
    """A check that holds once ``done(state)`` held for each of ``names``, looked at again
    only once another of ``cycles`` (the loop's reports) has ended, since states change only
    in cycles; then only the names not yet done. (A copy of every job every 50 ms took, at
    100,000 jobs, most of the GIL from the loop being measured; a walk of the names left
    every 0.1 s, 29% of it during a 20,000-job intake: py-spy --gil.)"""
    left = set(names)
    jobs = daemon.jobs
    looked = -1

    def check() -> bool:
        nonlocal looked
        if len(cycles) == looked:
            return False
        looked = len(cycles)
        for name in list(left):
            job = jobs.get(name)
            if job is not None and done(job.state):
                left.discard(name)
        return not left

    return check


def specs(prefix: str, count: int, command: str, resource: str, kind: str) -> list[Any]:
    return [
        new_jobspec(
            name=f"{prefix}-{i:06d}",
            command=command,
            user_id="bench",
            project_id="default",
            resources={resource: 1},
            runner={"kind": kind},
        )
        for i in range(count)
    ]


def write_all(
    rig: Rig, prefix: str, count: int, *how: str, mode: str = "--write"
) -> concurrent.futures.Future[Any]:
    """Submit ``count`` specs (``specs(prefix, count, *how)``) from 32 threads of another
    process, as users on their own machines do: writers in this process took the GIL from
    the daemon being measured (a 20,000-spec intake's second cycle took 9.7 s, 14 s of
    writes). Done when that process is. ``mode="--write-array"``: as arrays instead
    (``array_writer``)."""
    endpoint = rig.bucket.emulator.endpoint if rig.bucket.emulator else ""
    argv = [sys.executable, __file__, mode, rig.root, endpoint, prefix, str(count), *how]
    process = subprocess.Popen(argv, env=dict(os.environ, PYTHONPATH=str(REPO)))

    def wait() -> None:
        if process.wait() != 0:
            raise RuntimeError(f"the writer process exited with {process.returncode}")

    runner = concurrent.futures.ThreadPoolExecutor(1)
    done = runner.submit(wait)
    runner.shutdown(wait=False)  # the wait goes on; the runner ends with it
    return done


def writer(root: str, endpoint: str, prefix: str, count: str, *how: str) -> None:
    """The users' process (``--write``): specs written straight to the bucket."""
    store = Store(root, endpoint_url=endpoint, token="anon") if endpoint else Store(root)
    users = Client(store=store, expect_daemon=False)
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        list(pool.map(users.submit, specs(prefix, int(count), *how)))


def array_writer(root: str, endpoint: str, prefix: str, count: str, *how: str) -> None:
    """The users' process (``--write-array``): ``count`` jobs as arrays of at most
    MAX_GROUP_SIZE, one ``bastion launch --array`` after another (``Client.launch``)."""
    command, resource, kind = how
    store = Store(root, endpoint_url=endpoint, token="anon") if endpoint else Store(root)
    users = Client(store=store, expect_daemon=False)
    for group, size in array_sizes(prefix, int(count)):
        users.launch(
            group,
            command,
            user_id="bench",
            project_id="default",
            array=f"0-{size - 1}",
            resources={resource: 1},
            runner={"kind": kind},
        )


def array_sizes(prefix: str, count: int) -> list[tuple[str, int]]:
    """The arrays ``array_writer`` submits: (group name, members)."""
    starts = range(0, count, MAX_GROUP_SIZE)
    return [(f"{prefix}{k}", min(MAX_GROUP_SIZE, count - s)) for k, s in enumerate(starts)]


# -- rows ----------------------------------------------------------------------------------------


def row_intake(rig: Rig, n: int, poll: float) -> dict[str, float]:
    """N specs written at once while the daemon cycles: all visible, the longest cycle, and
    the used-up markers' deletes."""
    daemon = rig.live
    before = rig.bucket.requests()
    batch = specs("job", n, "sleep 3600", "cpu", "fake")
    with looping(daemon, poll) as reports:
        t0 = time.monotonic()
        writing = write_all(rig, "job", n, "sleep 3600", "cpu", "fake")
        written: list[float] = []
        writing.add_done_callback(lambda _: written.append(time.monotonic() - t0))

        names = [s.name for s in batch]
        visible = until_all(daemon, names, lambda s: s.status in VISIBLE, reports)
        # (the limit counts from the users' last write: on the GCS emulator, whose writes
        # slow down as its bucket fills, 10,000 jobs' writes alone take minutes)
        seconds = wait_until(
            visible,
            60 + n / 50,
            "intake after the users' writes",
            every=0.01,  # (a look at the states once per cycle: see until_all)
            limit_from=lambda: written[0] if written else None,
        )
        writing.result()
        wait_until(lambda: not markers_left(rig), 120, "marker deletes")
        cycles = list(reports)
    print_cycles(cycles)
    requests = since(before, rig.bucket.requests())
    return {
        "intake_s": seconds,
        "intake_writes_s": written[0],
        "intake_longest_cycle_s": max(r.seconds for r in cycles),
        "intake_cycles": len(cycles),
        "markers_delete_s": sum(s for _, s in rig.deletes),
        "markers_delete_calls": len(rig.deletes),
        # LatencyBucket counts a batch request per 100 paths; the proxy counts each DELETE
        "markers_delete_requests": requests.get("delete_many", 0) + requests.get("DELETE", 0),
        "markers_deleted": sum(m for m, _ in rig.deletes),
    }


def row_array(rig: Rig, n: int, poll: float) -> dict[str, float]:
    """N more jobs as arrays (``array_writer``: a sweep's path, a thousand members' specs per
    call, then their markers) while the daemon cycles: all PENDING, from the first write."""
    daemon = rig.live
    names = [f"{group}-{i}" for group, size in array_sizes("arr", n) for i in range(size)]
    with looping(daemon, poll) as reports:
        t0 = time.monotonic()
        writing = write_all(rig, "arr", n, "sleep 3600", "cpu", "fake", mode="--write-array")
        written: list[float] = []
        writing.add_done_callback(lambda _: written.append(time.monotonic() - t0))
        visible = until_all(daemon, names, lambda s: s.status in VISIBLE, reports)
        seconds = wait_until(
            visible,
            60 + n / 50,
            "array intake after the users' writes",
            every=0.01,
            limit_from=lambda: written[0] if written else None,
        )
        writing.result()
        cycles = list(reports)
    print_cycles(cycles)
    return {
        "array_s": seconds,
        "array_writes_s": written[0],
        "array_longest_cycle_s": max(r.seconds for r in cycles),
    }


def markers_left(rig: Rig) -> int:
    return sum(1 for entry in rig.users.store.requests.list() if is_marker(entry))


def row_restart(rig: Rig) -> dict[str, float]:
    """The daemon stopped cleanly (its snapshot written, as ``bastion start`` does at a stop)
    and built again: its first cycle reads the snapshot and what changed since."""
    t0 = time.perf_counter()
    before = rig.bucket.requests()
    snapshot.write_now(rig.live.ctx, timeout=600)
    written = {
        "snapshot_s": time.perf_counter() - t0,
        "snapshot_requests": total(since(before, rig.bucket.requests())),
    }
    stop_daemon(rig)
    daemon = start_daemon(rig)
    before = rig.bucket.requests()
    report = step(daemon)
    daemon.settle()
    return {
        "restart_s": report.seconds,
        "restart_requests": total(since(before, rig.bucket.requests())),
        "jobs": len(daemon.jobs),
        **written,
    }


def row_idle(rig: Rig, poll: float, window: float) -> dict[str, float]:
    """CPU share of this process while nothing changes, cycling every ``poll`` s."""
    daemon = rig.live
    for _ in range(2):  # what the restart left to write back
        step(daemon)
        daemon.settle()
    cpu, t0 = time.process_time(), time.monotonic()
    cycles = []
    while time.monotonic() - t0 < window:
        started = time.monotonic()
        cycles.append(step(daemon))
        time.sleep(max(0.0, poll - (time.monotonic() - started)))
    wall = time.monotonic() - t0
    return {
        "idle_cpu_share": (time.process_time() - cpu) / wall,
        "idle_cycle_max_s": max(r.seconds for r in cycles),
    }


def row_policy(rig: Rig) -> dict[str, float]:
    """One PENDING job cancelled: the policy pass of the cycle that takes it in."""
    daemon = rig.live
    pending = sorted(n for n, s in jobs_now(daemon).items() if s.status is Status.PENDING)
    rig.users.cancel(pending[len(pending) // 2], user_id="bench")
    report = step(daemon)
    daemon.settle()
    return {"policy_s": report.phases.get("schedule", 0.0)}


def row_burst(rig: Rig, count: int, poll: float) -> dict[str, float]:
    """``count`` ``true`` jobs on the local runner: first write until every one started, that
    is until the runner's start call returned for each (its process runs); and until the
    daemon had decided every start (its attempt recorded), which comes first: the starts
    themselves run in the effects pool after."""
    daemon = rig.live
    names = [s.name for s in specs("burst", count, "true", "burst", "local")]
    runner = daemon.runners.get("local")
    attempts: list[str] = []
    started = timed_starts(runner, set(names), attempts)
    with looping(daemon, poll) as reports:
        t0 = time.monotonic()
        write_all(rig, "burst", count, "true", "burst", "local").result()

        # (a `true` job is known for a cycle or more once started)
        decided_all = until_all(daemon, names, lambda s: s.attempt >= 1, reports)
        wait_until(decided_all, 300, "burst decided", every=0.01)
        decided = time.monotonic() - t0
        wait_until(lambda: len(started) == count, 300, "burst started")
        wait_until(lambda: all(map(ran, attempts)), 300, "burst ran", every=0.05)
        ran_s = time.monotonic() - t0
    print_cycles(reports)
    if os.environ.get("BENCH_CYCLES"):  # how the starts spread after the first write
        at = sorted(t - t0 for t in started.values())
        print(
            "    starts, s after the first write, by tenths:",
            " ".join(f"{at[min(len(at) - 1, len(at) * q // 10)]:.1f}" for q in range(11)),
        )
    return {
        "burst_s": max(started.values()) - t0,
        "burst_decided_s": decided,
        "burst_ran_s": ran_s,
    }


def ran(directory: str) -> bool:
    """Whether the attempt's command has ended: its ``exit`` is written (or, deleted since,
    its directory is gone)."""
    return os.path.exists(os.path.join(directory, "exit")) or not os.path.isdir(directory)


def timed_starts(runner: Any, jobs: set[str], attempts: list[str]) -> dict[str, float]:
    """When the runner's start returned for each of ``jobs`` (its first attempt), filled in
    as the daemon's effects pool starts them; ``attempts``: their directories."""
    started: dict[str, float] = {}
    start = runner.start

    def timed(attempt: Any) -> Any:
        handle = start(attempt)
        if attempt.job in jobs:
            started.setdefault(attempt.job, time.monotonic())
            attempts.append(os.path.join(runner.attempts_dir, attempt.name))
        return handle

    runner.start = timed
    return started


def print_cycles(reports: list[CycleReport]) -> None:
    """With BENCH_CYCLES set: each cycle's slowest steps, to find where the time went."""
    if os.environ.get("BENCH_CYCLES"):
        for r in reports:
            print(f"    cycle {r.seconds:6.2f}s ops {sum(r.ops.values()):5d}: {r.slowest(4)}")


def row_probes(rig: Rig, count: int, poll: float) -> dict[str, float]:
    """Single jobs at random moments of the loop: submit until the command runs."""
    marks = rig.work / "probes"
    marks.mkdir(exist_ok=True)
    rng = random.Random(7)
    latencies = []
    with looping(rig.live, poll):
        for i in range(count):
            time.sleep(rng.uniform(0, poll))
            mark = marks / f"p{i}"
            command = f"date +%s.%N > {mark}.tmp && mv {mark}.tmp {mark}"
            spec = specs(f"probe{i}", 1, command, "probe", "local")[0]
            submitted = time.time()
            rig.users.submit(spec)
            wait_until(mark.exists, 300, f"probe {i}")
            latencies.append(float(mark.read_text()) - submitted)
    return {"probe_median_s": statistics.median(latencies)}


def row_cli(rig: Rig) -> dict[str, float]:
    """``bastion list --json`` and ``bastion why`` in a subprocess, its store on the model."""
    pending = sorted(n for n, s in jobs_now(rig.live).items() if s.status is Status.PENDING)
    out = {}
    for key, argv in (("list_s", ["list", "--json"]), ("why_s", ["why", pending[-1]])):
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, str(CLI_ON_MODEL), str(rig.bucket.args.latency), *argv],
            env=dict(rig.bucket.cli_env(), BASTION_ROOT=rig.root),
            stdout=subprocess.DEVNULL,
            check=True,
            timeout=600,
        )
        out[key] = time.monotonic() - t0
    return out


def row_memory(rig: Rig) -> dict[str, float]:
    """The daemon rebuilt under tracemalloc takes the root in: Python memory per job."""
    stop_daemon(rig)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        daemon = start_daemon(rig, latency=False)
        step(daemon)
        daemon.settle()
        gc.collect()
        per_job = (tracemalloc.get_traced_memory()[0] - base) / max(1, len(daemon.jobs))
    finally:
        tracemalloc.stop()
    return {"memory_per_job_kb": per_job / 1024}


# -- a repeat, and the table ---------------------------------------------------------------------


def one_repeat(bucket: Bucket, n: int, index: int, tmp: Path) -> dict[str, float]:
    args = bucket.args
    work = tmp / f"r{index}"
    root = bucket.root(f"n{n}-r{index}")
    rig = Rig(bucket, root, work, bucket.users(root))
    rig.users.store.quota.write_default(
        QUOTA.format(running=args.running, burst=args.burst, probes=args.probes)
    )
    out: dict[str, float] = {}
    every: dict[str, Callable[[], dict[str, float]]] = {
        "intake": lambda: row_intake(rig, n, args.poll),
        "restart": lambda: row_restart(rig),
        "idle": lambda: row_idle(rig, args.poll, args.idle_seconds),
        "policy": lambda: row_policy(rig),
        "burst": lambda: row_burst(rig, args.burst, args.poll),
        "probes": lambda: row_probes(rig, args.probes, args.poll),
        "cli": lambda: row_cli(rig),
        "memory": lambda: row_memory(rig),
        "array": lambda: row_array(rig, n, args.poll),
    }
    rows = [every["intake"]] + [every[name] for name in args.rows if name != "intake"]
    try:
        start_daemon(rig)
        step(rig.live)  # an empty root's recovery, before the writes begin
        for row in rows:
            try:
                got = row()
                print(
                    f"  repeat {index + 1}: " + ", ".join(f"{k} {v:,.3f}" for k, v in got.items())
                )
                out.update(got)
            except Exception as e:  # one row's failure (a timeout on a loaded machine)
                print(f"  repeat {index + 1}: a row failed, the next ones go on: {e!r}")
    finally:
        stop_daemon(rig)
        kill_descendants()
    return out


ROW_NAMES = ("intake", "restart", "idle", "policy", "burst", "probes", "cli", "memory", "array")
DEFAULT_ROWS = ROW_NAMES[:-1]  # the array row adds N jobs: asked for alone
ROWS = (  # (label, key, format): the table
    ("first cycle after a restart: seconds", "restart_s", "{:.1f}"),
    ("  requests", "restart_requests", "{:,.0f}"),
    ("snapshot written at the stop before it, s", "snapshot_s", "{:.1f}"),
    ("  requests", "snapshot_requests", "{:,.0f}"),
    ("daemon CPU while idle, share of a core", "idle_cpu_share", "{:.1%}"),
    ("  longest idle cycle, s", "idle_cycle_max_s", "{:.2f}"),
    ("policy pass when one job changed, s", "policy_s", "{:.3f}"),
    ("memory per job (tracemalloc), KB", "memory_per_job_kb", "{:.1f}"),
    ("N specs written at once: all PENDING, s", "intake_s", "{:.1f}"),
    ("  the users' writes alone took, s", "intake_writes_s", "{:.1f}"),
    ("  longest cycle meanwhile, s", "intake_longest_cycle_s", "{:.2f}"),
    ("N more as arrays of 10,000: all PENDING, s", "array_s", "{:.1f}"),
    ("  the `launch --array` calls alone took, s", "array_writes_s", "{:.1f}"),
    ("  longest cycle meanwhile, s", "array_longest_cycle_s", "{:.2f}"),
    ("burst of --burst `true` jobs: all started, s", "burst_s", "{:.1f}"),
    ("  every start decided (attempt recorded), s", "burst_decided_s", "{:.1f}"),
    ("  every command ran (its exit written), s", "burst_ran_s", "{:.1f}"),
    ("used-up markers: deleting them, s", "markers_delete_s", "{:.2f}"),
    ("  delete requests", "markers_delete_requests", "{:,.0f}"),
    ("  delete calls (one per consuming cycle)", "markers_delete_calls", "{:,.0f}"),
    ("`bastion list --json`, s", "list_s", "{:.1f}"),
    ("`bastion why`, s", "why_s", "{:.1f}"),
    ("submit -> running median, s", "probe_median_s", "{:.2f}"),
)


def print_table(n: int, results: list[dict[str, float]], args: argparse.Namespace) -> None:
    where = "GCS emulator" if args.gcs else "local root"
    print(
        f"\n{n:,} jobs ({results[0].get('jobs', n):,.0f} at the restart), {where}, "
        f"{args.latency * 1000:.0f} ms per request, --poll {args.poll:g}; "
        f"min-max over {len(results)}"
    )
    for label, key, fmt in ROWS:
        values = [r[key] for r in results if key in r]
        if values:
            low, high = fmt.format(min(values)), fmt.format(max(values))
            print(f"  {label:<44} {low if low == high else f'{low} - {high}'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[10000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gcs", action="store_true", help="fake-gcs-server behind the proxy")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds per request")
    parser.add_argument("--poll", type=float, default=3.0, help="the daemon's poll, s")
    parser.add_argument("--idle_seconds", type=float, default=60.0, help="idle CPU window")
    parser.add_argument("--running", type=int, default=20, help="cpu pool of the N jobs")
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument(
        "--supervisor",
        choices=("shared", "forked"),
        default="shared",
        help="[runners.local] supervisor for the burst and the probes",
    )
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=ROW_NAMES,
        default=list(DEFAULT_ROWS),
        help="rows to measure (the intake always runs: it fills the root)",
    )
    parser.add_argument("--bucket_dir", default=default_bucket_dir(), help="the model's tmpfs")
    args = parser.parse_args()
    for n in args.jobs:
        # The daemon's work and the local runner's attempts beside the model's bucket (a
        # tmpfs): the figures are the daemon's, not a disk's (on this VM's ext4 /tmp a file
        # creation took 0.7 ms of CPU, a dozen per attempt)
        with tempfile.TemporaryDirectory(prefix=f"bench-scale-{n}-", dir=args.bucket_dir) as tmp:
            with bucket_for(args, Path(tmp)) as bucket:
                results = [one_repeat(bucket, n, i, Path(tmp)) for i in range(args.repeat)]
            print_table(n, results, args)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--write":
        writer(*sys.argv[2:])
    elif len(sys.argv) > 2 and sys.argv[1] == "--write-array":
        array_writer(*sys.argv[2:])
    else:
        main()

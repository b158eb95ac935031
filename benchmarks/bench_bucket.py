"""Cost of the daemon against a GCS-like bucket: fake-gcs-server behind a latency-adding proxy.

The real daemon (``build_daemon``, lease included) runs in this process on ``gs://`` against
fake-gcs-server (tests/gcs_emulator.py), with every one of its requests going through
tests/faultproxy.py in a subprocess that adds ``--latency`` (20 ms: a GCS-like round trip) to
each request and counts them. Users' specs go straight to the emulator from a thread pool (a
healthy client far away is not what we measure).

For each N in ``--jobs`` (default 1,000 and 10,000):

- N jobs are submitted (each needs ``cpu=1``; the quota pool has ``--running`` cpu, so that many
  run as real ``sleep`` processes and the rest stay PENDING: 10,000 processes would swamp this
  machine), then the first cycles take them in;
- steady state: ``--cycles`` cycles with nothing submitted and nothing finishing; reported:
  bucket requests per cycle (counted by the proxy, by kind, and by the store's own counters)
  and seconds per cycle;
- burst: ``--burst`` new jobs arrive at once, each needing ``burst=1`` of a pool that fits them
  all, so the next cycle admits (starts) every one of them (``sleep`` processes); reported: the
  seconds of that cycle (which also uploads their first log bytes) and of the next one;
- submit-to-running latency: ``--probes`` single jobs, one at a time at random moments, with the
  daemon looping at ``--poll`` seconds (the CLI's default, 3 s); a probe's latency is from just
  before its spec is written until its command runs (the command writes the time).

The burst cycle also prints the CPU seconds the daemon, the proxy and the emulator spent in it
and the cycle's time per phase (``CycleReport.phases``).

``--backend`` picks the bucket, because the emulator does not scale like GCS and on a small
machine its costs, not the daemon's, can dominate what is measured:

- ``memory`` (default): fake-gcs-server's memory store. Its listings are cheap, but it keeps a
  bucket's objects in a slice and scans it on every write, so an upload costs O(objects):
  about 1.4 ms of emulator CPU at 1,000 objects and 7.6 ms at 10,000 (measured, 500 uploads).
  Good for the steady state; a burst at 10,000 jobs measures the emulator.
- ``filesystem``: its filesystem store. Reads and writes cost O(1), but every write holds one
  global lock (about 1 ms each, so writes queue behind one another: ~600-1,000 per second
  whatever the client's concurrency) and a listing reads every object file.
- ``model``: no emulator. The daemon's store is a local directory whose every request first
  sleeps ``--latency`` (``LatencyBucket``): GCS's model, where requests do not queue behind one
  another, with everything on the daemon's side (threads, parsing, process starts) real. The
  directory is on ``--bucket_dir`` (default /dev/shm, a tmpfs, where there is one): on this
  machine's disk, creating and renaming an object's file costs 0.8-1.1 ms of kernel time,
  serialized per directory (measured: 1,000 state writes, 1.1 s), a cost of the bucket's own
  storage that GCS does not put on the daemon's CPU; on tmpfs it is 0.03 ms. The daemon's
  work directory (its log mirrors) stays on the disk, as on a real VM.

    .venv/bin/python benchmarks/bench_bucket.py [--jobs 1000 10000] [--latency 0.02]
        [--running 50] [--cycles 5] [--burst 1000] [--probes 20] [--poll 3]
        [--backend memory|filesystem|model] [--profile]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # before gcsfs loads

from bastion.bucket.store import Store  # noqa: E402
from bastion.daemon import CycleReport, Daemon  # noqa: E402
from bastion.daemon.start import build_daemon  # noqa: E402
from bastion.jobstate import Status  # noqa: E402
from benchmarks.latency import LatencyBucket  # noqa: E402
from launch.api import Client, new_jobspec  # noqa: E402
from tests.faultproxy import control  # noqa: E402
from tests.gcs_emulator import GcsEmulator  # noqa: E402

BUCKET = "bench"
QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
cpu = {running}
burst = {burst}
probe = {probes}
[project_membership]
default = [".*"]
[project_resources.default]
cpu = 1.0
burst = 1.0
probe = 1.0
"""


class Proxy:
    """tests/faultproxy.py in its own process, so its threads do not share our GIL."""

    def __init__(self, upstream: str, latency: float) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.faultproxy",
                "--upstream",
                upstream,
                "--latency",
                str(latency),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "READY":
            raise RuntimeError(f"proxy did not start: {line}")
        self.endpoint = line[1]

    def reset(self) -> None:
        control(self.endpoint, "reset")

    def stats(self) -> dict[str, Any]:
        return control(self.endpoint, "stats")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def submit_all(client: Client, specs: Iterable[Any], threads: int = 32) -> float:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for result in pool.map(client.submit, specs):
            assert result is not None
    return time.perf_counter() - t0


def specs(prefix: str, count: int, resource: str, command: str) -> list[Any]:
    return [
        new_jobspec(
            name=f"{prefix}-{i:05d}",
            command=command,
            user_id="bench",
            project_id="default",
            resources={resource: 1},
        )
        for i in range(count)
    ]


def step(daemon: Daemon, proxy: Proxy | LatencyBucket) -> tuple[CycleReport, dict[str, Any]]:
    """One pass of the daemon's loop (lease, then cycle), with the proxy's count of the cycle."""
    assert daemon.lease is None or daemon.lease.hold(), "the daemon lost its lease"
    proxy.reset()
    report = daemon.cycle(time.time())
    return report, proxy.stats()


class CpuMeter:
    """CPU seconds used by each named process since construction: on a 2-core machine the
    daemon, the proxy and the emulator compete, and this shows for what. Children count only
    once reaped, so the jobs' own processes (still running) are not in the daemon's figure."""

    def __init__(self, **pids: int | None) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items() if pid}
        self.before = {name: self._cpu(p) for name, p in self.procs.items()}

    @staticmethod
    def _cpu(proc: psutil.Process) -> float:
        t = proc.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def read(self) -> str:
        return ", ".join(
            f"{name} {self._cpu(p) - self.before[name]:.1f}" for name, p in self.procs.items()
        )


def fmt_phases(report: CycleReport) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in report.phases.items() if v >= 0.005)


def fmt_routes(stats: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(stats["routes"].items())) or "none"


def status_counts(daemon: Daemon) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in daemon.jobs.values():
        counts[job.state.status.value] = counts.get(job.state.status.value, 0) + 1
    return counts


def loop_in_thread(daemon: Daemon, poll: float) -> tuple[threading.Thread, threading.Event]:
    """``Daemon.run``'s loop (lease, cycle, wait for the rest of ``poll``), minus its signal
    handlers, which only the main thread may install."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            started = time.monotonic()
            if daemon.lease is None or daemon.lease.hold():
                daemon._run_cycle(poll)
            stop.wait(max(0.0, poll - (time.monotonic() - started)))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread, stop


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def default_bucket_dir() -> str | None:
    """Where the model's bucket directory goes: a tmpfs when there is one (see above)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def run_one(n: int, args: argparse.Namespace, tmp: Path, model: Path) -> dict[str, Any]:
    emulator: GcsEmulator | None = None
    proxy: Proxy | LatencyBucket
    if args.backend == "model":
        root = str(model / "root")
        users = Client(store=Store(root))
    else:
        emulator = GcsEmulator(tmp, root=tmp / "gcs" if args.backend == "filesystem" else None)
        emulator.start()
        emulator.create_bucket(BUCKET)
        proxy = Proxy(emulator.endpoint, args.latency)
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.endpoint  # the daemon's gcsfs, per call
        root = f"gs://{BUCKET}/n{n}"
        users = Client(store=Store(root, endpoint_url=emulator.endpoint, token="anon"))
    daemon: Daemon | None = None
    result: dict[str, Any] = {"jobs": n}
    try:
        users.store.quota.write_default(
            QUOTA.format(running=args.running, burst=args.burst, probes=args.probes)
        )
        seconds = submit_all(users, specs("job", n, "cpu", "sleep 3600"))
        print(f"\n== N = {n:,} jobs, {args.latency * 1000:.0f} ms per bucket request ==")
        print(f"submitted {n:,} specs straight to the bucket in {seconds:.1f}s")

        daemon = build_daemon(root, work_dir=str(tmp / "work"), lease_seconds=60)
        if args.backend == "model":
            proxy = daemon.store.bucket.objects = LatencyBucket(daemon.store.objects, args.latency)
        for i in range(1, 4):  # take everything in; the cycle after that is steady
            report, stats = step(daemon, proxy)
            print(
                f"intake cycle {i}: {report.seconds:.2f}s, {stats['total']} requests, "
                f"{status_counts(daemon)}"
            )
        steady = [step(daemon, proxy) for _ in range(args.cycles)]
        seconds_per = [r.seconds for r, _ in steady]
        requests_per = [s["total"] for _, s in steady]
        result["steady_s"] = statistics.median(seconds_per)
        result["steady_requests"] = statistics.median(requests_per)
        print(
            f"steady-state cycle: median {result['steady_s']:.3f}s "
            f"(min {min(seconds_per):.3f}, max {max(seconds_per):.3f}) over {args.cycles}"
        )
        print(
            f"  bucket requests per cycle (proxy): {requests_per}; "
            f"last by kind: {fmt_routes(steady[-1][1])}"
        )
        print(f"  store counters per cycle: {[dict(sorted(r.ops.items())) for r, _ in steady]}")

        breakdown(daemon, args.profile)

        seconds = submit_all(users, specs("burst", args.burst, "burst", "sleep 3600"))
        print(f"burst: {args.burst:,} more specs submitted in {seconds:.1f}s")
        meter = CpuMeter(
            daemon=os.getpid(),
            proxy=proxy.proc.pid if isinstance(proxy, Proxy) else None,
            emulator=emulator.proc.pid if emulator and emulator.proc else None,
        )
        if args.profile:  # the main thread only: the pool's requests show as waits
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
        report, stats = step(daemon, proxy)
        if args.profile:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        print(f"  CPU seconds during it: {meter.read()}; phases: {fmt_phases(report)}")
        started = sum(
            1
            for name, job in daemon.jobs.items()
            if name.startswith("burst-") and job.state.status is Status.ACTIVE
        )
        result["burst_s"] = report.seconds
        result["burst_started"] = started
        print(
            f"  admitting cycle: {report.seconds:.2f}s, {stats['total']} requests "
            f"({fmt_routes(stats)}); {started:,} of {args.burst:,} started"
        )
        report, stats = step(daemon, proxy)
        result["after_burst_s"] = report.seconds
        print(
            f"  next cycle: {report.seconds:.2f}s, {stats['total']} requests ({fmt_routes(stats)});"
            f" phases: {fmt_phases(report)}"
        )
        report, stats = step(daemon, proxy)
        print(
            f"  steady again: {report.seconds:.2f}s, {stats['total']} requests "
            f"({fmt_routes(stats)}); phases: {fmt_phases(report)}"
        )

        latencies = probe_latency(daemon, users, args, tmp)
        result["p50"] = percentile(latencies, 0.5)
        result["p95"] = percentile(latencies, 0.95)
        print(
            f"submit-to-running over {len(latencies)} single jobs, daemon polling every "
            f"{args.poll:g}s: p50 {result['p50']:.2f}s, p95 {result['p95']:.2f}s "
            f"(min {min(latencies):.2f}, max {max(latencies):.2f})"
        )
        return result
    finally:
        if daemon is not None:
            daemon.close()
            local = daemon.runners.get("local")
            for _ in range(50):  # delete kills first, then removes once the process is gone
                owned = local.list_owned()
                if not owned:
                    break
                for attempt in owned:
                    local.delete(attempt.handle)
                time.sleep(0.1)
        if emulator is not None:
            assert isinstance(proxy, Proxy)
            proxy.stop()
            emulator.stop()


def breakdown(daemon: Daemon, profile: bool) -> None:
    """Where a steady-state cycle's time goes: the listing of the specs, and CPU."""
    t0 = time.perf_counter()
    listed = daemon.store.specs.list()
    listing = time.perf_counter() - t0
    cpu0, t0 = time.process_time(), time.perf_counter()
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
    daemon.cycle(time.time())
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(
        f"  of a steady cycle ({wall:.3f}s wall, {cpu:.3f}s CPU in this process): listing "
        f"{len(listed):,} specs alone takes {listing:.3f}s"
    )
    if profile:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(12)


def probe_latency(
    daemon: Daemon, users: Client, args: argparse.Namespace, tmp: Path
) -> list[float]:
    marks = tmp / "probes"
    marks.mkdir()
    rng = random.Random(7)
    thread, stop = loop_in_thread(daemon, args.poll)
    latencies = []
    try:
        for i in range(args.probes):
            time.sleep(rng.uniform(0, args.poll))  # arrive at a random point of the cycle
            mark = marks / f"p{i}"
            spec = specs(
                f"probe{i}", 1, "probe", f"date +%s.%N > {mark}.tmp && mv {mark}.tmp {mark}"
            )
            submitted = time.time()
            users.submit(spec[0])
            deadline = time.monotonic() + 120
            while not mark.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"probe {i} did not start within 120 s")
                time.sleep(0.01)
            latencies.append(float(mark.read_text()) - submitted)
    finally:
        stop.set()
        thread.join()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added per request")
    parser.add_argument("--running", type=int, default=50, help="cpu pool: jobs that run")
    parser.add_argument("--cycles", type=int, default=5, help="steady-state cycles measured")
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--poll", type=float, default=3.0, help="daemon poll for the probes")
    parser.add_argument(
        "--profile", action="store_true", help="profile a steady cycle and the burst's admission"
    )
    parser.add_argument(
        "--backend",
        choices=["memory", "filesystem", "model"],
        default="memory",
        help="the emulator's memory or filesystem store, or a local directory with the "
        "latency added per request (LatencyBucket); see the module docstring",
    )
    parser.add_argument(
        "--bucket_dir",
        default=default_bucket_dir(),
        help="where the model's bucket directory goes (default: /dev/shm when there is one)",
    )
    args = parser.parse_args()
    results = []
    for n in args.jobs:
        with (
            tempfile.TemporaryDirectory(prefix=f"bench-bucket-{n}-") as tmp,
            tempfile.TemporaryDirectory(prefix="bench-bucket-model-", dir=args.bucket_dir) as model,
        ):
            results.append(run_one(n, args, Path(tmp), Path(model)))
    print(
        f"\nsummary ({args.latency * 1000:.0f} ms per request; targets: steady < 1 s at "
        f"10,000 jobs, a 1,000-job burst admitted in one cycle of a few seconds)"
    )
    print(
        f"{'jobs':>7} {'steady s':>9} {'requests':>9} {'burst s':>8} {'started':>8} "
        f"{'next s':>7} {'p50 s':>6} {'p95 s':>6}"
    )
    for r in results:
        print(
            f"{r['jobs']:>7,} {r['steady_s']:>9.3f} {r['steady_requests']:>9.0f} "
            f"{r['burst_s']:>8.2f} {r['burst_started']:>8,} {r['after_burst_s']:>7.2f} "
            f"{r['p50']:>6.2f} {r['p95']:>6.2f}"
        )


if __name__ == "__main__":
    main()

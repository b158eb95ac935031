"""A busy queue: what a daemon cycle costs while jobs finish and start all the time.

A cycle should cost what changed, not what waits: with N jobs waiting and a few finishing each
cycle, bucket requests, seconds and CPU per cycle should grow with the jobs that finished and
started, not with N. This measures it. The real daemon (``build_daemon``, lease included) runs
in this process; every job needs ``cpu=1`` of a pool of ``--running`` cpu, so that many run as
real processes of the local runner and the rest (N - ``--running``) wait. Users' specs go
straight to the bucket (from a thread pool when many), as in bench_bucket.py.

For each N in ``--jobs`` (default 1,000 and 10,000), on two roots of the same bucket:

- churn: N jobs, each ``sleep S`` with S uniform in [``--min_seconds``, ``--max_seconds``]
  (seeded), are submitted and taken in; then the daemon cycles every ``--poll`` seconds for
  ``--seconds`` seconds, and after each cycle as many new jobs are submitted as finished, so N
  stay queued. Per cycle: seconds (``CycleReport.seconds``), bucket requests, CPU seconds of
  this process from the cycle's start until the effects it handed to the I/O pool (starts,
  stops, deletes) are done, jobs started and finished, and the bytes of decision-log records it
  wrote. Reported: median and p90 per cycle, bucket requests per second, the daemon's CPU as a
  share of one core, and the RSS growth from taking the N jobs in, per job;
- static: N jobs ``sleep 3600 || true``, taken in with tracemalloc on (Python memory the daemon
  holds per job), then: quiet cycles (nothing finishes, nothing is submitted), with the CPU
  share such a daemon takes at ``--quiet_poll`` (3 s, the CLI's default), and one quiet cycle
  that lists every spec, as one does every 30 s on a large queue (bastion/bucket/specwatch.py; the
  "+full" CPU share counts it in); ``--singles`` times
  the cycle in which exactly one job finishes among N waiting (the ``sleep`` under one running
  job is sent SIGTERM, so the job succeeds) and the cycle after it (which records the handle of
  the job that took its place); and one job cancelled with ``Client.cancel``, every cycle until
  it is gone and the next.

Requests are counted as the daemon makes them: on ``--backend model`` (default) by
``LatencyBucket`` (bench_bucket.py: a local directory, on ``--bucket_dir`` (a tmpfs by
default), whose every request first waits ``--latency``, 20 ms; a listing counts one request
per 800 names; the quota file's lookup is neither delayed nor counted); on ``--backend
emulator`` (fake-gcs-server's memory store behind tests/faultproxy.py adding ``--latency``) by
the store's own counters (``Store.ops``: a listing counts once however many pages it takes).
The emulator scans every object on each upload, so at 10,000 jobs its costs, not the daemon's,
dominate: allow minutes, and read its CPU figures with that in mind (the emulator and proxy run
in their own processes and are not in them). The lease is renewed before each cycle and is not
in its figures.

    .venv/bin/python benchmarks/bench_churn.py [--jobs 1000 10000] [--running 20]
        [--seconds 30] [--poll 1] [--min_seconds 2] [--max_seconds 6] [--latency 0.02]
        [--backend model|emulator] [--singles 3] [--quiet_cycles 5] [--verbose]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import gc
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import tracemalloc
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # before gcsfs loads

from bastion.bucket.specwatch import FULL_LISTING_SECONDS  # noqa: E402
from bastion.bucket.store import Store  # noqa: E402
from bastion.daemon import Daemon  # noqa: E402
from bastion.daemon.start import build_daemon  # noqa: E402
from bastion.jobspec import JobSpec  # noqa: E402
from bastion.jobstate import Status  # noqa: E402
from benchmarks.bench_bucket import (  # noqa: E402
    BUCKET,
    LatencyBucket,
    Proxy,
    default_bucket_dir,
    percentile,
)
from benchmarks.bench_cycle import QUOTA  # noqa: E402
from launch.api import Client, NoDaemonWarning, new_jobspec  # noqa: E402
from tests.gcs_emulator import GcsEmulator  # noqa: E402

CHANGES = ("write", "write_if", "create", "append", "delete")  # routes that change the bucket


@dataclass
class Sample:
    """One measured cycle."""

    seconds: float
    requests: int
    cpu: float
    started: int
    finished: int
    decision_bytes: int
    routes: dict[str, int]
    phases: dict[str, float]

    @property
    def changes(self) -> int:
        return sum(v for k, v in self.routes.items() if k in CHANGES)

    def line(self) -> str:
        routes = ", ".join(f"{k} {v}" for k, v in sorted(self.routes.items())) or "none"
        slow = ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(self.phases.items(), key=lambda kv: -kv[1])[:3]
        )
        return (
            f"{self.requests} requests ({routes}); {self.seconds:.3f} s ({slow}); "
            f"CPU {self.cpu * 1000:.0f} ms; started {self.started}, finished {self.finished}; "
            f"decision log +{self.decision_bytes:,} B"
        )


class RequestCount:
    """Bucket requests since ``reset``: LatencyBucket's count (model), else ``Store.ops``."""

    def __init__(self, daemon: Daemon, bucket: LatencyBucket | None) -> None:
        self.daemon, self.bucket = daemon, bucket
        self.before: dict[str, int] = {}

    def reset(self) -> None:
        if self.bucket is not None:
            self.bucket.reset()
        self.before = dict(self.daemon.store.ops)

    def read(self) -> dict[str, int]:
        if self.bucket is not None:
            return dict(self.bucket.stats()["routes"])
        ops = self.daemon.store.ops
        return {k: v - self.before.get(k, 0) for k, v in ops.items() if v > self.before.get(k, 0)}


class DecisionLog:
    """Bytes of decision-log records written since the last look (listed by the users'
    store, so the daemon's counts do not include the look)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.seen = set(self._listing())

    def _listing(self) -> dict[str, int]:
        return self.store.decisions.sizes()

    def new_bytes(self) -> int:
        listing = self._listing()
        new = [name for name in listing if name not in self.seen]
        self.seen.update(new)
        return sum(listing[name] for name in new)


@dataclass
class Run:
    """A daemon on one root, with what measures it and what the users have submitted."""

    daemon: Daemon
    users: Client
    requests: RequestCount
    decisions: DecisionLog
    attempts: Path
    submitted: int = 0
    left: int = 0  # jobs that were in the daemon and are gone (finished)
    samples: list[Sample] = field(default_factory=list)

    @property
    def queued(self) -> int:
        return self.submitted - self.left


class Backend:
    """The bucket for one N: a local directory (model) or fake-gcs-server behind the proxy."""

    def __init__(self, kind: str, tmp: Path, n: int, latency: float, model: Path) -> None:
        self.kind, self.tmp, self.n, self.latency, self.model = kind, tmp, n, latency, model
        self.emulator: GcsEmulator | None = None
        self.proxy: Proxy | None = None

    def root(self, phase: str) -> str:
        if self.kind == "model":
            return str(self.model / phase / "root")
        return f"gs://{BUCKET}/n{self.n}-{phase}"

    def client(self, phase: str) -> Client:
        if self.emulator is None:
            return Client(store=Store(self.root(phase)))
        store = Store(self.root(phase), endpoint_url=self.emulator.endpoint, token="anon")
        return Client(store=store)


@contextlib.contextmanager
def backend(args: argparse.Namespace, tmp: Path, n: int, model: Path) -> Iterator[Backend]:
    bucket = Backend(args.backend, tmp, n, args.latency, model)
    try:
        if args.backend == "emulator":
            bucket.emulator = GcsEmulator(tmp)
            bucket.emulator.start()
            bucket.emulator.create_bucket(BUCKET)
            bucket.proxy = Proxy(bucket.emulator.endpoint, args.latency)
            os.environ["STORAGE_EMULATOR_HOST"] = bucket.proxy.endpoint  # the daemon's gcsfs
        yield bucket
    finally:
        if bucket.proxy is not None:
            bucket.proxy.stop()
        if bucket.emulator is not None:
            bucket.emulator.stop()


# -- submitting ----------------------------------------------------------------------------------


def job_spec(index: int, command: str) -> JobSpec:
    return new_jobspec(
        name=f"job-{index:06d}",
        command=command,
        user_id="bench",
        project_id="default",
        resources={"cpu": 1},
    )


def submit(run_or_users: Run | Client, commands: list[str], first: int) -> None:
    """Write specs straight to the bucket, from a thread pool when there are many."""
    users = run_or_users.users if isinstance(run_or_users, Run) else run_or_users
    specs = [job_spec(first + i, command) for i, command in enumerate(commands)]
    if len(specs) < 8:
        for spec in specs:
            users.submit(spec)
        return
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        list(pool.map(users.submit, specs))


def sleeps(rng: random.Random, count: int, args: argparse.Namespace) -> list[str]:
    return [f"sleep {rng.uniform(args.min_seconds, args.max_seconds):.2f}" for _ in range(count)]


def prepare(bucket: Backend, phase: str, args: argparse.Namespace, commands: list[str]) -> Client:
    users = bucket.client(phase)
    users.store.quota.write_default(QUOTA.format(running=args.running))
    t0 = time.perf_counter()
    submit(users, commands, 0)
    print(f"{phase}: {len(commands):,} specs submitted in {time.perf_counter() - t0:.1f} s")
    return users


# -- the daemon ----------------------------------------------------------------------------------


@contextlib.contextmanager
def daemon_on(bucket: Backend, phase: str, users: Client, submitted: int) -> Iterator[Run]:
    """The daemon on the phase's root; at the end every attempt's processes are killed."""
    work = bucket.tmp / phase
    attempts = work / "attempts"
    daemon = build_daemon(
        bucket.root(phase),
        work_dir=str(work / "work"),
        gpus=[],
        lease_seconds=60,
        settings={"runners": {"local": {"attempts_dir": str(attempts)}}},
    )
    latency: LatencyBucket | None = None
    if bucket.kind == "model":
        latency = LatencyBucket(daemon.store.objects, bucket.latency)
        daemon.store.bucket.objects = latency
    run = Run(
        daemon, users, RequestCount(daemon, latency), DecisionLog(users.store), attempts, submitted
    )
    try:
        yield run
    finally:
        daemon.close()  # no effect is in flight after this: nothing new can start
        kill_attempts(daemon)


def kill_attempts(daemon: Daemon) -> None:
    """SIGKILL every attempt's process group and delete its directory, until none is left."""
    local = daemon.runners.get("local")
    for _ in range(100):
        owned = local.list_owned()
        if not owned:
            return
        for item in owned:
            local.stop(item.handle, 0.0)  # past its deadline: SIGKILL to the group
            local.delete(item.handle)
        time.sleep(0.05)
    print(f"warning: {len(local.list_owned())} attempts could not be deleted", file=sys.stderr)


def kill_descendants() -> None:
    """Last resort: any process this one started (a job's) that is still alive."""
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(psutil.Process().children(recursive=True), timeout=5)


def attempts_by_job(daemon: Daemon) -> dict[str, int]:
    return {name: job.state.attempt for name, job in daemon.jobs.items()}


def measure(run: Run) -> Sample:
    """One cycle, plus the effects it handed to the pool, with its requests, CPU and jobs."""
    daemon = run.daemon
    assert daemon.lease is None or daemon.lease.hold(), "the daemon lost its lease"
    before = attempts_by_job(daemon)
    run.requests.reset()
    cpu = time.process_time()
    report = daemon.cycle(time.time())
    concurrent.futures.wait(list(daemon.ctx.futures), timeout=120)
    cpu = time.process_time() - cpu
    routes = run.requests.read()
    after = attempts_by_job(daemon)
    sample = Sample(
        seconds=report.seconds,
        requests=sum(routes.values()),
        cpu=cpu,
        started=sum(1 for name, attempt in after.items() if attempt > before.get(name, 0)),
        finished=sum(1 for name in before if name not in after),
        decision_bytes=run.decisions.new_bytes(),
        routes=routes,
        phases=dict(report.phases),
    )
    run.left += sample.finished
    return sample


def running(daemon: Daemon) -> list[str]:
    return [
        name
        for name, job in daemon.jobs.items()
        if job.state.status is Status.ACTIVE and not job.state.stop
    ]


def intake(run: Run, target_running: int, label: str, max_cycles: int = 12) -> None:
    """Cycle until every submitted spec is taken in and the pool is full (or no more room)."""
    samples = []
    while len(samples) < max_cycles:
        samples.append(measure(run))
        daemon = run.daemon
        seen = len(daemon.jobs) + run.left >= run.submitted
        full = len(running(daemon)) >= min(target_running, len(daemon.jobs))
        if len(samples) >= 2 and seen and full:
            break
    print(
        f"{label}: taken in over {len(samples)} cycles, "
        f"{sum(s.seconds for s in samples):.1f} s, {sum(s.requests for s in samples):,} "
        f"requests, CPU {sum(s.cpu for s in samples):.1f} s; {len(run.daemon.jobs):,} jobs, "
        f"{len(running(run.daemon))} running"
    )


# -- phases --------------------------------------------------------------------------------------


def churn_phase(bucket: Backend, args: argparse.Namespace, n: int) -> dict[str, Any]:
    rng = random.Random(args.seed)
    users = prepare(bucket, "churn", args, sleeps(rng, n, args))
    gc.collect()
    rss = psutil.Process().memory_info().rss
    with daemon_on(bucket, "churn", users, n) as run:
        intake(run, args.running, "churn")
        gc.collect()
        rss = (psutil.Process().memory_info().rss - rss) / max(1, len(run.daemon.jobs))
        run.decisions.new_bytes()  # the intake's records are not churn's
        started = time.monotonic()
        while time.monotonic() - started < args.seconds:
            t0 = time.monotonic()
            sample = measure(run)
            run.samples.append(sample)
            if args.verbose:
                print(f"  cycle {len(run.samples)}: {sample.line()}")
            missing = max(0, n - run.queued)
            submit(run, sleeps(rng, missing, args), run.submitted)
            run.submitted += missing
            time.sleep(max(0.0, args.poll - (time.monotonic() - t0)))
        elapsed = time.monotonic() - started
        return churn_summary(run.samples, elapsed, rss, args)


def churn_summary(
    samples: list[Sample], elapsed: float, rss: float, args: argparse.Namespace
) -> dict[str, Any]:
    changed = [s.decision_bytes for s in samples if s.decision_bytes]
    result = {
        "req_per_s": sum(s.requests for s in samples) / elapsed,
        "cpu_share": sum(s.cpu for s in samples) / elapsed,
        "rss_per_job": rss,
        "finished": sum(s.finished for s in samples),
    }
    print(
        f"churn: {len(samples)} cycles in {elapsed:.1f} s at --poll {args.poll:g}: "
        f"{result['finished']:,} finished, {sum(s.started for s in samples):,} started "
        f"(as many submitted to keep the queue full)"
    )
    print(f"  {'per cycle':<30} {'median':>9} {'p90':>9} {'max':>9}")
    rows = [
        ("requests", [s.requests for s in samples], "{:>9.0f}"),
        ("seconds", [s.seconds for s in samples], "{:>9.3f}"),
        ("CPU ms", [s.cpu * 1000 for s in samples], "{:>9.0f}"),
        ("started", [s.started for s in samples], "{:>9.0f}"),
        ("finished", [s.finished for s in samples], "{:>9.0f}"),
        ("decision log B (changed cycles)", changed, "{:>9.0f}"),
    ]
    for name, values, fmt in rows:
        if values:
            stats = (statistics.median(values), percentile(values, 0.9), max(values))
            print(f"  {name:<30} " + " ".join(fmt.format(v) for v in stats))
            result[name] = stats
    print(
        f"  bucket requests per second {result['req_per_s']:.1f}; daemon CPU "
        f"{result['cpu_share'] * 100:.1f}% of a core; RSS +{rss / 1024:.1f} KiB per job taken in"
    )
    return result


def static_phase(bucket: Backend, args: argparse.Namespace, n: int) -> dict[str, Any]:
    users = prepare(bucket, "static", args, ["sleep 3600 || true"] * n)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with daemon_on(bucket, "static", users, n) as run:
            intake(run, args.running, "static")
            gc.collect()
            traced = (tracemalloc.get_traced_memory()[0] - base) / max(1, len(run.daemon.jobs))
            tracemalloc.stop()
            print(f"  memory: tracemalloc {traced / 1024:.1f} KiB per job held by the daemon")
            settle(run, args.poll)
            result = {"traced_per_job": traced, **quiet(run, args)}
            result.update(singles(run, args))
            cancel_one(run, args.poll)
            return result
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()


def settle(run: Run, poll: float, max_cycles: int = 6) -> None:
    """Cycle until one changes nothing (the last starts' handles are written)."""
    for _ in range(max_cycles):
        time.sleep(poll)
        sample = measure(run)
        if not sample.changes and not sample.started and not sample.finished:
            return
    print(f"  warning: not quiet after {max_cycles} cycles: {sample.line()}")


def quiet(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    samples = []
    for _ in range(args.quiet_cycles):
        time.sleep(args.poll)
        samples.append(measure(run))
    result = {
        "quiet_requests": statistics.median(s.requests for s in samples),
        "quiet_s": statistics.median(s.seconds for s in samples),
        "quiet_cpu": statistics.median(s.cpu for s in samples),
    }
    result["quiet_share"] = result["quiet_cpu"] / args.quiet_poll
    print(
        f"  quiet cycle (median of {len(samples)}): {result['quiet_requests']:.0f} requests, "
        f"{result['quiet_s']:.3f} s, CPU {result['quiet_cpu'] * 1000:.0f} ms = "
        f"{result['quiet_share'] * 100:.1f}% of a core at --poll {args.quiet_poll:g}"
    )
    print(f"    last: {samples[-1].line()}")
    # A quiet cycle lists jobs/active/ only every FULL_LISTING_SECONDS on a large queue
    # (bastion/bucket/specwatch.py): one such cycle, and the CPU share with it counted in.
    time.sleep(args.poll)
    run.daemon.specwatch.forget()  # the next look is a full listing
    full = measure(run)
    every = max(1.0, FULL_LISTING_SECONDS / args.quiet_poll)  # cycles per full listing
    result["full_requests"], result["full_s"], result["full_cpu"] = (
        full.requests,
        full.seconds,
        full.cpu,
    )
    result["quiet_share_with_full"] = ((every - 1) * result["quiet_cpu"] + full.cpu) / (
        every * args.quiet_poll
    )
    print(
        f"  quiet cycle with the full spec listing (every {FULL_LISTING_SECONDS:g} s): "
        f"{full.line()}; CPU share counting it: "
        f"{result['quiet_share_with_full'] * 100:.1f}% of a core at --poll {args.quiet_poll:g}"
    )
    return result


def end_one(run: Run) -> str:
    """SIGTERM to the ``sleep`` under one running job; ``|| true`` makes the job succeed.
    Returns once its wrapper has recorded the exit, so the next cycle sees it finished."""
    name = running(run.daemon)[0]
    handle = run.daemon.jobs[name].state.run_attempt.handle
    for proc in psutil.Process(handle["pid"]).children(recursive=True):
        if proc.name() == "sleep":
            proc.send_signal(signal.SIGTERM)
    exit_file = run.attempts / handle["name"] / "exit"
    deadline = time.monotonic() + 10
    while not exit_file.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: its attempt did not exit")
        time.sleep(0.01)
    return name


def singles(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    finish, after = [], []
    for i in range(args.singles):
        time.sleep(args.poll)
        name = end_one(run)
        finish.append(measure(run))
        time.sleep(args.poll)
        after.append(measure(run))
        if finish[-1].finished != 1 or finish[-1].started != 1:
            print(f"  warning: single {i + 1} ({name}): {finish[-1].line()}")
    print(f"  one job finishes among {len(run.daemon.jobs):,} (last of {args.singles}):")
    print(f"    its cycle:  {finish[-1].line()}")
    print(f"    next cycle: {after[-1].line()}")
    return {
        "one_requests": statistics.median(s.requests for s in finish),
        "one_s": statistics.median(s.seconds for s in finish),
        "one_cpu": statistics.median(s.cpu for s in finish),
        "one_decision_bytes": statistics.median(s.decision_bytes for s in finish),
        "next_requests": statistics.median(s.requests for s in after),
    }


def cancel_one(run: Run, poll: float) -> None:
    name = running(run.daemon)[0]
    run.users.cancel(name, user_id="bench")
    print(f"  one job cancelled ({name}), each cycle until it is gone and the next:")
    for i in range(6):
        time.sleep(poll)
        sample = measure(run)
        print(f"    cycle {i + 1}: {sample.line()}")
        if name not in run.daemon.jobs:
            break
    time.sleep(poll)
    print(f"    next:    {measure(run).line()}")


# -- main ----------------------------------------------------------------------------------------


def run_one(n: int, args: argparse.Namespace) -> dict[str, Any]:
    print(
        f"\n== N = {n:,} jobs, {args.running} running; {args.backend} backend, "
        f"{args.latency * 1000:.0f} ms per request =="
    )
    with (
        tempfile.TemporaryDirectory(prefix=f"bench-churn-{n}-") as tmp,
        tempfile.TemporaryDirectory(prefix="bench-churn-model-", dir=args.bucket_dir) as model,
    ):
        try:
            with backend(args, Path(tmp), n, Path(model)) as bucket:
                result = {"jobs": n, **churn_phase(bucket, args, n)}
                result.update(static_phase(bucket, args, n))
                return result
        finally:
            kill_descendants()


def print_summary(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nsummary ({args.backend}, {args.latency * 1000:.0f} ms per request; churn medians "
        f"per cycle at --poll {args.poll:g}; quiet CPU share at --poll {args.quiet_poll:g})"
    )
    header = (
        f"{'jobs':>7} {'req/s':>6} {'req':>5} {'cyc s':>6} {'p90 s':>6} {'CPU ms':>7} "
        f"{'CPU%':>5} {'dec B':>6} | {'quiet req':>9} {'s':>6} {'CPU%':>5} {'+full':>5} | "
        f"{'one req':>7} {'s':>6} {'CPU ms':>7} {'next':>5} | {'KiB/job':>7} {'RSS':>6}"
    )
    print(header)
    for r in results:
        dec = r.get("decision log B (changed cycles)", (0, 0, 0))[0]
        print(
            f"{r['jobs']:>7,} {r['req_per_s']:>6.1f} {r['requests'][0]:>5.0f} "
            f"{r['seconds'][0]:>6.3f} {r['seconds'][1]:>6.3f} {r['CPU ms'][0]:>7.0f} "
            f"{r['cpu_share'] * 100:>5.1f} {dec:>6.0f} | {r['quiet_requests']:>9.0f} "
            f"{r['quiet_s']:>6.3f} {r['quiet_share'] * 100:>5.1f} "
            f"{r['quiet_share_with_full'] * 100:>5.1f} | {r['one_requests']:>7.0f} "
            f"{r['one_s']:>6.3f} {r['one_cpu'] * 1000:>7.0f} {r['next_requests']:>5.0f} | "
            f"{r['traced_per_job'] / 1024:>7.1f} {r['rss_per_job'] / 1024:>6.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--running", type=int, default=20, help="cpu pool: jobs that run")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the churn")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between cycles")
    parser.add_argument("--quiet_poll", type=float, default=3.0, help="for the quiet CPU share")
    parser.add_argument("--min_seconds", type=float, default=2.0, help="shortest job")
    parser.add_argument("--max_seconds", type=float, default=6.0, help="longest job")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added per request")
    parser.add_argument("--backend", choices=["model", "emulator"], default="model")
    parser.add_argument(
        "--bucket_dir",
        default=default_bucket_dir(),
        help="where the model's bucket directory goes (default: /dev/shm, see bench_bucket.py)",
    )
    parser.add_argument("--singles", type=int, default=3, help="one-job-finishes cycles")
    parser.add_argument("--quiet_cycles", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--verbose", action="store_true", help="print every churn cycle")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=NoDaemonWarning)  # specs precede the daemon
    results = [run_one(n, args) for n in args.jobs]
    print_summary(results, args)


if __name__ == "__main__":
    main()

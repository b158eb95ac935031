"""The daemon's cycle with real runners: a burst of local jobs, 1,000 running, 50 containers.

Prints figures; not a test. Everything runs in-process (``build_daemon`` and ``daemon.cycle``)
on a temporary local root; the specs are written straight into ``ROOT/jobs/active``.

(a) burst: N local jobs appear at once. Time of the admitting cycle, time until every job's
    attempt is observed RUNNING, and the decision loop's seconds per phase (CycleReport.phases)
    of the admitting cycle and summed over the cycles until all run.
(b) steady state with the N local jobs running (``sleep 600``): store ops and seconds per cycle,
    and the CPU their wrappers take over ``--idle_seconds`` while the jobs run.
(c) with --docker: the same with --containers running containers (DOCKER_HOST, --image), the
    submit-to-RUNNING latency of single container jobs (p50) and the runner's start() cost per
    container (in the burst, in parallel, and one at a time), and the CPU the containers'
    outputs watchers take over ``--idle_seconds``.

Everything it started is killed (processes) or removed (containers) at the end.

Figures on the 2-core VM, 1,000 local jobs, 3 runs (2026-11-27): (a) all RUNNING after 9.2-15.2 s
(23.1-38.8 s before the wrappers waited on a pidfd and local polls left the I/O pool); (b) a
steady cycle 0.096-0.099 s (0.44-1.07 s), the wrappers 0-16% of a core in all, 1 wake-up a
second each (136.7%, 45.6 wake-ups). The shared supervisor (2026-11-28, on /dev/shm, 5 runs of
each --supervisor, interleaved): (a) 3.7-4.0 s (forked 9.7-12.9 s); (b) a steady cycle
0.039-0.045 s (0.106-0.115 s: a shared attempt is judged by its lock, not through psutil), the
supervisor 4.3-5.5% of a core for the 1,000 jobs, 1.4-1.5 wake-ups a second each (the forked
wrappers 2.9-4.1%, 1.3).

    .venv/bin/python benchmarks/bench_runners.py [--jobs 1000] [--cycles 5] [--idle_seconds 10]
    eval "$(bash scripts/docker_setup.sh)"; .venv/bin/python benchmarks/bench_runners.py \\
        --jobs 1000 --docker --image "$BASTION_TEST_IMAGE"
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bastion.daemon import CycleReport, Daemon
from bastion.daemon.start import build_daemon
from bastion.jobstate import Status
from bastion.runners.launcher import LAUNCHER_ARG, SHARED_ARG
from benchmarks.bench_bucket import default_bucket_dir
from launch.api import new_jobspec

QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
cpu = {cpus}
[project_membership]
default = [".*"]
[project_resources.default]
cpu = 1.0
"""


def write_specs(root: str, names: list[str], command: str, runner: dict | None = None) -> None:
    active = Path(root, "jobs", "active")
    active.mkdir(parents=True, exist_ok=True)
    for name in names:
        spec = new_jobspec(
            name=name,
            command=command,
            user_id="bench",
            project_id="default",
            resources={"cpu": 1},
            runner=runner,
        )
        (active / name).write_bytes(spec.dumps())


def running(daemon: Daemon, names: list[str]) -> int:
    count = 0
    for name in names:
        job = daemon.jobs.get(name)
        if (
            job
            and job.state.status is Status.ACTIVE
            and job.state.run_attempt is not None
            and job.state.run_attempt.phase == "RUNNING"
        ):
            count += 1
    return count


def fmt_ops(report: CycleReport) -> str:
    return str(dict(sorted(report.ops.items())))


def fmt_phases(phases: dict[str, float]) -> str:
    return ", ".join(f"{k} {v * 1000:.1f}ms" for k, v in phases.items())


def burst(daemon: Daemon, names: list[str], timeout: float, label: str) -> float:
    """Cycles until every job in ``names`` is observed RUNNING; prints the figures."""
    t0 = time.perf_counter()
    first = daemon.cycle(time.time())
    admitted = sum(
        1 for n in names if (daemon.jobs.get(n) and daemon.jobs[n].state.status is Status.ACTIVE)
    )
    print(
        f"[{label}] admitting cycle: {first.seconds:.3f}s, {admitted}/{len(names)} admitted, "
        f"ops {fmt_ops(first)}"
    )
    print(f"[{label}]   phases: {fmt_phases(first.phases)}")
    total: collections.Counter[str] = collections.Counter(first.phases)
    cycles = 1
    while running(daemon, names) < len(names):
        if time.perf_counter() - t0 > timeout:
            print(
                f"[{label}] TIMEOUT: only {running(daemon, names)}/{len(names)} RUNNING "
                f"after {timeout}s"
            )
            break
        time.sleep(0.05)
        report = daemon.cycle(time.time())
        total.update(report.phases)
        cycles += 1
    elapsed = time.perf_counter() - t0
    print(
        f"[{label}] all {running(daemon, names)}/{len(names)} RUNNING (Observed) after "
        f"{elapsed:.2f}s and {cycles} cycles"
    )
    print(f"[{label}]   phases summed over those cycles: {fmt_phases(dict(total))}")
    return elapsed


def steady(
    daemon: Daemon, cycles: int, label: str, calls: collections.Counter[str] | None = None
) -> None:
    reports = []
    per_cycle = []
    for _ in range(cycles):
        time.sleep(0.05)
        if calls is not None:
            calls.clear()
        reports.append(daemon.cycle(time.time()))
        daemon.settle()
        per_cycle.append(dict(sorted(calls.items())) if calls is not None else None)
    seconds = [r.seconds for r in reports]
    print(
        f"[{label}] steady-state cycle: median {statistics.median(seconds):.3f}s "
        f"(min {min(seconds):.3f}s, max {max(seconds):.3f}s) over {cycles} cycles"
    )
    for i, r in enumerate(reports):
        print(
            f"[{label}]   cycle {i + 1}: {r.seconds:.3f}s ops {fmt_ops(r)}; slowest {r.slowest()}"
        )
        if per_cycle[i] is not None:
            print(f"[{label}]     engine API calls: {per_cycle[i]}")


def wrappers_idle(seconds: float, label: str) -> None:
    """The CPU the running jobs' wrappers take while their jobs run: each wakes to look at
    its stop file; nothing else should cost while a job runs for days. A shared supervisor
    is one process for all (its children are the jobs); a forking launcher's children are
    the wrappers."""
    launchers = [p for p in psutil.Process().children() if LAUNCHER_ARG in p.cmdline()]
    shared = [p for p in launchers if p.cmdline()[-1] == SHARED_ARG]
    wrappers = [w for p in launchers if p not in shared for w in p.children()]
    if shared:
        jobs = sum(len(p.children()) for p in shared)
        idle(shared, seconds, f"[{label}] {len(shared)} shared supervisor(s) of {jobs} jobs", jobs)
    if wrappers:
        idle(wrappers, seconds, f"[{label}] {len(wrappers)} wrappers")


def watchers_idle(seconds: float, label: str) -> None:
    """The same for the Docker runner's outputs watchers (one per running container)."""
    watchers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "bastion.outputs.watch" in " ".join(p.info["cmdline"] or ())
    ]
    idle(watchers, seconds, f"[{label}] {len(watchers)} outputs watchers")


def idle(processes: list[psutil.Process], seconds: float, what: str, per: int = 0) -> None:
    """CPU and wake-ups (voluntary switches of every thread) of ``processes`` over
    ``seconds``; the wake-ups per one of ``per`` attempts (default: per process)."""
    before = {p: sum(p.cpu_times()[:2]) for p in processes}
    switches = {p: woken(p) for p in processes}
    time.sleep(seconds)
    used = woke = 0.0
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            used += sum(p.cpu_times()[:2]) - before[p]
            woke += woken(p) - switches[p]
    print(
        f"{what} over {seconds:g}s: {used / seconds:.1%} of a core in all, "
        f"{woke / max(1, per or len(processes)) / seconds:.1f} wake-ups a second each"
    )


def woken(process: psutil.Process) -> int:
    """Voluntary context switches of all its threads (psutil's count is the main thread's)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{process.pid}/task")
    except OSError:  # (gone)
        return 0
    for task in tasks:
        with contextlib.suppress(OSError), open(f"/proc/{process.pid}/task/{task}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
    return total


def count_engine_calls(api) -> collections.Counter[str]:
    """Wrap the docker APIClient's methods the runner uses, counting calls by name."""
    calls: collections.Counter[str] = collections.Counter()
    for method in (
        "inspect_container",
        "logs",
        "containers",
        "create_container",
        "start",
        "kill",
        "remove_container",
        "pull",
    ):
        original = getattr(api, method)

        def counted(*a, _original=original, _method=method, **kw):
            calls[_method] += 1
            return _original(*a, **kw)

        setattr(api, method, counted)
    return calls


def stop_all(daemon: Daemon, root: str) -> None:
    """Kill every attempt this benchmark started, then delete them through their runners."""
    handles = []
    for job in daemon.jobs.values():
        record = job.state.run_attempt
        if record is not None and record.handle:
            handles.append((record.kind, record.handle))
    for kind, handle in handles:
        with contextlib.suppress(Exception):
            daemon.runners.get(kind).stop(handle, 0.0)
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.environ().get("BASTION_ROOT") == root:
                proc.kill()
    deadline = time.monotonic() + 60
    pending = handles
    while pending and time.monotonic() < deadline:
        left = []
        for kind, handle in pending:
            try:
                if not daemon.runners.get(kind).delete(handle):
                    left.append((kind, handle))
            except Exception:
                left.append((kind, handle))
        pending = left
        if pending:
            time.sleep(0.2)
    if pending:
        print(f"WARNING: {len(pending)} attempts could not be deleted")
    daemon.settle()
    daemon.close()


def bench_local(args: argparse.Namespace) -> None:
    # On a tmpfs when there is one: the figures are the daemon's and the supervisors', not a
    # disk's (a file creation on this VM's ext4 /tmp took 0.7 ms of CPU, a dozen per attempt)
    with tempfile.TemporaryDirectory(dir=default_bucket_dir()) as tmp:
        root = f"{tmp}/root"
        quota = Path(root, "project-quotas", "project-quotas.config")
        quota.parent.mkdir(parents=True)
        quota.write_text(QUOTA.format(cpus=args.jobs + 10))
        names = [f"job-{i:05d}" for i in range(args.jobs)]
        t0 = time.perf_counter()
        write_specs(root, names, "sleep 600")
        print(f"[local] wrote {args.jobs} specs in {time.perf_counter() - t0:.2f}s")
        daemon = build_daemon(
            root,
            work_dir=f"{tmp}/work",
            grace_seconds=1,
            settings={
                "runners": {
                    "local": {"attempts_dir": f"{tmp}/attempts", "supervisor": args.supervisor}
                }
            },
        )
        try:
            burst(daemon, names, args.timeout, "a: local burst")
            steady(daemon, args.cycles, f"b: {args.jobs} local running")
            wrappers_idle(args.idle_seconds, f"b: {args.jobs} local running")
        finally:
            stop_all(daemon, root)


def bench_docker(args: argparse.Namespace) -> None:
    import docker

    if not os.environ.get("DOCKER_HOST"):
        print('[c] skipped: DOCKER_HOST is not set (eval "$(bash scripts/docker_setup.sh)")')
        return
    if not args.image:
        print("[c] skipped: --image is needed")
        return
    client = docker.DockerClient(base_url=os.environ["DOCKER_HOST"])
    with tempfile.TemporaryDirectory() as tmp:
        root = f"{tmp}/root"
        quota = Path(root, "project-quotas", "project-quotas.config")
        quota.parent.mkdir(parents=True)
        quota.write_text(QUOTA.format(cpus=args.containers + 100))
        settings = {
            "runners": {"docker": {"image": args.image, "docker_host": os.environ["DOCKER_HOST"]}}
        }
        daemon = build_daemon(root, work_dir=f"{tmp}/work", grace_seconds=1, settings=settings)
        runner = daemon.runners.get("docker")
        starts: list[float] = []
        lock = threading.Lock()
        original = runner.start

        def timed_start(attempt):
            t = time.perf_counter()
            try:
                return original(attempt)
            finally:
                with lock:
                    starts.append(time.perf_counter() - t)

        runner.start = timed_start  # type: ignore[method-assign]
        docker_runner = {"kind": "docker", "image": args.image}
        try:
            names = [f"ctr-{i:03d}" for i in range(args.containers)]
            write_specs(root, names, "sleep 600", docker_runner)
            burst(daemon, names, args.timeout, f"c: {args.containers} containers burst")
            burst_starts = list(starts)
            if burst_starts:
                print(
                    f"[c] runner.start per container in the burst (parallel pool): "
                    f"p50 {statistics.median(burst_starts):.3f}s, max {max(burst_starts):.3f}s"
                )
            calls = count_engine_calls(runner._api())
            steady(daemon, args.cycles, f"c: {args.containers} containers running", calls)
            watchers_idle(args.idle_seconds, f"c: {args.containers} containers running")
            latencies = []
            starts.clear()
            for i in range(args.singles):
                name = f"single-{i:02d}"
                t0 = time.perf_counter()
                write_specs(root, [name], "sleep 600", docker_runner)
                while running(daemon, [name]) < 1 and time.perf_counter() - t0 < 60:
                    daemon.cycle(time.time())
                    time.sleep(0.02)
                latencies.append(time.perf_counter() - t0)
            print(
                f"[c] submit-to-RUNNING of a single container job (cycling back to back, "
                f"{args.singles} jobs): p50 {statistics.median(latencies):.3f}s, "
                f"min {min(latencies):.3f}s, max {max(latencies):.3f}s"
            )
            print(
                f"[c] runner.start per container one at a time: p50 "
                f"{statistics.median(starts):.3f}s, max {max(starts):.3f}s"
            )
        finally:
            stop_all(daemon, root)
            from bastion.runners.base import root_tag

            left = client.containers.list(
                all=True,
                filters={"label": f"bastion.root={root_tag(daemon.store.root_url)}"},
                ignore_removed=True,
            )
            for c in left:
                c.remove(force=True)
            print(f"[c] removed {len(left)} containers left after the runner's deletes")
            client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--idle_seconds", type=float, default=10, help="wrappers' CPU window")
    parser.add_argument(
        "--supervisor", choices=("shared", "forked"), default="shared", help="[runners.local]"
    )
    parser.add_argument("--docker", action="store_true")
    parser.add_argument("--no_local", action="store_true")
    parser.add_argument("--image", default=os.environ.get("BASTION_TEST_IMAGE"))
    parser.add_argument("--containers", type=int, default=50)
    parser.add_argument("--singles", type=int, default=10)
    args = parser.parse_args()
    print(f"cpus {os.cpu_count()}, python {sys.version.split()[0]}")
    if not args.no_local:
        bench_local(args)
    if args.docker:
        bench_docker(args)


if __name__ == "__main__":
    main()

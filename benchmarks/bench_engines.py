"""Cost of gke and slurm jobs: engine calls per daemon cycle and per job, and submit to RUNNING.

The real daemon (``build_daemon``) runs in this process with the real runner against the real
engine the tests use:

- ``gke``: the real kube-apiserver 1.20 with etcd and the garbage collector
  (tests/kube_cluster.py, built once by scripts/kube_setup.sh), and the harness that plays the
  JobSet controller, scheduler and kubelet against its API. The pods' agents are simulated in
  this process (``--jobs`` pods would otherwise be as many Python processes on a 2-core
  machine): when the harness starts a pod's container, ``SimAgent`` claims ``started`` through
  ``Store`` exactly as bastion/agent.py does; at the end it writes the exit record and the
  container exits 0. API calls are the runner's own count (``GkeRunner.calls``: every request
  goes through ``Cluster.call``).
- ``slurm``: the real two-node Slurm (tests/slurm_cluster.py: munged, slurmctld, two slurmd),
  real agents under ``srun``. ``--jobs`` jobs ask for a whole node each, so two run and the rest
  queue: the steady state is "N queued and running". Commands are the runner's count
  (``SlurmRunner.calls``, by command).

Phases per engine: intake (submit ``--jobs`` jobs; cycles until every one is placed; for gke
until every one is RUNNING), steady state (``--cycles`` cycles with nothing changing: engine
calls per cycle), for gke one spot eviction (cycles and seconds until the requeued attempt's
JobSet exists), finish (every job ends; cycles until every one is recorded finished and its
JobSet or Slurm job is gone: engine calls per job from submit to deleted, the steady cycles
taken out), and one job alone on an idle engine: seconds and cycles from submit to RUNNING.
Cycles run every ``--poll`` seconds (1; the CLI's default is 3).

    .venv/bin/python benchmarks/bench_engines.py [--engine gke slurm] [--jobs 200]
        [--slurm_jobs 200] [--cycles 5] [--poll 1]

About 4 minutes for gke and 6 for slurm (200 jobs each) on a 2-core machine.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bastion.bucket.store import Store
from bastion.daemon import Daemon
from bastion.daemon.start import build_daemon
from launch.api import Client, new_jobspec
from launch.status import NoDaemonWarning

QUOTA = """[toml-schema]
version = "1"
[total_resources]
v5p = 100000
gpu = 64
cpu = 100000
[project_membership]
default = [".*"]
[project_resources.default]
v5p = 1.0
gpu = 1.0
cpu = 1.0
"""


class Figures(dict):
    """The figures of one engine, printed as each is measured (a long run shows its progress
    and keeps what it measured if a later phase stalls)."""

    def __init__(self, engine: str, **first: Any) -> None:
        super().__init__()
        self.engine = engine
        for key, value in first.items():
            self[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        shown = round(value, 2) if isinstance(value, float) else value
        print(f"{self.engine:6s} {key:34s} {shown}", flush=True)


class SimAgent:
    """A pod's container: the agent's records through ``Store``, no process."""

    def __init__(self, store: Store, pod: dict[str, Any], env: dict[str, str]) -> None:
        meta = pod["metadata"]
        self.store = store
        self.job = (meta.get("annotations") or {})["bastion-job-name"]
        self.attempt = meta["labels"]["bastion-attempt-name"]
        self.worker = int(env.get("BASTION_GKE_WORKER_INDEX") or 0)
        self.returncode: int | None = None
        started = {
            "worker": self.worker,
            "time": time.time(),
            "host": meta["name"],
            "pid": 1000 + self.worker,
            "num_workers": 1,
            "command": "python3 train.py",
        }
        if store.agents.claim(self.job, self.attempt, self.worker, started):
            beat = {"worker": self.worker, "time": time.time(), "uploaded": 0}
            store.agents.write(self.job, self.attempt, self.worker, "heartbeat", beat)

    def finish(self, code: int, reason: str = "", preempted: bool = False) -> None:
        if self.returncode is not None:
            return
        record = {
            "worker": self.worker,
            "time": time.time(),
            "code": code,
            "preempted": preempted,
            "reason": reason or f"exited with status {code}",
            "output_bytes": 0,
            "chunks": 0,
        }
        self.store.agents.write(self.job, self.attempt, self.worker, "exit", record)
        self.returncode = code

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.finish(128 + sig, f"stopped by {signal.Signals(sig).name}")

    def kill(self) -> None:
        self.finish(137, "killed")

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


class Rig:
    """A root with a quota file, a daemon on it, and the helpers every phase uses."""

    def __init__(self, tmp: Path, kind: str, settings: dict[str, Any], poll: float) -> None:
        self.root, self.kind, self.poll = tmp / "root", kind, poll
        (self.root / "project-quotas").mkdir(parents=True)
        (self.root / "project-quotas" / "project-quotas.config").write_text(QUOTA)
        self.client = Client(str(self.root))
        all_settings = {"default_runner": "local", "runners": {kind: settings}}
        self.daemon: Daemon = build_daemon(
            str(self.root), work_dir=str(tmp / "work"), gpus=[], settings=all_settings
        )
        self.runner = self.daemon.runners.get(kind)

    def calls(self) -> int:
        counted = self.runner.calls
        return sum(counted.values()) if isinstance(counted, dict) else int(counted)

    def submit(self, name: str, command: str, resources: dict[str, int], **runner: Any) -> None:
        self.client.submit(
            new_jobspec(
                name=name,
                command=command,
                user_id="bench",
                project_id="default",
                resources=resources,
                runner={"kind": self.kind, **runner},
            )
        )

    def phase(self, name: str) -> str | None:
        state = self.client.get(name).state
        record = state.run_attempt if state else None
        return record.phase if record is not None else None

    def finished(self, name: str) -> bool:
        return (self.root / "jobs" / "complete" / name).exists()

    def cycle(self) -> int:
        """One daemon cycle; the engine calls it made."""
        before = self.calls()
        self.daemon.cycle(time.time())
        self.daemon.settle()
        return self.calls() - before

    def until(self, done: Callable[[], bool], what: str, limit: float = 900) -> tuple[int, float]:
        """Cycles every ``poll`` s until ``done()``: (cycles, seconds)."""
        began, cycles = time.monotonic(), 0
        while not done():
            if time.monotonic() - began > limit:
                raise SystemExit(f"timed out after {limit:.0f} s waiting for {what}")
            started = time.monotonic()
            self.cycle()
            cycles += 1
            time.sleep(max(0.0, self.poll - (time.monotonic() - started)))
        return cycles, time.monotonic() - began

    def close(self) -> None:
        self.daemon.close()


def steady(rig: Rig, cycles: int) -> list[int]:
    counts = []
    for _ in range(cycles):
        counts.append(rig.cycle())
        time.sleep(rig.poll)
    return counts


def one_job_latency(rig: Rig, submit: Callable[[str], None], name: str) -> tuple[int, float]:
    """Seconds and cycles from submit to the runner's RUNNING, alone on an idle engine."""
    submit(name)
    return rig.until(lambda: rig.phase(name) == "RUNNING", f"{name} RUNNING", 120)


def bench_gke(args: argparse.Namespace) -> dict[str, Any]:
    from tests.kube_cluster import Cluster, kube_server

    out = Figures("gke", jobs=args.jobs)
    with kube_server() as kube, tempfile.TemporaryDirectory(prefix="bench-gke-") as tmp_dir:
        tmp = Path(tmp_dir)
        out["apiserver_setup_s"] = round(kube.build_seconds, 1)
        store = Store(str(tmp / "root"))
        agents: list[SimAgent] = []

        def spawn(pod: dict[str, Any], env: dict[str, str]) -> SimAgent:
            agents.append(SimAgent(store, pod, env))
            return agents[-1]

        (tmp / "pods").mkdir()
        cluster = Cluster(kube, tmp / "pods", spawn=spawn)
        settings = {
            "kubeconfig": kube.kubeconfig,
            "image": "bench",
            "publish_package": False,
            "listing_ttl": 0,
            "heartbeat_timeout": 600,
            "termination_grace_seconds": 5,
        }
        rig = Rig(tmp, "gke", settings, args.poll)
        try:
            _gke_phases(rig, agents, cluster, args, out)
        finally:
            rig.close()
            cluster.close()
    return out


def _gke_phases(
    rig: Rig, agents: list[SimAgent], cluster: Any, args: argparse.Namespace, out: dict
) -> None:
    out["alone_cycles"], out["alone_s"] = one_job_latency(
        rig, lambda n: rig.submit(n, "sleep 600", {"v5p": 8}, instance_type="tpu-v5p-8"), "alone"
    )
    for agent in list(agents):
        agent.finish(0)
    rig.until(lambda: rig.finished("alone") and not cluster.jobsets(), "alone to go")
    names = [f"job{i:03d}" for i in range(args.jobs)]
    before = rig.calls()
    for name in names:
        rig.submit(name, "sleep 600", {"v5p": 8}, instance_type="tpu-v5p-8")
    out["intake_cycles"], out["intake_s"] = rig.until(
        lambda: all(rig.phase(n) == "RUNNING" for n in names), "every job RUNNING"
    )
    counts = steady(rig, args.cycles)
    out["steady_calls_per_cycle"] = counts
    out["evicted_to_new_jobset_cycles"], out["evicted_to_new_jobset_s"] = evict_one(
        rig, cluster, names[0]
    )

    def all_gone() -> bool:
        for agent in list(agents):  # also a requeued attempt's, whose pod may start later
            agent.finish(0)
        return all(rig.finished(n) for n in names) and not cluster.jobsets()

    finish = rig.until(all_gone, "every job gone")
    out["finish_cycles"], out["finish_s"] = finish
    total = rig.calls() - before - sum(counts)
    out["calls_per_job_submit_to_deleted"] = round(total / len(names), 2)


def evict_one(rig: Rig, cluster: Any, name: str) -> tuple[int, float]:
    """A spot eviction of the job's pod: cycles and seconds until its attempt 2's JobSet is
    in the cluster (the agent's exit record is written at the SIGTERM, as a real one flushes)."""
    first = rig.client.get(name).state.run_attempt.name
    (pod,) = [p for p in cluster.pods() if p["metadata"]["labels"]["bastion-attempt-name"] == first]
    cluster.evict(pod["metadata"]["name"])

    def requeued() -> bool:
        record = rig.client.get(name).state.run_attempt
        now = record.name if record is not None else first
        return now != first and any(a == now for a in cluster.attempts.values())

    return rig.until(requeued, f"{name}'s attempt 2 JobSet", 120)


def bench_slurm(args: argparse.Namespace) -> dict[str, Any]:
    from tests.slurm_cluster import _stop, start_cluster

    out = Figures("slurm", jobs=args.slurm_jobs)
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp_dir:
        tmp = Path(tmp_dir)
        (tmp / "slurm").mkdir()
        cluster = start_cluster(tmp / "slurm")
        import os

        os.environ["SLURM_CONF"] = str(cluster.conf)
        settings = {
            "python": sys.executable,
            "agent_args": ["--chunk_seconds=0.5", "--heartbeat_seconds=5", "--grace_seconds=2"],
            "listing_ttl": 0,
            "heartbeat_timeout": 600,
            "jobcomp_file": str(cluster.jobcomp),
        }
        rig = Rig(tmp, "slurm", settings, args.poll)
        try:
            _slurm_phases(rig, args, out, os.cpu_count() or 1)
        finally:
            rig.close()
            cluster.quiesce(timeout=60)
            _stop(tmp / "slurm")
    return out


def _slurm_phases(rig: Rig, args: argparse.Namespace, out: dict, cpus: int) -> None:
    out["alone_cycles"], out["alone_s"] = one_job_latency(
        rig, lambda n: rig.submit(n, "sleep 2", {"cpu": 1}), "alone"
    )
    rig.until(lambda: rig.finished("alone"), "alone to finish")
    names = [f"job{i:03d}" for i in range(args.slurm_jobs)]
    before = rig.calls()
    for name in names:
        rig.submit(name, "sleep 20", {"cpu": cpus})  # a whole node: two run, the rest queue
    out["intake_cycles"], out["intake_s"] = rig.until(
        lambda: all(rig.phase(n) in ("QUEUED", "RUNNING", "PROVISIONING") for n in names),
        "every job submitted",
    )
    counts = steady(rig, args.cycles)
    out["steady_calls_per_cycle"] = counts
    out["steady_by_command"] = dict(rig.runner.calls)
    for name in names:
        rig.client.cancel(name, user_id="bench")
    out["finish_cycles"], out["finish_s"] = rig.until(
        lambda: (
            all(rig.finished(n) for n in names)
            and not [r for r in rig.runner.listing()[1] if r.live]
        ),
        "every job gone",
    )
    total = rig.calls() - before - sum(counts)
    out["calls_per_job_submit_to_deleted"] = round(total / len(names), 2)
    out["by_command"] = dict(rig.runner.calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", nargs="+", default=["gke", "slurm"], choices=["gke", "slurm"])
    parser.add_argument("--jobs", type=int, default=200, help="gke jobs")
    parser.add_argument("--slurm_jobs", type=int, default=200, help="slurm jobs")
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--poll", type=float, default=1.0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=NoDaemonWarning)  # the daemon is in-process
    # A SIGTERM (timeout, ^C from a supervisor) unwinds, so the apiserver, etcd and slurmd
    # this run started are stopped by their context managers instead of left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for engine in args.engine:
        bench_gke(args) if engine == "gke" else bench_slurm(args)


if __name__ == "__main__":
    main()

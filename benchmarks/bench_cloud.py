"""Cost of cloud jobs: API calls, bucket requests and seconds per daemon cycle with N TPU jobs.

The real daemon (``build_daemon``) runs in this process with the real TPU runner and the real
googleapiclient against the TPU stand-in (tests/standins/tpu.py) on 127.0.0.1. For each N in
``--jobs`` (default 100 and 1,000):

- N jobs ``--accelerator`` (default v4-8: one worker per node; v4-32 gives 4), spot, are
  submitted as ``bastion launch --instance_type=tpu-v4-8 --spot`` writes them, with a quota
  file giving room for all of them.
- Three zones in three regions. The stand-in holds at most ceil(N/3) nodes in each of the
  first two zones: a create beyond that answers 429 with a QuotaFailure (as a region's TPU
  quota does), the runner blocks that region and creates in the next zone. So the nodes end
  up spread over the three zones, a third each.
- The agents are simulated in this process (no 4,000 processes): when a node turns READY the
  stand-in's ``on_ready`` hook claims ``started`` for each worker through ``Store`` exactly as
  bastion/agent.py does; then, on a virtual clock, every worker writes ``heartbeat`` every
  ``--heartbeat`` s (10, the agent's default) and, when its command prints, a numbered output
  chunk then its ``progress`` record, at most every ``--chunk`` s (5, the agent's default,
  uploading at once after a quiet spell as the agent does); at the end a last chunk and the
  ``exit`` record (``preempted`` after a preemption notice).

Time is compressed: one daemon cycle stands for ``--poll`` (3, the CLI's default) virtual
seconds; the agents and the stand-in (one ``tick()`` per cycle, 2 ticks to provision, 1 to
delete) move by that much between cycles, while the cycles run back to back (at least the
runner's ``listing_ttl``, 1 s, apart, so each cycle lists afresh as a real 3 s poll would).
The daemon judges heartbeats on its own real clock, so ``heartbeat_timeout`` is raised to
600 s: compressed time must not make a worker look late or lost (a beat is a listing token
changing, never a read, so this changes no count).

Latency model: every API call waits ``--api_latency`` (20 ms) in the stand-in before it is
served (the server is threaded: calls do not queue behind one another); every bucket request
of the daemon waits ``--latency`` (20 ms) in ``LatencyBucket`` (benchmarks/bench_bucket.py: a
local directory answering like GCS; a listing counts one request per 800 names, and the
agents' recursive listing is counted the same way here). Bucket requests are counted there, on
both of the daemon's stores (its own and the TPU runner's: ``CycleReport.ops`` counts the
daemon's store only, so it misses the agents' listing, record and chunk reads), plus the
quota file's change token, which goes through a client of its own (taken from
``CycleReport.ops``, not delayed). The agents' writes are neither delayed nor counted. API
calls are counted from the stand-in's request log.

Seconds are this process's: the stand-in serves its listings (a JSON copy of every node) from
the same process, and the local directory's recursive listing stats every object, so at 1,000
jobs part of a cycle's seconds is theirs, not the daemon's (on GCS the agents' listing is a
few pages fetched in parallel).

Phases per N: intake (submit to every job RUNNING with its worker started), steady state
(``--cycles`` cycles, heartbeats only), output (``--probes`` jobs print a line a cycle at a
random moment: time until the bytes are in ROOT/logs/<job>), preemption (``--preempt`` nodes
preempted, with their agents' last chunk and preempted exit record: cycles until attempt 2
is created and until it runs), finish (every command exits 0: cycles until every job is
recorded finished and every node is deleted).

    .venv/bin/python benchmarks/bench_cloud.py [--jobs 100 1000] [--cycles 10] [--probes 20]
        [--preempt 5] [--accelerator v4-8] [--latency 0.02] [--api_latency 0.02]

About 3 minutes for ``--jobs 100 1000`` on a 2-core machine; ``--jobs 1000 --accelerator
v4-32`` (4,000 simulated agents) about 5.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # before gcsfs loads

from bastion.bucket.store import Store  # noqa: E402
from bastion.daemon import Daemon  # noqa: E402
from bastion.daemon.start import build_daemon  # noqa: E402
from bastion.runners.google.tpu import TpuRunner, hosts  # noqa: E402
from benchmarks.bench_bucket import LatencyBucket, percentile  # noqa: E402
from launch.api import Client, NoDaemonWarning, new_jobspec  # noqa: E402
from tests.standins.common import ApiError, _Handler, rpc_error  # noqa: E402
from tests.standins.tpu import TpuServer  # noqa: E402

PROJECT = "bench-project"
ZONES = ["us-central2-b", "us-central1-a", "europe-west4-a"]  # three regions
QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
v4 = {v4}
[project_membership]
default = [".*"]
[project_resources.default]
v4 = 1.0
"""


# -- the latency models ----------------------------------------------------------------------


class Bucket(LatencyBucket):
    """LatencyBucket, with the recursive listing (``find``: the agents' records) paged and
    delayed like ``list`` (GcsObjects lists both in ranges of 800 names, 16 at a time)."""

    def __getattr__(self, name: str) -> Any:
        if name != "find":
            return super().__getattr__(name)
        method = self.inner.find

        def request(*args: Any, **kwargs: Any) -> Any:
            time.sleep(self.latency)
            result = method(*args, **kwargs)
            pages = max(1, -(-len(result) // 800)) if len(result) > 1000 else 1
            time.sleep(self.latency * (-(-pages // 16) - 1))
            with self._lock:
                self.routes["find"] += pages
            return result

        return request


class _Server(ThreadingHTTPServer):
    request_queue_size = 2048


class SlowTpuServer(TpuServer):
    """The TPU stand-in with ``delay`` seconds per API call (outside its lock: calls run in
    parallel, as on the real API) and at most ``capacity[zone]`` nodes in a zone (a create
    beyond answers 429 QuotaFailure, as a region's quota does)."""

    def __init__(self, delay: float, capacity: dict[str, int], **kw: Any) -> None:
        super().__init__(**kw)
        self.delay, self.capacity = delay, capacity
        self.refused: collections.Counter[str] = collections.Counter()  # attempt -> 429s

    def start(self) -> SlowTpuServer:
        """As StandinServer.start, with a listen backlog for a thousand concurrent creates
        (the stdlib's 5 resets connections: a stand-in limit, not the API's)."""
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.standin = self  # type: ignore[attr-defined]
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def _create_node(self, parent: str, query: dict, body: dict) -> Any:
        try:
            return super()._create_node(parent, query, body)
        except ApiError as e:
            if e.status == 429:
                self.refused[query.get("nodeId", "")] += 1
            raise

    def _handle(self, h: Any) -> None:
        time.sleep(self.delay)
        super()._handle(h)

    def _guard_create(self, parent: str) -> None:
        super()._guard_create(parent)
        zone = parent.rsplit("/", 1)[1]
        cap = self.capacity.get(zone)
        if cap is not None and sum(1 for k in self.nodes if k.startswith(parent + "/")) >= cap:
            region = zone.rsplit("-", 1)[0]
            message = (
                f"Quota 'TPUV4PodPerProjectPerRegionForTPUAPI' exhausted. Limit {cap * 8} "
                f"in region {region}"
            )
            raise rpc_error(
                429,
                "RESOURCE_EXHAUSTED",
                message,
                [
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [{"subject": f"project:{PROJECT}", "description": message}],
                    }
                ],
            )


# -- the simulated agents --------------------------------------------------------------------


@dataclass
class Worker:
    job: str
    attempt: str
    index: int
    num_workers: int
    next_beat: float
    next_chunk: float = float("-inf")
    seq: int = 0
    uploaded: int = 0
    pending: list[tuple[float, bytes]] = field(default_factory=list)  # (printed at, bytes)


class Agents:
    """What bastion/agent.py writes, per worker, through its own (uncounted) Store."""

    def __init__(self, root: str, heartbeat: float, chunk: float, seed: int) -> None:
        self.store = Store(root)
        self.heartbeat, self.chunk = heartbeat, chunk
        self.rng = random.Random(seed)
        self.clock = 0.0  # virtual seconds
        self.workers: dict[tuple[str, int], Worker] = {}  # (attempt, worker) ->
        self.uploads: list[tuple[str, bytes, float, float]] = []  # job, bytes, printed, stored
        self.lock = threading.Lock()

    def _record(self, w: Worker, **fields: Any) -> dict[str, Any]:
        return {"worker": w.index, "time": time.time(), **fields}

    def on_ready(self, node: dict, worker: int, metadata: dict) -> None:
        """The startup script ran the agent on this worker: it claims ``started`` and beats."""
        job = metadata["bastion-job-name"]
        attempt = node["name"].rsplit("/", 1)[1]
        w = Worker(
            job,
            attempt,
            worker,
            len(node.get("networkEndpoints") or []) or 1,
            next_beat=self.clock + self.rng.uniform(0, self.heartbeat),
        )
        started = self._record(
            w,
            host=f"{attempt}-w{worker}",
            pid=1000 + worker,
            num_workers=w.num_workers,
            command="python3 train.py",
        )
        if self.store.agents.claim(job, attempt, worker, started):
            beat = self._record(w, uploaded=0, host=started["host"])
            self.store.agents.write(job, attempt, worker, "heartbeat", beat)
            with self.lock:
                self.workers[(attempt, worker)] = w

    def of_job(self, job: str) -> list[Worker]:
        return [w for w in self.workers.values() if w.job == job]

    def say(self, job: str, data: bytes, at: float) -> None:
        """Worker 0 of the job's attempt prints ``data`` at virtual time ``at``."""
        for w in self.of_job(job):
            if w.index == 0:
                w.pending.append((at, data))

    def _flush(self, w: Worker, at: float) -> None:
        if not w.pending:
            return
        data = b"".join(d for _, d in w.pending)
        self.store.runs.write_chunk(w.job, w.attempt, w.index, w.seq, data)
        w.seq += 1
        w.uploaded += len(data)
        self.store.agents.write(
            w.job, w.attempt, w.index, "progress", self._record(w, chunks=w.seq, bytes=w.uploaded)
        )
        self.uploads += [(w.job, d, printed, at) for printed, d in w.pending]
        w.pending = []
        w.next_chunk = at + self.chunk

    def advance(self, to: float) -> None:
        """Virtual time moves to ``to``: heartbeats and chunk uploads due meanwhile, in order."""
        events = []
        for w in list(self.workers.values()):
            t = w.next_beat
            while t <= to:
                events.append((t, 0, w))
                t += self.heartbeat
            w.next_beat = t
            if w.pending:  # the agent's loop: upload once the chunk period has passed
                at = max(w.pending[0][0], w.next_chunk)
                if at <= to:
                    events.append((at, 1, w))
        for at, kind, w in sorted(events, key=lambda e: (e[0], e[1])):
            if kind == 0:
                self.store.agents.write(
                    w.job, w.attempt, w.index, "heartbeat", self._record(w, uploaded=w.uploaded)
                )
            else:
                self._flush(w, at)
        self.clock = to

    def exit(self, job: str, code: int, preempted: bool = False, reason: str = "") -> None:
        """Every worker of the job's attempt: last chunk, then the exit record."""
        for w in self.of_job(job):
            self._flush(w, self.clock)
            record = self._record(
                w,
                code=code,
                preempted=preempted,
                reason=reason or f"exited with status {code}",
                output_bytes=w.uploaded,
                chunks=w.seq,
            )
            self.store.agents.write(w.job, w.attempt, w.index, "exit", record)
            with self.lock:
                self.workers.pop((w.attempt, w.index), None)


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Cycle:
    phase: str
    seconds: float  # CycleReport.seconds (the cycle; its effects run in the pool after it)
    settle: float  # the effects' time after the cycle returned
    api: collections.Counter[str]
    bucket: dict[str, int]
    store_ops: dict[str, int]  # CycleReport.ops: the daemon's own store only
    at: float = 0.0  # virtual time at which it ran
    phases: dict[str, float] = field(default_factory=dict)  # CycleReport.phases

    @property
    def api_calls(self) -> int:
        return sum(self.api.values())

    @property
    def requests(self) -> int:
        return sum(self.bucket.values())


def api_kind(method: str, path: str) -> str:
    tail = path.rstrip("/").rsplit("/", 2)
    if method == "GET" and tail[-1] == "nodes":
        return "list"
    if method == "POST" and tail[-1] == "nodes":
        return "create"
    if "/operations/" in path:
        return "get op"
    return {"GET": "get node", "DELETE": "delete"}.get(method, method)


class Bench:
    def __init__(self, n: int, args: argparse.Namespace, tmp: Path) -> None:
        self.n, self.args, self.tmp = n, args, tmp
        self.root = str(tmp / "root")
        self.users = Client(self.root)
        quota = Path(self.root, "project-quotas", "project-quotas.config")
        quota.parent.mkdir(parents=True, exist_ok=True)
        per = int(args.accelerator.split("-")[1])
        quota.write_text(QUOTA.format(v4=per * n))
        self.agents = Agents(self.root, args.heartbeat, args.chunk, args.seed)
        cap = math.ceil(n / 3)
        self.server = SlowTpuServer(
            args.api_latency,
            {ZONES[0]: cap, ZONES[1]: cap},
            seconds_per_tick=args.poll,
            on_ready=self.agents.on_ready,
        )
        self.server.start()
        tpu = {
            "project": PROJECT,
            "zones": ZONES,
            "api_endpoint": self.server.endpoint,
            "publish_package": False,
            "heartbeat_timeout": 600,
        }
        self.daemon: Daemon = build_daemon(
            self.root,
            work_dir=str(tmp / "work"),
            gpus=[],
            settings={"default_runner": "local", "runners": {"tpu": tpu}},
        )
        runner = self.daemon.runners.get("tpu")
        assert isinstance(runner, TpuRunner)
        self.runner = runner
        runner.sleep = lambda _s: None
        self.buckets = [
            Bucket(self.daemon.store.objects, args.latency),
            Bucket(runner.store.objects, args.latency),
        ]
        self.daemon.store.bucket.objects, runner.store.bucket.objects = self.buckets
        self.cycles: list[Cycle] = []
        self.last_end = 0.0

    def close(self) -> None:
        self.daemon.close()
        self.server.stop()

    # -- driving -----------------------------------------------------------------------------

    def submit(self) -> float:
        specs = [
            new_jobspec(
                name=f"job-{i:05d}",
                command="python3 train.py",
                user_id="bench",
                project_id="default",
                resources={"v4": int(self.args.accelerator.split("-")[1])},
                runner={"kind": "tpu", "accelerator_type": self.args.accelerator, "spot": True},
            )
            for i in range(self.n)
        ]
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(self.users.submit, specs))
        return time.perf_counter() - t0

    def step(self, phase: str) -> Cycle:
        """One poll: the cycle, its effects, then the cloud and the agents move one poll on."""
        wait = self.runner.listing_ttl + 0.05 - (time.monotonic() - self.last_end)
        if wait > 0:
            time.sleep(wait)
        for b in self.buckets:
            b.reset()
        before = len(self.server.requests)
        report = self.daemon.cycle(time.time())
        t0 = time.monotonic()
        self.daemon.settle(timeout=300)
        settle = time.monotonic() - t0
        with self.server.lock:
            calls = self.server.requests[before:]
        bucket: collections.Counter[str] = collections.Counter()
        for b in self.buckets:
            bucket.update(b.stats()["routes"])
        # The quota file's change token goes through a client of its own (QuotaFiles._objects_of),
        # which LatencyBucket does not see; CycleReport.ops counts it as "info".
        quota = report.ops.get("info", 0) - bucket.get("info", 0)
        if quota > 0:
            bucket["quota info"] = quota
        cycle = Cycle(
            phase,
            report.seconds,
            settle,
            collections.Counter(api_kind(m, p) for m, p, _, _ in calls),
            dict(bucket),
            dict(report.ops),
            self.agents.clock,
            dict(report.phases),
        )
        self.cycles.append(cycle)
        self.last_end = time.monotonic()
        self.server.tick()  # the cloud: nodes turn READY (agents start), deletions finish
        self.agents.advance(self.agents.clock + self.args.poll)
        if self.args.verbose:
            print(
                f"    {phase} {len(self.cycles)}: {cycle.seconds:.2f}+{settle:.2f} s, api "
                f"{dict(cycle.api)}, bucket {cycle.bucket}",
                flush=True,
            )
        return cycle

    def record(self, job: str) -> dict[str, Any]:
        j = self.daemon.jobs.get(job)
        record = j.state.run_attempt if j is not None else None
        return record.to_json() if record is not None else {}

    def running(self, job: str, attempt: int = 1) -> bool:
        j = self.daemon.jobs.get(job)
        if j is None or j.state.attempt != attempt:
            return False
        r = j.state.run_attempt
        workers = (r.workers if r is not None else None) or ("waiting",)
        return r is not None and r.phase == "RUNNING" and all(w == "running" for w in workers)

    def until(self, phase: str, done: Any, limit: int) -> int:
        for i in range(limit):
            if done():
                return i
            self.step(phase)
        if not done():
            raise RuntimeError(f"{phase}: not done after {limit} cycles")
        return limit

    # -- phases ------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        args, n = self.args, self.n
        names = [f"job-{i:05d}" for i in range(n)]
        out: dict[str, Any] = {"n": n, "submit_s": self.submit()}
        t0 = time.monotonic()
        self.until("intake", lambda: all(self.running(j) for j in names), 40)
        out["intake_wall"] = time.monotonic() - t0
        out["zones"] = collections.Counter(n.split("/")[3] for n in self.server.nodes)

        steady = [self.step("steady") for _ in range(args.cycles)]
        out["steady"] = steady

        rng = random.Random(args.seed + 1)
        probes = names[:: max(1, n // args.probes)][: args.probes]
        seen_at: dict[bytes, int] = {}  # line -> index of the cycle after which it is in the log
        lines: list[tuple[str, bytes, float]] = []  # job, line, printed at (virtual)
        for k in range(args.output_cycles + 4):  # the last 4: the last lines' uploads
            if k < args.output_cycles:
                for job in probes:  # a line at a random moment of the next poll interval
                    at = self.agents.clock + rng.uniform(0, args.poll)
                    line = f"{job} line {k} {rng.random():.9f}\n".encode()
                    self.agents.say(job, line, at)
                    lines.append((job, line, at))
            self.step("output")
            logs = {j: Path(self.root, "logs", j).read_bytes() for j in probes}
            for job, line, _ in lines:
                if line not in seen_at and line in logs[job]:
                    seen_at[line] = len(self.cycles) - 1
        out["latency"] = self.latencies(lines, seen_at)
        out["output"] = [c for c in self.cycles if c.phase == "output"][: args.output_cycles]

        victims = [j for j in names if j not in probes][: args.preempt]
        first_names = {j: self.record(j)["name"] for j in victims}
        for job in victims:  # the notice: the node turns PREEMPTED, the agent flushes and exits
            self.server.preempt(first_names[job])
            self.agents.exit(job, 143, preempted=True, reason="preempted by the provider")
        seen: dict[str, dict[str, int]] = {j: {} for j in victims}
        for i in range(1, 30):
            self.step("preempt")
            for j in victims:
                rec, job = self.record(j), self.daemon.jobs[j]
                if job.state.attempt >= 2:
                    seen[j].setdefault("requeued", i)
                    if rec.get("handle"):
                        seen[j].setdefault("created", i)
                    if self.running(j, 2):
                        seen[j].setdefault("running", i)
                short = first_names[j]
                if not any(k.endswith("/" + short) for k in self.server.nodes):
                    seen[j].setdefault("old deleted", i)
            if all(len(s) == 4 for s in seen.values()):
                break
        out["preempt"] = seen

        for job in names:
            self.agents.exit(job, 0)
        t0 = time.monotonic()
        out["finish_cycles"] = self.until(
            "finish", lambda: not self.daemon.jobs and not self.server.nodes, 60
        )
        out["finish_wall"] = time.monotonic() - t0
        out["per_job"] = self.per_job(set(first_names.values()))
        out["cycles"] = self.cycles
        return out

    def latencies(
        self, lines: list[tuple[str, bytes, float]], seen_at: dict[bytes, int]
    ) -> dict[str, list[float]]:
        """Per line printed: the daemon cycles that started after it was printed, up to the
        one after which it was in ROOT/logs/<job>; and virtual seconds from its printing to
        the end of that cycle (which starts at its ``--poll`` boundary and lasts its measured
        seconds). ``upload_s``: from printing to the agent's chunk upload."""
        stored = {d: at for _, d, _, at in self.agents.uploads}
        result: dict[str, list[float]] = {"cycles": [], "seconds": [], "upload_s": []}
        for job, line, printed in lines:
            j = seen_at.get(line)
            if j is None:
                raise RuntimeError(f"{job}: {line!r} never reached the bucket log")
            copied = self.cycles[j]
            result["cycles"].append(sum(1 for c in self.cycles[: j + 1] if c.at > printed))
            result["seconds"].append(copied.at + copied.seconds - printed)
            result["upload_s"].append(stored[line] - printed)
        return result

    def per_job(self, preempted: set[str]) -> dict[str, Any]:
        """API calls naming one attempt (create, get op, get node, delete), by job."""
        ops = {
            name: op["metadata"]["target"].rsplit("/", 1)[1] for name, op in self.server.ops.items()
        }
        per_attempt: collections.Counter[str] = collections.Counter()
        kinds: collections.Counter[str] = collections.Counter()
        shared = 0
        for method, path, query, _ in self.server.requests:
            kind = api_kind(method, path)
            if kind == "list":
                shared += 1
                continue
            if kind == "create":
                attempt = query.get("nodeId", "")
            elif kind == "get op":
                attempt = ops.get(path.split("/v2/", 1)[1], "?")
            else:
                attempt = path.rstrip("/").rsplit("/", 1)[1]
            per_attempt[attempt] += 1
            if attempt not in preempted:
                kinds[kind] += 1
        for attempt, refused in self.server.refused.items():
            if attempt not in preempted:
                kinds["create"] -= refused
                kinds["create refused (zone full)"] += refused
        plain = [v for a, v in per_attempt.items() if a not in preempted]
        return {
            "plain": plain,
            "kinds": kinds,
            "shared_lists": shared,
            "attempts": len(per_attempt),
        }


# -- report --------------------------------------------------------------------------------------


def fmt_counts(counter: dict[str, float]) -> str:
    """``a 1, b 2``, by name."""
    return (
        ", ".join(
            f"{k} {v:,.0f}" if float(v).is_integer() else f"{k} {v:.3g}"
            for k, v in sorted(counter.items())
        )
        or "none"
    )


def median_counts(cycles: list[Cycle], attr: str) -> dict[str, float]:
    keys = {k for c in cycles for k in getattr(c, attr)}
    return {k: statistics.median(getattr(c, attr).get(k, 0) for c in cycles) for k in keys}


def report(out: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    n, steady, cycles = out["n"], out["steady"], out["cycles"]
    print(
        f"\n== N = {n:,} running TPU jobs ({args.accelerator}, "
        f"{out['zones'][ZONES[0]]}/{out['zones'][ZONES[1]]}/{out['zones'][ZONES[2]]} nodes in "
        f"{', '.join(ZONES)}) =="
    )
    by_phase: dict[str, list[Cycle]] = collections.defaultdict(list)
    for c in cycles:
        by_phase[c.phase].append(c)
    print(
        f"  submitted in {out['submit_s']:.1f} s; intake {len(by_phase['intake'])} cycles "
        f"({out['intake_wall']:.0f} s wall), finish {out['finish_cycles']} cycles "
        f"({out['finish_wall']:.0f} s wall)"
    )
    print(
        f"  {'phase':<8} {'cycles':>6} {'API calls':>9} {'API/cycle':>9} "
        f"{'bucket req':>10} {'req/cycle':>9} {'s/cycle':>8}  API calls by kind"
    )
    for phase in ("intake", "steady", "output", "preempt", "finish"):
        cs = by_phase.get(phase, [])
        if not cs:
            continue
        api = sum(c.api_calls for c in cs)
        req = sum(c.requests for c in cs)
        kinds: collections.Counter[str] = collections.Counter()
        for c in cs:
            kinds.update(c.api)
        secs = statistics.median(c.seconds + c.settle for c in cs)
        print(
            f"  {phase:<8} {len(cs):>6} {api:>9,} {api / len(cs):>9.1f} {req:>10,} "
            f"{req / len(cs):>9.1f} {secs:>8.2f}  {fmt_counts(kinds)}"
        )
    s_api = [c.api_calls for c in steady]
    s_req = [c.requests for c in steady]
    s_sec = [c.seconds + c.settle for c in steady]
    print(f"  steady state, per cycle (median of {len(steady)}; min-max):")
    print(
        f"    API calls        {statistics.median(s_api):g} ({min(s_api)}-{max(s_api)}): "
        f"{fmt_counts(median_counts(steady, 'api'))}"
    )
    print(
        f"    bucket requests  {statistics.median(s_req):g} ({min(s_req)}-{max(s_req)}): "
        f"{fmt_counts(median_counts(steady, 'bucket'))}"
    )
    print(
        f"      (CycleReport.ops, the daemon's own store only: "
        f"{fmt_counts(median_counts(steady, 'store_ops'))})"
    )
    print(
        f"    seconds          {statistics.median(s_sec):.3f} ({min(s_sec):.3f}-"
        f"{max(s_sec):.3f})  [{args.api_latency * 1000:.0f} ms per API call, "
        f"{args.latency * 1000:.0f} ms per bucket request]"
    )
    phases = median_counts(steady, "phases")
    top = sorted(phases.items(), key=lambda kv: -kv[1])[:4]
    print("      by phase (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in top))
    lat = out["latency"]
    o_req = [c.requests for c in out["output"]]
    print(
        f"  output ({args.probes} jobs print a line a cycle, {len(lat['cycles'])} lines): "
        f"output to bucket log p50 {percentile(lat['cycles'], 0.5):g} / p95 "
        f"{percentile(lat['cycles'], 0.95):g} cycles = p50 "
        f"{percentile(lat['seconds'], 0.5):.1f} / p95 {percentile(lat['seconds'], 0.95):.1f} s "
        f"(of which the agent's chunk wait p50 {percentile(lat['upload_s'], 0.5):.1f} / p95 "
        f"{percentile(lat['upload_s'], 0.95):.1f} s); bucket requests per cycle median "
        f"{statistics.median(o_req):g}"
    )
    pre = out["preempt"]
    rows = {
        k: [s[k] for s in pre.values() if k in s]
        for k in ("requeued", "created", "running", "old deleted")
    }
    print(
        f"  preemption ({len(pre)} nodes), cycles after the notice (median, max): "
        + ", ".join(f"{k} {statistics.median(v):g}, {max(v)}" for k, v in rows.items() if v)
    )
    pj = out["per_job"]
    plain = pj["plain"]
    print(
        f"  API calls per job, submit to deleted (not preempted, {len(plain)} jobs): median "
        f"{statistics.median(plain):g} (min {min(plain)}, max {max(plain)}): "
        f"{fmt_counts({k: v / len(plain) for k, v in pj['kinds'].items()})}; plus the "
        f"listings shared by all jobs: {pj['shared_lists']:,} over {len(cycles)} cycles "
        f"= {pj['shared_lists'] / n:.1f} per job"
    )
    return {
        "n": n,
        "api": statistics.median(s_api),
        "req": statistics.median(s_req),
        "s": statistics.median(s_sec),
        "lat": lat,
        "pre": rows,
        "per_job": plain,
        "lists_per_job": pj["shared_lists"] / n,
        "intake_api": sum(c.api_calls for c in by_phase["intake"]),
        "intake_lists": sum(c.api.get("list", 0) for c in by_phase["intake"]),
    }


def summary(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nsummary ({args.accelerator}, 3 zones; steady state: median per cycle; "
        f"{args.api_latency * 1000:.0f} ms per API call, {args.latency * 1000:.0f} ms per "
        f"bucket request; 1 cycle = {args.poll:g} s poll)"
    )
    print(
        f"{'jobs':>6} | {'API/cycle':>9} {'req/cycle':>9} {'s/cycle':>7} | "
        f"{'out p50':>7} {'p95':>4} {'p50 s':>6} {'p95 s':>6} | {'preempt->create':>15} "
        f"{'->run':>5} | {'API/job':>7} {'lists/job':>9} | {'intake API':>10} "
        f"{'lists':>6}"
    )
    for r in results:
        lat, pre = r["lat"], r["pre"]
        print(
            f"{r['n']:>6,} | {r['api']:>9g} {r['req']:>9g} {r['s']:>7.3f} | "
            f"{percentile(lat['cycles'], 0.5):>7g} {percentile(lat['cycles'], 0.95):>4g} "
            f"{percentile(lat['seconds'], 0.5):>6.1f} {percentile(lat['seconds'], 0.95):>6.1f} | "
            f"{statistics.median(pre['created']):>15g} {statistics.median(pre['running']):>5g} | "
            f"{statistics.median(r['per_job']):>7g} {r['lists_per_job']:>9.1f} | "
            f"{r['intake_api']:>10,} {r['intake_lists']:>6,}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--cycles", type=int, default=10, help="steady-state cycles measured")
    parser.add_argument("--probes", type=int, default=20, help="jobs that print, for latency")
    parser.add_argument("--output_cycles", type=int, default=8)
    parser.add_argument("--preempt", type=int, default=5)
    parser.add_argument("--accelerator", default="v4-8", help="v4-8: 1 worker; v4-32: 4")
    parser.add_argument("--poll", type=float, default=3.0, help="virtual seconds per cycle")
    parser.add_argument("--heartbeat", type=float, default=10.0)
    parser.add_argument("--chunk", type=float, default=5.0)
    parser.add_argument("--latency", type=float, default=0.02, help="per bucket request")
    parser.add_argument("--api_latency", type=float, default=0.02, help="per API call")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore", NoDaemonWarning)  # the specs are written before it starts
    print(__doc__.splitlines()[0])
    print(
        f"  the real daemon, TPU runner and googleapiclient against the TPU stand-in, in this "
        f"process; {args.accelerator} spot nodes ({hosts(args.accelerator)} worker(s) "
        f"each), "
        f"3 zones in 3 regions (the first two hold ceil(N/3) nodes each);\n"
        f"  agents simulated through Store as bastion/agent.py writes: started, heartbeat every "
        f"{args.heartbeat:g} s, output chunk + progress at most every {args.chunk:g} s, exit;\n"
        f"  time compressed: 1 cycle = {args.poll:g} virtual s (the CLI's poll) for the agents "
        f"and the stand-in (2 ticks to provision, 1 to delete); cycles run back to back;\n"
        f"  latency: {args.api_latency * 1000:.0f} ms per API call (in the stand-in, in "
        f"parallel), {args.latency * 1000:.0f} ms per bucket request of the daemon "
        f"(LatencyBucket; a listing is a request per 800 names); s/cycle = the cycle plus its "
        f"effects in the pool"
    )
    results = []
    for n in args.jobs:
        with tempfile.TemporaryDirectory(prefix=f"bench-cloud-{n}-") as tmp:
            bench = Bench(n, args, Path(tmp))
            try:
                results.append(report(bench.run(), args))
            finally:
                bench.close()
    summary(results, args)


if __name__ == "__main__":
    main()

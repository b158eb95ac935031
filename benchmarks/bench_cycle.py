"""Cost of a daemon cycle on a local root: seconds and bucket operations per cycle.

Submits N jobs (default 1,000), of which --running fit in the pool and start (each a real
`sleep` process), the rest wait. Then it runs the daemon's cycle in-process and reports the
admission cycle and the steady-state cycles, with bucket operations counted at the store layer.
The figure we want: a steady-state cycle lists and reads or writes nothing else.

    .venv/bin/python benchmarks/bench_cycle.py [--jobs 1000] [--running 50] [--cycles 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bastion.daemon.start import build_daemon
from bastion.jobstate import Status
from launch.api import Client, new_jobspec

QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
cpu = {running}
[project_membership]
default = [".*"]
[project_resources.default]
cpu = 1.0
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--running", type=int, default=50)
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = f"{tmp}/root"
        client = Client(root)
        quota = Path(root, "project-quotas", "project-quotas.config")
        quota.parent.mkdir(parents=True)
        quota.write_text(QUOTA.format(running=args.running))
        t0 = time.perf_counter()
        for i in range(args.jobs):
            client.submit(
                new_jobspec(
                    name=f"job-{i:05d}",
                    command="sleep 3600",
                    user_id="bench",
                    project_id="default",
                    resources={"cpu": 1},
                )
            )
        print(f"submitted {args.jobs} jobs in {time.perf_counter() - t0:.2f}s")

        daemon = build_daemon(root, work_dir=f"{tmp}/work")
        try:
            first = daemon.cycle(time.time())
            running = sum(1 for j in daemon.jobs.values() if j.state.status is Status.ACTIVE)
            print(
                f"admission cycle: {first.seconds:.3f}s, ops {dict(sorted(first.ops.items()))}, "
                f"{running} running, {len(daemon.jobs) - running} pending"
            )
            daemon.settle()  # the starts run in the I/O pool; their handles are recorded next
            daemon.cycle(time.time())
            steady = [daemon.cycle(time.time()) for _ in range(args.cycles)]
            seconds = [r.seconds for r in steady]
            print(
                f"steady-state cycle: median {statistics.median(seconds):.4f}s "
                f"(min {min(seconds):.4f}s, max {max(seconds):.4f}s) over {args.cycles} cycles"
            )
            for i, report in enumerate(steady):
                print(f"  cycle {i + 1}: ops {dict(sorted(report.ops.items()))}")
            reads = sum(r.ops.get("read", 0) for r in steady)
            writes = sum(r.ops.get("write", 0) + r.ops.get("append", 0) for r in steady)
            print(f"steady-state spec/state reads: {reads}, state writes + appends: {writes}")
        finally:
            local = daemon.runners.get("local")
            for job in list(daemon.jobs.values()):
                handle = job.state.run_attempt.handle if job.state.run_attempt else None
                if handle:
                    local.stop(handle, 0.0)
                    local.delete(handle)
            daemon.close()


if __name__ == "__main__":
    main()

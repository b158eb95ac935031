"""Seconds per scheduling pass for 1,000 / 10,000 / 50,000 pending jobs over 100 projects.

The pool (two tiers of v4 plus cpu) is mostly busy with running jobs, some projects borrow,
so each pass does real work: reclaim checks, lending, reasons for every waiting job.
AXLearn's TierScheduler takes about 1.5 s for 50,000 jobs on this 2-core machine; issue 13
asks for at most 0.5 s at 50,000 pending jobs (tests/quota/test_quota_golden.py checks
that the tuned pass decides exactly what its frozen golden plans say, this world included).

    .venv/bin/python benchmarks/bench_policy.py [--repeat 5]

Wall and CPU seconds are both printed: on a shared machine the CPU figure is the steadier.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quota.config import QuotaConfig, SchedulingKnobs
from quota.model import JobRequest, Phase
from quota.policy import schedule

PROJECTS = 100
NOW = 1_000_000.0


def make_config(rng: random.Random) -> QuotaConfig:
    weights = [rng.uniform(0.2, 1.0) for _ in range(PROJECTS)]
    total = sum(weights)
    shares = {f"p{i}": {"v4": w / total, "cpu": w / total} for i, w in enumerate(weights)}
    return QuotaConfig(
        tiers=({"v4": 4096, "cpu": 8192}, {"v4": 2048, "cpu": 4096}),
        membership={p: ("u.*",) for p in shares},
        shares=shares,
        scheduling=SchedulingKnobs(),
    )


def make_jobs(rng: random.Random, pending: int) -> list[JobRequest]:
    jobs = []
    used = 0
    i = 0
    while used < 5800:  # about 94% of the v4 pool is running
        n = rng.choice((1, 2, 4, 8, 16, 32))
        p = f"p{rng.randrange(PROJECTS // 3)}"  # a third of the projects hold (and borrow) it
        jobs.append(
            JobRequest(
                f"r{i}",
                p,
                f"u{rng.randrange(50)}",
                {"v4": n, "cpu": 2 * n},
                rng.randint(1, 5),
                NOW - 5000,
                Phase.RUNNING,
                NOW - rng.uniform(0, 4000),
                rng.randint(0, 1),
            )
        )
        used += n
        i += 1
    for k in range(pending):
        n = rng.choice((1, 1, 2, 4, 8, 16, 32, 64))
        jobs.append(
            JobRequest(
                f"j{k}",
                f"p{rng.randrange(PROJECTS)}",
                f"u{rng.randrange(500)}",
                {"v4": n, "cpu": 2 * n},
                rng.randint(1, 5),
                NOW - rng.uniform(0, 3600),
            )
        )
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(0)
    config = make_config(rng)
    usage = {f"u{i}": rng.uniform(0, 1e7) for i in range(500)}
    print(
        f"{'pending':>8} {'running':>8} {'best s/pass':>12} {'mean s/pass':>12} "
        f"{'best cpu s':>11}  starts preempts waits"
    )
    for n in (1_000, 10_000, 50_000):
        jobs = make_jobs(rng, n)
        times, cpu = [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            plan = schedule(config, jobs, usage, NOW)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        running = sum(j.phase is Phase.RUNNING for j in jobs)
        print(
            f"{n:>8} {running:>8} {min(times):>12.3f} {sum(times) / len(times):>12.3f} "
            f"{min(cpu):>11.3f}  {len(plan.starts())} {len(plan.preemptions())} "
            f"{len(plan.waits())}"
        )


if __name__ == "__main__":
    main()

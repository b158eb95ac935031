"""Simulator metrics on a generated Kueue-like trace (small, medium and large jobs, 6 projects).

Like Kueue's scheduler performance test, the trace mixes job classes and scores utilisation
and time-to-admission per class; we add share attainment and preemption cost.

    .venv/bin/python benchmarks/bench_simulator.py [--jobs 800] [--hours 24] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quota.commands import metrics_table
from quota.config import QuotaConfig, SchedulingKnobs
from quota.simulate import simulate
from quota.trace import TraceJob

SHARES = {"search": 0.3, "speech": 0.25, "vision": 0.2, "ads": 0.15, "infra": 0.1, "interns": 0.0}
CLASSES = {  # name: (weight, v4 sizes, duration range in seconds)
    "small": (0.65, (1, 2, 4), (300, 1800)),
    "medium": (0.3, (8, 16), (1800, 5400)),
    "large": (0.05, (32, 64), (3600, 3 * 3600)),
}


def make_config() -> QuotaConfig:
    total = sum(SHARES.values())
    return QuotaConfig(
        tiers=({"v4": 192}, {"v4": 64}),
        membership={p: (f"{p}-.*",) for p in SHARES},
        shares={p: {"v4": s / total} for p, s in SHARES.items()},
        scheduling=SchedulingKnobs(
            min_runtime_seconds=600, preemption_grace_seconds=60, reserve_after_seconds=1800
        ),
    )


def make_trace(rng: random.Random, n: int, hours: float) -> list[TraceJob]:
    names = list(CLASSES)
    weights = [CLASSES[c][0] for c in names]
    projects = list(SHARES)
    trace = []
    for i in range(n):
        cls = rng.choices(names, weights)[0]
        _, sizes, (lo, hi) = CLASSES[cls]
        p = rng.choice(projects)
        trace.append(
            TraceJob(
                f"{cls}-{i}",
                p,
                f"{p}-u{rng.randrange(4)}",
                round(rng.uniform(0, hours * 3600)),
                round(rng.uniform(lo, hi)),
                {"v4": rng.choice(sizes)},
                rng.choices((1, 2, 3, 4, 5), (1, 2, 4, 2, 1))[0],
            )
        )
    return trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=800)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--poll_seconds", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    trace = make_trace(random.Random(args.seed), args.jobs, args.hours)
    demand = sum(t.duration * t.resources["v4"] for t in trace)
    print(
        f"trace: {len(trace)} jobs over {args.hours:g} h, demand "
        f"{demand / (256 * args.hours * 3600):.2f}x the 256-v4 pool"
    )
    t0 = time.perf_counter()
    result = simulate(make_config(), trace, args.poll_seconds)
    wall = time.perf_counter() - t0
    print(metrics_table(result.metrics))
    submit = {t.name: t.submit for t in trace}
    first: dict[str, float] = {}
    for e in result.events:
        if e["event"] == "start":
            first.setdefault(e["name"], e["time"])
    for cls in CLASSES:
        waits = [first[n] - submit[n] for n in first if n.startswith(cls + "-")]
        print(
            f"time to first start, {cls}: mean {sum(waits) / len(waits):.0f}s "
            f"over {len(waits)} jobs"
        )
    print(f"simulated in {wall:.1f}s wall ({len(result.events)} events)")
    print(json.dumps(result.metrics, sort_keys=True))


if __name__ == "__main__":
    main()

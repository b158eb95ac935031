"""The rules of issue 13 per scenario, measured from the simulator's event log.

Scenarios (each over several seeds): mixed sizes (1, 4, 16 units, priorities 2..4, unequal
shares), two resource types with different shares per type, one large job against a stream
of small ones, two projects always over their share, a borrower holding the whole pool when
its owner returns. Each row is scored by quota/rules.py (loaded by path from this checkout,
so `--tree` can replay another checkout's policy, e.g. the one before a change, and be
scored the same way):

    .venv/bin/python benchmarks/bench_fairness.py [--seeds 3] [--hours 8]
    git worktree add /tmp/before <commit> && \
        .venv/bin/python benchmarks/bench_fairness.py --tree /tmp/before

Columns: idle% (rule 1, <= 2%), deprv (max deprivation seconds over projects, rule 2, <=
reclaim period), attain (min attainment, >= 0.97), wq (within-quota preemptions, rule 3,
0), wp (within-project violations, rule 4, 0), maxp (max preemptions of one job, rule 5,
<= 3), pre (preemptions), lost (resource-hours lost to preemption), ax pre / ax maxp
(AXLearn's scheduler replayed on the same trace, benchmarks/axlearn_model.py: its
preemptions, and the most of one job), ratio (pre / ax pre, rule 5: <= 1/8 = 0.125), and for
borrower-returns lb (the fewest preemptions any policy needs at the owner's return to honour
rule 2, see return_bound) and lb|run (the same given the borrower jobs that ran at the
return in this run). The last lines give the largest ratio per scenario and over all rows,
and the bounds beside our preemptions and AXLearn's.

Lost work (issue 25): the same traces with every job checkpointing every K minutes
(`--checkpoint_minutes`, default 10; 0 skips) at a random phase after each start, resuming
from its last checkpoint, replayed twice: with running jobs reporting their last checkpoint
to the policy (victims of equal standing by least work lost) and without (newest first). The
last table gives the accelerator-hours lost to preemption (units x time since the victim's
last checkpoint, or its start) of each, and the preemptions.

On borrower-returns AXLearn preempts only 17 to 23 times, while the owner's return alone
needs at least 6 (an eighth of AXLearn's would be 2 or 3): rule 5's ratio cannot be met
there by any policy that honours rule 2, so these rows compare with the bound instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
POLL = 30.0
MIN_RUNTIME, GRACE = 300.0, 60.0
PERIOD = MIN_RUNTIME + GRACE + 2 * POLL


def _rules() -> Any:
    spec = importlib.util.spec_from_file_location("_rules", HERE / "quota" / "rules.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _job(
    name: str, p: str, submit: float, duration: float, res: dict[str, int], prio: int
) -> dict[str, Any]:
    return {
        "name": name,
        "project_id": p,
        "user_id": f"{p}-u",
        "submit": round(submit),
        "duration": round(duration),
        "resources": res,
        "priority": prio,
    }


def mixed(rng: random.Random, hours: float) -> tuple[dict, dict, list]:
    pool = {"v4": 64}
    shares = {"a": {"v4": 0.4}, "b": {"v4": 0.3}, "c": {"v4": 0.2}, "d": {"v4": 0.1}}
    jobs = []
    t = 0.0
    i = 0
    while t < hours * 3600:
        t += rng.expovariate(1 / 90)
        p = rng.choices("abcd", (4, 3, 2, 1))[0]
        n = rng.choices((1, 4, 16), (5, 3, 1))[0]
        jobs.append(_job(f"m{i}", p, t, rng.uniform(600, 3600), {"v4": n}, rng.randint(2, 4)))
        i += 1
    return pool, shares, jobs


def two_types(rng: random.Random, hours: float) -> tuple[dict, dict, list]:
    pool = {"v4": 32, "gpu": 32}
    shares = {
        "a": {"v4": 0.6, "gpu": 0.1},
        "b": {"v4": 0.1, "gpu": 0.6},
        "c": {"v4": 0.3, "gpu": 0.3},
    }
    jobs = []
    t = 0.0
    i = 0
    while t < hours * 3600:
        t += rng.expovariate(1 / 120)
        p = rng.choice("abc")
        r = rng.choice(("v4", "gpu"))
        n = rng.choices((1, 4, 8), (4, 3, 1))[0]
        jobs.append(_job(f"t{i}", p, t, rng.uniform(600, 3600), {r: n}, rng.randint(2, 4)))
        i += 1
    return pool, shares, jobs


def large_vs_stream(rng: random.Random, hours: float) -> tuple[dict, dict, list]:
    pool = {"v4": 32}
    shares = {"a": {"v4": 0.5}, "b": {"v4": 0.5}}
    jobs = [_job("big", "a", 1800, 3600, {"v4": 16}, 3)]
    t = 0.0
    i = 0
    while t < hours * 3600:
        t += rng.expovariate(1 / 40)
        p = rng.choice("ab")
        jobs.append(
            _job(
                f"s{i}", p, t, rng.uniform(300, 1500), {"v4": rng.choice((1, 2))}, rng.randint(2, 4)
            )
        )
        i += 1
    return pool, shares, jobs


def over_share(rng: random.Random, hours: float) -> tuple[dict, dict, list]:
    pool = {"v4": 48}
    shares = {"a": {"v4": 0.25}, "b": {"v4": 0.25}, "c": {"v4": 0.5}}
    jobs = []
    i = 0
    for p in "ab":  # always far over their share: a deep queue from the start
        for k in range(int(hours * 6)):
            jobs.append(
                _job(
                    f"{p}{k}",
                    p,
                    rng.uniform(0, 600),
                    rng.uniform(900, 2400),
                    {"v4": rng.choice((2, 4, 8))},
                    rng.randint(2, 4),
                )
            )
    t = 0.0
    while t < hours * 3600:
        t += rng.expovariate(1 / 600)
        jobs.append(
            _job(
                f"c{i}",
                "c",
                t,
                rng.uniform(600, 3000),
                {"v4": rng.choice((4, 8))},
                rng.randint(2, 4),
            )
        )
        i += 1
    return pool, shares, jobs


def borrower_returns(rng: random.Random, hours: float) -> tuple[dict, dict, list]:
    pool = {"v4": 32}
    shares = {"owner": {"v4": 0.75}, "borrower": {"v4": 0.25}}
    jobs = [
        _job(
            f"b{k}",
            "borrower",
            rng.uniform(0, 60),
            rng.uniform(3 * 3600, hours * 3600),
            {"v4": rng.choice((1, 2, 4))},
            3,
        )
        for k in range(20)
    ]
    back = 3600.0
    for k in range(12):
        jobs.append(
            _job(
                f"o{k}",
                "owner",
                back + rng.uniform(0, 900),
                rng.uniform(1800, 5400),
                {"v4": rng.choice((2, 4, 8))},
                rng.randint(2, 4),
            )
        )
    return pool, shares, jobs


SCENARIOS = {
    "mixed": mixed,
    "two-types": two_types,
    "large-vs-stream": large_vs_stream,
    "over-share": over_share,
    "borrower-returns": borrower_returns,
}


def _axlearn() -> Any:
    """benchmarks/axlearn_model.py of this file's checkout (whatever --tree says)."""
    mod = sys.modules.get("_axlearn")
    if mod is None:
        spec = importlib.util.spec_from_file_location(
            "_axlearn", Path(__file__).resolve().parent / "axlearn_model.py"
        )
        assert spec and spec.loader
        mod = sys.modules["_axlearn"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


def return_bound(
    pool: dict[str, int],
    quotas: dict[str, dict[str, float]],
    raw: list[dict],
    events: list[dict] | None = None,
) -> int:
    """Fewest preemptions a policy needs at the owner's return to honour rule 2 (the later
    preemptions of borrower jobs restarted in capacity the owner could not use yet are not
    counted).

    The owner is the project that submits last (its first job at t0). It is taken to be owed,
    within about one reclaim period of t0, `need` = min(its quota, the units of its jobs
    submitted by t0 + period) of each resource (rule 2 read as a promise for the owner's
    first wave at once; a policy that started the owner's jobs strictly one per period could
    spread the wave over several periods, in which borrower jobs might end: none do in these
    traces, whose borrower jobs run three hours or more). The borrowers hold `held` (work
    conserving: all of the pool their jobs active at t0 can fill; with `events`, what they
    held in that run), so `need - (pool - held)` units must come from borrower jobs, less
    those of jobs that can finish by t0 + period (submit + duration, their earliest end).
    Each victim frees at most its own units: the fewest victims take the largest borrower
    jobs first (with `events`, among the jobs that ran at t0; else among all borrower jobs
    active at t0). Not a proof for every policy: with the owner's wave spread out (its jobs
    started one per period as they come to fit), a policy may need fewer."""
    from quota.capacity import EPS  # (of the --tree checkout, as run_one imports)

    first: dict[str, float] = {}
    for j in raw:
        first[j["project_id"]] = min(first.get(j["project_id"], math.inf), j["submit"])
    owner = max(first, key=lambda p: (first[p], p))
    t0 = first[owner]
    horizon = t0 + PERIOD
    active = [
        j
        for j in raw
        if j["project_id"] != owner and j["submit"] < t0 and j["submit"] + j["duration"] > t0
    ]
    if events is not None:
        running: set[str] = set()
        for e in events:
            if e["time"] > t0:
                break
            if e["event"] == "start":
                running.add(e["name"])
            elif e["event"] in ("finish", "preempt"):
                running.discard(e["name"])
        active = [j for j in active if j["name"] in running]
    worst = 0
    for r, total in pool.items():
        demand = sum(
            j["resources"].get(r, 0)
            for j in raw
            if j["project_id"] == owner and j["submit"] <= horizon
        )
        need = min(quotas.get(owner, {}).get(r, 0.0), demand)
        sizes = [j["resources"].get(r, 0) for j in active]
        held = sum(sizes) if events is not None else min(total, sum(sizes))
        freeing = sum(
            j["resources"].get(r, 0) for j in active if j["submit"] + j["duration"] <= horizon
        )
        lack = need - (total - held) - freeing
        victims = 0
        for n in sorted(
            (j["resources"].get(r, 0) for j in active if j["submit"] + j["duration"] > horizon),
            reverse=True,
        ):
            if lack <= EPS:
                break
            lack -= n
            victims += 1
        worst = max(worst, victims)
    return worst


def run_one(name: str, seed: int, hours: float) -> tuple[dict[str, Any], float]:
    from quota.config import QuotaConfig, SchedulingKnobs
    from quota.simulate import simulate

    pool, shares, raw = SCENARIOS[name](random.Random(seed), hours)
    config = QuotaConfig(
        tiers=(pool,),
        membership={p: (f"{p}-.*",) for p in shares},
        shares=shares,
        scheduling=SchedulingKnobs(min_runtime_seconds=MIN_RUNTIME, preemption_grace_seconds=GRACE),
    )
    trace = _trace(raw)
    t0 = time.perf_counter()
    result = simulate(config, trace, POLL)
    wall = time.perf_counter() - t0
    jobs = {j["name"]: j for j in raw}
    m = _rules().measure(pool, config.quotas, jobs, result.events, GRACE, PERIOD)
    ax = _axlearn().replay(config.tiers, shares, raw, POLL)
    m["axlearn_preemptions"] = ax.preemptions
    m["axlearn_max_preemptions_per_job"] = ax.max_preemptions_per_job
    if name == "borrower-returns":
        m["return_bound"] = return_bound(pool, config.quotas, raw)
        m["return_bound_run"] = return_bound(pool, config.quotas, raw, result.events)
        # ours at the return: until the owner's first job ends (later ones preempt borrower
        # jobs restarted meanwhile in capacity the owner could not use)
        owner = max(raw, key=lambda j: (j["submit"], j["project_id"]))["project_id"]
        ends = [
            e["time"]
            for e in result.events
            if e["event"] == "finish" and jobs[e["name"]]["project_id"] == owner
        ]
        m["return_preemptions"] = sum(
            1
            for e in result.events
            if e["event"] == "preempt" and e["time"] < min(ends, default=math.inf)
        )
    return m, wall


def _trace(raw: list[dict]) -> list[Any]:
    from quota.trace import TraceJob

    out = []
    for j in raw:
        job = TraceJob(
            j["name"],
            j["project_id"],
            j["user_id"],
            j["submit"],
            j["duration"],
            j["resources"],
            j["priority"],
        )
        if "checkpoint_every" in j:  # (only traces made by with_checkpoints)
            job = TraceJob(
                *(getattr(job, f) for f in ("name", "project_id", "user_id", "submit")),
                job.duration,
                job.resources,
                job.priority,
                checkpoint_every=j["checkpoint_every"],
                checkpoint_phase=j["checkpoint_phase"],
            )
        out.append(job)
    return out


def with_checkpoints(raw: list[dict], seed: int, minutes: float) -> list[dict]:
    """The trace with every job checkpointing every `minutes`, its first checkpoint a random
    phase (uniform in one interval, its own RNG: the trace is unchanged) after each start."""
    rng = random.Random(f"checkpoints-{seed}")
    every = minutes * 60
    return [
        {**j, "checkpoint_every": every, "checkpoint_phase": rng.uniform(0, every)} for j in raw
    ]


def lost_work(name: str, seed: int, hours: float, minutes: float) -> dict[str, tuple[float, int]]:
    """Accelerator-hours lost to preemption and preemptions, with the policy told each
    running job's last checkpoint ("told") and not told ("blind"), on the same trace."""
    from quota.config import QuotaConfig, SchedulingKnobs
    from quota.simulate import simulate

    pool, shares, raw = SCENARIOS[name](random.Random(seed), hours)
    config = QuotaConfig(
        tiers=(pool,),
        membership={p: (f"{p}-.*",) for p in shares},
        shares=shares,
        scheduling=SchedulingKnobs(min_runtime_seconds=MIN_RUNTIME, preemption_grace_seconds=GRACE),
    )
    trace = _trace(with_checkpoints(raw, seed, minutes))
    out = {}
    for key, told in (("told", True), ("blind", False)):
        m = simulate(config, trace, POLL, report_checkpoints=told).metrics
        out[key] = (m["lost_resource_seconds"] / 3600, m["preemptions"])
    return out


def print_lost_work(names: list[str], seeds: int, hours: float, minutes: float) -> None:
    print(
        f"accelerator-hours lost to preemption, jobs checkpointing every {minutes:g} min "
        "(random phase), with and without victims chosen by lost work:"
    )
    print(
        f"{'scenario':<18} {'seed':>4} {'lost h (by ckpt)':>17} {'lost h (newest)':>16} "
        f"{'pre':>4} {'pre':>4}"
    )
    total = {"told": 0.0, "blind": 0.0}
    for name in names:
        for seed in range(seeds):
            r = lost_work(name, seed, hours, minutes)
            for key in total:
                total[key] += r["told"][0] if key == "told" else r["blind"][0]
            print(
                f"{name:<18} {seed:>4} {r['told'][0]:>17.1f} {r['blind'][0]:>16.1f} "
                f"{r['told'][1]:>4} {r['blind'][1]:>4}",
                flush=True,
            )
    print(f"  {'all':<18} {total['told']:>20.1f} {total['blind']:>16.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--hours", type=float, default=8.0)
    ap.add_argument("--tree", default=str(HERE), help="checkout whose quota/ policy to run")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument(
        "--checkpoint_minutes",
        type=float,
        default=10.0,
        help="jobs checkpoint this often in the lost-work comparison (0: skip it)",
    )
    ap.add_argument("--lost_work_only", action="store_true", help="only the lost-work table")
    args = ap.parse_args()
    if args.checkpoint_minutes < 0:
        ap.error(f"--checkpoint_minutes must be >= 0, got {args.checkpoint_minutes:g}")
    sys.path.insert(0, str(Path(args.tree).resolve()))
    names = [s for s in args.only.split(",") if s] or list(SCENARIOS)
    print(f"policy from {args.tree}; reclaim period {PERIOD:g}s; {args.hours:g} h per trace")
    if not args.lost_work_only:
        print_rules(names, args.seeds, args.hours)
    if args.checkpoint_minutes > 0:
        print_lost_work(names, args.seeds, args.hours, args.checkpoint_minutes)


def print_rules(names: list[str], seeds: int, hours: float) -> None:
    """The rules of issue 13 per scenario and seed, and the largest ratios to AXLearn's."""
    print(
        f"{'scenario':<18} {'seed':>4} {'idle%':>6} {'deprv':>6} {'attain':>6} {'wq':>3} "
        f"{'wp':>3} {'maxp':>4} {'pre':>5} {'lost h':>7} {'sim s':>6} {'ax pre':>6} "
        f"{'ax maxp':>7} {'ratio':>6} {'lb':>3} {'lb|run':>6}"
    )
    worst: dict[str, float] = {}
    bounds: list[str] = []
    for name in names:
        for seed in range(seeds):
            m, wall = run_one(name, seed, hours)
            deprv = max(m["max_deprivation_seconds"].values(), default=0.0)
            attain = min(m["attainment"].values(), default=1.0)
            ax = m["axlearn_preemptions"]
            # (no preemption at all against none of AXLearn's: ratio 0, the rule holds)
            ratio = m["preemptions"] / ax if ax else (math.inf if m["preemptions"] else 0.0)
            worst[name] = max(worst.get(name, 0.0), ratio)
            print(
                f"{name:<18} {seed:>4} {100 * m['idle_while_fit_fraction']:>6.2f} "
                f"{deprv:>6.0f} {attain:>6.3f} {m['within_quota_preemptions']:>3} "
                f"{m['within_project_violations']:>3} {m['max_preemptions_per_job']:>4} "
                f"{m['preemptions']:>5} {m['lost_resource_seconds'] / 3600:>7.1f} "
                f"{wall:>6.1f} {ax:>6} {m['axlearn_max_preemptions_per_job']:>7} "
                f"{ratio:>6.3f} {m.get('return_bound', '-'):>3} "
                f"{m.get('return_bound_run', '-'):>6}",
                flush=True,
            )
            if "return_bound" in m:
                bounds.append(
                    f"  {name} seed {seed}: ours {m['preemptions']} "
                    f"({m['return_preemptions']} at the return), bound "
                    f"{m['return_bound']} ({m['return_bound_run']} given the borrower "
                    f"jobs that ran at the return), AXLearn {ax}"
                )
    print("largest ratio of preemptions to AXLearn's (rule 5: <= 0.125):")
    for name, ratio in worst.items():
        print(f"  {name:<18} {ratio:.3f}")
    print(f"  {'all':<18} {max(worst.values(), default=0.0):.3f}")
    if bounds:
        print("preemptions, and the fewest at the owner's return that rule 2 needs (return_bound):")
        print("\n".join(bounds))


if __name__ == "__main__":
    main()

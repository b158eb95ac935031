"""The frozen scenarios, the record of a plan, and reading and writing the golden files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from quota.config import QuotaConfig, SchedulingKnobs
from quota.model import JobRequest, Phase, Plan, Verdict
from quota.policy import schedule

GOLDEN_DIR = Path(__file__).resolve().parent
NOW = 10_000.0
RANDOM_WORLDS = 400  # random worlds frozen (seeds drawn from SEED_OF_SEEDS)
SEED_OF_SEEDS = 20261125
BENCH_SEEDS = (0, 1, 2)
BENCH_PENDING = 3000

World = tuple[QuotaConfig, list[JobRequest], dict[str, float], float]


@dataclass(frozen=True)
class Scenario:
    """One input of the pass, named after how it is made (so it can be made again)."""

    name: str
    make: Callable[[], World]


def random_world(seed: int) -> World:
    """A pool mostly held by running jobs (some releasing, some backfill), and a queue of up
    to 150 pending jobs, invalid ones among them, over up to six projects."""
    rng = random.Random(seed)
    types = ("v4", "cpu")[: rng.randint(1, 2)]
    ntiers = rng.randint(1, 2)
    tiers = tuple({r: rng.choice((0, 4, 8, 16, 32)) for r in types} for _ in range(ntiers))
    projects = [f"p{i}" for i in range(rng.randint(1, 6))]
    raw = {p: {r: rng.choice((0.0, 0.1, 0.25, 0.5, 1.0)) for r in types} for p in projects}
    totals = {r: sum(raw[p][r] for p in projects) for r in types}
    shares = {
        p: {r: (f / totals[r] if totals[r] else 0.0) for r, f in s.items()} for p, s in raw.items()
    }
    knobs = SchedulingKnobs(
        min_runtime_seconds=rng.choice((0.0, 300.0)),
        preempt_within_project=rng.random() < 0.4,
        reserve_after_seconds=rng.choice((0.0, 300.0, 1e9)),
        reclaim_after_seconds=0.0,
    )  # (the plain pass they were checked against had no reclaim delay)
    config = QuotaConfig(
        tiers=tiers, membership={p: ("u[0-5]",) for p in projects}, shares=shares, scheduling=knobs
    )
    npending = rng.choice((0, 5, 20, 60, 150))
    jobs = _running(rng, config, types, projects, ntiers, npending)
    jobs += _pending(rng, types, projects, npending)
    rng.shuffle(jobs)
    usage = {f"u{i}": float(rng.randrange(0, 1000, 100)) for i in range(7)}
    return config, jobs, usage, NOW


_SIZES = (0, 1, 1, 2, 3, 5, 8, 16)


def _running(
    rng: random.Random,
    config: QuotaConfig,
    types: tuple[str, ...],
    projects: list[str],
    ntiers: int,
    npending: int,
) -> list[JobRequest]:
    """Up to 40 running or releasing jobs that fit the pool, some marked as backfill."""
    free = dict(config.pool)
    jobs: list[JobRequest] = []
    for i in range(rng.randint(0, 40)):
        need = {r: rng.choice(_SIZES) for r in types}
        if not all(n <= free[r] for r, n in need.items()):
            continue
        for r, n in need.items():
            free[r] -= n
        phase = Phase.RELEASING if rng.random() < 0.1 else Phase.RUNNING
        backfill = (
            tuple(sorted({f"j{rng.randrange(npending)}" for _ in range(2)}))
            if npending and phase is Phase.RUNNING and rng.random() < 0.3
            else ()
        )
        by = f"j{rng.randrange(npending)}" if npending and phase is Phase.RELEASING else None
        jobs.append(
            JobRequest(
                f"r{i}",
                rng.choice(projects),
                f"u{rng.randrange(6)}",
                need,
                rng.randint(1, 5),
                NOW - 5000,
                phase,
                NOW - rng.choice((10, 200, 400, 4000)),
                rng.choice((None, *range(ntiers))),
                preempted_by=by,
                backfill_for=backfill,
                preemptions=rng.choice((0, 0, 1, 2)),
            )
        )
    return jobs


def _pending(
    rng: random.Random, types: tuple[str, ...], projects: list[str], npending: int
) -> list[JobRequest]:
    """Pending jobs, a few invalid (unknown resource type, or a user of no project)."""
    jobs: list[JobRequest] = []
    for i in range(npending):
        submit = NOW - rng.choice((0, 100, 1000, 5000))
        need = {r: rng.choice(_SIZES) for r in types}
        if rng.random() < 0.03:
            need["tpu"] = 1  # unknown resource type: rejected
        user = f"u{rng.randrange(7)}"  # u6 is nobody's member: rejected
        jobs.append(
            JobRequest(
                f"j{i}",
                rng.choice(projects),
                user,
                need,
                rng.randint(1, 5),
                submit,
                preemptions=rng.choice((0, 0, 1, 2)),
                pending_since=rng.choice((None, submit, NOW - 50)),
                creation_time=rng.choice((None, 1.0, 2.0)),
            )
        )
    return jobs


def bench_world(seed: int) -> World:
    """bench_policy.py's shape (100 projects, a third borrowing, a nearly full two-tier pool)
    at 3,000 pending jobs: the pass's early exits are taken here."""
    benchmarks = str(GOLDEN_DIR.parents[2] / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    import bench_policy

    rng = random.Random(seed)
    config = bench_policy.make_config(rng)
    config = dataclasses.replace(
        config, scheduling=dataclasses.replace(config.scheduling, reclaim_after_seconds=0.0)
    )
    usage = {f"u{i}": rng.uniform(0, 1e7) for i in range(500)}
    return config, bench_policy.make_jobs(rng, BENCH_PENDING), usage, bench_policy.NOW


@cache
def groups() -> dict[str, list[Scenario]]:
    """Golden file name -> its scenarios."""
    seeds = random.Random(SEED_OF_SEEDS).sample(range(2**32), RANDOM_WORLDS)
    return {
        "random_worlds": [
            Scenario(f"random-{seed}", lambda seed=seed: random_world(seed)) for seed in seeds
        ],
        "bench_worlds": [
            Scenario(f"bench-{seed}", lambda seed=seed: bench_world(seed)) for seed in BENCH_SEEDS
        ],
    }


# The fields of a decision's record, in order.
DECISION_FIELDS = (
    "verdict",
    "tier",
    "reason",
    "preempted_by",
    "backfill_for",
    "wait",
    "ahead",
    "wait_text",
)


def fingerprint(world: World) -> str:
    """A digest of the scenario's inputs: tells a changed scenario from changed decisions.
    Fields at their defaults are left out, so a new optional field of JobRequest or of the
    config changes no fingerprint."""
    return hashlib.sha256(repr(_canonical(world)).encode()).hexdigest()[:16]


def _canonical(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            tuple(
                (f.name, _canonical(getattr(value, f.name)))
                for f in dataclasses.fields(value)
                if f.default is dataclasses.MISSING or getattr(value, f.name) != f.default
            ),
        )
    if isinstance(value, Mapping):
        return tuple((k, _canonical(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_canonical(v) for v in value)
    return value


def plan_record(plan: Plan, world: World) -> dict[str, Any]:
    """Everything a plan says, as JSON: decisions in input order (each read twice, as the
    daemon may: the wait text without the decision, then the decision), the verdict lists,
    held and free capacity, usage, the within-quota set and the waiting order."""
    decisions = {}
    for name in plan.decisions:
        wait_text = plan.wait_text(name)  # (before the decision is made on reading)
        d = plan.decisions[name]
        decisions[name] = [
            d.verdict.value,
            d.tier,
            d.reason,
            d.preempted_by,
            list(d.backfill_for),
            d.wait,
            d.ahead,
            wait_text,
        ]
    verdicts = (
        ("starts", plan.starts(), Verdict.START),
        ("preemptions", plan.preemptions(), Verdict.PREEMPT),
        ("waits", plan.waits(), Verdict.WAIT),
        ("rejects", plan.rejects(), Verdict.REJECT),
    )
    return {
        "inputs": fingerprint(world),
        "decisions": decisions,
        **{key: [d.name for d in made] for key, made, _ in verdicts},
        "reserved": plan.reserved,
        "free": plan.free,
        "usage": plan.usage,
        "within_quota": sorted(plan.within_quota),
        "waiting": plan.waiting,
    }


def compute(scenario: Scenario) -> dict[str, Any]:
    """The scenario's plan as the pass makes it now (a JSON round trip, as stored)."""
    world = scenario.make()
    config, jobs, usage, now = world
    return json.loads(json.dumps(plan_record(schedule(config, jobs, usage, now), world)))


def golden_path(group: str) -> Path:
    return GOLDEN_DIR / f"{group}.json"


def write_golden(group: str) -> Path:
    path = golden_path(group)
    records = {s.name: compute(s) for s in groups()[group]}
    path.write_text(_dumps(records))
    return path


def _dumps(records: Mapping[str, Mapping[str, Any]]) -> str:
    """JSON with one line per scenario field and per decision, so that a change of
    decisions reads as a diff of the jobs it touched."""

    def one(value: Any) -> str:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)

    out = ["{"]
    for i, (scenario, record) in enumerate(records.items()):
        out.append(f"{one(scenario)}: {{")
        fields = []
        for key, value in record.items():
            if key == "decisions":
                rows = [f"  {one(name)}: {one(row)}" for name, row in value.items()]
                fields.append(' "decisions": {\n' + ",\n".join(rows) + "\n }")
            else:
                fields.append(f" {one(key)}: {one(value)}")
        out.append(",\n".join(fields))
        out.append("}" + ("," if i + 1 < len(records) else ""))
    out.append("}")
    return "\n".join(out) + "\n"


def read_golden(group: str) -> Mapping[str, Any]:
    """The group's frozen records; FileNotFoundError names the command that writes them."""
    path = golden_path(group)
    if not path.is_file():
        raise FileNotFoundError(
            f"golden file {path} is missing: run `.venv/bin/python -m tests.quota.golden "
            "--write`, review the decisions it writes, and commit it"
        )
    return json.loads(path.read_text())


def differences(scenario: str, golden: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Where the plan made now differs from the frozen one, one line per difference naming
    the scenario, the job and the field (empty: the same plan)."""
    if golden.get("inputs") != now.get("inputs"):
        return [
            f"{scenario}: its inputs changed (fingerprint {golden.get('inputs')} frozen, "
            f"{now.get('inputs')} now): the scenario generator changed; regenerate the golden "
            "files (python -m tests.quota.golden --write) only if that was meant"
        ]
    out: list[str] = []
    frozen, made = golden["decisions"], now["decisions"]
    if list(frozen) != list(made):
        out.append(f"{scenario}: decided jobs {list(frozen)} frozen, {list(made)} now")
    for name, row in frozen.items():
        got = made.get(name)
        if got is None:
            continue
        for field, old, new in zip(DECISION_FIELDS, row, got, strict=True):
            if old != new:
                out.append(f"{scenario}, job {name}: {field}\n  frozen: {old!r}\n  now:    {new!r}")
    for key in sorted((set(golden) | set(now)) - {"inputs", "decisions"}):
        if golden.get(key) != now.get(key):
            out.append(
                f"{scenario}: {key}\n  frozen: {golden.get(key)!r}\n  now:    {now.get(key)!r}"
            )
    return out

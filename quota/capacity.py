"""Free capacity per tier, and the resource arithmetic the policy needs.

Fit is decided on the total over tiers (a slice may span tiers); tiers only decide the label
a job gets. As in AXLearn, a job's tier is the highest tier it touches (forward pass), and it
consumes that tier first (backward pass), leaving reserved capacity for later jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain, compress
from operator import is_not, methodcaller

EPS = 1e-6  # resource amounts are fractions of a pool: equal within this is equal

Res = Mapping[str, int]


def fmt_units(res: Mapping[str, float], zeros: bool = False) -> str:
    """'2 cpu, 8 v4' (integral floats print without decimals; zero amounts left out)."""
    return ", ".join(f"{_num(n)} {r}" for r, n in sorted(res.items()) if zeros or n) or "nothing"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def fmt_ratio(
    used: Mapping[str, float], quota: Mapping[str, float], keys: Mapping[str, float] | Sequence[str]
) -> str:
    """'410/410 v4, 3/4 cpu' over the given resource types (a mapping: its non-zero ones)."""
    if isinstance(keys, Mapping):
        keys = [r for r, n in keys.items() if n]
    return (
        ", ".join(f"{_num(used.get(r, 0))}/{_num(quota.get(r, 0.0))} {r}" for r in sorted(keys))
        or "no resources"
    )


def add(acc: dict[str, int], res: Res, sign: int = 1) -> None:
    for r, n in res.items():
        acc[r] = acc.get(r, 0) + sign * n


def shortfall(need: Res, have: Mapping[str, float]) -> dict[str, int]:
    """What `need` lacks beyond `have`, per resource type (only positive parts)."""
    out = {}
    for r, n in need.items():
        gap = n - have.get(r, 0)
        if gap > 0:
            out[r] = int(-(-gap // 1))  # ceil: quotas may be fractional
    return out


def least_need(needs: list[Mapping[str, int]], pool: Mapping[str, int]) -> dict[str, int]:
    """For each resource every request needs, the smallest amount any of them needs (valid
    requests need only resources of the pool). Each distinct mapping is looked at once (the
    daemon interns them: 100,000 waiting jobs of a sweep share one, and come together), then
    one C loop a resource (map and methodcaller): 26 -> 5 ms for 100,000 jobs and a pool of
    three. Only the first of each run of one mapping object goes into that dict, the runs found
    in C: 100,000 jobs sharing one mapping 8 -> 2 ms, 100,000 distinct ones 16 ms either way
    (``groupby``, which compares mappings by content, took those to 31 ms)."""
    firsts = compress(needs, map(is_not, needs, chain((None,), needs)))
    distinct = {id(need): need for need in firsts}.values()
    least = {}
    for r in pool:
        m = min(map(methodcaller("get", r, 0), distinct), default=0)
        if m > 0:
            least[r] = m
    return least


class Capacity:
    """Free units per tier, plus their total (kept in step)."""

    def __init__(self, tiers: Sequence[Res]) -> None:
        self.tiers = [dict(t) for t in tiers]
        self.total: dict[str, int] = {}
        self.held: dict[str, list[tuple[int, str, int]]] = {}  # key -> (tier, resource, n)
        for t in self.tiers:
            add(self.total, t)

    def fits(self, need: Res) -> bool:
        total = self.total
        return all(n <= total.get(r, 0) for r, n in need.items())

    def take(self, need: Res) -> int:
        """Consume a job that fits; return its tier."""
        last = 0
        for r, n in need.items():
            if n <= 0:
                continue
            seen = 0
            for i, t in enumerate(self.tiers):
                seen += t.get(r, 0)
                if seen >= n:
                    last = max(last, i)
                    break
        self._consume(need, range(last, -1, -1))
        return last

    def hold(self, need: Res, tier: int | None) -> int:
        """Charge a job already running (it may over-commit a shrunk pool); return its tier."""
        if tier is None or not 0 <= tier < len(self.tiers):
            if self.fits(need):
                return self.take(need)
            tier = len(self.tiers) - 1
        order = [*range(tier, -1, -1), *range(tier + 1, len(self.tiers))]
        self._consume(need, order)
        return tier

    def reserve(self, need: Res, key: str | None = None) -> dict[str, int]:
        """Hold what is free of `need` (up to `need`) for a waiting job; return the amounts.
        With a `key`, where it came from is remembered, for `unreserve`."""
        got = {r: min(n, self.total.get(r, 0)) for r, n in need.items()}
        got = {r: n for r, n in got.items() if n > 0}
        taken = self._consume(got, range(len(self.tiers) - 1, -1, -1))
        if key is not None and got:
            self.held.setdefault(key, []).extend(taken)
        return got

    def unreserve(self, key: str, amount: Res) -> None:
        """Give back `amount` of what was reserved under `key` to the tiers it came from."""
        taken = self.held.get(key, [])
        for r, n in amount.items():
            left = n
            for k in range(len(taken) - 1, -1, -1):
                i, rr, m = taken[k]
                if rr != r or left <= 0:
                    continue
                back = min(m, left)
                self.tiers[i][r] = self.tiers[i].get(r, 0) + back
                self.total[r] = self.total.get(r, 0) + back
                left -= back
                taken[k] = (i, rr, m - back)

    def _consume(self, need: Res, order: Sequence[int] | range) -> list[tuple[int, str, int]]:
        taken = []
        for r, n in need.items():
            left = n
            for i in order:
                t = self.tiers[i]
                have = t.get(r, 0)
                if have > 0 and left > 0:
                    used = min(have, left)
                    t[r] = have - used
                    left -= used
                    taken.append((i, r, used))
            took = n - left
            if took:
                self.total[r] = self.total.get(r, 0) - took
        return taken

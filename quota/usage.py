"""Per-user usage that decays with a half-life (Slurm's PriorityDecayHalfLife), for fair share.

Usage is resource-unit-seconds summed over resource types. Accrual is integrated exactly under
the decay, so advancing in many small steps equals one big step for the same running set: the
order of users does not depend on how often the daemon polls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quota.model import JobRequest, Phase

_FORGET = 1e-6  # users whose usage decayed below this are dropped (keeps the ledger bounded)


@dataclass(frozen=True)
class UsageLedger:
    half_life_seconds: float
    as_of: float
    by_user: Mapping[str, float] = field(default_factory=dict)

    def advance(self, running: Iterable[JobRequest], now: float) -> UsageLedger:
        """Decay to `now` and add what running jobs used since `as_of` (or their start)."""
        if now <= self.as_of:
            return self
        h = self.half_life_seconds
        decay = 0.5 ** ((now - self.as_of) / h) if h > 0 and math.isfinite(h) else 1.0
        out = {u: v * decay for u, v in self.by_user.items()}
        for j in running:
            if j.phase is Phase.PENDING:
                continue
            since = self.as_of if j.start_time is None else max(self.as_of, j.start_time)
            if since >= now:
                continue
            units = sum(n for n in j.resources.values() if n > 0)
            out[j.user_id] = out.get(j.user_id, 0.0) + units * _decayed_span(now - since, h)
        return UsageLedger(h, now, {u: v for u, v in sorted(out.items()) if v > _FORGET})

    def to_json(self) -> dict[str, Any]:
        return {
            "half_life_seconds": self.half_life_seconds,
            "as_of": self.as_of,
            "by_user": dict(self.by_user),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UsageLedger:
        """Inverse of to_json; raises ValueError on a malformed record."""
        try:
            by_user = {str(u): float(v) for u, v in dict(data["by_user"]).items()}
            return cls(float(data["half_life_seconds"]), float(data["as_of"]), by_user)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed usage ledger: {e!r}") from e


def usage_now(
    saved: UsageLedger | None, half_life: float, jobs: Iterable[JobRequest], now: float
) -> UsageLedger:
    """The decayed usage a policy pass at ``now`` sees: the saved ledger (none: zero at
    ``now``) under the quota file's current half-life, advanced with the jobs that hold
    capacity. The daemon and ``bastion why`` both call this, so a half-life changed in the
    quota file since the ledger was saved weighs the same in both."""
    ledger = saved or UsageLedger(half_life, now, {})
    if ledger.half_life_seconds != half_life:
        ledger = UsageLedger(half_life, ledger.as_of, ledger.by_user)
    return ledger.advance([j for j in jobs if j.phase is not Phase.PENDING], now)


def _decayed_span(span: float, half_life: float) -> float:
    """Integral over the last `span` seconds of the decay weight 0.5**(age/half_life)."""
    if not (half_life > 0 and math.isfinite(half_life)):
        return span
    k = math.log(2) / half_life
    return -math.expm1(-k * span) / k

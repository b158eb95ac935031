"""The kind of capacity an attempt asks its provider for: spot, on-demand or reserved.

Why: the quota policy admits a job on a tier (0: within its project's quota; higher: borrowed
idle quota), and AXLearn's practice is that a job within quota gets the reservation while a
borrower gets spot capacity, which the provider may take back as the policy may. The runner
settings' ``tiers`` table says which tier gets what; a job's own ``spot`` or ``reservation``
option wins; a tier not listed uses the settings' ``spot``. Every runner that can choose
(TPU nodes, queued resources, GCE, a GKE node pool, a Slurm QOS) reads the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bastion.runners.base import Attempt, RunnerError

KINDS = ("spot", "on-demand", "reserved")


def capacity(
    attempt: Attempt, tiers: Mapping[Any, Any] | None, spot: bool, kind: str
) -> tuple[str, str | None]:
    """("spot" | "on-demand" | "reserved", reservation name or None) for the attempt: its
    own options first, then ``tiers`` for its tier, then ``spot``. ``kind`` (the runner's)
    names the settings in the error for a tier value that is none of these."""
    options = attempt.options
    if options.get("reservation"):
        return "reserved", str(options["reservation"])
    if "spot" in options:
        return ("spot" if options["spot"] else "on-demand"), None
    table = {str(k): str(v) for k, v in (tiers or {}).items()}
    said = table.get(str(attempt.tier)) if attempt.tier is not None else None
    if said is None:
        return ("spot" if spot else "on-demand"), None
    if said.startswith("reservation:"):
        return "reserved", said.split(":", 1)[1]
    if said not in KINDS:
        raise RunnerError(
            f"runner {kind}: tiers.{attempt.tier} = {said!r} is not spot, on-demand, "
            "reserved or reservation:<name>; fix the daemon's runner settings"
        )
    return said, None

"""The daemon's runners: one instance per kind, made on first use from the daemon's settings,
all sharing the host's GPU ledger. Apart from the contract (bastion/runners/base.py), which
the ledger itself uses, so that neither imports the other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bastion.runners.base import Runner, RunnerError, factory_for
from bastion.runners.gpus import SETTING, GpuLedger

# The kinds ``bastion launch --instance_type`` picks for AXLearn's instance types
# (launch/bundling.py: tpu-* as tpu or tpu-qr, gpu-* as gce).
INSTANCE_TYPE_KINDS = frozenset({"tpu", "tpu-qr", "gce"})


def instance_types_kind(settings: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The kind whose settings say ``instance_types = true``: it runs every job whose runner
    an AXLearn instance type implied (a team whose TPUs and GPUs are in a GKE cluster sets it
    on ``[runners.gke]``, and AXLearn-style launches run there unchanged)."""
    claims = []
    for kind, options in settings.items():
        said = options.get("instance_types", False)
        if not isinstance(said, bool):
            raise RunnerError(
                f"[runners.{kind}] instance_types = {said!r}: give true (this runner runs "
                "jobs launched with --instance_type) or false"
            )
        if said:
            claims.append(kind)
    if len(claims) > 1:
        raise RunnerError(
            f"instance_types = true in [runners.{claims[0]}] and [runners.{claims[1]}]: "
            "one runner takes the instance-type jobs; keep it in one table"
        )
    return claims[0] if claims else None


class Runners:
    """The daemon's runners, one per kind, made on first use from the daemon's settings.

    Every factory is also handed the host's one GPU ledger (``settings["gpu_ledger"]``,
    bastion/runners/gpus.py), so runners that place work on this machine's GPUs (local,
    docker) never give one GPU to two attempts; a runner that places none ignores it."""

    def __init__(
        self,
        settings: Mapping[str, Mapping[str, Any]],
        default: str = "local",
        configured: frozenset[str] = frozenset(),
    ) -> None:
        self.settings = settings
        self.default = default
        self.configured = configured  # kinds the daemon's settings name: swept for orphans
        self.gpu_ledger = GpuLedger()
        self.instance_types = instance_types_kind(settings)
        self._made: dict[str, Runner] = {}

    def kind_for(self, named: str | None) -> str:
        """The kind that runs a job whose spec names ``named`` (None: the default); a kind
        implied by an instance type goes to the runner that claims instance types, if any."""
        if named in INSTANCE_TYPE_KINDS and self.instance_types:
            return self.instance_types
        return named or self.default

    def get(self, kind: str | None) -> Runner:
        kind = kind or self.default
        if kind not in self._made:
            settings = {**self.settings.get(kind, {}), SETTING: self.gpu_ledger}
            self._made[kind] = factory_for(kind)(settings)
        return self._made[kind]

    def made(self) -> list[Runner]:
        return list(self._made.values())

    def close(self) -> None:
        for runner in self._made.values():
            runner.close()

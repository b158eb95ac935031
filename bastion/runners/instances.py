"""The daemon's runners: one instance per kind, made on first use from the daemon's settings,
all sharing the host's GPU ledger. Apart from the contract (bastion/runners/base.py), which
the ledger itself uses, so that neither imports the other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bastion.runners.base import Runner, factory_for
from bastion.runners.gpus import SETTING, GpuLedger


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
        self._made: dict[str, Runner] = {}

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

"""The daemon's view of the quota file: re-read only when it changed, last good kept.

With no quota file at all the daemon runs one project, ``default``, whose pool is this machine
(CPUs, memory in GiB, GPUs), so the embedded default works with no set-up. A file that turns
invalid is reported in the daemon log and ignored: the daemon never crash-loops on it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

import psutil

from bastion.bucket.store import Store
from quota.config import QuotaConfig, QuotaError, default_quota, parse_quota
from quota.model import JobRequest
from quota.usage import UsageLedger, usage_now

log = logging.getLogger("bastion.quota")


def machine_pool(gpus: Sequence[int]) -> dict[str, int]:
    pool = {"cpu": os.cpu_count() or 1, "memory": psutil.virtual_memory().total >> 30}
    if gpus:
        pool["gpu"] = len(gpus)
    return pool


def missing_after_good(url: str) -> str:
    """Why the daemon keeps the last good quota although no file is there: a deleted file (or
    one uploaded to another path) would otherwise drop every project but ``default``."""
    return (
        f"the file is gone (deleted, or uploaded to another path); keeping the last good quota; "
        f"put one back with: bastion quota upload FILE (it writes {url})"
    )


class QuotaSource:
    def __init__(self, store: Store, url: str | None, pool: Mapping[str, int]) -> None:
        self.store = store
        self.url = url or store.quota.default_url()
        self.machine_pool = dict(pool)
        self.config: QuotaConfig | None = None
        self.from_file = False  # the config came from a quota file (now or its last good)
        self.error = ""
        self._token: str | None = "<never read>"
        self._usage: UsageLedger | None = None

    def refresh(self) -> None:
        """One metadata call; a download only when the file changed."""
        token = self.store.quota.token(self.url)
        if token == self._token:
            return
        self._token = token
        if token is None:
            kept = self.config if self.from_file else self._last_good()
            if kept is not None:  # deleted or moved after a good one: as an invalid file
                self.config, self.from_file = kept, True
                self.error = missing_after_good(self.url)
                log.error("quota file %s: %s", self.url, self.error)
                return
            self.config = default_quota(self.machine_pool)
            self.error = ""
            log.info(
                "no quota file at %s: one project 'default' with this machine's pool %s",
                self.url,
                self.machine_pool,
            )
            return
        try:
            text = self.store.quota.read(self.url).decode()
            config = parse_quota(text, source=self.url)
        except QuotaError as e:
            self.error = "; ".join(e.problems) or str(e)
            if self.config is None:
                self.config = self._last_good()
                self.from_file = self.config is not None
            kept = "keeping the last good quota" if self.config else "no job will start"
            log.error("quota file %s is invalid (%s): %s", self.url, kept, self.error)
            return
        except (OSError, UnicodeDecodeError) as e:
            self._token = "<unreadable>"  # try again next cycle
            log.error("could not read quota file %s: %s", self.url, e)
            return
        self.config, self.error, self.from_file = config, "", True
        try:
            self.store.quota.write_last_good(text)
        except OSError as e:
            log.warning("could not save the last good quota: %s", e)
        log.info(
            "loaded quota file %s: pool %s, projects %s",
            self.url,
            config.pool,
            sorted(config.shares),
        )

    def _last_good(self) -> QuotaConfig | None:
        """The last file that parsed, saved in the bucket so a restart survives a bad edit."""
        try:
            text = self.store.quota.read_last_good()
            return parse_quota(text, source="last good quota") if text else None
        except (OSError, QuotaError) as e:
            log.error("no usable last good quota: %s", e)
            return None

    def usage_for(self, jobs: Sequence[JobRequest], now: float) -> Mapping[str, float]:
        """Decayed per-user usage, advanced with the jobs running now (quota.usage.usage_now)."""
        assert self.config is not None
        half_life = self.config.scheduling.usage_half_life_seconds
        if self._usage is None:
            self._usage = self._load_usage(half_life, now)
        self._usage = usage_now(self._usage, half_life, jobs, now)
        return self._usage.by_user

    def _load_usage(self, half_life: float, now: float) -> UsageLedger:
        """The ledger saved by the last daemon; advancing it from its as_of with the jobs running
        now re-creates the usage accrued since, so it only needs saving when something changed."""
        try:
            data = self.store.usage.read()
            if data:
                return UsageLedger.from_json(data)
        except (OSError, ValueError) as e:
            log.warning("usage ledger unreadable, starting from zero: %s", e)
        return UsageLedger(half_life_seconds=half_life, as_of=now, by_user={})

    def save_usage(self) -> None:
        if self._usage is not None:
            self.store.usage.write(self._usage.to_json())

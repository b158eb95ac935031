"""The daemon's loop: one cycle runs the steps in order on the shared context."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import signal
import time
from typing import Any

from bastion import heap
from bastion.bucket.specwatch import Look
from bastion.bucket.store import Store
from bastion.daemon import (
    archive,
    effects,
    gates,
    ingest,
    observe,
    plan,
    publish,
    recovery,
    snapshot,
    status_page,
    writeback,
)
from bastion.daemon.context import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_START_GIVE_UP_SECONDS,
    SWEEP_EVERY_CYCLES,
    Context,
    CycleReport,
    NotHolding,
)
from bastion.lease import Lease
from bastion.quota_source import QuotaSource
from bastion.runners.instances import Runners

log = logging.getLogger("bastion.daemon")
# Between cycles more than this apart, the acting daemon glances at jobs/user_states/ this
# often (one listing request) and starts the next cycle at once when something was submitted
# or cancelled: submit to running in about half of it, whatever --poll_seconds.
WAKE_SECONDS = 1.0


class Daemon:
    def __init__(
        self,
        store: Store,
        runners: Runners,
        work_dir: str,
        quota: QuotaSource,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        max_workers: int = 48,
        lease: Lease | None = None,
        start_give_up_seconds: float = DEFAULT_START_GIVE_UP_SECONDS,
    ) -> None:
        self.ctx = Context(
            store=store,
            runners=runners,
            work_dir=work_dir,
            quota=quota,
            grace_seconds=grace_seconds,
            max_workers=max_workers,
            lease=lease,
            start_give_up_seconds=start_give_up_seconds,
        )

    def __getattr__(self, name: str) -> Any:
        """Reading the cycle's state through the daemon (``daemon.jobs``, ``daemon.store``,
        ``daemon.runners``...), as tools and tests do; the steps get the context itself."""
        return getattr(self.__dict__["ctx"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        """What the context holds is set on the context (``daemon.info = ...``), so the
        steps see it; only ``ctx`` itself lives on the daemon."""
        if name != "ctx" and hasattr(self.__dict__.get("ctx"), name):
            setattr(self.__dict__["ctx"], name, value)
        else:
            object.__setattr__(self, name, value)

    def run(self, poll_seconds: float, once: bool = False) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.ctx.stop.set())
        try:
            while not self.ctx.stop.is_set():
                started = time.monotonic()
                if self.ctx.lease is None or self.ctx.lease.hold():
                    self._run_cycle(poll_seconds)
                else:
                    self._forget()
                    writeback.sync_daemon_log(self.ctx)
                if once:
                    break
                self.wait_for_work(started + poll_seconds)
        finally:
            log.info("stopping; running jobs keep running and are adopted by the next daemon")
            self.settle()
            if self.ctx.lease is None or self.ctx.lease.held:
                with contextlib.suppress(Exception):
                    writeback.write_back(
                        self.ctx
                    )  # what the last effects changed (handles), then let go
                with contextlib.suppress(Exception):
                    writeback.save_usage(self.ctx, force=True)
                with contextlib.suppress(Exception):
                    snapshot.write_now(self.ctx)  # the next daemon reads only the snapshot
            if self.ctx.page is not None:
                self.ctx.page.wait(timeout=10.0)  # a render in flight lands (start --once)
            if self.ctx.lease is not None:
                self.ctx.lease.release()
            writeback.sync_daemon_log(self.ctx, force=True)

    def wait_for_work(self, until: float) -> None:
        """Until the next cycle is due, or a stop; while acting, a glance at the submissions
        every WAKE_SECONDS ends the wait early when one came (bastion/bucket/specwatch.py),
        and specs left unread by the last cycle's intake bound end it at once."""
        while not self.ctx.stop.is_set():
            left = until - time.monotonic()
            if left <= 0 or self.ctx.intake_backlog:  # a burst's rest: taken in at once
                return
            acting = self.ctx.recovered and (self.ctx.lease is None or self.ctx.lease.held)
            if not acting or left <= WAKE_SECONDS:
                self.ctx.stop.wait(left)
                return
            self.ctx.stop.wait(WAKE_SECONDS)
            if not self.ctx.stop.is_set() and self.ctx.specwatch.glance():
                return

    def close(self) -> None:
        """After the last ``run``: the pools and the runners' clients (and the lease, for a
        daemon driven by ``cycle`` alone)."""
        if self.ctx.lease is not None:
            self.ctx.lease.close()
        self.ctx.prefetch.close()
        self.settle()
        if self.ctx.page is not None:
            self.ctx.page.wait()  # a render in flight writes before the store goes
        if self.ctx.effects_pool is not None:
            self.ctx.effects_pool.shutdown(wait=True)
        self.ctx.pool.shutdown(wait=True)
        self.ctx.runners.close()
        heap.thaw()

    def _run_cycle(self, poll_seconds: float) -> None:
        try:
            report = self.cycle(time.time())
            if report.seconds > poll_seconds:
                log.warning(
                    "cycle took %.2fs, longer than --poll_seconds=%s (slowest: %s)",
                    report.seconds,
                    poll_seconds,
                    report.slowest(),
                )
        except NotHolding:
            log.error("the lease is not certainly ours; acting no more")
            self.ctx.lost_ownership = True
        except Exception:  # a failed listing (bucket outage): log it and try again
            log.exception("cycle %d failed; retrying in %ss", self.ctx.cycles, poll_seconds)
        if self.ctx.lost_ownership:
            log.error("another daemon may act on this root; stopping")
            if self.ctx.lease is not None:
                self.ctx.lease.release()
            self._forget()

    def _forget(self) -> None:
        """Drop what we know; if we act again it starts with a full recovery from the bucket."""
        if self.ctx.jobs or self.ctx.recovered:
            log.info("not acting on %s; forgetting in-memory state", self.ctx.store.root_url)
        self.ctx.jobs.clear()
        self.ctx.index.clear()
        self.ctx.job_changes += 1
        heap.thaw()  # what the recovery froze is collectable again
        self.ctx.start_retries.clear()
        self.ctx.deleting.clear()
        self.ctx.deletes_in_pool.clear()
        self.ctx.deletes_of.clear()
        with self.ctx.results_lock:
            self.ctx.effect_results.clear()
            self.ctx.undeleted.clear()
        self.ctx.cycles = 0
        self.ctx.recovered = False
        self.ctx.lost_ownership = False
        self.ctx.queue_written = ""
        self.ctx.inputs_changed = True
        self.ctx.specwatch.forget()
        self.ctx.ledger.reset()  # acting again: its first pass records every attempt anew

    def settle(self, timeout: float = 60.0) -> None:
        """Wait for the effects in flight and take in their results, and for a prefetch
        under way (tests, shutdown)."""
        concurrent.futures.wait(list(self.ctx.futures), timeout=timeout)
        self.ctx.prefetch.peek()
        effects.take_in_results(self.ctx)

    def cycle(self, now: float) -> CycleReport:
        ops_before = dict(self.ctx.store.ops)
        report = CycleReport()
        mark = time.perf_counter()

        def done(phase: str) -> None:
            nonlocal mark
            report.phases[phase] = time.perf_counter() - mark
            mark = time.perf_counter()

        look = self.ctx.specwatch.look(now, full=not self.ctx.recovered)
        done("list")
        if not self.ctx.recovered:
            self._recover(look, now)
            done("recover")
        self.ctx.cycles += 1
        for runner in self.ctx.runners.made():
            runner.begin_cycle()
        effects.take_in_results(self.ctx)
        self.ctx.quota.refresh()
        publish.publish_capabilities(self.ctx)
        done("quota")
        ingest.read_specs(self.ctx, look, now)
        done("read_specs")
        ingest.apply_requests(self.ctx, look.requests, now)
        done("requests")
        observe.observe(self.ctx, now)
        done("observe")
        gates.enforce_time_limits(self.ctx, now)
        done("time_limits")
        report.planned = plan.run_pass(self.ctx, now)
        done("schedule")
        writeback.write_back(self.ctx)
        done("write_back")
        effects.carry_out(self.ctx, now)
        done("effects")
        if self.ctx.cycles % SWEEP_EVERY_CYCLES == 0:
            recovery.upkeep(self.ctx, now)
            done("upkeep")
        archive.finalize_all(self.ctx, now)
        done("finalize")
        snapshot.maybe_write(self.ctx, now)  # the shards that changed, in the background
        done("snapshot")
        status_page.offer_page(self.ctx, now)  # rendered and written in the background
        done("status_page")
        consumed = self.ctx.specwatch.hand_off()  # submission markers taken in: deleted at leisure
        if consumed:
            effects.submit(self.ctx, self.ctx.specwatch.delete, consumed)
        writeback.sync_daemon_log(self.ctx)
        done("daemon_log")
        self.ctx.settle_attention()
        done("attention")
        if self._freeze_taken_in():
            done("freeze")
        report.seconds = time.time() - now
        ops = self.ctx.store.ops.items()
        report.ops = {k: moved for k, v in ops if (moved := v - ops_before.get(k, 0))}
        return report

    def _recover(self, look: Look, now: float) -> None:
        """The first cycle's recovery from the first look, which lists every spec; raises if
        a state is unreadable."""
        assert look.specs is not None
        with heap.bulk_load():  # most of what it holds, made at once: frozen after
            recovery.recover(self.ctx, look.specs, now)
        self.ctx.recovered = True
        self.ctx.born_since_freeze = 0  # (what it took in is frozen)

    def _freeze_taken_in(self) -> bool:
        """Once FREEZE_AFTER_JOBS jobs were taken in since the last freeze, what they made is
        frozen (heap.settle); True when it was."""
        if self.ctx.born_since_freeze < heap.FREEZE_AFTER_JOBS:
            return False
        heap.settle()
        self.ctx.born_since_freeze = 0
        return True

    def daemon_log_path(self) -> str:
        return self.ctx.logs.path(self.ctx.daemon_log)

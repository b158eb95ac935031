"""``bastion agent``: runs a job's command on one worker of a remote slice; reports via the bucket.

Delivered as a VM's startup script (TPU, GCE) or a container's command, it replaces SSH: the
daemon never connects to a worker, it reads what the agent writes under
``ROOT/runs/<job>/<attempt>/workers/<w>/`` (names in
:class:`bastion.bucket.store.Store`, section runs):

- ``started``, created only if absent: a startup script that runs again on the same attempt
  (reboot, repair) finds the claim and exits 0 without starting the command a second time. A
  command that died with its VM is then seen by the daemon as a stale heartbeat (LOST, requeued
  as a new attempt), never silently restarted inside the old one.
- ``heartbeat`` every ``--heartbeat_seconds`` while the command runs, so a VM that vanished
  without a word is noticed.
- ``log/<seq>``: the command's stdout+stderr go to a local spool file; every
  ``--chunk_seconds`` the bytes written since the last upload become the next numbered chunk
  (GCS has no append, and re-uploading a growing object would cost O(output) per upload).
  A chunk is cut once and retried with the same bytes under the same name until stored, so a
  write whose answer was lost is rewritten identically; the sequence advances only after.
- ``exit``: ``{code, preempted, time, reason}``, after the last chunk.

On SIGTERM (the VM's shutdown: 30 s on Spot) or when the metadata server says
``instance/preempted`` is TRUE, the command's process group gets SIGTERM, SIGKILL after
``--grace_seconds``, then the last chunk and the exit record are written inside the window.

Whatever of the command still runs once its main process has ended (a ``setsid`` or ``nohup``
child, a background process it did not wait for) is ended too: every process the command
starts carries ``BASTION_ATTEMPT_NAME`` and ``BASTION_WORKER`` in its environment, so a scan
of ``/proc`` finds it wherever it went (:mod:`bastion.leftovers`); SIGTERM, SIGKILL after
:data:`LEFTOVER_GRACE` (less when stopping: the Spot window), and the exit record names what
was killed (``left_behind``), which the job's history shows.

    python -m bastion.agent --root=gs://b/r --job=train --attempt=NAME -- python3 train.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from bastion import leftovers
from bastion.bucket.store import Store
from bastion.outputs.checkpoint import read_checkpoint_time
from bastion.outputs.supervise import stop_signal, sync_seconds
from bastion.outputs.syncer import Periodic, Syncer

log = logging.getLogger("bastion.agent")

LEFTOVER_GRACE = 5.0  # SIGTERM to SIGKILL for what outlived the command (2 s when stopping)
MAX_CHUNK = 8 << 20  # bound memory per upload; the rest goes in the next chunk right after
SPOT_WINDOW_SECONDS = 30.0  # from the shutdown notice to the VM's power-off
OUTPUT_SYNC_SECONDS = 30.0  # between syncs of the outputs ($BASTION_SYNC_SECONDS overrides)


def job_stop_signal() -> int:
    """The signal the job chose to be warned with ($BASTION_STOP_SIGNAL; TERM)."""
    return stop_signal(dict(os.environ))


def job_grace(window: float) -> float:
    """The job's grace ($BASTION_GRACE_SECONDS), within the agent's ``window`` (the cloud's
    own: a Spot VM is powered off 30 s after its notice, whatever the job asked for)."""
    try:
        return min(window, float(os.environ.get("BASTION_GRACE_SECONDS") or window))
    except ValueError:
        return window


# -- the metadata server (GCE_METADATA_HOST, as google-auth finds it) -----------------------------


def metadata_base() -> str:
    host = os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_ROOT")
    return f"http://{host or 'metadata.google.internal'}/computeMetadata/v1/"


def metadata(path: str, timeout: float = 2.0) -> str | None:
    """A metadata value; None when absent (404) or when there is no metadata server."""
    request = urllib.request.Request(metadata_base() + path, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.read().decode().strip()
    except (OSError, urllib.error.URLError, ValueError):
        return None


def worker_index(flag: int | None, env_var: str | None = None) -> int:
    """--worker, else the variable ``env_var`` names (a GKE pod's completion index, which the
    pod spec maps in from its annotations), else the TPU VM's ``agent-worker-number``
    attribute, else 0 (one host). Within one slice: :func:`slice_of` turns it into the
    attempt's worker number."""
    if flag is not None:
        return flag
    if env_var:
        value = os.environ.get(env_var, "")
        if not value.isdigit():
            raise ValueError(f"--worker_env={env_var}: the variable is {value!r}, not an index")
        return int(value)
    value = metadata("instance/attributes/agent-worker-number")
    return int(value) if value and value.isdigit() else 0


MEGASCALE = (
    "MEGASCALE_SLICE_ID",
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_COORDINATOR_ADDRESS",
    "MEGASCALE_PORT",
)


def parse_tpu_env(text: str) -> dict[str, str]:
    """The TPU VM's ``tpu-env`` metadata attribute: lines ``KEY: 'value'``."""
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().isidentifier():
            found[key.strip()] = value.strip().strip("'\"")
    return found


def slice_of(num_slices: int, tpu_env: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    """(this worker's slice, the variables its command gets) in an attempt of ``num_slices``.

    One startup script serves every slice of a multislice queued resource, so the slice is
    learnt on the VM: the TPU runtime's ``tpu-env`` attribute names it (``MEGASCALE_SLICE_ID``,
    with ``MEGASCALE_NUM_SLICES``, ``MEGASCALE_COORDINATOR_ADDRESS``, ``MEGASCALE_PORT``), and
    the command gets those (as JAX/libtpu and AXLearn read them) plus ``BASTION_SLICE`` and
    ``BASTION_NUM_SLICES``. Without a slice id in a multislice attempt the workers of
    different slices would take the same numbers: ValueError, saying so."""
    if num_slices <= 1:
        return 0, {"BASTION_SLICE": "0", "BASTION_NUM_SLICES": "1"}
    if tpu_env is None:
        tpu_env = parse_tpu_env(metadata("instance/attributes/tpu-env") or "")
    said = tpu_env.get("MEGASCALE_SLICE_ID", "")
    if not said.isdigit() or int(said) >= num_slices:
        raise ValueError(
            f"this attempt has {num_slices} slices but the TPU metadata attribute "
            f"tpu-env gives no MEGASCALE_SLICE_ID below {num_slices} "
            f"(found {said!r}): the VM is not part of a multislice"
        )
    count = tpu_env.get("MEGASCALE_NUM_SLICES", str(num_slices))
    if count != str(num_slices):
        raise ValueError(
            f"this attempt has {num_slices} slices but tpu-env says MEGASCALE_NUM_SLICES={count}"
        )
    env = {k: tpu_env[k] for k in MEGASCALE if tpu_env.get(k)}
    env.update(
        MEGASCALE_NUM_SLICES=str(num_slices), BASTION_SLICE=said, BASTION_NUM_SLICES=str(num_slices)
    )
    return int(said), env


# -- the agent ----------------------------------------------------------------------------------


class Agent:
    def __init__(
        self,
        store: Store,
        job: str,
        attempt: str,
        worker: int,
        num_workers: int,
        command: str,
        chunk_seconds: float = 5.0,
        heartbeat_seconds: float = 10.0,
        grace_seconds: float = 25.0,
        spool_dir: str | None = None,
        bundle: dict[str, Any] | None = None,
        slice_env: dict[str, str] | None = None,
    ) -> None:
        self.slice_env = dict(slice_env or {})  # slice_of's variables for the command
        self.bundle = bundle  # the job's code (bundlers.Bundle record), fetched before it runs
        self.store, self.job, self.attempt = store, job, attempt
        self.worker, self.num_workers, self.command = worker, num_workers, command
        self.chunk_seconds, self.heartbeat_seconds = chunk_seconds, heartbeat_seconds
        self.grace_seconds = grace_seconds
        env = {"BASTION_SYNC_SECONDS": str(OUTPUT_SYNC_SECONDS), **os.environ}
        self.sync_seconds = sync_seconds(env)
        spool_dir = spool_dir or tempfile.mkdtemp(prefix="bastion-agent-")
        self.spool = os.path.join(spool_dir, f"{job}.{attempt}.{worker}.out")
        self.uploaded = 0  # spool bytes known to be in the bucket
        self.seq = 0  # the next chunk's number
        self._pending: bytes | None = None  # cut but not yet known stored: retried as it is
        self._progress_due = False  # chunks stored that the progress record does not count
        self.stop = threading.Event()
        self.stop_reason = ""
        self.preempted = False
        self.stopped_at = 0.0
        # The job's outputs: restored before the command, synced while it runs and once more
        # after it ends (bastion/outputs/), worker k's apart from worker 0's.
        self.output_dir = os.path.join(spool_dir, f"{job}.{attempt}.{worker}.outputs")
        self.syncer: Syncer | None = None
        self._reported_checkpoint: float | None = None

    def _record(self, **fields: Any) -> dict[str, Any]:
        return {"worker": self.worker, "time": time.time(), **fields}

    def _retry(self, what: str, fn: Callable[[], Any], deadline: float) -> Any:
        """Bucket writes are retried with backoff until ``deadline``: a worker cannot report
        any other way, so giving up early loses the attempt's record."""
        delay = 0.5
        while True:
            try:
                return fn()
            except Exception as e:
                if time.time() + delay > deadline:
                    raise
                log.warning(
                    "%s failed (%s: %s); retrying in %.1fs", what, type(e).__name__, e, delay
                )
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def request_stop(self, reason: str, preempted: bool = False) -> None:
        if not self.stop.is_set():
            self.preempted = preempted
            self.stop_reason = reason
            self.stopped_at = time.time()
            self.stop.set()

    def watch_preemption(self, poll_seconds: float = 1.0) -> None:
        """In a thread: long-poll ``instance/preempted``; no metadata server (a laptop, GKE
        without one) only means no notice, so errors back off and retry quietly."""
        wait = "?wait_for_change=true&timeout_sec=60"
        query = ""
        while not self.stop.is_set():
            value = metadata("instance/preempted" + query, timeout=70 if query else 2)
            if value == "TRUE":
                log.warning("the metadata server says this VM is preempted")
                self.request_stop("preempted by the provider", preempted=True)
                return
            if value is None:
                query = ""
                self.stop.wait(poll_seconds)
                poll_seconds = min(poll_seconds * 2, 30.0)
            else:
                query = wait  # first a plain read (already TRUE?), then wait for a change

    def _confirm_preemption(self) -> None:
        """A stop by SIGTERM may be the provider's: a Spot VM's shutdown sends it at the moment
        ``instance/preempted`` turns TRUE, and the signal can win the race with the watcher's
        long-poll. Asked once more here, so the exit record says preempted (the job is requeued)
        instead of a failure with status 143."""
        stopped = self.stop.is_set() and not self.preempted
        if stopped and metadata("instance/preempted") == "TRUE":
            log.warning("stopped while the metadata server says this VM is preempted")
            self.preempted = True
            self.stop_reason = "preempted by the provider"

    def flush(self, deadline: float) -> None:
        """Upload what the command wrote since the last chunk, in chunks of at most MAX_CHUNK."""
        with open(self.spool, "rb") as spool:
            while True:
                if self._pending is None:
                    spool.seek(self.uploaded)
                    self._pending = spool.read(MAX_CHUNK) or None
                if self._pending is None:
                    break
                data, seq = self._pending, self.seq
                self._retry(f"chunk {seq}", lambda d=data, n=seq: self._put(n, d), deadline)
                self.uploaded += len(data)
                self.seq += 1
                self._pending = None
                self._progress_due = True
            if self._progress_due:  # after the chunks it counts: a reader never runs ahead
                self._retry("progress", self._put_progress, deadline)
                self._progress_due = False

    def _put_progress(self) -> None:
        record = self._record(chunks=self.seq, bytes=self.uploaded)
        self.store.agents.write(self.job, self.attempt, self.worker, "progress", record)

    def _put(self, seq: int, data: bytes) -> None:
        self.store.runs.write_chunk(self.job, self.attempt, self.worker, seq, data)

    def heartbeat(self, deadline: float) -> None:
        record = self._record(uploaded=self.uploaded, host=socket.gethostname())
        self._retry(
            "heartbeat",
            lambda: self.store.agents.write(
                self.job, self.attempt, self.worker, "heartbeat", record
            ),
            deadline,
        )

    def report_checkpoint(self, deadline: float) -> None:
        """The job's progress report (``.bastion/checkpoint.json``), as a ``checkpoint``
        record written only when its time changed: the daemon reads it once per change."""
        when = read_checkpoint_time(self.output_dir)
        if when is None or when == self._reported_checkpoint:
            return
        record = self._record(checkpoint=when)
        record["time"] = when  # (the record's time is the checkpoint's)
        self._retry(
            "checkpoint",
            lambda: self.store.agents.write(
                self.job, self.attempt, self.worker, "checkpoint", record
            ),
            deadline,
        )
        self._reported_checkpoint = when

    def run(self) -> int:
        started = self._record(
            host=socket.gethostname(),
            pid=os.getpid(),
            num_workers=self.num_workers,
            command=self.command,
        )
        claim = lambda: self.store.agents.claim(self.job, self.attempt, self.worker, started)  # noqa: E731
        if not self._retry("claim", claim, time.time() + 600):
            log.info(
                "worker %d of %s already started: not running the command again",
                self.worker,
                self.attempt,
            )
            return 0
        cwd = None
        if self.bundle:
            try:
                cwd = self._unpack()
            except Exception as e:  # a bundle that fails its digest never runs
                return self._refuse(f"the job's bundle could not be used: {e}")
        try:
            self._restore()
        except Exception as e:  # never start the job without its checkpoint
            return self._refuse(f"its outputs could not be restored from the bucket: {e}")
        proc = self._spawn(cwd)
        periodic = Periodic(self.syncer, self.sync_seconds).start() if self.syncer else None
        code = self._supervise(proc)
        if periodic is not None:
            periodic.stop()
        left = self._end_left_behind(proc)
        self._confirm_preemption()
        return self._finish(code, left)

    def _spawn(self, cwd: str | None) -> subprocess.Popen[bytes]:
        env = dict(
            os.environ,
            BASTION_WORKER=str(self.worker),
            BASTION_NUM_WORKERS=str(self.num_workers),
            BASTION_OUTPUT_DIR=self.output_dir,
            BASTION_OUTPUT_URL=self.store.outputs.url(self.job, self.worker),
            **self.slice_env,
            **{leftovers.MARKER: self.attempt},
        )
        with open(self.spool, "wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", self.command],
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own group: signals reach everything it started
            )
        log.info("worker %d of %s: started pid %d", self.worker, self.attempt, proc.pid)
        return proc

    def _restore(self) -> None:
        """The worker's outputs from the bucket into its output directory (a few tries)."""
        attempt_number = int(os.environ.get("BASTION_ATTEMPT") or 0)
        syncer = Syncer(self.store.outputs, self.job, self.output_dir, self.worker, attempt_number)
        syncer.stats.purpose = os.environ.get("BASTION_PURPOSE") or "run"
        self._retry("restoring outputs", syncer.restore, time.time() + 120)
        self.syncer = syncer

    def _finish(self, code: int, left: list[leftovers.Process]) -> int:
        """The last output, the outputs' final sync, then the exit record: after a stop
        request everything must land inside the Spot window; else be patient."""
        end = self.stopped_at + SPOT_WINDOW_SECONDS - 1 if self.stop.is_set() else time.time() + 600
        end = max(end, time.time() + 3)
        try:
            self.flush(end)
        except Exception as e:  # the exit record still matters more than the last bytes
            log.error("could not upload the last output: %s", e)
        self._final_sync(end - 2)
        reason = self.stop_reason or f"exited with status {code}"
        exit_record = self._record(
            code=code,
            preempted=self.preempted,
            reason=reason,
            output_bytes=self.uploaded,
            chunks=self.seq,
        )
        if left:
            exit_record["left_behind"] = leftovers.describe(left)
        self._retry(
            "exit record",
            lambda: self.store.agents.write(
                self.job, self.attempt, self.worker, "exit", exit_record
            ),
            end,
        )
        log.info("worker %d of %s: %s (code %d)", self.worker, self.attempt, reason, code)
        return code

    def _final_sync(self, deadline: float) -> None:
        """The outputs once more, after the command ended, in a thread bounded by ``deadline``
        (the exit record must still land before the VM goes); then the attempt's summary."""
        syncer = self.syncer
        if syncer is None:
            return

        def final() -> None:
            syncer.sync(final=True)
            syncer.write_summary()

        thread = threading.Thread(target=final, name="final-sync", daemon=True)
        thread.start()
        thread.join(max(0.0, deadline - time.time()))
        if thread.is_alive():
            log.error("the final sync of the outputs did not end in the window")

    def _unpack(self) -> str:
        """Fetch the job's code, verify its digest and extract it: the command runs in it."""
        from bundlers import Bundle, fetch

        bundle = Bundle.from_json(dict(self.bundle or {}))
        if bundle.kind != "tar":
            raise ValueError(f"a {bundle.kind} bundle runs as a container image, not here")
        work = tempfile.mkdtemp(prefix=f"bastion-{self.attempt}-{self.worker}-")
        fetch(bundle, self.store, work)
        return work

    def _refuse(self, reason: str) -> int:
        """The command cannot run: say why in the exit record (code 1), run nothing."""
        log.error("worker %d of %s: %s", self.worker, self.attempt, reason)
        record = self._record(code=1, preempted=False, reason=reason, output_bytes=0, chunks=0)
        self._retry(
            "exit record",
            lambda: self.store.agents.write(self.job, self.attempt, self.worker, "exit", record),
            time.time() + 60,
        )
        return 1

    def _supervise(self, proc: subprocess.Popen[bytes]) -> int:
        """Wait for the command, uploading and heartbeating; on a stop request SIGTERM its
        group, SIGKILL after the grace. Uploads here get a short deadline: a bucket outage
        must not stop the command, the pending chunk is retried on the next tick."""
        next_chunk = next_beat = time.time()
        kill_at = None
        while proc.poll() is None:
            now = time.time()
            if self.stop.is_set() and kill_at is None:
                log.info("stopping the command: %s", self.stop_reason)
                self._signal(proc, job_stop_signal())
                kill_at = now + job_grace(self.grace_seconds)
            if kill_at is not None and now >= kill_at:
                self._signal(proc, signal.SIGKILL)
                kill_at = float("inf")
            if kill_at is None:  # while stopping, the window is for the last chunk only
                try:
                    if now >= next_beat:
                        self.heartbeat(now + 5)
                        self.report_checkpoint(now + 5)
                        next_beat = now + self.heartbeat_seconds
                    if now >= next_chunk and os.path.getsize(self.spool) > self.uploaded:
                        self.flush(now + 5)
                        next_chunk = now + self.chunk_seconds
                except Exception as e:
                    log.warning("upload failed, will retry: %s", e)
            time.sleep(0.1)
        code = proc.returncode
        return 128 - code if code < 0 else code

    def _end_left_behind(self, proc: subprocess.Popen[bytes]) -> list[leftovers.Process]:
        """The command's main process has ended: end what it left running, in its group or
        out of it (found by the marker), and return those processes for the exit record."""
        stopping = self.stop.is_set()
        grace = min(LEFTOVER_GRACE, 2.0) if stopping else LEFTOVER_GRACE
        left = leftovers.end(
            self.attempt, grace, worker=str(self.worker), group=proc.pid, group_termed=stopping
        )
        if left:
            log.warning("worker %d of %s: %s", self.worker, self.attempt, leftovers.describe(left))
        return left

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def parser() -> argparse.ArgumentParser:
    """The agent's flags (what the startup script, container or batch script passes)."""
    p = argparse.ArgumentParser(prog="bastion agent")
    p.add_argument("--root", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--attempt", required=True, help="the attempt's name")
    p.add_argument("--worker", type=int, default=None, help="default: agent-worker-number, else 0")
    p.add_argument("--num_workers", type=int, default=1)
    p.add_argument(
        "--num_slices",
        type=int,
        default=1,
        help="slices of a multislice attempt; the worker's slice is tpu-env's",
    )
    p.add_argument(
        "--worker_env",
        default=None,
        help="a variable holding the worker's index within its slice (GKE's "
        "pod index; a Slurm step's SLURM_PROCID, one agent per node)",
    )
    p.add_argument(
        "--slices_from_env",
        action="store_true",
        help="MEGASCALE_* come from the environment (GKE), not tpu-env",
    )
    p.add_argument("--chunk_seconds", type=float, default=5.0)
    p.add_argument("--heartbeat_seconds", type=float, default=10.0)
    p.add_argument("--grace_seconds", type=float, default=25.0)
    p.add_argument("--spool_dir", default=None)
    p.add_argument("--bundle", default=None, help="the job's bundle record (JSON)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print(
            "usage: python -m bastion.agent --root=URL --job=NAME --attempt=NAME -- COMMAND",
            file=sys.stderr,
        )
        return 2
    split = argv.index("--")
    args = parser().parse_args(argv[:split])
    command = " ".join(argv[split + 1 :])
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s bastion-agent %(levelname)s %(message)s"
    )
    try:
        slice_id, slice_env = slice_of(
            args.num_slices, dict(os.environ) if args.slices_from_env else None
        )
        worker = worker_index(args.worker, args.worker_env)
    except ValueError as e:
        log.error("%s", e)
        return 2
    if args.worker is None:  # agent-worker-number counts within the slice
        worker += slice_id * (args.num_workers // max(1, args.num_slices))
    agent = Agent(
        Store(args.root),
        args.job,
        args.attempt,
        worker,
        args.num_workers,
        command,
        args.chunk_seconds,
        args.heartbeat_seconds,
        args.grace_seconds,
        args.spool_dir,
        json.loads(args.bundle) if args.bundle else None,
        slice_env,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(
            sig, lambda signum, _: agent.request_stop(f"stopped by {signal.Signals(signum).name}")
        )
    threading.Thread(target=agent.watch_preemption, daemon=True, name="preemption").start()
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())

"""Outputs on cloud VMs: the real agent, started by the TPU and GCE runners' startup scripts
on the stand-ins (tests/standins), restores each worker's outputs, syncs them while the job
runs and once more after a preemption's warning, so the next attempt resumes."""

from __future__ import annotations

import dataclasses
import time

from bastion.bucket.store import Store
from bastion.runners.base import AttemptPhase
from tests import test_cloud_runners as cloud
from tests.test_cloud_runners import A3, V4, attempt, poll_until

# The stand-ins, their guests and the runners: the fixtures of tests/test_cloud_runners.py
guests, root = cloud.guests, cloud.root
tpu_server, tpu, gce_server, gce = cloud.tpu_server, cloud.tpu, cloud.gce_server, cloud.gce

# Counts on from its checkpoint; on the warning it writes one last checkpoint (it takes 1 s)
# and ends. Each worker keeps its own (worker k's apart in the bucket).
RESUMABLE = (
    'f="$BASTION_OUTPUT_DIR/ckpt.txt"; step=$(cat "$f" 2>/dev/null || echo 0); '
    'echo "worker $BASTION_WORKER start at $step"; '
    "trap 'sleep 1; echo $step > \"$BASTION_OUTPUT_DIR/last-words\"; exit 143' TERM; "
    'while true; do step=$((step+1)); echo $step > "$f.tmp"; mv "$f.tmp" "$f"; sleep 0.1; done'
)
ENV = {"BASTION_SYNC_SECONDS": "0.3", "BASTION_GRACE_SECONDS": "5"}


def with_env(a, n: int):
    return dataclasses.replace(a, env={**a.env, **ENV, "BASTION_ATTEMPT": str(n)})


def wait_synced(store: Store, worker: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while "ckpt.txt" not in store.outputs.list("train", worker=worker):
        assert time.monotonic() < deadline, f"worker {worker}'s checkpoint never synced"
        time.sleep(0.1)


def start_lines(output: str) -> list[int]:
    return [int(line.split()[-1]) for line in output.splitlines() if " start at " in line]


def test_tpu_preempted_attempt_is_resumed_by_the_next_on_every_worker(
    root, tpu_server, tpu, guests
):
    store = Store(root)
    first = with_env(attempt(root, RESUMABLE, n=1, **V4), 1)
    handle = tpu.start(first)
    poll_until(tpu, handle, tpu_server, {AttemptPhase.RUNNING})
    for worker in range(4):
        wait_synced(store, worker)
    guests.preempt(first.name)  # the metadata notice: the agents warn the job and sync
    tpu_server.preempt(first.name)
    seen = poll_until(
        tpu, handle, tpu_server, {AttemptPhase.PREEMPTED, AttemptPhase.FAILED}, timeout=40
    )
    assert seen.phase is AttemptPhase.PREEMPTED
    guests.wait(first.name)
    # Written after the warning, inside the grace: in the bucket, for every worker
    last = {w: store.outputs.list("train", worker=w) for w in range(4)}
    assert all("last-words" in files for files in last.values()), last
    tpu.stop(handle, time.time() + 30)
    tpu_server.tick()
    assert tpu.delete(handle) is True
    second = with_env(attempt(root, RESUMABLE, n=2, **V4), 2)
    handle2 = tpu.start(second)
    poll_until(tpu, handle2, tpu_server, {AttemptPhase.RUNNING})
    deadline = time.monotonic() + 30
    while not start_lines(tpu.read_output(handle2, 0, 1 << 20).decode()):
        assert time.monotonic() < deadline
        tpu.poll(handle2)
        time.sleep(0.2)
    assert start_lines(tpu.read_output(handle2, 0, 1 << 20).decode())[0] > 0  # worker 0 resumed
    summaries = store.outputs.read_summaries("train")
    assert {(s["attempt"], s["worker"]) for s in summaries} >= {(1, w) for w in range(4)}
    assert all(s["final"] for s in summaries if s["attempt"] == 1)
    tpu.stop(handle2, time.time())
    tpu_server.tick()


def test_gce_lost_vm_attempt_is_resumed_by_the_next(root, gce_server, gce, guests):
    store = Store(root)
    first = with_env(attempt(root, RESUMABLE, n=1, **A3), 1)
    handle = gce.start(first)
    poll_until(gce, handle, gce_server, {AttemptPhase.RUNNING})
    wait_synced(store, 0)
    time.sleep(1)
    guests.shutdown(first.name)  # the VM's power-off: SIGTERM to the agent, which passes it on
    guests.wait(first.name)
    assert "last-words" in store.outputs.list("train")  # written in the grace, then synced
    gce_server.preempt(first.name)
    poll_until(gce, handle, gce_server, {AttemptPhase.PREEMPTED, AttemptPhase.FAILED}, timeout=40)
    second = with_env(attempt(root, RESUMABLE, n=2, **A3), 2)
    handle2 = gce.start(second)
    poll_until(gce, handle2, gce_server, {AttemptPhase.RUNNING})
    deadline = time.monotonic() + 30
    while not start_lines(gce.read_output(handle2, 0, 1 << 20).decode()):
        assert time.monotonic() < deadline
        gce.poll(handle2)
        time.sleep(0.2)
    resumed = start_lines(gce.read_output(handle2, 0, 1 << 20).decode())[0]
    last_words = int(open_text(store, "last-words"))
    assert resumed >= last_words > 0
    gce.stop(handle2, time.time())
    gce_server.tick()


def open_text(store: Store, name: str) -> str:
    return store.fs.cat_file(f"{store.root}/outputs/train/{name}").decode().strip()


def test_a_cloud_jobs_checkpoint_report_reaches_the_runners_observation(
    root, gce_server, gce, guests
):
    report = (
        'd="$BASTION_OUTPUT_DIR/.bastion"; mkdir -p "$d"; '
        'echo \'{"step": 9, "time": 1700000000.25}\' > "$d/checkpoint.json"; sleep 300'
    )
    handle = gce.start(with_env(attempt(root, report, n=1, **A3), 1))
    deadline = time.monotonic() + 60
    while (seen := gce.poll(handle)).checkpoint != 1700000000.25:
        assert time.monotonic() < deadline, seen
        assert not seen.finished, seen
        gce_server.tick()
        time.sleep(0.2)
    assert seen.phase is AttemptPhase.RUNNING
    gce.stop(handle, time.time())
    gce_server.tick()

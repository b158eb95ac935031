"""What a job's outputs cost: syncing while it runs, and restoring at an attempt's start.

Two measurements, both with the real syncer (bastion/outputs/syncer.py) against the GCS
emulator (fake-gcs-server, tests/gcs_emulator.py; ``--root DIR`` for a local directory):

1. **Sync cost per poll** for a job that writes a checkpoint of ``--checkpoint_mb`` (1,024: a
   1 GB checkpoint, in ``--shards`` files) every ``--period`` seconds (300) and keeps the last
   ``--keep`` (2), synced every ``--sync_seconds`` (5, the local runner's default). Virtual
   time: between two checkpoints the syncer runs period / sync_seconds times (60), each a real
   sync; only the sleeping is skipped. Reported: bucket requests and bytes per sync, per
   checkpoint period and per hour, and the wall time of a quiet sync (a stat of the
   directory). ``--scale`` (default 1/16) writes a smaller checkpoint and multiplies the bytes
   back: bytes are exactly proportional to the checkpoint's size, requests depend only on the
   number of files (said in the report when scaled).
2. **Restore time** of ``--restore_mb`` (1,024) in ``--shards`` files at an attempt's start:
   uploaded once, then restored into an empty directory, timed, ``--repeats`` times.

    .venv/bin/python benchmarks/bench_outputs.py [--checkpoint_mb 1024] [--scale 0.0625]
        [--shards 16] [--period 300] [--sync_seconds 5] [--periods 4] [--keep 2]
        [--restore_mb 1024] [--repeats 2] [--root DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bastion.bucket.store import Store
from bastion.outputs.syncer import Syncer
from tests.gcs_emulator import GcsEmulator

MB = 1 << 20


def write_checkpoint(directory: Path, step: int, size: int, shards: int, keep: int) -> None:
    """One checkpoint as ``shards`` files under ``ckpt-<step>/``, written then renamed (as a
    careful job writes), and the oldest beyond ``keep`` removed (rotation)."""
    part = directory / f".tmp-ckpt-{step}"
    part.mkdir(parents=True)
    chunk = os.urandom(min(size // shards, 4 * MB))
    for shard in range(shards):
        with open(part / f"shard-{shard:03d}", "wb") as f:
            left = size // shards
            while left > 0:
                f.write(chunk[: min(left, len(chunk))])
                left -= len(chunk)
    part.rename(directory / f"ckpt-{step}")
    for old in sorted(directory.glob("ckpt-*"), key=lambda p: int(p.name.split("-")[1]))[:-keep]:
        shutil.rmtree(old)


def sync_cost(store: Store, args: argparse.Namespace, tmp: Path) -> None:
    size = int(args.checkpoint_mb * MB * args.scale)
    local = tmp / "job-out"
    syncer = Syncer(store.outputs, f"bench-{uuid.uuid4().hex[:6]}", str(local))
    syncs_per_period = max(1, round(args.period / args.sync_seconds))
    quiet: list[float] = []
    periods = []
    for step in range(args.periods):
        before = (syncer.stats.requests, syncer.stats.synced_bytes)
        write_checkpoint(local, step, size, args.shards, args.keep)
        t0 = time.perf_counter()
        syncer.sync()  # the sync that finds the new checkpoint
        busy = time.perf_counter() - t0
        for _ in range(syncs_per_period - 1):  # the rest of the period: nothing changed
            t0 = time.perf_counter()
            syncer.sync()
            quiet.append(time.perf_counter() - t0)
        requests = syncer.stats.requests - before[0]
        data = syncer.stats.synced_bytes - before[1]
        periods.append((requests, data, busy))
    steady = periods[args.keep :] or periods[-1:]  # the first ``keep`` rotate nothing out
    requests = sum(p[0] for p in steady) / len(steady)
    data = sum(p[1] for p in steady) / len(steady) / args.scale
    busy = sum(p[2] for p in steady) / len(steady)
    per_hour = 3600 / args.period
    scaled = (
        f" (measured at {args.scale:g} of the size: {size / MB:.0f} MiB; bytes scaled back)"
        if args.scale != 1
        else ""
    )
    print(
        f"sync cost: a {args.checkpoint_mb} MiB checkpoint in {args.shards} files every "
        f"{args.period:g}s, keeping {args.keep}, synced every {args.sync_seconds:g}s{scaled}"
    )
    print(
        f"  per checkpoint period ({syncs_per_period} syncs): {requests:.0f} requests, "
        f"{data / MB:.0f} MiB uploaded"
    )
    print(
        f"  per sync, averaged: {requests / syncs_per_period:.2f} requests, "
        f"{data / syncs_per_period / MB:.1f} MiB"
    )
    print(f"  per hour: {requests * per_hour:.0f} requests, {data * per_hour / MB / 1024:.1f} GiB")
    print(
        f"  a quiet sync (nothing changed): 0 requests, "
        f"{1000 * sorted(quiet)[len(quiet) // 2]:.2f} ms median (a stat of the directory)"
    )
    print(f"  the sync that uploads a checkpoint: {busy:.2f}s for {size / MB:.0f} MiB")


def restore_time(store: Store, args: argparse.Namespace, tmp: Path) -> None:
    size = int(args.restore_mb * MB)
    job = f"restore-{uuid.uuid4().hex[:6]}"
    source = tmp / "restore-src"
    write_checkpoint(source, 0, size, args.shards, 1)
    t0 = time.perf_counter()
    Syncer(store.outputs, job, str(source)).sync()
    upload = time.perf_counter() - t0
    times = []
    for i in range(args.repeats):
        target = tmp / f"restore-{i}"
        syncer = Syncer(store.outputs, job, str(target))
        t0 = time.perf_counter()
        stats = syncer.restore()
        times.append(time.perf_counter() - t0)
        assert stats.restored_bytes == size, stats
        shutil.rmtree(target)
    best = min(times)
    print(
        f"restore: {args.restore_mb} MiB in {args.shards} files, {args.repeats} runs: "
        f"{', '.join(f'{t:.1f}s' for t in times)} ({size / MB / best:.0f} MiB/s best); "
        f"the upload took {upload:.1f}s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint_mb", type=float, default=1024)
    parser.add_argument("--scale", type=float, default=1 / 16)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--period", type=float, default=300)
    parser.add_argument("--sync_seconds", type=float, default=5)
    parser.add_argument("--periods", type=int, default=4)
    parser.add_argument("--keep", type=int, default=2)
    parser.add_argument("--restore_mb", type=float, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--root", default=None, help="a local directory instead of the emulator")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-outputs-") as name:
        tmp = Path(name)
        emulator = None
        if args.root:
            root = args.root
        else:
            (tmp / "emulator").mkdir()
            emulator = GcsEmulator(tmp / "emulator").start()
            emulator.create_bucket("bench")
            os.environ["STORAGE_EMULATOR_HOST"] = emulator.endpoint
            os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
            root = f"gs://bench/{uuid.uuid4().hex[:8]}"
        try:
            print(f"bucket: {root}{' (fake-gcs-server, memory backend)' if emulator else ''}")
            sync_cost(Store(root), args, tmp)
            restore_time(Store(root), args, tmp)
        finally:
            if emulator is not None:
                emulator.stop()


if __name__ == "__main__":
    main()

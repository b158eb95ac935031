"""How long a 1,000-member sweep takes to submit: expansion in the client, every check
(names free, dependencies), then one spec and one submission marker per member, written in
parallel. On a local root; on a local root whose every request first waits --latency s
(``LatencyBucket``, the GCS model of the other benchmarks: what matters on a real bucket is
requests in flight, not bytes); or on the GCS emulator with --gcs (its own CPU shares this
machine's, so it measures the client's cost more than a bucket's).

    .venv/bin/python benchmarks/bench_submit_group.py [--members 1000] [--gcs | --latency 0.05]
        [--repeat 3]

Measured (2-core VM, 1,000 members, medians of 3, the same hour; before -> after the group's
specs and markers went a thousand per call, 64 in flight; a4fd3be): --latency 0.05: 6.61-6.71
-> 3.17-3.24 s; --gcs: 2.28 -> 2.15 s; a local root: 0.78-1.61 -> 0.79-1.42 s over four pairs
(this VM's disk moved more than the change did).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bastion.bucket.store import Store
from benchmarks.latency import LatencyBucket
from launch import expand
from launch.api import Client, new_jobspec


def sweep_file(directory: Path, members: int) -> str:
    """A sweep of ``members`` points: two axes whose product is at least that many."""
    side = int(members**0.5)
    while side * (members // side) != members:
        side -= 1
    path = directory / "sweep.toml"
    axes = f"LR = {list(range(side))}\nSEED = {list(range(members // side))}\n"
    path.write_text(f"max_running = 8\n[axes]\n{axes}")
    return str(path)


def submit_once(root: str, sweep: str, name: str, latency: float) -> tuple[float, float, int]:
    """Seconds to expand, seconds to check and write, and the members written."""
    store = Store(root)
    if latency:
        store.bucket.objects = LatencyBucket(store.objects, latency)
    client = Client(store=store)
    started = time.perf_counter()
    template = new_jobspec(
        name=name, command="echo $LR $SEED", user_id="bench", project_id="default"
    )
    specs = expand.expand(template, expand.load_sweep(sweep))
    expanded = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no daemon: the figure is the submission alone
        client.submit_group(specs)
    written = time.perf_counter()
    assert len(client.store.specs.list()) >= len(specs)
    return expanded - started, written - expanded, len(specs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gcs", action="store_true", help="on the GCS emulator")
    parser.add_argument(
        "--latency", type=float, default=0.0, help="s per request on a local root (the model)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sweep = sweep_file(Path(tmp), args.members)
        emulator = None
        if args.gcs:
            import os

            from tests.gcs_emulator import GcsEmulator  # the test suite's real emulator

            (Path(tmp) / "gcs").mkdir()
            emulator = GcsEmulator(Path(tmp) / "gcs").start()
            os.environ["STORAGE_EMULATOR_HOST"] = emulator.endpoint
            os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
        try:
            totals = []
            for i in range(args.repeat):
                root = str(Path(tmp) / f"root{i}")
                if emulator:  # a bucket per run: the emulator's writes slow with its size
                    emulator.create_bucket(f"bench-{i}")
                    root = f"gs://bench-{i}/{uuid.uuid4().hex[:8]}"
                expand_s, write_s, count = submit_once(root, sweep, f"sw{i}", args.latency)
                totals.append(expand_s + write_s)
                print(
                    f"run {i + 1}: {count} members: expand {expand_s * 1000:.0f} ms, "
                    f"check and write {write_s:.2f} s"
                )
            where = "the GCS emulator" if emulator else "a local root"
            if args.latency and not emulator:
                where += f", {args.latency * 1000:g} ms per request"
            print(
                f"{args.members}-member sweep on {where}: median {statistics.median(totals):.2f} "
                f"s to submit (best {min(totals):.2f} s)"
            )
        finally:
            if emulator:
                emulator.stop()


if __name__ == "__main__":
    main()

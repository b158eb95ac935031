"""``bastion ARGS...`` with every local Store behind the latency model, importing only what
the CLI does and the model (bench_scale times it in a subprocess): importing the benchmark
itself, with the daemon's modules, added 0.1-0.15 s to every figure it measured.

    python benchmarks/cli_on_model.py LATENCY ARGS...
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bastion.bucket.store import Store
from benchmarks.latency import LatencyBucket
from launch.cli.main import run


def cli_with_latency(latency: float, argv: list[str]) -> None:
    made = Store.__init__

    def slowed(self: Store, root: str, **options: Any) -> None:
        made(self, root, **options)
        if self.is_local:
            self.bucket.objects = LatencyBucket(self.bucket.objects, latency)  # type: ignore[assignment]

    Store.__init__ = slowed  # type: ignore[method-assign]
    sys.argv = ["bastion", *argv]
    run()


if __name__ == "__main__":
    cli_with_latency(float(sys.argv[1]), sys.argv[2:])

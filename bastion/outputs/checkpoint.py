"""A job's progress report: ``BASTION_OUTPUT_DIR/.bastion/checkpoint.json``.

A job may write ``{"step": N, "time": T}`` (T: epoch seconds) there after each checkpoint; the
syncer uploads it like any file, last in its sync. Where the job runs, its runner reads it to
tell the daemon when the last checkpoint was (``Observation.checkpoint``), which the job's state
keeps as ``last_checkpoint``: the policy can prefer, among victims of equal standing, the one
that loses the least work.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from bastion.bucket.outputs import CHECKPOINT


def checkpoint_time(record: Any) -> float | None:
    """The report's ``time`` when it is a finite, positive number; None otherwise (a job's
    malformed report is ignored, never an error for the daemon)."""
    if not isinstance(record, dict):
        return None
    value = record.get("time")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def read_checkpoint_time(output_dir: str, limit: int = 64 << 10) -> float | None:
    """From a local output directory; None when there is no readable report."""
    try:
        with open(os.path.join(output_dir, CHECKPOINT), "rb") as f:
            return checkpoint_time(json.loads(f.read(limit)))
    except (OSError, ValueError):
        return None

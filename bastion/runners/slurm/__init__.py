"""The slurm runner: one Slurm batch job per attempt, one agent per node, reports via the bucket.

A daemon on a cluster's login node gives Slurm users what Slurm alone does not (project quotas
with borrowing, one bucket for specs, logs and history); Slurm keeps doing what it is good at
(placing jobs on nodes, partitions, preemption). See engines.md section 4 for the flags used.

The package, by concern:

- :mod:`.batch`: the ``sbatch`` flags and the batch script (pure).
- :mod:`.squeue`: ``squeue`` rows, exit codes, the job-completion file, queue positions (pure).
- :mod:`.commands`: Slurm's client commands, counted, and accounting once per finished job.
- :mod:`.observe`: a job's state and its agents' word as an Observation.
- :mod:`.runner`: :class:`SlurmRunner`, composing them with the kit's agent channel and
  per-cycle listing.

Settings (``[runners.slurm]`` in the daemon's settings file; all optional but ``root``):

- ``partition``, ``account``, ``qos``: defaults for every job.
- ``tiers``: per quota tier the job was admitted on, e.g. ``{0 = "partition:high", 1 =
  "partition:low,qos:scavenger"}`` (comma-separated ``partition:``, ``qos:``, ``account:``):
  a job within its project's quota runs in the partition that is not preempted, a job
  borrowing idle quota in one that is. A job's own runner options ``partition``, ``qos``,
  ``account`` win.
- ``time``: the default ``--time`` (a job's ``time`` option wins), e.g. ``"4:00:00"``;
  ``warn_seconds`` (60; 0: none): ``--signal=B:TERM@<warn_seconds>``, so the agents flush
  before the time limit.
- ``output``: ``bucket`` (default: agents on the compute nodes write output and exit records
  to the bucket) or ``shared_fs`` with ``output_dir`` (no agent; each task's output file on a
  file system the login node shares, read by offset).
- ``python`` (default: the daemon's own interpreter, as on a shared file system),
  ``package_url``, ``agent_args``, ``heartbeat_timeout`` (default 120), ``flush_seconds``:
  as for the cloud runners.
- ``slurm_output``: where Slurm writes the batch script's own output (srun's messages),
  default ``/dev/null``; a pattern on a shared file system (``/shared/bastion/%x.out``)
  keeps it for debugging.
- ``sbatch_args``: extra ``sbatch`` flags for every job (``["--constraint=a100"]``).
- ``bin_dir``: where ``sbatch``, ``squeue``, ``scancel`` are (default: ``PATH``).
- ``jobcomp_file``: the cluster's ``JobCompLoc`` (``JobCompType=jobcomp/filetxt``), read for
  jobs that left ``squeue`` where ``sacct`` has no slurmdbd.
- ``listing_ttl``: seconds a listing lasts without a daemon driving cycles (default 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bastion.runners.slurm.batch import comment_for
from bastion.runners.slurm.runner import SlurmRunner
from bastion.runners.slurm.squeue import Row, parse_squeue


def from_settings(settings: Mapping[str, Any]) -> SlurmRunner:
    return SlurmRunner(settings)


__all__ = ["Row", "SlurmRunner", "comment_for", "from_settings", "parse_squeue"]

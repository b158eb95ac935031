"""A job's outputs and checkpoints: one directory that survives its attempts.

Every attempt gets ``$BASTION_OUTPUT_DIR`` (a local directory) and ``$BASTION_OUTPUT_URL`` (the
same place in the bucket, ``ROOT/outputs/<job>/``). Where the job runs, one
:class:`~bastion.outputs.syncer.Syncer` restores the directory from the bucket before the
command starts, uploads what changed every few seconds while it runs, and once more after it
has ended (stop, preemption, finish), inside the stop's grace. It runs in the process that
supervises the job, never in the daemon's cycle: the local runner's wrapper
(:mod:`bastion.outputs.supervise`), the Docker runner's watcher and the agent on cloud VMs.
"""

from bastion.outputs.syncer import Syncer, SyncStats

__all__ = ["SyncStats", "Syncer"]

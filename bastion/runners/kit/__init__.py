"""The runner kit: parts that no provider owns, which every runner composes instead of inheriting.

SkyPilot's provisioner is the model: a provider is a handful of plain functions (list, create,
delete, read states), and the stages around them are shared. Each part here is one concern,
with no cloud API in it, so a Slurm or GKE runner uses the same parts as the Google ones:

- :mod:`.records` and :mod:`.channel`: the agent channel. What the in-guest agents write to the
  bucket, listed once per cycle, and the one rule for when the agents' word wins over the
  provider's (a finished attempt whose machines are gone, a preemption's flush window, a
  worker that never started).
- :mod:`.listing`: a listing made once per daemon cycle (or per time-to-live without a daemon)
  and shared by every poll of the cycle, with its locks and invalidation.
- :mod:`.failover`: where not to create for a while (stockout, quota, exponential backoff of
  failed creates), and what such a failure means for the attempt.
- :mod:`.capacity`: the quota tier a job was admitted on, as spot, on-demand or reserved.
- :mod:`.lease_fence`: the lease-term check before a create at a provider that takes no
  fencing token (:mod:`bastion.runners.fence` is the other fence: this host's token file).
- :mod:`.retry`: one bounded exponential retry loop.
"""

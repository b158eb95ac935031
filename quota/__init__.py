"""Quotas and scheduling: pure functions of (quota file, jobs, usage, now), no I/O.

config    the quota file (AXLearn schema "1" plus [scheduling]), validated
policy    schedule() and explain(): decisions with reasons (engine, within, reclaim do the work)
usage     decayed per-user usage that orders users inside a project
simulate  the same policy replayed on a trace, with metrics (trace parses the trace file)
commands  `bastion quota check` and `bastion simulate`: the only module here that reads files
"""

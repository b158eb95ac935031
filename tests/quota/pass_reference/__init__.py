"""The scheduling pass as it was before it was made fast (commit cf5ed6b, quota/engine.py,
within.py, reclaim.py, reasons.py and capacity.py copied unchanged but for their imports).

It is the oracle of tests/quota/test_quota_fast_pass.py: the optimised pass in quota/ must
decide exactly what this one decides, reason texts and queue positions included, on random
worlds. A deliberate change of policy changes both (copy the new pass here with it). Since
the copy: projects losing jobs to another project's reclaim still under way (RELEASING)
defer their own backfill reclaims (engine.py, marked); a waiting job keeps no claim on
its own project's backfill that jobs ahead of it would take (engine.py `_overtaken`, plain
form); a reclaim takes the widest-first set of victims when it is smaller (reclaim.py
`_fewest`, copied as in quota/reclaim.py); the reclaim delay
(reclaim_after_seconds) is not here, so the comparison runs with it at 0.
"""

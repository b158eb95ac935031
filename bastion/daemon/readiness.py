"""Each runner the daemon's settings configure, made once when the daemon starts: a runner that
cannot be made (no credentials, a client that cannot be built) is said in one log line at once,
not first at the first job's start, many cycles later."""

from __future__ import annotations

import logging

from bastion.runners.instances import Runners

log = logging.getLogger("bastion.daemon")


def check_runners(runners: Runners) -> dict[str, str]:
    """Runner kind -> the problem that stops it from starting jobs ("" when it is ready),
    each logged in one line. Jobs of a runner with a problem wait to start, backing off, and
    let go of their quota after ``start_give_up_seconds`` (bastion/lifecycle.py)."""
    found = {}
    for kind in sorted({runners.default, *runners.configured}):
        try:
            runners.get(kind)
        except Exception as e:
            problem = " ".join(str(e).split()) or type(e).__name__
            log.error("runner %s cannot start jobs: %s", kind, problem)
            found[kind] = problem
        else:
            log.info("runner %s: ready", kind)
            found[kind] = ""
    return found

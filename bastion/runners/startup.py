"""The startup script a cloud VM runs on every worker at boot: it runs the agent for one attempt.

Delivered as the ``startup-script`` metadata value (TPU node metadata, GCE metadata items). The
cloud runs it on each worker of the slice (and again after a reboot or repair; the agent's
``started`` claim makes a second run exit 0 without starting the command again). The worker's
index comes from the metadata server (``agent-worker-number``) inside the agent, so one script
serves every worker.

Getting the agent onto a bare image: if ``import bastion`` fails and the daemon gave a
``package_url`` (a wheel of its own version in the bucket), the script copies it with
``gcloud storage cp`` (any ``gs://`` URL; a local path or ``https`` URL is used as it is) and
``pip install``s it. TODO: the daemon does not yet publish its package into the bucket
(content-addressed); until it does, jobs run on images that already have bastion, and a bare
VM without ``package_url`` writes a clear error to the boot log and exits 1.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def script(
    *,
    root: str,
    job: str,
    attempt: str,
    num_workers: int,
    command: str,
    env: Mapping[str, str],
    python: str = "python3",
    package_url: str | None = None,
    agent_args: Sequence[str] = (),
    worker_offset: int | None = None,
) -> str:
    """A bash script; every value is shell-quoted (job names and env come from users).

    ``worker_offset``: the first worker index of this slice in a multislice attempt (queued
    resources): every slice's VMs number themselves 0..hosts-1 (``agent-worker-number``), so
    the script passes the agent ``--worker`` = offset + that number."""
    q = shlex.quote
    lines = ["#!/bin/bash", "# bastion: runs this attempt's agent on every worker", "set -u"]
    lines += [f"export {k}={q(str(v))}" for k, v in sorted(env.items()) if _NAME.fullmatch(k)]
    py = q(python)
    install = (
        f"  url={q(package_url)}\n"
        '  case "$url" in gs://*) gcloud storage cp "$url" /tmp/ && url=/tmp/$(basename "$url");; '
        "esac\n"
        f'  {py} -m pip install --quiet "$url" || exit 1'
        if package_url
        else '  echo "bastion: python cannot import bastion and no package_url was given" >&2\n'
        "  exit 1"
    )
    lines.append(f"if ! {py} -c 'import bastion' 2>/dev/null; then\n{install}\nfi")
    argv = [python, "-m", "bastion.agent", f"--root={root}", f"--job={job}",
            f"--attempt={attempt}", f"--num_workers={num_workers}", *agent_args]  # fmt: skip
    worker = ""
    if worker_offset is not None:
        lines.append(f"w=$({py} -c 'from bastion.agent import worker_index; "
                     f"print(worker_index(None) + {int(worker_offset)})') || exit 1")  # fmt: skip
        worker = ' --worker="$w"'
    lines.append("exec " + " ".join(q(a) for a in argv) + worker + " -- " + q(command))
    return "\n".join(lines) + "\n"

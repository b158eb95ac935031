"""Issue 27: the cloud path tried locally in one command (scripts/sandbox.py), as the README
walks it: the TPU and Compute stand-ins in real time, local "VMs" that run the startup script,
a 4-worker tpu-v4-32 spot job with ``--worker=all`` logs, a simulated spot preemption, Ctrl-C.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys

from tests.harness import REPO, Bastion, wait_for

LOOP = "for i in $(seq 600); do echo step $i on worker $BASTION_WORKER; sleep 0.5; done"


def test_sandbox_runs_a_four_worker_tpu_job_through_a_spot_preemption(tmp_path):
    sandbox = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "sandbox.py"), f"--dir={tmp_path / 'sbx'}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    b = None
    try:
        lines = []
        while not (lines and lines[-1].startswith("VM output")):
            line = sandbox.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        said = "".join(lines)
        root = re.search(r"export BASTION_ROOT=(\S+)", said).group(1)
        settings = re.search(r"bastion start (--settings=\S+)", said).group(1)
        assert f"kill -USR1 {sandbox.pid}" in said
        b = Bastion(tmp_path, root=root)
        b.start(settings, poll=0.5)
        b.cli(
            "launch",
            "--name=tpu",
            "--instance_type=tpu-v4-32",
            "--spot",
            "--bundler=none",
            "--",
            LOOP,
        )
        wait_for(
            lambda: "4/4 running" in b.cli("list").stdout, timeout=240, interval=1, what="4 workers"
        )
        wait_for(
            lambda: "[a1 w3] step" in b.cli("logs", "tpu", "--worker=all").stdout,
            timeout=60,
            interval=1,
            what="worker 3's output",
        )
        sandbox.send_signal(signal.SIGUSR1)
        wait_for(
            lambda: "PROVIDER_PREEMPTED" in b.cli("history", "tpu").stdout,
            timeout=120,
            interval=1,
            what="the spot preemption",
        )
        b.cli("cancel", "tpu")
    finally:
        sandbox.send_signal(signal.SIGINT)
        out, _ = sandbox.communicate(timeout=60)
        if b is not None:
            b.close()
    assert sandbox.returncode == 0
    assert "sandbox: preempted bst-" in out and "stopped the stand-ins and every VM" in out

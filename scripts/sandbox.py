#!/usr/bin/env python3
"""Try the cloud path on this machine: the Cloud TPU and Compute Engine stand-ins, in real
time, whose "VMs" are local processes that run the startup script the runner sends (so the
real agent runs the job and reports through the root), plus a root with a quota that has TPU
and GPU capacity and a daemon settings file that points the tpu, tpu-qr and gce runners at
the stand-ins.

    python scripts/sandbox.py [--dir=DIR]      # prints what to run; Ctrl-C stops everything

While it runs, ``kill -USR1 <its pid>`` preempts every spot TPU node and spot VM, as the
provider would (the agents are told through their metadata server, the node turns
PREEMPTED), so the daemon's handling of a spot preemption can be watched. The stand-ins are
the ones the test suite uses (tests/standins/); this needs a checkout of the repository.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.standins.compute import ComputeServer  # noqa: E402
from tests.standins.tpu import TpuServer  # noqa: E402
from tests.test_cloud_runners import Guests  # noqa: E402

PROJECT, ZONE = "sandbox-project", "us-central2-b"
QUOTA = """[toml-schema]
version = "1"
[total_resources]
v4 = 64
gpu = 16
cpu = 8
[project_membership]
default = [".*"]
[project_resources.default]
v4 = 1.0
gpu = 1.0
cpu = 1.0
"""
AGENT_ARGS = ["--chunk_seconds=0.5", "--heartbeat_seconds=1", "--grace_seconds=5"]
TICK_SECONDS = 1.0  # one virtual minute of the stand-ins per real second: creates take ~2 s


def settings_toml(tpu: str, compute: str) -> str:
    """The daemon's --settings: every cloud runner on the stand-ins, agents run by this
    Python (the "VM" has the package through the checkout)."""
    common = (
        f'project = "{PROJECT}"\nzones = ["{ZONE}"]\npython = "{sys.executable}"\n'
        f"agent_args = {AGENT_ARGS!r}\nheartbeat_timeout = 30\n".replace("'", '"')
    )
    return (
        'default_runner = "local"\n\n'
        f'[runners.tpu]\napi_endpoint = "{tpu}"\n{common}\n'
        f'[runners.tpu-qr]\napi_endpoint = "{tpu}"\n{common}\n'
        f'[runners.gce]\napi_endpoint = "{compute}"\n{common}'
    )


def preempt_all(tpu: TpuServer, compute: ComputeServer, guests: Guests) -> list[str]:
    """Every spot node or VM: PREEMPTED at the provider, the agents told."""
    done = []
    for path, node in list(tpu.nodes.items()):
        name = path.rsplit("/", 1)[-1]
        if node.get("_spot") and node.get("state") == "READY":
            tpu.preempt(name)
            done.append(name)
    for (_, _, name), inst in list(compute.instances.items()):
        spot = (inst.get("scheduling") or {}).get("provisioningModel") == "SPOT"
        if spot and inst.get("status") == "RUNNING" and hasattr(compute, "preempt"):
            compute.preempt(name)
            done.append(name)
    for name in done:
        if name in guests.workers:
            guests.preempt(name)
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="where the root, settings and VM output go (default: new)")
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="bastion-sandbox-")).resolve()
    root = base / "root"
    (root / "project-quotas").mkdir(parents=True, exist_ok=True)
    (root / "project-quotas" / "project-quotas.config").write_text(QUOTA)
    (base / "vms").mkdir(exist_ok=True)
    guests = Guests(base / "vms")
    tpu = TpuServer(on_ready=guests.on_ready).start()
    compute = ComputeServer(on_ready=guests.on_ready).start()
    settings = base / "settings.toml"
    settings.write_text(settings_toml(tpu.endpoint, compute.endpoint))
    stop = threading.Event()
    preempt = threading.Event()

    def clock() -> None:
        while not stop.wait(TICK_SECONDS):
            tpu.tick()
            compute.tick()
            if preempt.is_set():
                preempt.clear()
                names = preempt_all(tpu, compute, guests)
                print(f"sandbox: preempted {', '.join(names) or 'nothing (no spot VM runs)'}")
                sys.stdout.flush()

    signal.signal(signal.SIGUSR1, lambda *_: preempt.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())  # Ctrl-C, also when started with &
    ticker = threading.Thread(target=clock, name="sandbox-clock", daemon=True)
    ticker.start()
    print(
        f"sandbox ready (pid {os.getpid()}): TPU API {tpu.endpoint}, Compute API "
        f"{compute.endpoint}\n"
        f"  export BASTION_ROOT={root}\n"
        f"  bastion start --settings={settings}          # in a second terminal\n"
        "  bastion launch --name=tpu --instance_type=tpu-v4-32 --spot --bundler=none -- "
        "'for i in $(seq 100); do echo step $i on worker $BASTION_WORKER; sleep 1; done'\n"
        "  bastion logs tpu --worker=all --follow\n"
        f"  kill -USR1 {os.getpid()}     # a spot preemption of every spot TPU node and VM\n"
        f"VM output: {base / 'vms'}; Ctrl-C stops the stand-ins and every VM",
        flush=True,
    )
    while not stop.is_set():
        time.sleep(0.2)
    ticker.join(5)
    guests.close()
    tpu.stop()
    compute.stop()
    print("sandbox: stopped the stand-ins and every VM", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

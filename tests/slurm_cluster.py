"""A real Slurm for the tests: munged, slurmctld and two slurmd on this machine, per session.

``scripts/slurm_setup.sh`` installs Debian's slurm-wlm and munge where they are missing; this
fixture writes a config under a temporary directory (everything on 127.0.0.1, free ports, no
systemd and no cgroups: ``proctrack/linuxproc``, ``task/none``), starts the daemons, waits until
both nodes are idle and stops them by pid at the end of the session.

The one machine is two nodes (``n1``, ``n2``: two slurmd with ``-N``, each with its own port),
so multi-node jobs run one task per node as on a real cluster. Two partitions share them:
``low`` (PriorityTier 1, the default) and ``high`` (PriorityTier 10), with
``PreemptType=preempt/partition_prio`` and ``PreemptMode=REQUEUE``, so a job in ``high``
preempts one in ``low``. Each node has two fake GPUs (``gres.conf`` with device files made by
``mknod``), so ``--gres=gpu:1`` sets ``CUDA_VISIBLE_DEVICES``. Accounting is the
``jobcomp/filetxt`` file (no slurmdbd).

A cluster that cannot start fails the tests that ask for it, loudly and with the logs: the
Slurm tests are never skipped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parent.parent / "scripts" / "slurm_setup.sh"
NODES = ("n1", "n2")
GPUS_PER_NODE = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SlurmCluster:
    dir: Path
    conf: Path
    jobcomp: Path
    env: dict[str, str]

    def run(self, *argv: str, check: bool = True, input: str | None = None) -> str:
        done = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, input=input, timeout=60
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr}")
        return done.stdout

    def jobs(self) -> list[dict[str, str]]:
        """Every job Slurm still lists: id, name, state, reason, comment."""
        out = self.run("squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%r|%k")
        keys = ("id", "name", "state", "reason", "comment")
        return [dict(zip(keys, line.split("|", 4), strict=True)) for line in out.splitlines()]

    def live(self) -> list[dict[str, str]]:
        ended = {
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "PREEMPTED",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "BOOT_FAIL",
            "DEADLINE",
        }
        return [j for j in self.jobs() if j["state"] not in ended]

    def idle(self) -> bool:
        states = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).split("\n")
        found = dict(line.split() for line in states if len(line.split()) == 2)
        return all(found.get(n) == "idle" for n in NODES)

    def quiesce(self, timeout: float = 60) -> None:
        """Cancel every job and wait until both nodes are idle (tests start from nothing)."""
        if self.live():
            self.run(
                "scancel", "--full", "--signal=KILL", *[j["id"] for j in self.live()], check=False
            )
            self.run("scancel", *[j["id"] for j in self.live()], check=False)
        deadline = time.monotonic() + timeout
        while not (self.idle() and not self.live()):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"Slurm not idle after {timeout} s: {self.live()}\n"
                    f"{self.run('sinfo', check=False)}"
                )
            time.sleep(0.2)

    def logs(self) -> str:
        parts = []
        for log in sorted(self.dir.glob("*.log")):
            parts.append(f"== {log.name}\n" + "\n".join(log.read_text().splitlines()[-30:]))
        return "\n".join(parts)


def _config(d: Path, host: str, ports: list[int]) -> str:
    cpus = os.cpu_count() or 1
    nodes = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[i + 1]} CPUs={cpus} "
        f"RealMemory=4000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        for i, n in enumerate(NODES)
    )
    return f"""ClusterName=bastiontest
SlurmctldHost={host}(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ports[0]}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.txt
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
KillWait=2
SlurmdTimeout=10
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
GresTypes=gpu
{nodes}
PartitionName=low Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10
"""


def _stop(d: Path) -> None:
    pids = [d / f"slurmd-{n}.pid" for n in NODES] + [d / "slurmctld.pid", d / "munge/munged.pid"]
    for path in pids:
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):  # a zombie passes kill(pid, 0)
                os.kill(pid, signal.SIGKILL)


def start_cluster(d: Path) -> SlurmCluster:
    done = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(
            f"{SETUP} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    for sub in ("state", "spool", "munge", "gpu"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "munge").chmod(0o700)
    for i in range(GPUS_PER_NODE):
        device = d / "gpu" / f"nvidia{i}"
        try:
            os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, /dev/null
        except PermissionError:
            device.touch()
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(_config(d, host, [_free_port() for _ in range(1 + len(NODES))]))
    (d / "gres.conf").write_text(
        "".join(
            f"NodeName={n} Name=gpu File={d}/gpu/nvidia[0-{GPUS_PER_NODE - 1}]\n" for n in NODES
        )
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(d, conf, d / "jobcomp.txt", env)
    cluster.run(
        "munged",
        "--force",
        f"--socket={d}/munge/munge.sock",
        f"--pid-file={d}/munge/munged.pid",
        f"--log-file={d}/munge/munged.log",
        f"--seed-file={d}/munge/munged.seed",
        "--key-file=/etc/munge/munge.key",
    )
    cluster.run("slurmctld")
    for n in NODES:
        cluster.run("slurmd", "-N", n)
    deadline = time.monotonic() + 60
    while not cluster.idle():
        if time.monotonic() > deadline:
            sinfo = cluster.run("sinfo", check=False)
            raise RuntimeError(f"the nodes are not idle after 60 s:\n{sinfo}\n{cluster.logs()}")
        time.sleep(0.1)
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    d = Path(tmp_path_factory.mktemp("slurm"))
    try:
        cluster = start_cluster(d)
    except Exception as e:
        _stop(d)
        pytest.fail(f"the tests' Slurm cluster did not start: {e}", pytrace=False)
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # the runner, daemons and CLIs use it
    yield cluster
    try:
        cluster.quiesce(timeout=20)
    finally:
        _stop(d)
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


@pytest.fixture
def slurm(slurm_cluster):
    """The session's cluster, with no job of an earlier test left on it."""
    slurm_cluster.quiesce()
    yield slurm_cluster
    slurm_cluster.quiesce()

"""The Docker runner through the real CLI and a real daemon subprocess, on a real engine.

Every test uses a local root (the Docker runner bind-mounts it at the same path, so a job can
write under it) and the session's private dockerd (``tests/docker_engine.py``). Containers a
test leaves behind are removed by its fixture (by the root's label) and, at the session's end,
by the engine fixture (by the ``bst-`` name prefix).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from bastion.runners.base import name_prefix, root_tag
from tests.harness import Bastion, wait_for

POLL = 0.3
COUNT_TO_3 = "for i in 1 2 3; do echo line $i; sleep 0.3; done"


class DockerBastion(Bastion):
    """A Bastion whose daemons get the engine's DOCKER_HOST and a docker settings file."""

    def __init__(self, tmp: Path, engine, default_runner: str = "local") -> None:
        super().__init__(tmp)
        self.engine = engine
        self.env["DOCKER_HOST"] = engine.docker_host
        Path(self.root).mkdir(parents=True, exist_ok=True)
        self.scratch = Path(self.root) / "scratch"  # under the bind mount: seen by containers
        self.scratch.mkdir()
        self.settings = tmp / "settings.toml"
        self.settings.write_text(
            f'default_runner = "{default_runner}"\n'
            "[runners.docker]\n"
            f'image = "{engine.base_image}"\n'
            f'docker_host = "{engine.docker_host}"\n'
        )
        self.docker = engine.client()

    @property
    def tag(self) -> str:
        return root_tag(self.store.root_url)

    def start_daemon(self, *args: str):
        return self.start(f"--settings={self.settings}", *args, poll=POLL)

    def launch(self, name: str, command: str, *args: str, image: str | None = None):
        return self.cli(
            "launch",
            f"--name={name}",
            "--runner=docker",
            f"--image={image or self.engine.base_image}",
            *args,
            "--",
            command,
        )

    def containers(self, job: str | None = None) -> list:
        filters = {"label": [f"bastion.root={self.tag}"]}
        if job is not None:
            filters["label"].append(f"bastion.job={job}")
        # ignore_removed: the SDK lists, then inspects each; one removed meanwhile is skipped
        return self.docker.containers.list(all=True, filters=filters, ignore_removed=True)

    def running_container(self, job: str):
        def found():
            for c in self.containers(job):
                if c.status == "running":
                    return c
            return None

        return wait_for(found, timeout=60, what=f"a running container of {job}")

    def cleanup(self) -> None:
        self.close()
        for c in self.containers():
            c.remove(force=True)
        self.docker.close()


@pytest.fixture
def dk(docker_engine, tmp_path):
    b = DockerBastion(tmp_path, docker_engine)
    yield b
    b.cleanup()


@pytest.fixture
def dk_default_docker(docker_engine, tmp_path):
    b = DockerBastion(tmp_path, docker_engine, default_runner="docker")
    yield b
    b.cleanup()


def test_docker_job_logs_follow_and_succeeds(dk):
    dk.start_daemon()
    out = dk.launch("dhello", COUNT_TO_3).stdout
    assert "submitted dhello" in out
    follow = dk.cli("logs", "dhello", "--follow", "--follow_poll_seconds=0.1", timeout=90)
    assert [ln for ln in follow.stdout.splitlines() if ln.startswith("line")] == [
        "line 1",
        "line 2",
        "line 3",
    ]
    assert "attempt 1 of dhello started" in follow.stdout
    # --follow returned because the job ended, not on a timeout: it is complete by now.
    record = dk.wait_complete("dhello", timeout=10)
    assert record["state"]["outcome"] == "SUCCEEDED"
    assert record["state"]["exit_code"] == 0
    assert '"docker"' in str(record["spec"]).replace("'", '"')
    wait_for(lambda: not dk.containers("dhello"), timeout=15, what="the container's removal")


def test_docker_job_exit_code_3_is_failed(dk):
    dk.start_daemon()
    dk.launch("dfail", "echo about to fail; exit 3")
    record = dk.wait_complete("dfail", timeout=60)
    assert record["state"]["outcome"] == "FAILED"
    assert record["state"]["exit_code"] == 3
    assert "about to fail" in dk.log("dfail")
    proc = dk.cli("logs", "dfail", "--follow", "--exit_status", check=False)
    assert proc.returncode == 3
    wait_for(lambda: not dk.containers("dfail"), timeout=15, what="the container's removal")


def test_cancel_running_docker_job_removes_container(dk):
    dk.start_daemon("--grace_seconds=2")
    dk.launch("dcancel", "echo started; sleep 300")
    container = dk.running_container("dcancel")
    wait_for(lambda: "started" in dk.log("dcancel"), timeout=30, what="the job's first line")
    dk.cli("cancel", "dcancel")
    record = dk.wait_complete("dcancel", timeout=40)
    assert record["state"]["outcome"] == "CANCELLED"
    wait_for(lambda: not dk.containers("dcancel"), timeout=15, what="the container's removal")
    assert not dk.docker.api.containers(all=True, filters={"name": container.name})


def test_kill_9_daemon_adopts_running_container(dk):
    starts = dk.scratch / "starts"
    daemon = dk.start_daemon()
    dk.launch(
        "dsurvivor",
        f"echo start >> {starts}; for i in $(seq 1 40); do echo tick $i; sleep 0.1; done",
    )
    wait_for(lambda: starts.exists(), timeout=60, what="the container's start")
    time.sleep(0.5)
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    assert len(dk.containers("dsurvivor")) == 1
    time.sleep(0.5)
    dk.start_daemon()
    record = dk.wait_complete("dsurvivor", timeout=60)
    assert starts.read_text().count("start") == 1
    assert record["state"]["outcome"] == "SUCCEEDED" and record["state"]["attempt"] == 1
    assert [ln for ln in dk.log("dsurvivor").splitlines() if ln.startswith("tick")] == [
        f"tick {i}" for i in range(1, 41)
    ]
    wait_for(lambda: not dk.containers("dsurvivor"), timeout=15, what="the container's removal")


def _orphan(dk: DockerBastion, suffix: str, **labels: str):
    return dk.docker.containers.run(
        dk.engine.base_image,
        ["sleep", "300"],
        name=name_prefix(dk.store.root_url) + suffix,
        labels={"bastion.root": dk.tag, **labels},
        detach=True,
    )


def _gone(dk: DockerBastion, container) -> bool:
    return not dk.docker.api.containers(all=True, filters={"id": container.id})


def wait_gone(dk: DockerBastion, container, timeout: float) -> None:
    try:
        wait_for(lambda: _gone(dk, container), timeout=timeout, what="the orphan's removal")
    except AssertionError as e:
        raise AssertionError(f"{e}\ndaemon output:\n{dk.daemon_output()[-4000:]}") from None


def test_orphan_container_removed_by_periodic_sweep_while_docker_in_use(dk):
    """With a docker job running, the periodic sweep (every 20 cycles) finds the orphan."""
    dk.start_daemon()
    dk.launch("dholder", "sleep 300")
    dk.running_container("dholder")
    orphan = _orphan(dk, "orphan", **{"bastion.name": name_prefix(dk.store.root_url) + "orphan"})
    wait_gone(dk, orphan, timeout=45)
    assert dk.running_container("dholder")  # the live job's container is untouched


def test_orphan_container_removed_by_recovery_sweep_default_docker(dk_default_docker):
    dk = dk_default_docker
    orphan = _orphan(dk, "orphan", **{"bastion.name": name_prefix(dk.store.root_url) + "orphan"})
    dk.start_daemon()
    wait_gone(dk, orphan, timeout=20)


def test_orphan_labelled_only_with_root_is_removed(dk_default_docker):
    """The orphan as the brief describes it: bastion.root label and prefixed name only."""
    dk = dk_default_docker
    orphan = _orphan(dk, "orphan")
    dk.start_daemon()
    wait_gone(dk, orphan, timeout=12)


def test_orphan_container_removed_when_docker_configured_but_not_default(dk):
    orphan = _orphan(dk, "orphan", **{"bastion.name": name_prefix(dk.store.root_url) + "orphan"})
    dk.start_daemon()
    dk.cli("launch", "--name=localjob", "--", "echo hi")  # a local job: the daemon cycles
    dk.wait_complete("localjob", timeout=30)
    wait_gone(dk, orphan, timeout=12)


def test_missing_image_fails_job_and_others_keep_running(dk):
    missing = f"{dk.engine.registry}/bastion-test/no-such-image:none"
    dk.start_daemon()
    dk.launch("dsteady", "for i in $(seq 1 30); do echo tick $i; sleep 0.1; done; echo end")
    dk.running_container("dsteady")
    dk.launch("dmissing", "echo never", image=missing)
    dk.cli("launch", "--name=lsteady", "--", "sleep 1; echo local done")
    record = dk.wait_complete("dmissing", timeout=60)
    assert record["state"]["outcome"] == "FAILED"
    assert missing in record["state"]["reason"], record["state"]["reason"]
    assert not dk.containers("dmissing")
    steady = dk.wait_complete("dsteady", timeout=60)
    assert steady["state"]["outcome"] == "SUCCEEDED"
    assert [ln for ln in dk.log("dsteady").splitlines() if ln.startswith("tick")] == [
        f"tick {i}" for i in range(1, 31)
    ]
    assert dk.wait_complete("lsteady", timeout=30)["state"]["outcome"] == "SUCCEEDED"
    assert "local done" in dk.log("lsteady")


def _project(tmp: Path, dockerfile_from: str) -> Path:
    project = tmp / "proj"
    project.mkdir()
    (project / "train.py").write_text("print(open('config.txt').read().strip(), 'in', __file__)\n")
    (project / "config.txt").write_text("lr=0.3\n")
    (project / "Dockerfile").write_text(f"FROM {dockerfile_from}\nCOPY . /app\nWORKDIR /app\n")
    return project


def _launch_from(dk: DockerBastion, cwd: Path, *args: str) -> None:
    import subprocess
    import sys

    from tests.harness import REPO

    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "launch", *args],
        env={**dk.env, "PYTHONPATH": str(REPO)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_container_job_runs_inside_its_tar_bundle(dk: DockerBastion, tmp_path):
    project = _project(tmp_path, dk.engine.base_image)
    dk.start_daemon()
    _launch_from(
        dk,
        project,
        "--name=tarred",
        "--runner=docker",
        f"--image={dk.engine.base_image}",
        "--",
        "python3 train.py",
    )
    record = dk.wait_complete("tarred", timeout=90)
    assert record["state"]["outcome"] == "SUCCEEDED", dk.log("tarred")
    assert "lr=0.3 in" in dk.log("tarred")


def test_a_docker_bundle_is_built_pushed_and_run_by_digest(dk: DockerBastion, tmp_path):
    project = _project(tmp_path, dk.engine.base_image)
    dk.start_daemon()
    _launch_from(
        dk,
        project,
        "--name=imaged",
        "--bundler=docker",
        f"--bundler_spec=repo={dk.engine.registry}/team",
        "--runner=docker",
        "--",
        "python3 /app/train.py",
    )
    record = dk.wait_complete("imaged", timeout=120)
    bundle = record["spec"]["bundle"]
    assert bundle["kind"] == "docker" and "@sha256:" in bundle["uri"]
    assert record["state"]["outcome"] == "SUCCEEDED", dk.log("imaged")
    assert "lr=0.3 in /app/train.py" in dk.log("imaged")

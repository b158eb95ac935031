"""One GPU ledger per host (bastion/runners/gpus.py): the local and Docker runners of a daemon
never hand the same GPU to two attempts, after a restart too.

No GPU is needed: GPU indices are numbers handed out in ``CUDA_VISIBLE_DEVICES`` (local) and in
the container's device request (Docker). The engine here has no GPU driver, so a container
that asks for a GPU is created (with its device request) and then refused at its start; what
the engine was asked is read from a byte-for-byte relay between the runner and the real engine
(:class:`RecordingEngine`). The tests that need Docker use the session's engine
(tests/docker_engine.py); ``BASTION_SKIP_DOCKER=1`` skips them, not the ledger's own tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docker.errors import NotFound

from bastion.daemon import Daemon
from bastion.daemon.start import build_daemon
from bastion.runners.base import Attempt, RunnerError, TryAgain, attempt_name, root_tag
from bastion.runners.docker import DockerRunner
from bastion.runners.gpus import GpuLedger
from bastion.runners.instances import Runners
from bastion.runners.local import LocalRunner
from launch.api import Client, new_jobspec
from tests.harness import wait_for

# -- the ledger itself --------------------------------------------------------------------------


def test_the_ledger_gives_each_gpu_to_one_attempt_until_it_is_freed() -> None:
    ledger = GpuLedger()
    assert ledger.allocate("a", 1, [0, 1], "here") == [0]
    assert ledger.allocate("b", 1, [0, 1], "here") == [1]
    assert ledger.allocate("cpu-only", 0, [0, 1], "here") == []
    assert ledger.allocate("b", 1, [0, 1], "here") == [1]  # asked again: the same GPUs
    with pytest.raises(RunnerError, match=r"needs 1 GPUs but only 0 of 2 are free on here"):
        ledger.allocate("c", 1, [0, 1], "here")
    assert ledger.held() == {"a": [0], "b": [1]}  # a refused start holds nothing
    ledger.free("a")
    assert ledger.allocate("c", 1, [0, 1], "here") == [0]
    # Each runner hands out its own pool, but a GPU held through one is taken for all.
    assert ledger.allocate("d", 1, [1, 2], "there") == [2]
    # What the caller knows is taken outside the ledger (another daemon's container) is too.
    ledger.free("c")
    assert ledger.allocate("e", 1, [0, 3], "there", busy=[0]) == [3]


def test_the_ledger_reads_what_each_runner_holds_before_its_next_allocation() -> None:
    """A restarted daemon: its runners join with what their live attempts hold, and nothing is
    handed out before every listing is read; a listing that fails makes the start wait."""
    ledger = GpuLedger()
    reads: list[str] = []
    ledger.join("local", lambda: reads.append("local") or [("old-local", [0]), ("cpu", [])])
    assert reads == []  # read lazily: making a runner asks nothing of it
    failing = [True]

    def docker_listing() -> list[tuple[str, list[int]]]:
        reads.append("docker")
        if failing[0]:
            raise RunnerError("docker engine at the default socket unreachable")
        return [("old-container", [2])]

    ledger.join("docker", docker_listing)
    with pytest.raises(TryAgain, match="which GPUs the docker runner's attempts hold"):
        ledger.allocate("new", 1, [0, 1, 2, 3], "here")
    assert "new" not in ledger.held()
    failing[0] = False
    assert ledger.allocate("new", 2, [0, 1, 2, 3], "here") == [1, 3]
    assert ledger.held() == {"old-local": [0], "old-container": [2], "new": [1, 3]}
    assert reads == ["local", "docker", "docker"]  # each listing is read once it answered
    ledger.allocate("newer", 0, [0], "here")
    assert reads == ["local", "docker", "docker"]


def test_runners_of_one_daemon_share_one_ledger(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    runners = Runners(
        {
            "local": {"root": root, "attempts_dir": str(tmp_path / "attempts"), "gpus": [0, 1]},
            "docker": {"root": root, "gpus": [0, 1]},
        }
    )
    local, docker = runners.get("local"), runners.get("docker")  # (docker asks no engine yet)
    assert isinstance(local, LocalRunner) and isinstance(docker, DockerRunner)
    assert local.ledger is docker.ledger is runners.gpu_ledger
    # Runners made on their own (tools, tests) keep their own accounts, as before.
    assert LocalRunner(str(tmp_path / "other"), gpus=[0]).ledger is not local.ledger


# -- a relay that keeps what the Docker runner asked the engine ---------------------------------


class RecordingEngine:
    """A unix socket that relays every byte between the Docker runner and the real engine and
    keeps what the runner sent, so a test reads each ``create`` request (its device request)
    exactly as the engine got it, even for a container the engine then refused to start."""

    def __init__(self, engine_host: str) -> None:
        self.engine = engine_host.removeprefix("unix://")
        self.dir = tempfile.mkdtemp(prefix="bst-eng-")  # a short path: sun_path is 108 bytes
        self.path = os.path.join(self.dir, "docker.sock")
        self.url = f"unix://{self.path}"
        self._sent: list[bytearray] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.engine)
            sent = bytearray()
            with self._lock:
                self._sent.append(sent)
            threading.Thread(target=_pump, args=(client, upstream, sent), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client, None), daemon=True).start()

    def creates(self) -> dict[str, dict[str, Any]]:
        """Container name -> the body of the ``create`` request that named it."""
        found: dict[str, dict[str, Any]] = {}
        with self._lock:
            streams = [bytes(s) for s in self._sent]
        for data in streams:
            for match in re.finditer(rb"POST /v[\d.]+/containers/create\?name=([\w.-]+)", data):
                head_end = data.find(b"\r\n\r\n", match.end())
                length = re.search(rb"(?i)content-length: *(\d+)", data[match.end() : head_end])
                if head_end < 0 or length is None:
                    continue
                body = data[head_end + 4 : head_end + 4 + int(length.group(1))]
                if len(body) == int(length.group(1)):
                    found[match.group(1).decode()] = json.loads(body)
        return found

    def device_ids(self, name: str) -> list[str] | None:
        """The GPU ids of the device request the container ``name`` was created with."""
        body = self.creates().get(name)
        if body is None:
            return None
        requests = (body.get("HostConfig") or {}).get("DeviceRequests") or []
        return [d for r in requests for d in r.get("DeviceIDs") or []]

    def close(self) -> None:
        self._server.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pump(source: socket.socket, sink: socket.socket, keep: bytearray | None) -> None:
    try:
        while chunk := source.recv(65536):
            if keep is not None:
                keep += chunk
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


# -- one daemon, a local job and a Docker job ---------------------------------------------------


class Rig:
    """The real daemon in-process (``gpus=[0, 1]``, local and docker runners) driven one cycle
    at a time, with jobs submitted through the client."""

    def __init__(self, tmp: Path, engine: Any) -> None:
        self.root = tmp / "root"
        self.root.mkdir()
        self.tmp = tmp
        self.engine = engine
        self.relay = RecordingEngine(engine.docker_host)
        self.client = Client(str(self.root), expect_daemon=False)
        self.daemons: list[Daemon] = []

    def daemon(self) -> Daemon:
        settings = {
            "runners": {
                "local": {"attempts_dir": str(self.tmp / "attempts")},
                "docker": {"image": self.engine.base_image, "docker_host": self.relay.url},
            }
        }
        daemon = build_daemon(
            str(self.root), work_dir=str(self.tmp / "work"), gpus=[0, 1], settings=settings
        )
        self.daemons.append(daemon)
        return daemon

    def submit(self, name: str, command: str, kind: str) -> None:
        runner = (
            {"kind": kind} if kind == "local" else {"kind": kind, "image": self.engine.base_image}
        )
        self.client.submit(
            new_jobspec(
                name=name,
                command=command,
                user_id="tester",
                project_id="default",
                resources={"gpu": 1},
                runner=runner,
            )
        )

    def drive(self, daemon: Daemon, done: Any, what: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := done()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            daemon.cycle(time.time())
            daemon.settle()
            time.sleep(0.05)
        return value

    def printed_gpus(self, job: str) -> list[int] | None:
        path = self.root / "logs" / job
        text = path.read_text() if path.exists() else ""
        match = re.search(r"^gpus=\[([\d,]*)\]$", text, re.M)
        return None if match is None else [int(g) for g in match.group(1).split(",") if g]

    def attempt_of(self, job: str) -> str | None:
        path = self.root / "jobs" / "states" / job
        if not path.exists():
            return None
        record = json.loads(path.read_text()).get("runner") or {}
        return record.get("name")

    def outcome(self, job: str) -> str | None:
        path = self.root / "jobs" / "complete" / job
        return json.loads(path.read_text())["state"].get("outcome") if path.exists() else None

    def close(self) -> None:
        (self.tmp / "go").touch()  # the local jobs end
        for daemon in self.daemons:
            daemon.close()
        client = self.engine.client()
        try:
            for c in client.containers.list(
                all=True, filters={"label": f"bastion.root={root_tag(str(self.root))}"}
            ):
                c.remove(force=True)
        finally:
            client.close()
        self.relay.close()


@pytest.fixture
def rig(docker_engine: Any, tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, docker_engine)
    yield r
    r.close()


def holds_a_gpu(rig: Rig) -> str:
    """A local job that prints its GPUs, then runs until the test ends."""
    return (
        f'echo "gpus=[$CUDA_VISIBLE_DEVICES]"; while [ ! -e {rig.tmp / "go"} ]; do sleep 0.1; done'
    )


def test_a_local_job_and_a_docker_job_of_one_daemon_get_different_gpus(rig: Rig) -> None:
    daemon = rig.daemon()
    rig.submit("on-host", holds_a_gpu(rig), "local")
    assert rig.drive(daemon, lambda: rig.printed_gpus("on-host"), "the local job's GPUs") == [0]

    rig.submit("in-container", "true", "docker")
    container = rig.drive(daemon, lambda: rig.attempt_of("in-container"), "its attempt")
    ids = rig.drive(daemon, lambda: rig.relay.device_ids(container), "the container's create")
    assert ids == ["1"]  # GPU 0 is the local job's
    labels = rig.relay.creates()[container]["Labels"]
    assert labels["bastion.gpus"] == "1"
    # (This engine has no GPU driver: the container is refused at its start, and its GPU freed.)
    assert rig.drive(daemon, lambda: rig.outcome("in-container"), "its end") == "FAILED"
    assert rig.printed_gpus("on-host") == [0]


def test_after_a_restart_the_gpus_of_running_jobs_are_not_handed_out_again(rig: Rig) -> None:
    first = rig.daemon()
    rig.submit("on-host", holds_a_gpu(rig), "local")
    assert rig.drive(first, lambda: rig.printed_gpus("on-host"), "the local job's GPUs") == [0]
    first.close()  # (its job runs on: the next daemon adopts it)

    second = rig.daemon()
    rig.submit("in-container", "true", "docker")
    container = rig.drive(second, lambda: rig.attempt_of("in-container"), "its attempt")
    ids = rig.drive(second, lambda: rig.relay.device_ids(container), "the container's create")
    assert ids == ["1"]
    assert rig.drive(second, lambda: rig.outcome("in-container"), "its end") == "FAILED"
    assert second.runners.gpu_ledger.held() == {rig.attempt_of("on-host"): [0]}


def test_a_container_a_dead_daemon_created_keeps_its_gpu_from_local_jobs(
    docker_engine: Any, tmp_path: Path
) -> None:
    """A daemon died between a container's create and its start: the container (labelled with
    its GPU) holds it, for the local runner too, until it is deleted; a start that finds no
    GPU free is refused as before."""
    root = str(tmp_path / "root")
    os.makedirs(root)
    attempts = str(tmp_path / "attempts")
    name = attempt_name(root, "made-before", "sub1", 1, "run")
    client = docker_engine.client()
    created = client.api.create_container(
        docker_engine.base_image,
        command=["true"],
        name=name,
        labels={"bastion.root": root_tag(root), "bastion.name": name, "bastion.gpus": "0"},
    )
    runners = Runners(
        {
            "local": {"root": root, "attempts_dir": attempts, "gpus": [0, 1]},
            "docker": {"root": root, "docker_host": docker_engine.docker_host, "gpus": [0, 1]},
        }
    )
    try:
        docker = runners.get("docker")  # (the daemon's recovery makes every runner in use)
        local = runners.get("local")

        def attempt(job: str) -> Attempt:
            return Attempt(
                name=attempt_name(root, job, uuid.uuid4().hex[:8], 1, "run"),
                job=job,
                attempt=1,
                command="exit 0",
                env={},
                resources={"gpu": 1},
            )

        assert local.start(attempt("first"))["gpus"] == [1]
        with pytest.raises(RunnerError, match=r"needs 1 GPUs but only 0 of 2 are free"):
            local.start(attempt("second"))
        (owned,) = [o for o in docker.list_owned() if o.name == name]
        assert not owned.finished and owned.handle["gpus"] == [0]
        wait_for(lambda: docker.delete(owned.handle), what="the container's removal")
        assert local.start(attempt("third"))["gpus"] == [0]
    finally:
        runners.close()
        with contextlib.suppress(NotFound):
            client.api.remove_container(created["Id"], force=True)
        client.close()

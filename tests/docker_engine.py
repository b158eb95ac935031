"""A real Docker engine for the tests: ``scripts/docker_setup.sh`` started once per session.

The engine, the local registry and the base image are left running and cached when the session
ends, on purpose: a cold setup installs packages and debootstraps an image (about 80 s), a warm
one only checks they answer (about 0.1 s). They live under ``~/.cache/bastion-test-docker``
(outside the repository); ``kill $(cat ~/.cache/bastion-test-docker/*.pid)`` stops them.
What the tests themselves made (containers named ``bst-...`` or labelled ``bastion.test=1``)
is removed at the end of the session.

An engine that cannot start fails the tests that ask for it, loudly and with the script's
output: a silent skip would hide a broken runner. ``BASTION_SKIP_DOCKER=1`` skips them instead,
for machines where Docker cannot run at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parent.parent / "scripts" / "docker_setup.sh"
SETUP_TIMEOUT = 600


@dataclass(frozen=True)
class DockerEngine:
    docker_host: str  # unix:///.../docker.sock
    registry: str  # host:port of the local registry, which holds ``registry/base_image`` too
    base_image: str  # a Debian bookworm image with python3, made without Docker Hub

    def client(self):
        import docker

        return docker.DockerClient(base_url=self.docker_host)


def _remove_test_containers(engine: DockerEngine) -> None:
    client = engine.client()
    try:
        for container in client.containers.list(all=True):
            if container.name.startswith("bst-") or container.labels.get("bastion.test") == "1":
                container.remove(force=True)
    finally:
        client.close()


@pytest.fixture(scope="session")
def docker_engine():
    if os.environ.get("BASTION_SKIP_DOCKER") == "1":
        pytest.skip("BASTION_SKIP_DOCKER=1")
    try:
        done = subprocess.run(
            ["bash", str(SETUP)], capture_output=True, text=True, timeout=SETUP_TIMEOUT
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{SETUP} took more than {SETUP_TIMEOUT} s:\n{e.stderr or ''}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"{SETUP} failed (exit {done.returncode}); set BASTION_SKIP_DOCKER=1 to skip the "
            f"Docker tests on a machine without Docker.\n{done.stdout}\n{done.stderr}",
            pytrace=False,
        )
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for line in done.stdout.splitlines()
        if line.startswith("export ") and "=" in line
    )
    print(done.stderr, file=sys.stderr)
    engine = DockerEngine(
        docker_host=exports["DOCKER_HOST"],
        registry=exports["BASTION_TEST_REGISTRY"],
        base_image=exports["BASTION_TEST_IMAGE"],
    )
    os.environ["DOCKER_HOST"] = engine.docker_host
    yield engine
    _remove_test_containers(engine)

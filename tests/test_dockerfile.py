"""The top-level Dockerfile builds offline on the real engine and its images run.

The build context is a temporary copy of the repository's files (tracked and untracked, not
ignored) plus ``wheels/``: wheels of pip, setuptools, wheel and the package's dependencies, made
on the host with ``pip wheel`` and cached outside the repository (keyed by the dependency list),
so the image installs with ``--no-index`` from a base image that has python3 but no pip.
A second run finds the wheels and every dependency layer cached: only the package layer may
rebuild when the code changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bastion-test-docker"
TAG = "bastion-test/bastion-image"


def _dependency_wheels() -> Path:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = ["pip", "setuptools", "wheel", *deps]
    key = hashlib.sha256(json.dumps(wanted).encode()).hexdigest()[:12]
    out = CACHE / f"wheels-{key}"
    if (out / ".complete").exists():
        return out
    tmp = out.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--disable-pip-version-check",
            "-w",
            str(tmp),
            *wanted,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        pytest.fail(f"pip wheel failed:\n{done.stdout}\n{done.stderr}", pytrace=False)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    (out / ".complete").touch()
    return out


def _context(tmp: Path) -> Path:
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    ctx = tmp / "context"
    for rel in filter(None, listed):
        src = REPO / rel
        if not src.is_file() or rel.startswith(("wheels/", ".venv/")):
            continue
        dst = ctx / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    shutil.copytree(_dependency_wheels(), ctx / "wheels", ignore=shutil.ignore_patterns(".*"))
    return ctx


def _build(client, ctx: Path, target: str, base: str) -> tuple[str, float, list[str]]:
    started = time.monotonic()
    log: list[str] = []
    for chunk in client.api.build(
        path=str(ctx),
        target=target,
        buildargs={"BASE": base},
        tag=f"{TAG}:{target}",
        rm=True,
        forcerm=True,
        decode=True,
    ):
        if "stream" in chunk:
            log.append(chunk["stream"])
        if "error" in chunk:
            pytest.fail(
                f"build of {target} failed: {chunk['error']}\n{''.join(log)}", pytrace=False
            )
    return f"{TAG}:{target}", time.monotonic() - started, log


@pytest.fixture(scope="module")
def images(docker_engine, tmp_path_factory):
    ctx = _context(tmp_path_factory.mktemp("dockerfile"))
    client = docker_engine.client()
    built = {}
    for target in ("bastion", "worker"):
        built[target] = _build(client, ctx, target, docker_engine.base_image)
        print(f"built {target} in {built[target][1]:.1f} s", file=sys.stderr)
    # Nothing changed: the second build of the same context is all cache.
    again = _build(client, ctx, "bastion", docker_engine.base_image)
    yield client, built, again
    client.close()


def _run(client, image, command, **kw):
    container = client.containers.run(
        image, command, detach=True, network_mode="host", labels={"bastion.test": "1"}, **kw
    )
    try:
        code = container.wait(timeout=180)["StatusCode"]
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def test_bastion_image_runs_one_cycle_against_a_mounted_root(images, tmp_path):
    client, built, _ = images
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the daemon runs as uid 10001
    code, logs = _run(
        client,
        built["bastion"][0],
        ["start", "--once", "--root=/data/root"],
        volumes={str(data): {"bind": "/data", "mode": "rw"}},
    )
    assert code == 0, logs
    assert (data / "root" / "history" / "daemon").exists(), logs
    assert (data / "root" / "lease").exists(), logs
    attrs = client.images.get(built["bastion"][0]).attrs["Config"]
    assert attrs["Entrypoint"] == ["bastion"] and attrs["Cmd"] == ["start"]
    assert attrs["User"] not in ("", "0", "root", "0:0")
    assert "BASTION_ROOT=/data/root" in attrs["Env"]


def test_bastion_image_takes_root_from_environment(images, tmp_path):
    client, built, _ = images
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)
    code, logs = _run(
        client,
        built["bastion"][0],
        ["start", "--once"],
        volumes={str(data): {"bind": "/data", "mode": "rw"}},
        environment={"BASTION_ROOT": "/data/other"},
    )
    assert code == 0, logs
    assert (data / "other" / "history" / "daemon").exists(), logs


def test_worker_image_has_the_agent(images):
    client, built, _ = images
    code, logs = _run(client, built["worker"][0], ["python3", "-m", "bastion.agent", "--help"])
    assert "usage: python -m bastion.agent" in logs, logs
    assert code == 2, logs  # the agent's usage exit status
    check = (
        "import site, sys, bastion, docker; "
        "assert bastion.__file__.startswith('/opt/bastion/app/'); "
        # where a user's `pip install` goes comes first: their versions win
        "assert sys.path.index(site.getsitepackages()[0]) < sys.path.index('/opt/bastion/deps')"
    )
    code, logs = _run(client, built["worker"][0], ["python3", "-c", check])
    assert code == 0, logs


def test_second_build_is_cached(images):
    _, built, (_, seconds, log) = images
    text = "".join(log)
    assert "Using cache" in text
    assert "Running in" not in text, text  # no RUN step executed again
    print(
        f"cold/first bastion {built['bastion'][1]:.1f} s, rebuild {seconds:.1f} s", file=sys.stderr
    )
    assert seconds < 30

"""A job that cannot start says so and lets go (issue 21, point 2; issue 27's cloud case).

Through the real daemon and CLI (tests/harness.py) on a local root: a start that fails for a
reason no retry cures ends the job FAILED after one try and frees its quota; a start that keeps
failing transiently backs off and gives up after the daemon's ``start_give_up_seconds``; a job
whose start waits can be cancelled; and the client refuses at submit what exec would refuse.

The transient failure is a real one: the test holds this host's fencing lock
(bastion/runners/fence.py) as a frozen daemon in the middle of a start would, so every start of
the local runner is told to try again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bastion.jobspec import EXEC_RESERVE_BYTES, MAX_SPEC_BYTES, exec_arg_max
from bastion.runners.local import default_attempts_dir
from launch.api import Client, ExecLimitError, new_jobspec
from tests.harness import Bastion, wait_for

CPUS = os.cpu_count() or 1


@contextlib.contextmanager
def fence_held(b: Bastion, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Hold the local runner's fence of ``b``'s root exclusively: each start waits 0.5 s for
    it, then raises TryAgain ("another daemon's start on this host holds the fence")."""
    monkeypatch.setenv("XDG_STATE_HOME", b.env["XDG_STATE_HOME"])
    directory = default_attempts_dir(b.store.root_url)
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, ".fence"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def events(record: dict) -> list[str]:
    return [e["event"] for e in record["state"]["events"]]


def start_tries(b: Bastion, name: str) -> int:
    """How often the daemon tried (and failed) to start ``name``'s attempt, from its log."""
    out = b.daemon_output()
    return sum(
        1
        for line in out.splitlines()
        if f"{name}: starting " in line or f"{name}: could not start " in line
    )


def test_an_environment_too_large_for_exec_fails_at_its_first_start_and_frees_its_quota(
    local_bastion: Bastion,
) -> None:
    b = local_bastion
    b.start()
    # Written straight into the bucket, as any bucket writer can (the client would refuse it):
    # a 1 MB value is accepted by the daemon's reader (the spec is under 1 MiB) but exec refuses
    # it (E2BIG). It asks for the whole pool, so while it holds quota nothing else runs.
    spec = new_jobspec(
        name="huge",
        command="echo never",
        user_id="tester",
        project_id="default",
        resources={"cpu": CPUS},
    )
    spec.env_vars = {"BIG": "x" * 1_000_000}
    raw = spec.dumps()
    assert len(raw) < MAX_SPEC_BYTES
    assert b.store.specs.submit("huge", raw)
    b.store.requests.write_marker("huge")
    wait_for(lambda: b.state("huge") or b.complete("huge"), what="huge to be admitted")
    b.cli("launch", "--name=next", f"--resources=cpu={CPUS}", "--", "echo next ran")

    record = b.wait_complete("huge", timeout=30)
    state = record["state"]
    assert state["outcome"] == "FAILED", state
    assert "Argument list too long" in state["reason"] and "E2BIG" in state["reason"]
    assert "BIG" in state["reason"] and "131,072" in state["reason"]  # names what to shrink
    assert events(record).count("STARTED") == 1 and state["attempt"] == 1
    assert start_tries(b, "huge") == 1  # one try, no retry every cycle
    assert "could not start" in b.log("huge")

    after = b.wait_complete("next", timeout=30)  # its quota was freed
    assert after["state"]["outcome"] == "SUCCEEDED"
    assert "next ran" in b.log("next")

    why = b.cli("why", "huge").stdout
    assert "FAILED" in why and "Argument list too long" in why, why
    history = b.cli("history", "huge").stdout
    assert "could not start the command" in history and "E2BIG" in history


def test_the_python_api_refuses_an_environment_value_exec_would_refuse(tmp_path: Path) -> None:
    client = Client(str(tmp_path / "root"))
    with pytest.raises(ExecLimitError, match=r"env_vars\.BIG: 200,005 bytes.*131,072"):
        new_jobspec(
            name="big",
            command="true",
            user_id="tester",
            project_id="default",
            env_vars={"BIG": "x" * 200_000},
        )
    spec = new_jobspec(name="big", command="true", user_id="tester", project_id="default")
    spec.env_vars = {"SMALL": "1", "BIG": "x" * 200_000}  # changed after it was made
    with pytest.raises(ExecLimitError, match=r"env_vars\.BIG"):
        client.submit(spec)
    assert client.store.specs.read("big") is None  # nothing was written


def test_the_cli_refuses_an_environment_over_exec_limit_with_exit_2(
    local_bastion: Bastion,
) -> None:
    arg_max = exec_arg_max()
    each = 100_000  # under the per-variable limit: only their total is too much
    count = (arg_max - EXEC_RESERVE_BYTES) // each + 1
    if count * (each + 16) + 64_000 > arg_max:
        pytest.skip("the CLI's own argv could not carry an environment over the job's budget")
    flags = [f"--env=V{i}={'x' * each}" for i in range(count)]
    proc = local_bastion.cli("launch", "--name=wide", *flags, "--", "true", check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr[-2000:])
    assert "env_vars" in proc.stderr and "ARG_MAX" in proc.stderr
    assert "env_vars.V" in proc.stderr  # names the largest variables
    assert len(proc.stderr) < 2000
    assert not local_bastion.exists("jobs", "active", "wide")


def test_a_start_failing_transiently_backs_off_and_gives_up_within_the_bound(
    local_bastion: Bastion, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = local_bastion
    bound = 3.0
    settings = tmp_path / "settings.toml"
    settings.write_text(f"start_give_up_seconds = {bound}\n")
    b.start(f"--settings={settings}", poll=0.1)
    with fence_held(b, monkeypatch):
        began = time.monotonic()
        b.cli("launch", "--name=stuck", f"--resources=cpu={CPUS}", "--", "echo never")
        b.cli("launch", "--name=after", f"--resources=cpu={CPUS}", "--", "echo after ran")
        record = b.wait_complete("stuck", timeout=30)
        took = time.monotonic() - began
        state = record["state"]
        assert state["outcome"] == "FAILED", state
        assert "holds the fence" in state["reason"] and "gave up" in state["reason"]
        assert "start_give_up_seconds is 3" in state["reason"]
        assert took < bound + 6, took  # the bound, one last try and a cycle or two
        # Backed off: tries next cycle, then 1 s, 2 s... (about 0.1 s apart without it).
        tries = start_tries(b, "stuck")
        assert 2 <= tries <= 6, tries
    after = b.wait_complete("after", timeout=30)  # its quota was freed
    assert after["state"]["outcome"] == "SUCCEEDED"
    why = b.cli("why", "stuck").stdout
    assert "FAILED" in why and "gave up" in why, why


def test_a_job_whose_start_waits_can_be_cancelled(
    local_bastion: Bastion, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = local_bastion
    ran = tmp_path / "ran"
    b.start()
    with fence_held(b, monkeypatch):
        b.cli("launch", "--name=waiting", "--", f"touch {ran}")
        wait_for(
            lambda: "waits to start" in ((b.state("waiting") or {}).get("reason") or ""),
            what="its start to wait",
        )
        assert "STARTING" in b.cli("list").stdout
        b.cli("cancel", "waiting")
        record = b.wait_complete("waiting", timeout=20)  # while its start still cannot happen
        assert record["state"]["outcome"] == "CANCELLED", record["state"]
        assert "cancelled by tester" in record["state"]["reason"]
    time.sleep(1.0)  # the fence is free now: nothing of the cancelled job may start
    assert not ran.exists()
    assert json.loads(b.cli("list", "--all", "--json").stdout)[0]["status"] == "CANCELLED"

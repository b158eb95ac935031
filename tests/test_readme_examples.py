"""The README's examples, run as written, so the README cannot drift from what the code does.

The shell examples of "Using it" run in order on a temporary root (BASTION_ROOT) from a
temporary project directory holding a train.py; the Python example runs as a script. Only
the root and the directory are substituted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.harness import REPO, kill_all, processes_with_env, wait_for

README = (REPO / "README.md").read_text()
BASTION = Path(sys.executable).parent / "bastion"


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def shell_examples(title: str) -> list[list[str]]:
    """The commands of the section's first indented block, comments dropped."""
    lines = section(title).splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("    "))
    commands = []
    for line in lines[first:]:
        if line and not line.startswith("    "):
            break
        argv = shlex.split(line, comments=True)
        if argv:
            commands.append(argv)
    return commands


def train_py() -> str:
    """The train.py of "Outputs and resume": the project's train.py for every example."""
    (code,) = re.findall(r"```python\n(.*?)```", section("Outputs and resume"), re.S)
    return code


def python_example() -> str:
    (code,) = re.findall(r"```python\n(.*?)```", section("Python API"), re.S)
    return code


@pytest.fixture
def user(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(train_py())
    root = str(tmp_path / "root")
    env = {
        **os.environ,
        "BASTION_ROOT": root,
        "BASTION_USER": "readme",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "PATH": f"{BASTION.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
    }
    daemons: list[subprocess.Popen[bytes]] = []
    yield project, env, daemons
    for proc in daemons:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    kill_all([p for p in processes_with_env("BASTION_ROOT", root) if p.pid != os.getpid()])


def run(argv: list[str], project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=120)


def test_using_it_examples_run_as_written(user, tmp_path):
    project, env, daemons = user
    commands = shell_examples("Using it")
    assert commands[0] == ["bastion", "start"], commands[0]
    out = open(tmp_path / "daemon.out", "wb")  # noqa: SIM115
    daemons.append(
        subprocess.Popen(commands[0], cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT)
    )
    wait_for(
        lambda: run(["bastion", "status"], project, env).returncode == 0,
        timeout=60,
        what="the daemon to hold the root",
    )
    outputs = {}
    for argv in commands[1:]:
        proc = run(argv, project, env)
        assert proc.returncode == 0, (
            f"README example failed: {shlex.join(argv)}\n{proc.stdout}\n{proc.stderr}\n"
            + (tmp_path / "daemon.out").read_text(errors="replace")[-3000:]
        )
        outputs[shlex.join(argv)] = proc.stdout
    follow = outputs["bastion logs hello --follow"]
    assert [ln for ln in follow.splitlines() if ln.startswith("line")] == [
        "line 1",
        "line 2",
        "line 3",
    ]
    assert "no daemon" not in " ".join(outputs.values())

    def train_cancelled() -> bool:
        listed = json.loads(run(["bastion", "list", "--all", "--json"], project, env).stdout)
        return any(j["name"] == "train" and j["status"] == "CANCELLED" for j in listed)

    wait_for(train_cancelled, timeout=60, interval=1, what="train to be cancelled")
    log = run(["bastion", "logs", "train"], project, env).stdout
    assert "training" in log and "step 0" in log  # train.py ran from its bundle


def test_python_example_runs_as_written(user):
    project, env, daemons = user
    daemons.append(
        subprocess.Popen(
            [str(BASTION), "start", "--poll_seconds=0.5"],
            cwd=project,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    wait_for(
        lambda: run(["bastion", "status"], project, env).returncode == 0,
        timeout=60,
        what="the daemon to hold the root",
    )
    code = python_example()
    proc = run([sys.executable, "-c", textwrap.dedent(code)], project, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    claimed = re.search(r"print\(info\.status.*#\s*(.+)", code).group(1).strip()
    assert claimed in proc.stdout, proc.stdout
    assert "hello from api-1" in proc.stdout


def _daemon(project: Path, env: dict[str, str], daemons: list, log: Path) -> None:
    out = open(log, "wb")  # noqa: SIM115
    daemons.append(
        subprocess.Popen(
            [str(BASTION), "start", "--poll_seconds=0.5"],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    )
    wait_for(
        lambda: run(["bastion", "status"], project, env).returncode == 0,
        timeout=60,
        what="the daemon to hold the root",
    )


def _run_all(commands: list[list[str]], project: Path, env: dict[str, str], log: Path) -> dict:
    outputs = {}
    for argv in commands:
        proc = run(argv, project, env)
        assert proc.returncode == 0, (
            f"README example failed: {shlex.join(argv)}\n{proc.stdout}\n{proc.stderr}\n"
            + log.read_text(errors="replace")[-3000:]
        )
        outputs[shlex.join(argv)] = proc.stdout + proc.stderr
    return outputs


def test_job_rules_examples_run_as_written(user, tmp_path):
    project, env, daemons = user
    title = "Time limits, dependencies, arrays and sweeps"
    (toml,) = re.findall(r"```toml\n(.*?)```", section(title), re.S)
    (project / "sweep.toml").write_text(toml)
    log = tmp_path / "daemon.out"
    _daemon(project, env, daemons, log)
    outputs = _run_all(shell_examples(title), project, env, log)
    assert "submitted group grid: 4 jobs grid-0 .. grid-3, at most 2 at once" in " ".join(
        outputs.values()
    )
    assert "submitted group lr: 4 jobs" in " ".join(outputs.values())

    def grid_done() -> str:
        line = run(["bastion", "list", "--group=lr"], project, env).stdout
        return line if "4 SUCCEEDED" in line else ""

    wait_for(grid_done, timeout=120, interval=1, what="the sweep to finish")
    seen = {run(["bastion", "logs", f"lr-{i}"], project, env).stdout for i in range(4)}
    assert any("lr=0.01 optimizer=sgd" in text for text in seen)
    code = re.findall(r"```python\n(.*?)```", section(title), re.S)[0]
    proc = run([sys.executable, "-c", textwrap.dedent(code)], project, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    claimed = re.search(r"print\(\[m\.name.*#\s*(.+)", code).group(1).strip()
    assert claimed in proc.stdout, proc.stdout


def test_earlier_runs_examples_run_as_written(user, tmp_path):
    project, env, daemons = user
    log = tmp_path / "daemon.out"
    _daemon(project, env, daemons, log)
    outputs = _run_all(shell_examples("Earlier runs of a name"), project, env, log)
    latest = outputs["bastion logs again"]
    assert "second" in latest and "first" not in latest
    previous = outputs["bastion logs again --previous"]
    assert "first" in previous and "second" not in previous
    assert outputs["bastion history again --all"].count("spec detected") == 2


def test_outputs_and_resume_examples_run_as_written(user, tmp_path):
    project, env, daemons = user
    commands = shell_examples("Outputs and resume")
    assert commands[0] == ["bastion", "start"], commands[0]
    out = open(tmp_path / "daemon.out", "wb")  # noqa: SIM115
    daemons.append(
        subprocess.Popen(commands[0], cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT)
    )
    wait_for(
        lambda: run(["bastion", "status"], project, env).returncode == 0,
        timeout=60,
        what="the daemon to hold the root",
    )
    outputs = {}
    for argv in commands[1:]:
        if argv[:2] == ["bastion", "update"]:  # a checkpoint to resume from, as a user waits
            wait_for(
                lambda: "ckpt.txt" in run(["bastion", "outputs", "train"], project, env).stdout,
                timeout=60,
                what="train's first checkpoint in the bucket",
            )
        if argv[:2] == ["bastion", "cancel"]:
            wait_for(
                lambda: (
                    "resumed from step" in run(["bastion", "logs", "train"], project, env).stdout
                ),
                timeout=60,
                what="the second attempt",
            )
        proc = run(argv, project, env)
        assert proc.returncode == 0, (
            f"README example failed: {shlex.join(argv)}\n{proc.stdout}\n{proc.stderr}\n"
            + (tmp_path / "daemon.out").read_text(errors="replace")[-3000:]
        )
        outputs[argv[2] if argv[1] == "outputs" and len(argv) > 3 else shlex.join(argv)] = (
            proc.stdout
        )
    log = outputs["bastion logs train --follow"]
    resumed = [ln for ln in log.splitlines() if ln.startswith("resumed from step")]
    assert resumed and int(resumed[0].split()[-1]) > 0, log
    assert "outputs: attempt 1 restored 0 file(s)" in outputs["bastion history train"]
    assert (project / "train-out" / "ckpt.txt").exists()
    assert "removed" in outputs["train"]  # --delete --yes
    listed = run(["bastion", "outputs", "train"], project, env).stdout
    assert "no outputs" in listed

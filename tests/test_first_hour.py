"""Issue 14: a new user's first hour, through the real CLI (and the Python API where it applies).

Each test fails on the code before the issue was fixed: silent no-daemon waits, the demo's
machine-wide pgrep, absl's useless --help, silent typos and tracebacks, exit 0 for jobs that
did not succeed, unmetered jobs, quota refusals only in the daemon's log, and the smaller ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import warnings

import pytest

from launch import Client, NoDaemon, NoDaemonWarning, SpecError, new_jobspec
from tests.harness import REPO, wait_for

QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
cpu = 4
[project_membership]
research = ["alice"]
[project_resources.research]
cpu = 1.0
"""


def one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{text}"
    assert "Traceback" not in text
    return lines[0]


# -- 1. no daemon, no word -----------------------------------------------------------------


def test_no_daemon_is_said_by_launch_list_logs_follow_and_the_api(local_bastion):
    b = local_bastion
    proc = b.cli("launch", "--name=lonely", "--bundler=none", "--", "echo hi")
    assert f"no daemon has ever run on {b.root}" in proc.stderr
    listed = b.cli("list").stderr  # header lines above the table; stdout is the table
    assert listed.splitlines()[0].startswith("! no daemon has ever run")
    assert "not being run or watched" in listed
    started = time.monotonic()
    proc = b.cli(
        "logs",
        "lonely",
        "--follow",
        "--daemon_wait_seconds=1",
        "--follow_poll_seconds=0.2",
        check=False,
        timeout=30,
    )
    assert proc.returncode == 1 and "no daemon has ever run" in proc.stderr
    assert time.monotonic() - started < 20

    # a daemon that ran and stopped cleanly: released lease
    b.once()
    proc = b.cli("launch", "--name=later", "--bundler=none", "--", "echo hi")
    assert re.search(rf"no daemon has held {re.escape(b.root)} since \d{{4}}-", proc.stderr)
    assert "no daemon has held" in b.cli("list").stderr.splitlines()[0]

    # a daemon that died: a lease not renewed for longer than its duration
    record = json.loads(b.read("lease"))
    record.update(released=False, renewed=time.time() - 300, duration=60)
    b.put("lease", data=json.dumps(record))
    assert "stopped renewing its lease" in b.cli("list").stderr.splitlines()[0]

    client = Client(b.root)
    spec = new_jobspec(name="api-lonely", command="echo hi", user_id="u", project_id="default")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client.submit(spec)
    assert any(
        issubclass(w.category, NoDaemonWarning) and "no daemon has held" in str(w.message)
        for w in caught
    )
    with pytest.raises(NoDaemon, match="no daemon has held"):
        for _ in client.follow_log("api-lonely", poll_seconds=0.1, no_daemon_timeout=0.5):
            pass

    # with a live daemon: nothing said, and list has no warning line
    b.start()
    wait_for(lambda: b.cli("status", check=False).returncode == 0, what="the daemon's lease")
    proc = b.cli("launch", "--name=served", "--bundler=none", "--", "echo hi")
    assert "no daemon" not in proc.stderr
    assert "no daemon" not in b.cli("list").stderr


# -- 2. the demo -----------------------------------------------------------------------------


def test_demo_checks_its_own_roots_lease_and_records_the_daemon_pid(tmp_path):
    assert "pgrep" not in (REPO / "scripts" / "demo.sh").read_text()
    readme = (REPO / "README.md").read_text()
    assert "pkill" not in readme and "demo-daemon.pid" in readme
    # someone else's `bastion start` on this machine must not stop the demo from starting ours
    decoy = subprocess.Popen(["bash", "-c", 'exec -a "bastion start" sleep 120'])
    env = {
        **os.environ,
        "BASTION_ROOT": str(tmp_path / "root"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "BASTION_DEMO_SKIP_INSTALL": "1",
        "PYTHONPATH": str(REPO),
    }
    pid_file = tmp_path / "state" / "bastion" / "demo-daemon.pid"
    try:
        proc = subprocess.run(
            [str(REPO / "scripts" / "demo.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "started the daemon" in proc.stdout and "SUCCEEDED" in proc.stdout
        pid = int(pid_file.read_text())
        os.kill(pid, 0)  # alive
        assert decoy.poll() is None
        again = subprocess.run(
            [str(REPO / "scripts" / "demo.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0 and "already holds" in again.stdout
    finally:
        decoy.kill()
        if pid_file.exists():
            pid = int(pid_file.read_text())
            os.kill(pid, 15)
            wait_for(lambda: not _alive(pid), timeout=20, what="the demo daemon to stop")


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


# -- 3. help ---------------------------------------------------------------------------------


def test_help_per_verb_and_flags_of_other_verbs_are_errors(local_bastion):
    b = local_bastion
    for args in (("--help",), ("-h",)):
        proc = b.cli(*args)
        assert "usage: bastion VERB" in proc.stdout and "launch" in proc.stdout
        assert len(proc.stdout.splitlines()) < 40
    for verb in ("launch", "logs", "cancel", "list", "start", "why", "quota"):
        for flag in ("--help", "-h"):
            proc = b.cli(verb, flag)
            assert proc.stdout.startswith(f"usage: bastion {verb}"), proc.stdout
            assert "example: bastion " in proc.stdout
    launch_help = b.cli("launch", "--help").stdout
    assert "--resources" in launch_help and "--poll_seconds" not in launch_help
    proc = b.cli("cancel", "--poll_seconds=2", "x", check=False)
    assert proc.returncode == 2
    line = one_line(proc.stderr)
    assert "--poll_seconds" in line and "cancel" in line
    proc = b.cli("list", "--nosuchflag", check=False)
    assert proc.returncode == 2 and "nosuchflag" in one_line(proc.stderr)
    assert b.cli("--helpfull").returncode == 0


# -- 4. typos, bad roots -----------------------------------------------------------------------


def test_typo_root_and_quota_file_and_bad_roots_are_one_line(local_bastion, tmp_path):
    b = local_bastion
    typo = str(tmp_path / "roott")
    for args in (("list",), ("logs", "x"), ("why", "x"), ("cancel", "x"), ("history", "x")):
        proc = b.cli(args[0], f"--root={typo}", *args[1:], check=False)
        assert proc.returncode == 1
        assert typo in one_line(proc.stderr) and "no Bastion root" in proc.stderr
    assert not os.path.exists(typo)

    a_file = tmp_path / "afile"
    a_file.write_text("x")
    for args in (("list",), ("launch", "--bundler=none", "--", "true")):
        proc = b.cli(args[0], f"--root={a_file}", *args[1:], check=False)
        assert proc.returncode == 1 and "is a file" in one_line(proc.stderr)

    proc = b.cli(
        "start",
        "--once",
        f"--work_dir={tmp_path / 'w'}",
        f"--quota_file={tmp_path / 'quota.tmol'}",
        check=False,
    )
    assert proc.returncode == 1
    assert "no quota file at" in one_line(proc.stderr) and "quota.tmol" in proc.stderr
    b.cli("launch", "--name=j", "--bundler=none", "--", "true")
    proc = b.cli("why", "j", f"--quota_file={tmp_path / 'quota.tmol'}", check=False)
    assert proc.returncode == 1 and "no quota file at" in one_line(proc.stderr)

    if os.geteuid() != 0:  # root ignores permissions
        ro = tmp_path / "ro"
        b.cli("launch", f"--root={ro}", "--bundler=none", "--", "true")
        ro.joinpath("jobs", "active").chmod(0o555)
        proc = b.cli("launch", f"--root={ro}", "--bundler=none", "--", "true", check=False)
        assert proc.returncode == 1 and str(ro) in one_line(proc.stderr)


def test_unreachable_bucket_is_one_line_after_a_bounded_wait(local_bastion):
    b = local_bastion
    b.env.update(
        STORAGE_EMULATOR_HOST="http://127.0.0.1:9", GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false"
    )
    started = time.monotonic()
    proc = b.cli("list", "--root=gs://no-such-bucket/x", check=False, timeout=60)
    assert time.monotonic() - started < 30  # the 8 s probe, and Python's start on a busy machine
    assert proc.returncode == 1
    assert "cannot reach gs://no-such-bucket/x" in one_line(proc.stderr)


# -- 5. rejected and failed jobs ----------------------------------------------------------------


def test_launch_follow_exits_nonzero_and_logs_say_why_for_rejected_and_failed(local_bastion):
    b = local_bastion
    b.start()
    proc = b.cli(
        "launch",
        "--name=huge",
        "--bundler=none",
        "--resources=cpu=100000",
        "--follow",
        "--follow_poll_seconds=0.2",
        "--",
        "true",
        check=False,
    )
    assert proc.returncode != 0
    assert "rejected" in proc.stdout and "cpu" in proc.stdout
    logs = b.cli("logs", "huge")
    assert "rejected" in logs.stdout and "cpu" in logs.stdout
    proc = b.cli(
        "launch",
        "--name=fails",
        "--bundler=none",
        "--follow",
        "--follow_poll_seconds=0.2",
        "--",
        "exit 3",
        check=False,
    )
    assert proc.returncode == 3 and "FAILED" in proc.stderr
    proc = b.cli(
        "launch",
        "--name=works",
        "--bundler=none",
        "--follow",
        "--follow_poll_seconds=0.2",
        "--",
        "echo fine",
        check=False,
    )
    assert proc.returncode == 0 and "fine" in proc.stdout


# -- 6. default resources --------------------------------------------------------------------------


def test_jobs_without_resources_ask_for_one_cpu(local_bastion):
    b = local_bastion
    spec = json.loads(b.cli("launch", "--dry_run", "--bundler=none", "--", "true").stdout)
    assert spec["metadata"]["resources"] == {"cpu": 1}
    b.cli("launch", "--name=plain", "--bundler=none", "--", "true")
    (job,) = json.loads(b.cli("list", "--json").stdout)
    assert job["resources"] == {"cpu": 1}
    assert "cpu=1" in (REPO / "README.md").read_text()


# -- 7. an invalid quota file on a running daemon -----------------------------------------------


def test_refused_quota_file_is_shown_by_list_why_and_quota_check(local_bastion):
    b = local_bastion
    b.put("project-quotas", "project-quotas.config", data=QUOTA)
    b.once()
    assert b.read("history", "quota-last-good")
    b.put("project-quotas", "project-quotas.config", data=QUOTA.replace("cpu = 1.0", "cpu = -1"))
    b.cli(
        "launch",
        "--name=q1",
        "--project_id=research",
        "--user_id=alice",
        "--bundler=none",
        "--",
        "sleep 30",
    )
    b.once()
    listed = b.cli("list").stderr
    assert "runs on the last good version" in listed and "project_resources.research" in listed
    why = b.cli("why", "q1").stdout
    assert "runs on the last good version" in why and "project_resources.research" in why
    proc = b.cli("quota", "check", b.root, check=False)
    assert proc.returncode == 1
    assert "runs on the last good version" in proc.stdout
    assert "project_resources.research" in proc.stdout and "research" in proc.stdout
    b.cli("cancel", "q1", "--user_id=alice")
    b.once()


# -- 8. smaller ones -------------------------------------------------------------------------------


def test_why_shows_human_times(local_bastion):
    b = local_bastion
    b.cli(
        "launch",
        "--name=blocker",
        f"--resources=cpu={os.cpu_count()}",
        "--bundler=none",
        "--",
        "sleep 30",
    )
    b.cli("launch", "--name=waits", "--bundler=none", "--", "true")
    b.once()
    why = b.cli("why", "waits").stdout
    assert "waits" in why
    assert not re.search(r"\b1[0-9]{9}\b", why), why
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", why), why
    for name in ("waits", "blocker"):
        b.cli("cancel", name)
    b.once()


def test_logs_of_a_large_log_stream_in_bounded_memory(local_bastion, tmp_path):
    b = local_bastion
    b.cli("launch", "--name=big", "--bundler=none", "--", "true")
    line = b"x" * 99 + b"\n"
    b.put("logs", "big", data=line * (50 * 1024 * 1024 // len(line)))
    # The CLI's own peak (VmHWM of its address space), reported at exit. Not ru_maxrss from
    # wait4: Linux carries the forking parent's peak (here the whole pytest process) into it.
    peak = tmp_path / "peak"
    report = (
        "import atexit, runpy, sys\n"
        "def report():\n"
        "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
        f"    open({str(peak)!r}, 'w').write(hwm.split()[1])\n"
        "atexit.register(report)\n"
        "sys.argv = ['bastion', 'logs', 'big']\n"
        "runpy.run_module('launch.cli', run_name='__main__')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", report],
        env=b.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    total = 0
    while chunk := proc.stdout.read(1 << 20):
        total += len(chunk)
    assert proc.wait() == 0 and total >= 50 * 1024 * 1024 - 100
    peak_kib = int(peak.read_text())
    # About 32 MiB of interpreter and imports; reading the whole 50 MiB log at once would not fit.
    assert peak_kib < 64 * 1024, f"peak RSS {peak_kib // 1024} MiB"


def test_cancel_without_an_identity_asks_as_the_login_name_not_as_the_owner(local_bastion):
    """Without --user_id and $BASTION_USER the caller is the login name, as for a launch: were
    it the job's owner, anyone's cancel would pass the ownership check and the history would
    name the owner for a cancel she never asked for (issue 21)."""
    b = local_bastion
    b.cli("launch", "--name=mine", "--user_id=alice", "--bundler=none", "--", "sleep 30")
    env = {k: v for k, v in b.env.items() if k != "BASTION_USER"}
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "cancel", "mine"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "the login name" in proc.stderr and "--force" in proc.stderr
    assert not b.exists("jobs", "user_states", "mine")
    b.cli("cancel", "mine", "--user_id=alice")
    request = json.loads(b.read("jobs", "user_states", "mine"))
    assert request["requested_by"] == request["user_id"] == "alice"
    b.cli("cancel", "mine", "--user_id=bob", "--force")
    assert json.loads(b.read("jobs", "user_states", "mine"))["requested_by"] == "bob"


def test_duplicate_resources_and_empty_command_or_user_are_errors(local_bastion):
    proc = local_bastion.cli(
        "launch", "--resources=cpu=1,cpu=2", "--bundler=none", "--", "true", check=False
    )
    assert proc.returncode == 1 and "cpu" in one_line(proc.stderr) and "twice" in proc.stderr
    with pytest.raises(SpecError, match="command"):
        new_jobspec(name="e", command="  ", user_id="u", project_id="default")
    with pytest.raises(SpecError, match="user_id"):
        new_jobspec(name="e", command="true", user_id="", project_id="default")


def test_readme_points_at_nothing_missing():
    readme = (REPO / "README.md").read_text()
    assert "../shared/DESIGN.md" not in readme
    for link in re.findall(r"`((?:\.\./|\./)?[\w./-]+\.md)`", readme):
        assert (REPO / link).exists(), link

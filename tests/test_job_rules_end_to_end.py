"""Time limits, dependencies, arrays, sweeps and earlier runs through the real CLI, the real
daemon and real processes (the local runner) on a real bucket: a local directory, and the GCS
emulator where the bucket layout is what is tested (earlier runs)."""

from __future__ import annotations

import json
import subprocess
import sys

from bastion.bucket.jobs import marked_job
from tests.harness import wait_for

TRAPS_TERM = "trap 'echo got TERM; exit 143' TERM; echo started; sleep 60 & wait"


def _outcome(bastion, name: str, timeout: float = 60) -> str:
    return bastion.wait_complete(name, timeout)["state"]["outcome"]


def _reason(bastion, name: str) -> str:
    return (bastion.state(name) or {}).get("reason", "")


def _no_writes(bastion, before: list[str]) -> None:
    """Nothing written: the same specs, and no submission marker of the refused names."""
    assert bastion.listdir("jobs", "active") == before
    marked = {marked_job(m) for m in bastion.listdir("jobs", "user_states")}
    assert not {n for n in marked if n and n.split("-")[0] == "x"}


# -- time limits -----------------------------------------------------------------------------


def test_a_job_is_stopped_at_its_time_limit_after_the_warning_and_ends_timeout(local_bastion):
    b = local_bastion
    b.start("--grace_seconds=5")
    b.cli("launch", "--name=tl", "--time=2s", "--bundler=none", "--", TRAPS_TERM)
    record = b.wait_complete("tl", 60)
    state = record["state"]
    assert state["outcome"] == "TIMEOUT" and state["attempt"] == 1  # never requeued
    assert state["reason"].startswith("time limit 2s reached")
    assert 2 <= state["ran_seconds"] < 30
    assert "got TERM" in b.log("tl")  # the warning came before the stop
    history = b.cli("history", "tl").stdout
    assert "TIME_LIMIT" in history and "now: TIMEOUT" in history
    assert "TIMEOUT" in b.cli("list", "--all").stdout


def test_list_and_why_show_the_time_left(local_bastion, tmp_path):
    b = local_bastion
    b.start()
    gate = tmp_path / "gate"
    b.cli(
        "launch",
        "--name=long",
        "--time=1h",
        "--bundler=none",
        "--",
        f"until [ -e {gate} ]; do sleep 0.2; done",
    )
    wait_for(lambda: (b.state("long") or {}).get("running_since"), 60, what="long to run")
    table = b.cli("list").stdout.splitlines()
    assert "LEFT" in table[0]
    assert any(word in table[1] for word in ("59m", "1h")), table
    assert "time limit 1h:" in b.cli("why", "long").stdout
    listed = json.loads(b.cli("list", "--json").stdout)
    assert 3000 < listed[0]["time_left"] <= 3600
    gate.touch()
    assert _outcome(b, "long") == "SUCCEEDED"


# -- dependencies ----------------------------------------------------------------------------


def test_a_dependent_waits_holding_no_quota_then_runs_after_success(local_bastion, tmp_path):
    b = local_bastion
    b.start()
    gate = tmp_path / "gate"
    b.cli(
        "launch", "--name=train", "--bundler=none", "--", f"until [ -e {gate} ]; do sleep 0.2; done"
    )
    wait_for(lambda: (b.state("train") or {}).get("running_since"), 60, what="train to run")
    b.cli("launch", "--name=evaluate", "--after=train", "--bundler=none", "--", "echo evaluated")
    wait_for(lambda: _reason(b, "evaluate") == "waiting for train (RUNNING)", 30, what="the wait")
    queue = b.store.queue.read() or {}
    waiting = [n for p in queue.get("projects", {}).values() for n in p.get("order", [])]
    assert "evaluate" not in waiting  # not offered to the policy: it holds no place, no quota
    assert b.state("evaluate")["status"] == "PENDING"
    assert "holds no quota" in b.cli("why", "evaluate").stdout
    gate.touch()
    assert _outcome(b, "train") == "SUCCEEDED"
    assert _outcome(b, "evaluate") == "SUCCEEDED"
    assert "evaluated" in b.log("evaluate")


def test_a_failed_dependency_cancels_the_dependent_but_not_an_after_any(local_bastion, tmp_path):
    b = local_bastion
    gate = tmp_path / "gate"
    b.start()
    b.cli(
        "launch",
        "--name=train",
        "--bundler=none",
        "--",
        f"until [ -e {gate} ]; do sleep 0.2; done; exit 1",
    )
    b.cli("launch", "--name=ok", "--after=train", "--bundler=none", "--", "echo never")
    b.cli("launch", "--name=any", "--after_any=train", "--bundler=none", "--", "echo anyway")
    gate.touch()
    assert _outcome(b, "train") == "FAILED"
    record = b.wait_complete("ok", 60)
    assert record["state"]["outcome"] == "CANCELLED"
    assert record["state"]["reason"] == "dependency train FAILED"
    assert record["state"]["attempt"] == 0  # never started
    assert _outcome(b, "any") == "SUCCEEDED"


def test_bad_inputs_are_refused_at_submit_with_exit_2_and_nothing_written(local_bastion, tmp_path):
    b = local_bastion
    b.start()
    gate = tmp_path / "gate"
    hold = f"until [ -e {gate} ]; do sleep 0.2; done"
    b.cli("launch", "--name=hold", "--bundler=none", "--", hold)
    b.cli("launch", "--name=a", "--bundler=none", "--", "true")
    assert _outcome(b, "a") == "SUCCEEDED"
    b.cli("launch", "--name=b", "--after=a,hold", "--bundler=none", "--", "true")  # waits
    sweep = tmp_path / "sweep.toml"
    sweep.write_text("[axis]\nLR = [0.1, 0.01]\n")
    before = b.listdir("jobs", "active")
    cases = [
        (["--name=x", "--time=2x"], "--time: '2x' is not a time limit"),
        (["--name=x", "--after=nosuch"], "no job named 'nosuch'"),
        (["--name=a", "--after=b"], "a would wait for itself: a -> b -> a"),
        (["--name=x", "--after=a", "--after_any=a"], "--after or --after_any"),
        (["--name=x", "--array=0-999999"], "--array: 0-999999 has 1,000,000+ members"),
        (["--name=x", "--array=9-1"], "runs backwards"),
        (["--name=x", f"--sweep={sweep}"], f"{sweep}: unknown key 'axis'; did you mean 'axes'?"),
        (["--name=x", "--array=0-1", f"--sweep={sweep}"], "--array or --sweep"),
    ]
    for flags, says in cases:
        proc = b.cli("launch", *flags, "--bundler=none", "--", "true", check=False)
        assert proc.returncode == 2, (flags, proc.stderr)
        assert says in proc.stderr, (flags, proc.stderr)
        _no_writes(b, before)
    gate.touch()


# -- arrays and sweeps -----------------------------------------------------------------------


def test_an_array_runs_at_most_n_at_once_each_with_its_index(local_bastion):
    b = local_bastion
    b.start()
    out = b.cli(
        "launch",
        "--name=arr",
        "--array=0-5%2",
        "--bundler=none",
        "--",
        'echo "index $BASTION_ARRAY_INDEX of $BASTION_ARRAY_SIZE in $BASTION_ARRAY_ID"; sleep 1',
    ).stdout
    assert "submitted group arr: 6 jobs arr-0 .. arr-5, at most 2 at once" in out
    most = 0

    def all_done() -> bool:
        nonlocal most
        states = [b.state(f"arr-{i}") for i in range(6)]
        running = [s for s in states if s and s["status"] in ("ACTIVE", "CANCELLING", "CLEANING")]
        most = max(most, len(running))
        held = [s for s in states if s and s["reason"].startswith("waiting for its group arr")]
        assert all(s["status"] == "PENDING" for s in held)
        return all(b.complete(f"arr-{i}") for i in range(6))

    wait_for(all_done, 120, interval=0.05, what="the array")
    assert 1 <= most <= 2
    for i in range(6):
        assert f"index {i} of 6 in arr" in b.log(f"arr-{i}")
    assert b.cli("list", "--group=arr").stdout.strip() == "arr  array  6 jobs: 6 SUCCEEDED"


def test_a_sweep_gives_each_member_its_values(local_bastion, tmp_path):
    b = local_bastion
    b.start()
    sweep = tmp_path / "sweep.toml"
    sweep.write_text('[axes]\nLR = [0.1, 0.01]\nOPT = ["adam", "sgd"]\n')
    b.cli(
        "launch", "--name=sw", f"--sweep={sweep}", "--bundler=none", "--", 'echo "lr=$LR opt=$OPT"'
    )
    seen = set()
    for i in range(4):
        assert _outcome(b, f"sw-{i}") == "SUCCEEDED"
        seen.add(next(ln for ln in b.log(f"sw-{i}").splitlines() if ln.startswith("lr=")))
    assert seen == {"lr=0.1 opt=adam", "lr=0.1 opt=sgd", "lr=0.01 opt=adam", "lr=0.01 opt=sgd"}
    assert b.cli("list", "--group=sw").stdout.strip() == "sw  sweep  4 jobs: 4 SUCCEEDED"


def test_retry_failed_resubmits_only_the_failed_members(local_bastion):
    b = local_bastion
    b.start()
    b.cli(
        "launch",
        "--name=r",
        "--array=0-3",
        "--bundler=none",
        "--",
        "exit $((BASTION_ARRAY_INDEX % 2))",
    )
    outcomes = [_outcome(b, f"r-{i}") for i in range(4)]
    assert outcomes == ["SUCCEEDED", "FAILED", "SUCCEEDED", "FAILED"]
    out = b.cli("launch", "--group=r", "--retry_failed").stdout
    assert "resubmitted 2 failed member(s) of r: r-1, r-3" in out
    for name in ("r-1", "r-3"):
        wait_for(lambda n=name: len(b.store.finished_runs.list(n)) == 2, 60, what="a 2nd run")
    assert [len(b.store.finished_runs.list(n)) for n in ("r-0", "r-2")] == [1, 1]  # not again
    assert b.cli("history", "r-1", "--all").stdout.count("spec detected") == 2


def test_cancel_of_several_asks_first_unless_yes(local_bastion, tmp_path):
    b = local_bastion  # no daemon: the requests are what is checked
    b.cli("launch", "--name=g", "--array=0-2", "--bundler=none", "--", "sleep 60")
    b.cli("launch", "--name=solo", "--bundler=none", "--project_id=other", "--", "sleep 60")
    proc = subprocess.run(
        [*_cli(b), "cancel", "--group=g"],
        env=b.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "pass --yes" in proc.stderr and "3 jobs" in proc.stderr
    assert not any(b.store.requests.read(f"g-{i}") for i in range(3))
    out = b.cli("cancel", "--group=g", "--yes").stdout
    assert out.count("cancel requested") == 3
    assert all(b.store.requests.read(f"g-{i}") for i in range(3))
    assert not b.store.requests.read("solo")
    assert "cancel requested for solo" in b.cli("cancel", "solo").stdout


def _cli(b) -> list[str]:
    return [sys.executable, "-m", "launch.cli"]


# -- list filters and earlier runs -----------------------------------------------------------


def test_list_filters_by_user_project_state_and_group(local_bastion):
    b = local_bastion  # no daemon: every job is SUBMITTED
    b.cli("launch", "--name=mine", "--bundler=none", "--", "true")
    b.cli(
        "launch",
        "--name=theirs",
        "--user_id=bob",
        "--project_id=p2",
        "--bundler=none",
        "--",
        "true",
    )
    b.cli("launch", "--name=grp", "--array=0-1", "--bundler=none", "--", "true")

    def names(*flags: str) -> list[str]:
        return [j["name"] for j in json.loads(b.cli("list", "--json", *flags).stdout)]

    assert names("--user_id=bob") == ["theirs"]
    assert names("--project_id=p2") == ["theirs"]
    assert names("--state=SUBMITTED") == ["grp-0", "grp-1", "mine", "theirs"]
    assert names("--state=RUNNING") == []
    assert names("--group=grp") == ["grp-0", "grp-1"]
    assert b.cli("list", "--group=grp").stdout.strip() == "grp  array  2 jobs: 2 SUBMITTED"


def test_earlier_runs_of_a_name_stay_reachable(bastion):
    bastion.start()
    bastion.cli("launch", "--name=rerun", "--bundler=none", "--", "echo first run")
    assert _outcome(bastion, "rerun") == "SUCCEEDED"
    bastion.cli("launch", "--name=rerun", "--bundler=none", "--", "echo second run; exit 4")
    wait_for(lambda: len(bastion.store.finished_runs.list("rerun")) == 2, 60, what="run 2")
    latest = bastion.cli("logs", "rerun").stdout
    assert "second run" in latest and "first run" not in latest
    for flags in (["--previous"], ["--run=-1"], ["--run=1"]):
        proc = bastion.cli("logs", "rerun", *flags)
        assert "first run" in proc.stdout and "second run" not in proc.stdout, flags
        assert "run 1 of rerun: SUCCEEDED" in proc.stderr
    assert "second run" in bastion.cli("logs", "rerun", "--run=0").stdout
    missing = bastion.cli("logs", "rerun", "--run=-2", check=False)
    assert missing.returncode == 1 and "has runs 1..2" in missing.stderr
    history = bastion.cli("history", "rerun", "--all").stdout
    assert history.count("spec detected") == 2 and "SUCCEEDED" in history and "FAILED" in history
    assert bastion.cli("history", "rerun").stdout.count("spec detected") == 1
    table = bastion.cli("list", "--all").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "RUN", "STATE"]
    rows = [r.split() for r in table[1:] if r.startswith("rerun")]
    assert [r[1:3] for r in rows] == [["1", "SUCCEEDED"], ["2", "FAILED"]]


def test_runs_seen_in_one_second_are_numbered_in_the_order_they_were_seen(tmp_path):
    """A run's record is named by its whole second and a random submission id: two runs of a
    name seen within one second listed in either order. The CLI numbered them as listed, and
    the earlier run's output then ended where it began (a flake of the test above)."""
    from bastion.bucket.store import Store
    from launch.runs import runs_of

    store = Store(str(tmp_path / "root"))
    store.logs.append("rerun", b"first run\nsecond run\n")
    runs = [(0.25, "b1", 0, "SUCCEEDED"), (0.75, "a2", 10, "FAILED")]  # a2 is listed first
    for when, submission, log_start, outcome in runs:
        state = {"status": "COMPLETED", "outcome": outcome, "submission": submission}
        state.update(submit_time=1_000_000.0 + when, log_start=log_start)
        store.finished_runs.save("rerun", f"{1_000_000:012d}-{submission}", {"state": state})
    assert store.finished_runs.list("rerun") == ["000001000000-a2", "000001000000-b1"]
    first, second = runs_of(store, "rerun", None)
    assert (first.number, first.info.state.submission, first.log_end) == (1, "b1", 10)
    assert (second.number, second.info.state.submission, second.log_end) == (2, "a2", None)

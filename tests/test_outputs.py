"""Outputs and checkpoints: the syncer on a real directory and on the GCS emulator, and jobs
on the local runner whose next attempt resumes from what the first one wrote."""

from __future__ import annotations

import json
import os
import time

import pytest

from bastion.bucket.store import Store
from bastion.outputs.syncer import Syncer
from tests.conftest import fresh_gcs_root
from tests.harness import wait_for


@pytest.fixture(params=["local", "gcs"])
def store(request, tmp_path):
    if request.param == "gcs":
        request.getfixturevalue("gcs_emulator")
        return Store(fresh_gcs_root())
    return Store(str(tmp_path / "root"))


def write(path, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


# -- the syncer --------------------------------------------------------------------------------


def test_sync_uploads_only_what_changed_and_a_quiet_sync_makes_no_request(store, tmp_path):
    local = tmp_path / "out"
    syncer = Syncer(store.outputs, "train", str(local))
    write(local / "a.txt", "aaa")
    write(local / "ckpt" / "step-1", "x" * 1000)
    write(local / ".bastion" / "checkpoint.json", json.dumps({"step": 1, "time": 5.0}))
    stats = syncer.sync()
    assert (stats.synced_files, stats.synced_bytes) == (
        3,
        3 + 1000 + len('{"step": 1, "time": 5.0}'),
    )
    requests = stats.requests
    syncer.sync()
    assert syncer.stats.requests == requests  # nothing changed: no bucket request at all
    write(local / "a.txt", "bbbb")
    syncer.sync()
    assert syncer.stats.requests == requests + 1 and syncer.stats.synced_bytes == stats.synced_bytes
    listed = store.outputs.list("train")
    assert sorted(listed) == [".bastion/checkpoint.json", "a.txt", "ckpt/step-1"]
    assert listed["a.txt"].size == 4
    assert store.outputs.read_checkpoint("train") == {"step": 1, "time": 5.0}


def test_a_file_the_job_removed_is_removed_from_the_bucket(store, tmp_path):
    local = tmp_path / "out"
    syncer = Syncer(store.outputs, "rotate", str(local))
    write(local / "ckpt-1", "1")
    write(local / "ckpt-2", "2")
    syncer.sync()
    os.unlink(local / "ckpt-1")  # a checkpoint rotated out
    syncer.sync()
    assert sorted(store.outputs.list("rotate")) == ["ckpt-2"]
    assert syncer.stats.removed_files == 1


def test_restore_brings_back_every_file_and_the_first_sync_uploads_nothing(store, tmp_path):
    first = Syncer(store.outputs, "resume", str(tmp_path / "a1"))
    write(tmp_path / "a1" / "ckpt" / "model.bin", "weights")
    write(tmp_path / "a1" / ".hidden", "dot-names are the job's too")
    first.sync()
    second = Syncer(store.outputs, "resume", str(tmp_path / "a2"), attempt=2)
    stats = second.restore()
    assert (stats.restored_files, stats.restored_bytes) == (2, 7 + 27)
    assert (tmp_path / "a2" / "ckpt" / "model.bin").read_text() == "weights"
    assert (tmp_path / "a2" / ".hidden").read_text() == "dot-names are the job's too"
    before = second.stats.requests
    second.sync()
    assert second.stats.requests == before and second.stats.synced_files == 0


def test_workers_keep_their_files_apart_worker_zero_at_the_top(store, tmp_path):
    zero = Syncer(store.outputs, "multi", str(tmp_path / "w0"), worker=0)
    one = Syncer(store.outputs, "multi", str(tmp_path / "w1"), worker=1)
    write(tmp_path / "w0" / "log.txt", "zero")
    write(tmp_path / "w1" / "log.txt", "one")
    zero.sync()
    one.sync()
    assert sorted(store.outputs.list("multi")) == ["log.txt"]
    assert sorted(store.outputs.list("multi", worker=1)) == ["log.txt"]
    assert sorted(store.outputs.list("multi", worker=None)) == ["log.txt", "workers/1/log.txt"]
    restored = Syncer(store.outputs, "multi", str(tmp_path / "again"), worker=1)
    restored.restore()
    assert (tmp_path / "again" / "log.txt").read_text() == "one"


def test_summaries_say_what_each_attempt_restored_and_synced(store, tmp_path):
    for attempt in (1, 2):
        syncer = Syncer(store.outputs, "sum", str(tmp_path / f"a{attempt}"), attempt=attempt)
        syncer.restore()
        write(tmp_path / f"a{attempt}" / f"file-{attempt}", "z" * (10 * attempt))
        syncer.sync(final=True)
        syncer.write_summary()
    summaries = store.outputs.read_summaries("sum")
    assert [(s["attempt"], s["restored_bytes"], s["synced_bytes"]) for s in summaries] == [
        (1, 0, 10),
        (2, 10, 20),
    ]
    assert all(s["final"] for s in summaries)
    restored = Syncer(store.outputs, "sum", str(tmp_path / "a3"))
    restored.restore()
    assert not (tmp_path / "a3" / ".bastion").exists()  # summaries stay in the bucket


def test_a_summary_counts_what_every_process_of_the_attempt_synced(store, tmp_path):
    """The Docker runner restores in the daemon, its watcher syncs, and the final sync is by
    whoever holds the lock then: each a Syncer of its own on one kept manifest."""
    write(tmp_path / "seed" / "old", "o" * 7)
    Syncer(store.outputs, "kept", str(tmp_path / "seed"), attempt=1).sync(final=True)
    directory, manifest = str(tmp_path / "a2"), str(tmp_path / "a2.manifest.json")
    Syncer(store.outputs, "kept", directory, attempt=2, manifest_path=manifest).restore()
    watcher = Syncer(store.outputs, "kept", directory, attempt=2, manifest_path=manifest)
    write(tmp_path / "a2" / "early", "e" * 5)
    watcher.sync()  # a periodic sync, in the watcher's process
    write(tmp_path / "a2" / "late", "l" * 3)
    last = Syncer(store.outputs, "kept", directory, attempt=2, manifest_path=manifest)
    last.sync(final=True)  # the watcher is gone: the runner's delete does the final sync
    last.write_summary()
    summary = next(s for s in store.outputs.read_summaries("kept") if s["attempt"] == 2)
    assert (summary["restored_files"], summary["restored_bytes"]) == (1, 7)
    assert (summary["synced_files"], summary["synced_bytes"], summary["syncs"]) == (2, 8, 2)
    assert summary["final"]


# -- jobs on the local runner ------------------------------------------------------------------

# A job that resumes: it says where it starts from, then counts on from its checkpoint.
RESUMABLE = (
    'f="$BASTION_OUTPUT_DIR/ckpt.txt"; step=$(cat "$f" 2>/dev/null || echo 0); '
    'echo "start at $step"; while true; do step=$((step+1)); echo $step > "$f.tmp"; '
    'mv "$f.tmp" "$f"; sleep 0.2; done'
)


def started_at(log: str) -> list[int]:
    return [int(line.split()[-1]) for line in log.splitlines() if line.startswith("start at ")]


def test_update_restarts_the_job_and_its_next_attempt_resumes_from_its_checkpoint(bastion):
    bastion.start("--grace_seconds=5")
    bastion.cli("launch", "--name=train", "--env=BASTION_SYNC_SECONDS=0.5", "--", RESUMABLE)
    wait_for(lambda: len(bastion.store.outputs.list("train")) == 1, what="a synced checkpoint")
    time.sleep(1)
    bastion.cli("update", "train", "--", RESUMABLE.replace("start at", "resumed at"))
    log = wait_for(
        lambda: "resumed at" in bastion.log("train") and bastion.log("train"),
        timeout=60,
        what="the second attempt",
    )
    resumed = int(next(ln for ln in log.splitlines() if ln.startswith("resumed at")).split()[-1])
    assert started_at(log) == [0] and resumed >= 3
    bastion.cli("cancel", "train")
    bastion.wait_complete("train", timeout=60)
    assert bastion.store.outputs.list("train")  # kept after the job's end


def test_a_file_finished_before_the_grace_ran_out_is_never_lost(local_bastion):
    b = local_bastion
    b.start("--grace_seconds=3")
    # On TERM it takes 1 s to write its last checkpoint; nothing syncs while it runs (the
    # periodic sync is an hour away), so only the final sync can save the file.
    job = (
        "trap 'sleep 1; echo final > $BASTION_OUTPUT_DIR/last.ckpt; exit 0' TERM; "
        "echo running; while true; do sleep 0.1; done"
    )
    b.cli("launch", "--name=careful", "--env=BASTION_SYNC_SECONDS=3600", "--", job)
    wait_for(lambda: "running" in b.log("careful"), what="the job to run")
    b.cli("cancel", "careful")
    record = b.wait_complete("careful", timeout=60)
    assert record["state"]["outcome"] == "CANCELLED"
    assert "last.ckpt" in b.store.outputs.list("careful")


def test_a_file_a_program_under_the_shell_finishes_in_its_grace_is_never_lost(local_bastion):
    """The common command line: a shell with a program under it. The shell has no handler and
    dies of the warning at once; the program (here an inner shell with a handler) takes 1 s
    to write its checkpoint. The final sync waits for the whole job, not for the shell."""
    b = local_bastion
    b.start("--grace_seconds=5")
    program = (
        "trap 'sleep 1; echo final > $BASTION_OUTPUT_DIR/last.ckpt; exit 0' TERM; "
        "echo running; while true; do sleep 0.1; done"
    )
    b.cli(
        "launch",
        "--name=nested",
        "--env=BASTION_SYNC_SECONDS=3600",
        "--",
        f'bash -c "{program}"; echo the shell goes on',
    )
    wait_for(lambda: "running" in b.log("nested"), what="the job to run")
    b.cli("cancel", "nested")
    record = b.wait_complete("nested", timeout=60)
    assert record["state"]["outcome"] == "CANCELLED"
    assert "last.ckpt" in b.store.outputs.list("nested")


def test_a_job_that_ignores_the_warning_is_killed_at_its_grace_and_still_synced(local_bastion):
    b = local_bastion
    b.start("--grace_seconds=30")
    job = "trap '' USR1; echo early > $BASTION_OUTPUT_DIR/early; echo running; sleep 300"
    b.cli(
        "launch",
        "--name=deaf",
        "--stop_signal=USR1",
        "--grace_seconds=1",
        "--env=BASTION_SYNC_SECONDS=3600",
        "--",
        job,
    )
    wait_for(lambda: "running" in b.log("deaf"), what="the job to run")
    began = time.monotonic()
    b.cli("cancel", "deaf")
    record = b.wait_complete("deaf", timeout=60)
    assert time.monotonic() - began < 20  # its own grace (1 s), not the daemon's 30 s
    assert "KILLED" in b.cli("history", "deaf").stdout
    assert record["state"]["exit_code"] == 137
    assert "early" in b.store.outputs.list("deaf")


def test_attempts_survive_a_daemon_killed_while_the_job_runs(local_bastion, tmp_path):
    b = local_bastion
    daemon = b.start("--grace_seconds=5")
    b.cli("launch", "--name=steady", "--env=BASTION_SYNC_SECONDS=0.3", "--", RESUMABLE)
    wait_for(lambda: "ckpt.txt" in b.store.outputs.list("steady"), what="first sync")
    daemon.kill()
    daemon.wait()
    # The wrapper syncs on with no daemon: the checkpoint in the bucket moves on.
    first = b.store.outputs.list("steady")["ckpt.txt"].token
    wait_for(
        lambda: b.store.outputs.list("steady")["ckpt.txt"].token != first,
        what="a sync with the daemon down",
    )
    b.start("--grace_seconds=5")
    b.cli("update", "steady", "--", RESUMABLE.replace("start at", "resumed at"))
    wait_for(lambda: "resumed at" in b.log("steady"), timeout=60, what="the second attempt")
    resumed = [ln for ln in b.log("steady").splitlines() if ln.startswith("resumed at")]
    assert int(resumed[0].split()[-1]) > 0
    b.cli("cancel", "steady")
    b.wait_complete("steady", timeout=60)


def test_bad_stop_signal_and_grace_are_refused_at_submit(local_bastion):
    b = local_bastion
    proc = b.cli("launch", "--name=x", "--stop_signal=KILL", "--", "true", check=False)
    assert proc.returncode != 0 and "--stop_signal" in proc.stderr and "USR1" in proc.stderr
    proc = b.cli("launch", "--name=x", "--grace_seconds=-1", "--", "true", check=False)
    assert proc.returncode != 0 and "--grace_seconds" in proc.stderr
    assert not b.exists("jobs", "active", "x")


# -- bastion outputs ---------------------------------------------------------------------------


def test_outputs_lists_downloads_only_what_changed_and_deletes(bastion, tmp_path):
    bastion.start()
    job = (
        'mkdir -p "$BASTION_OUTPUT_DIR/ckpt"; echo one > "$BASTION_OUTPUT_DIR/ckpt/a"; '
        'echo two > "$BASTION_OUTPUT_DIR/b.txt"'
    )
    bastion.cli("launch", "--name=made", "--", job)
    bastion.wait_complete("made", timeout=60)
    listing = bastion.cli("outputs", "made").stdout
    assert "ckpt/a" in listing and "b.txt" in listing and "2 file(s)" in listing
    target = tmp_path / "got"
    first = bastion.cli("outputs", "made", f"--download={target}").stdout
    assert "2 file(s) fetched" in first
    assert (target / "ckpt" / "a").read_text() == "one\n"
    again = bastion.cli("outputs", "made", f"--download={target}").stdout
    assert "0 file(s) fetched" in again and "2 unchanged" in again
    # A changed file in the bucket is fetched again, alone.
    src = tmp_path / "src"
    write(src / "b.txt", "three\n")
    bastion.store.outputs.upload("made", "b.txt", str(src / "b.txt"))
    third = bastion.cli("outputs", "made", f"--download={target}").stdout
    assert "1 file(s) fetched" in third and (target / "b.txt").read_text() == "three\n"
    history = bastion.cli("history", "made").stdout
    assert "outputs: attempt 1 restored 0 file(s), 0 bytes; synced 2 file(s), 8 bytes" in history
    refused = bastion.cli("outputs", "made", "--delete", check=False)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert bastion.store.outputs.list("made")  # nothing removed without --yes
    assert "removed" in bastion.cli("outputs", "made", "--delete", "--yes").stdout
    assert bastion.store.outputs.list("made", worker=None) == {}


def test_outputs_bad_input_is_a_clear_error_and_loses_nothing(local_bastion, tmp_path):
    b = local_bastion
    assert b.store.outputs.list("nosuchjob") == {}  # (and the root exists now)
    unknown = b.cli("outputs", "nosuchjob", check=False)
    assert unknown.returncode == 1 and "no job named 'nosuchjob'" in unknown.stderr
    src = tmp_path / "f"
    write(src, "data")
    b.store.outputs.upload("kept", "f", str(src))  # outputs of a job whose records are gone
    assert "f" in b.cli("outputs", "kept").stdout
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("mine")
    proc = b.cli("outputs", "kept", f"--download={a_file}", check=False)
    assert proc.returncode == 2 and "--download" in proc.stderr and "is a file" in proc.stderr
    assert a_file.read_text() == "mine"
    both = b.cli("outputs", "kept", "--delete", f"--download={tmp_path}", check=False)
    assert both.returncode == 2 and "not both" in both.stderr
    assert b.store.outputs.list("kept")
    bad_name = b.cli("outputs", "../etc", check=False)
    assert bad_name.returncode != 0 and "name" in bad_name.stderr


# -- checkpoint reports ------------------------------------------------------------------------


def test_the_daemon_learns_a_running_jobs_last_checkpoint_and_keeps_it(local_bastion):
    b = local_bastion
    b.start()
    job = (
        'd="$BASTION_OUTPUT_DIR/.bastion"; mkdir -p "$d"; '
        'echo \'{"step": 7, "time": 1700000000.5}\' > "$d/checkpoint.json"; '
        "echo reported; sleep 300"
    )
    b.cli("launch", "--name=reporter", "--", job)
    wait_for(
        lambda: (b.state("reporter") or {}).get("last_checkpoint") == 1700000000.5,
        timeout=60,
        what="last_checkpoint on the job's state",
    )
    assert "last checkpoint" in b.cli("why", "reporter").stdout
    b.cli("cancel", "reporter")
    record = b.wait_complete("reporter", timeout=60)
    assert record["state"]["last_checkpoint"] == 1700000000.5  # kept after the attempt
    assert b.store.outputs.read_checkpoint("reporter") == {"step": 7, "time": 1700000000.5}


@pytest.mark.parametrize(
    "report",
    [None, [], {"step": 1}, {"time": "soon"}, {"time": True}, {"time": -5}, {"time": float("nan")}],
)
def test_a_malformed_checkpoint_report_is_ignored(report):
    from bastion.outputs.checkpoint import checkpoint_time

    assert checkpoint_time(report) is None
    assert checkpoint_time({"step": 3, "time": 12.5}) == 12.5


# -- preemption by the policy ------------------------------------------------------------------

QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
cpu = 4
[project_membership]
research = ["alice"]
prod = ["bob"]
[project_resources.research]
cpu = 0.5
[project_resources.prod]
cpu = 0.5
[scheduling]
min_runtime_seconds = 0
preemption_grace_seconds = 30
"""


def test_a_preempted_borrower_resumes_from_its_checkpoint_and_its_own_grace_applies(
    local_bastion,
):
    b = local_bastion
    b.put("project-quotas", "project-quotas.config", data=QUOTA)
    b.start()
    # prod borrows research's half; its job asks for 2 s of grace (the quota file says 30)
    b.cli(
        "launch",
        "--name=borrower",
        "--project_id=prod",
        "--user_id=bob",
        "--resources=cpu=4",
        "--grace_seconds=2",
        "--env=BASTION_SYNC_SECONDS=0.3",
        "--",
        RESUMABLE.replace("sleep 0.2; done", "sleep 0.2; [ $step -ge 80 ] && exit 0; done"),
    )
    wait_for(lambda: "ckpt.txt" in b.store.outputs.list("borrower"), what="a checkpoint")
    time.sleep(1)
    began = time.monotonic()
    b.cli(
        "launch",
        "--name=owner",
        "--project_id=research",
        "--user_id=alice",
        "--resources=cpu=2",
        "--",
        "echo owner runs; sleep 1",
    )
    wait_for(
        lambda: ((b.state("borrower") or {}).get("preemptions") or 0) >= 1,
        timeout=60,
        what="the borrower to be preempted",
    )
    assert time.monotonic() - began < 25  # its own grace, not the quota file's 30 s
    record = b.wait_complete("borrower", timeout=120)
    assert record["state"]["outcome"] == "SUCCEEDED" and record["state"]["attempt"] == 2
    starts = started_at(b.log("borrower"))
    assert starts[0] == 0 and starts[1] > 0, starts  # attempt 2 resumed where 1 stopped

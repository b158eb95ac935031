"""The slurm runner (bastion/runners/slurm/) on the session's real single-node Slurm
(tests/slurm_cluster.py): the runner contract, submit refusals, races and placement.

Roots are local directories (the agents on the "compute nodes" write there, as they would to a
bucket the nodes reach)."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from bastion.runners import base
from bastion.runners.base import Attempt, AttemptPhase, RunnerError
from bastion.runners.slurm import SlurmRunner
from tests.runner_contract import RunnerContract, wait_until

AGENT_ARGS = ["--chunk_seconds=0.2", "--heartbeat_seconds=0.3", "--grace_seconds=2"]


def settings(root: str, tmp: Path, **more) -> dict:
    return {
        "root": root,
        "python": sys.executable,
        "agent_args": AGENT_ARGS,
        "slurm_output": str(tmp / "%x.out"),
        "listing_ttl": 0.1,
        "heartbeat_timeout": 30,
        **more,
    }


class TestSlurmContract(RunnerContract):
    """The shared runner contract, every attempt a real Slurm job."""

    __test__ = True
    kind = "slurm"
    timeout = 40.0

    @pytest.fixture(autouse=True)
    def _slurm_root(self, _contract_context, slurm, tmp_path):
        self.root = str(tmp_path / f"root-{uuid.uuid4().hex[:8]}")  # agents write here

    def make_runner(self, tmp_path):
        return base.factory_for("slurm")(settings(self.root, tmp_path))


def attempt(root: str, command: str, job: str = "job", n: int = 1, **options) -> Attempt:
    name = base.attempt_name(root, job, "sub", n, "run")
    return Attempt(name=name, job=job, attempt=n, command=command, env={}, options=options)


@pytest.fixture
def runner(slurm, tmp_path):
    made = SlurmRunner(settings(str(tmp_path / "root"), tmp_path))
    yield made
    made.close()


def finished(runner: SlurmRunner, handle, timeout: float = 40):
    return wait_until(lambda: (o := runner.poll(handle)).finished and o, timeout, "the end")


def test_an_unknown_partition_is_refused_with_slurms_message(runner, tmp_path):
    with pytest.raises(RunnerError, match=r"sbatch refused: .*[Ii]nvalid partition"):
        runner.start(attempt(runner.root, "true", partition="nosuch"))


def test_sbatch_missing_is_a_clear_error(slurm, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    bad = SlurmRunner(settings(str(tmp_path / "root"), tmp_path, bin_dir=str(empty)))
    with pytest.raises(RunnerError, match=r"bin/squeue not found: install Slurm.s client commands"):
        bad.start(attempt(bad.root, "true"))


def test_a_duplicate_made_by_a_race_is_cancelled_and_the_oldest_kept(runner, slurm):
    """Two daemons that both found no job submit two: each start's second look keeps the
    lowest job id, cancels the other, and both adopt the same job."""
    a = attempt(runner.root, "echo once; sleep 3")
    script = runner.batch_script(a, 1)
    first = int(slurm.run("sbatch", *runner.sbatch_args(a), input=script).split(";")[0])
    handle = runner.start(a)  # finds the racer's job: adopts it, submits nothing
    assert handle["job_id"] == first
    second = int(slurm.run("sbatch", *runner.sbatch_args(a), input=script).split(";")[0])
    again = runner.start(a)  # now two of that name: the newer one is cancelled
    assert again["job_id"] == first
    states = {int(j["id"]): j["state"] for j in slurm.jobs() if j["name"] == a.name}
    assert states[second] in ("CANCELLED", "COMPLETING")
    obs = finished(runner, again)
    assert obs.phase == AttemptPhase.SUCCEEDED
    assert runner.read_output(again, 0, 100) == b"once\n"


def test_a_job_cancelled_outside_bastion_fails_with_slurms_word(runner, slurm):
    handle = runner.start(attempt(runner.root, "echo up; sleep 60"))
    wait_until(lambda: runner.read_output(handle, 0, 10) == b"up\n", 30, "up")
    slurm.run("scancel", str(handle["job_id"]))
    obs = finished(runner, handle)
    assert (obs.phase, obs.retryable) == (AttemptPhase.FAILED, False)
    assert f"Slurm job {handle['job_id']} was cancelled outside Bastion" in obs.reason


def test_a_gpu_job_sees_only_its_own_devices(runner):
    a = attempt(runner.root, 'echo "gpus=$CUDA_VISIBLE_DEVICES"')
    a = Attempt(**{**a.__dict__, "resources": {"gpu": 1}})
    handle = runner.start(a)
    assert finished(runner, handle).phase == AttemptPhase.SUCCEEDED
    assert runner.read_output(handle, 0, 100) == b"gpus=0\n"


def test_tiers_give_partition_qos_and_account_and_a_jobs_option_wins(tmp_path):
    runner = SlurmRunner(
        {
            "root": str(tmp_path),
            "partition": "batch",
            "account": "lab",
            "tiers": {0: "partition:high", 1: "partition:low,qos:scavenger"},
        }
    )
    within = Attempt(**{**attempt(runner.root, "true").__dict__, "tier": 0})
    borrowed = Attempt(**{**attempt(runner.root, "true").__dict__, "tier": 1})
    own = Attempt(**{**attempt(runner.root, "true", partition="debug").__dict__, "tier": 1})
    assert runner.placement(within) == {"partition": "high", "account": "lab"}
    assert runner.placement(borrowed) == {"partition": "low", "qos": "scavenger", "account": "lab"}
    assert runner.placement(own)["partition"] == "debug"
    with pytest.raises(RunnerError, match=r"tiers.0 = 'high': give comma-separated partition"):
        SlurmRunner({"root": str(tmp_path), "tiers": {0: "high"}})


def test_resources_are_totals_split_over_the_nodes(tmp_path):
    runner = SlurmRunner({"root": str(tmp_path)})
    a = attempt(runner.root, "true", nodes="2")
    a = Attempt(**{**a.__dict__, "resources": {"gpu": 4, "cpu": 8, "memory": 2}})
    args = runner.sbatch_args(a)
    assert {
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gres=gpu:2",
        "--cpus-per-task=4",
        "--mem=1G",
        "--no-requeue",
    } <= set(args)
    odd = Attempt(**{**a.__dict__, "resources": {"gpu": 3}})
    with pytest.raises(RunnerError, match=r"resources\.gpu = 3 does not divide among 2 nodes"):
        runner.sbatch_args(odd)


def test_poll_costs_one_squeue_per_cycle_for_all_jobs(runner):
    handles = [runner.start(attempt(runner.root, "sleep 2", job=f"j{i}")) for i in range(3)]
    time.sleep(1)
    runner.begin_cycle()
    before = dict(runner.calls)
    for _ in range(3):
        for h in handles:
            runner.poll(h)
            runner.read_output(h, 0, 100)
    assert {k: v - before.get(k, 0) for k, v in runner.calls.items()} == {"squeue": 1, "sbatch": 0}


def test_a_pending_job_shows_its_position_in_the_partitions_queue(runner, slurm):
    """Slurm's reason and the place among every job pending in the partition (the filler that
    holds both nodes is running, so the three behind it are positions 1, 2 and 3)."""
    whole = {"cpu": 2 * (os.cpu_count() or 1)}
    filler = Attempt(**{**attempt(runner.root, "sleep 60", job="filler", nodes="2").__dict__})
    filler = Attempt(**{**filler.__dict__, "resources": whole})
    held = runner.start(filler)
    wait_until(lambda: runner.poll(held).phase is not AttemptPhase.QUEUED, 30, "the filler")
    waiting = []
    for i in range(3):
        a = attempt(runner.root, "true", job=f"wait{i}", nodes="2")
        waiting.append(runner.start(Attempt(**{**a.__dict__, "resources": whole})))
    time.sleep(1.2)  # past the first second, when a new job is "submitted" without a row
    reasons = [runner.poll(h) for h in waiting]
    assert [o.phase for o in reasons] == [AttemptPhase.QUEUED] * 3
    for n, (h, o) in enumerate(zip(waiting, reasons, strict=True), start=1):
        assert f"position {n} in partition low" in o.reason, o.reason
        assert f"Slurm job {h['job_id']} pending (" in o.reason


def test_the_warning_signal_is_asked_for_and_a_bad_setting_is_refused(tmp_path):
    runner = SlurmRunner({"root": str(tmp_path), "warn_seconds": 45})
    assert "--signal=B:TERM@45" in runner.sbatch_args(attempt(runner.root, "true"))
    quiet = SlurmRunner({"root": str(tmp_path), "warn_seconds": 0})
    assert not [a for a in quiet.sbatch_args(attempt(runner.root, "true")) if "--signal" in a]
    with pytest.raises(RunnerError, match=r"warn_seconds = 'soon': give whole seconds"):
        SlurmRunner({"root": str(tmp_path), "warn_seconds": "soon"})


def test_an_unknown_output_mode_or_shared_fs_without_a_directory_is_refused(tmp_path):
    with pytest.raises(RunnerError, match=r"output = 'nfs': use 'bucket' .* or 'shared_fs'"):
        SlurmRunner({"root": str(tmp_path), "output": "nfs"})
    with pytest.raises(RunnerError, match=r"'shared_fs' needs output_dir"):
        SlurmRunner({"root": str(tmp_path), "output": "shared_fs"})


def test_shared_fs_mode_reads_each_tasks_output_file_and_slurms_exit_code(slurm, tmp_path):
    """No agent: the command runs under srun, its output goes to the task's file (appended),
    read by offset; Slurm's state and exit code stand for the agents' records."""
    out = tmp_path / "shared"
    out.mkdir()
    runner = SlurmRunner(
        settings(str(tmp_path / "root"), tmp_path, output="shared_fs", output_dir=str(out))
    )
    two = runner.start(
        attempt(runner.root, 'echo "w$BASTION_WORKER of $BASTION_NUM_WORKERS"', nodes="2")
    )
    assert finished(runner, two).phase == AttemptPhase.SUCCEEDED
    assert runner.read_output(two, 0, 100) == b"w0 of 2\n"
    assert runner.read_output(two, 1, 100) == b"0 of 2\n"  # by offset
    assert (out / f"{two['name']}.1.out").read_text() == "w1 of 2\n"
    assert not (tmp_path / "root" / "agents").exists()  # nothing went through the bucket
    bad = runner.start(attempt(runner.root, "echo failing; exit 3", job="bad"))
    obs = finished(runner, bad)
    assert (obs.phase, obs.exit_code) == (AttemptPhase.FAILED, 3)
    assert runner.read_output(bad, 0, 100) == b"failing\n"
    runner.close()

"""The slurm runner (bastion/runners/slurm.py) on the session's real single-node Slurm
(tests/slurm_cluster.py): the runner contract, submit refusals, races and placement.

Roots are local directories (the agents on the "compute nodes" write there, as they would to a
bucket the nodes reach)."""

from __future__ import annotations

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

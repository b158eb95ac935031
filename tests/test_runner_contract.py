"""The runner contract (tests/runner_contract.py) run against each runner kind, and the fake
runner's own injections, which the daemon's lifecycle tests rely on."""

from __future__ import annotations

import importlib

import pytest

from bastion.runners import base
from bastion.runners import local as local_runner
from bastion.runners.base import Attempt, AttemptPhase, RunnerError
from bastion.runners.fake import FakeRunner
from tests.runner_contract import CONTRACT_MODULES, RunnerContract

ROOT = "gs://bastion-test/fake"


class TestFakeContract(RunnerContract):
    __test__ = True
    kind = "fake"

    def make_runner(self, tmp_path):
        return base.factory_for("fake")({"root": self.root, "state_dir": str(tmp_path / "fake")})


@pytest.mark.skipif(
    not hasattr(local_runner, "from_settings"),
    reason="bastion.runners.local has no from_settings yet (its rewrite to base.Runner)",
)
class TestLocalContract(RunnerContract):
    __test__ = True
    kind = "local"

    def make_runner(self, tmp_path):
        settings = {"root": self.root, "attempts_dir": str(tmp_path / "attempts"), "gpus": []}
        return base.factory_for("local")(settings)


# Kinds whose backend cannot run on a test machine, so no contract class holds them. Each entry
# says why. None of the built-in kinds is here: each one's backend or stand-in runs locally.
EXEMPT: dict[str, str] = {}


def test_every_registered_kind_has_a_contract_class():
    for module in CONTRACT_MODULES:
        importlib.import_module(module)
    held, todo = set(), list(RunnerContract.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__dict__.get("__test__") and cls.kind:
            held.add(cls.kind)
    missing = sorted(set(base.RUNNERS.names()) - held - EXEMPT.keys())
    assert not missing, (
        f"runner kinds {missing} have no RunnerContract class: add one (see "
        "tests/runner_contract.py and docs/runners.md) in a module of CONTRACT_MODULES"
    )


# -- the fake runner alone, on a clock the test moves ------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def fake(tmp_path, clock):
    return FakeRunner(ROOT, str(tmp_path / "fake"), clock)


def attempt(command: str, **options) -> Attempt:
    name = base.attempt_name(ROOT, "job", "sub", 1, "run")
    return Attempt(name=name, job="job", attempt=1, command=command, env={}, options=options)


def test_injections_walk_queued_provisioning_running_then_preempted(fake, clock):
    options = {"fake_queued_seconds": 10, "fake_provision_seconds": 5, "fake_preempt_after": 3}
    handle = fake.start(attempt("echo hi; sleep 60", **options))
    seen = []
    for at in (0, 9.9, 10, 14.9, 15, 17.9, 18, 100):
        clock.now = 1_700_000_000.0 + at
        seen.append((fake.poll(handle).phase, fake.read_output(handle, 0, 100)))
    assert seen == [
        (AttemptPhase.QUEUED, b""),
        (AttemptPhase.QUEUED, b""),
        (AttemptPhase.PROVISIONING, b""),
        (AttemptPhase.PROVISIONING, b""),
        (AttemptPhase.RUNNING, b"hi\n"),  # output only once running
        (AttemptPhase.RUNNING, b"hi\n"),
        (AttemptPhase.PREEMPTED, b"hi\n"),
        (AttemptPhase.PREEMPTED, b"hi\n"),
    ]
    obs = fake.poll(handle)
    assert (obs.retryable, obs.exit_code) == (True, None)
    assert obs.reason == "preempted by the provider (fake)"


def test_output_appears_when_each_echo_is_reached(fake, clock):
    handle = fake.start(attempt("echo a; sleep 1; echo b\nsleep 1"))
    assert fake.read_output(handle, 0, 100) == b"a\n"
    clock.now += 1
    assert (fake.poll(handle).phase, fake.read_output(handle, 0, 100)) == (
        AttemptPhase.RUNNING,
        b"a\nb\n",
    )
    clock.now += 1
    assert fake.poll(handle).phase == AttemptPhase.SUCCEEDED


def test_exit_code_is_the_last_status_without_exit(fake):
    obs = fake.poll(fake.start(attempt("echo x; false")))
    assert (obs.phase, obs.exit_code) == (AttemptPhase.FAILED, 1)


def test_start_error_raises_and_records_nothing(fake):
    with pytest.raises(RunnerError, match="no capacity in zone"):
        fake.start(attempt("true", fake_start_error="no capacity in zone"))
    assert fake.list_owned() == []


def test_unknown_fake_option_raises_but_other_runners_options_are_ignored(fake):
    with pytest.raises(RunnerError, match="fake_queued_secs"):
        fake.start(attempt("true", fake_queued_secs=1))
    assert fake.list_owned() == []
    assert fake.poll(fake.start(attempt("true", image="ubuntu"))).phase == AttemptPhase.SUCCEEDED


def test_unsupported_command_fails_at_once_with_127(fake):
    obs = fake.poll(fake.start(attempt("echo hi; ls -l", fake_queued_seconds=10)))
    assert (obs.phase, obs.exit_code) == (AttemptPhase.FAILED, 127)
    assert obs.reason == "fake runner cannot run: ls -l"


def test_lost_after_ends_lost_in_any_phase(fake, clock):
    handle = fake.start(attempt("sleep 60", fake_queued_seconds=10, fake_lost_after=5))
    clock.now += 5
    obs = fake.poll(handle)
    assert (obs.phase, obs.retryable) == (AttemptPhase.LOST, False)


def test_term_ends_at_once_with_143(fake, clock):
    handle = fake.start(attempt("echo a; sleep 30; echo b"))
    clock.now += 1
    fake.stop(handle, clock.now + 30)
    clock.now += 100
    obs = fake.poll(handle)
    assert (obs.phase, obs.exit_code) == (AttemptPhase.FAILED, 143)
    assert fake.read_output(handle, 0, 100) == b"a\n"  # output stops growing


@pytest.mark.parametrize("command", ["sleep 30 # ignore-term", "trap '' TERM; sleep 30"])
def test_ignored_term_ends_with_137_only_on_a_stop_at_the_deadline(fake, clock, command):
    handle = fake.start(attempt(command))
    deadline = clock.now + 10
    fake.stop(handle, deadline)
    clock.now = deadline - 0.01
    fake.stop(handle, deadline)
    assert fake.poll(handle).phase == AttemptPhase.RUNNING
    clock.now = deadline + 1
    assert fake.poll(handle).phase == AttemptPhase.RUNNING  # escalation is stop's, not poll's
    fake.stop(handle, deadline)
    obs = fake.poll(handle)
    assert (obs.phase, obs.exit_code) == (AttemptPhase.FAILED, 137)


def test_stop_while_queued_ends_it_before_it_ran(fake, clock):
    handle = fake.start(attempt("echo hi # ignore-term", fake_queued_seconds=10))
    fake.stop(handle, clock.now + 30)
    clock.now += 20
    obs = fake.poll(handle)
    assert (obs.phase, obs.exit_code) == (AttemptPhase.FAILED, None)
    assert fake.read_output(handle, 0, 100) == b""


def test_unknown_handle_polls_lost_and_bad_handle_raises(fake):
    assert fake.poll({"name": "bst-0000-gone-a1"}).phase == AttemptPhase.LOST
    with pytest.raises(RunnerError):
        fake.poll({"name": "../escape"})


def test_from_settings_needs_root_and_a_directory(tmp_path):
    factory = base.factory_for("fake")
    with pytest.raises(RunnerError, match="root"):
        factory({"state_dir": str(tmp_path)})
    with pytest.raises(RunnerError, match="state_dir"):
        factory({"root": ROOT})
    runner = factory({"root": ROOT, "work_dir": str(tmp_path)})
    assert runner.state_dir == str(tmp_path / "fake-attempts")

"""The contract every runner passes: one abstract suite, run against each runner kind.

Why: the daemon drives every runner through the same six calls (bastion/runners/base.py) and
must be able to rely on the same behaviour from each, whatever a job's spec names. So, as
fsspec tests every backend with one abstract suite, a runner's test module subclasses
:class:`RunnerContract` and says only how to make its runner.

Commands use only ``echo``, ``sleep``, ``exit``, ``true``, ``false`` and ``trap '' TERM`` (with
the fake's ``# ignore-term`` comment): the fake runner's language, and valid POSIX sh, so the
fake, the local and the Docker runner all run them.

A subclass provides:

- ``make_runner(self, tmp_path) -> Runner``: a NEW runner instance for the root ``self.root``,
  its state under ``tmp_path``. Two calls in one test give two instances on the same state,
  which is how the suite simulates a daemon restart.
- ``kind``: the registered runner kind it holds to the contract (a meta-test in
  tests/test_runner_contract.py fails for a kind of ``base.RUNNERS`` that no class names; the
  modules that hold contract classes are listed in :data:`CONTRACT_MODULES`);
- optionally ``make_root(self, tmp_path)``: the root URL of a test (default a ``gs://`` name
  that no runner writes to; a runner whose agents write to the root gives a real one);
- optionally ``isolates_roots = False``, where the kind cannot tell two roots apart on the
  same state (the root-isolation test is then skipped);
- optionally ``deletes_at_once = False``, where ``delete`` is verified on a later call (a
  cloud delete: the resource is gone a while after the call); the suite then calls it again,
  as the daemon does every cycle, until it says True;
- optionally ``stop_waits_for_deadline = False``, where ``stop`` ends the attempt at once
  whatever the deadline (a cloud runner deletes the machines: the VMs' shutdown is the grace
  the agent has, and the provider ends what ignores it), so the test that a command ignoring
  TERM runs until the deadline does not apply;
- optionally ``timeout`` (seconds) for each bounded wait, for runners slow to provision.

The suite provides, per test, ``self.root`` (a root URL of its own, so runners sharing a host,
like Docker, never see another test's attempts), ``self.tmp_path``, and the ``runner`` fixture
(one ``make_runner`` instance). Every runner made in a test has its attempts stopped (forced)
and deleted, and is closed, when the test ends.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from bastion.runners import base
from bastion.runners.base import Attempt, AttemptPhase, Handle, Observation, Runner


def wait_until(predicate: Callable[[], Any], timeout: float, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def read_all(runner: Runner, handle: Handle) -> bytes:
    return runner.read_output(handle, 0, 1 << 24)


# The test modules that hold RunnerContract classes (the meta-test imports them all).
CONTRACT_MODULES = (
    "tests.test_runner_contract",
    "tests.test_docker_runner",
    "tests.test_cloud_contract",
    "tests.test_slurm_runner",
    "tests.test_gke",
)


class RunnerContract:
    """Tests every runner must pass; see the module docstring for what a subclass provides."""

    __test__ = False  # abstract: subclasses set __test__ = True
    kind = ""
    isolates_roots = True
    deletes_at_once = True
    stop_waits_for_deadline = True
    timeout = 30.0

    def make_root(self, tmp_path) -> str:
        return f"gs://bastion-contract/{uuid.uuid4().hex}"

    def make_runner(self, tmp_path) -> Runner:
        raise NotImplementedError

    def make_runner_for_root(self, tmp_path, root: str) -> Runner:
        """A runner of another daemon (``root``) on the same state; overridable."""
        saved, self.root = self.root, root
        try:
            return self.make_runner(tmp_path)
        finally:
            self.root = saved

    # -- fixtures and helpers -------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _contract_context(self, tmp_path):
        self.tmp_path = tmp_path
        self.root = self.make_root(tmp_path)
        self.submission = uuid.uuid4().hex[:12]
        self._made: list[Runner] = []
        yield
        for runner in self._made:
            self._tear_down(runner)

    @pytest.fixture
    def runner(self, _contract_context) -> Runner:
        return self.new_runner()

    def new_runner(self, root: str | None = None) -> Runner:
        """A fresh instance on this test's state (``root``: another daemon's), torn down later."""
        if root is None:
            runner = self.make_runner(self.tmp_path)
        else:
            runner = self.make_runner_for_root(self.tmp_path, root)
        self._made.append(runner)
        return runner

    def _tear_down(self, runner: Runner) -> None:
        """Leave no process or container behind, whatever the test did."""
        try:
            for owned in runner.list_owned():
                wait_until(
                    lambda h=owned.handle: runner.stop(h, time.time()) or runner.poll(h).finished,
                    self.timeout,
                    f"{owned.name} to end at teardown",
                )
                runner.delete(owned.handle)
        finally:
            runner.close()

    def attempt(
        self, name_suffix: str, command: str, root: str | None = None, **options
    ) -> Attempt:
        """Attempt 1 of job ``contract-<name_suffix>`` of this test's submission under ``root``."""
        job = f"contract-{name_suffix}"
        name = base.attempt_name(root or self.root, job, self.submission, 1, "run")
        return Attempt(name=name, job=job, attempt=1, command=command, env={}, options=options)

    def wait_finished(self, runner: Runner, handle: Handle) -> Observation:
        return wait_until(
            lambda: (obs := runner.poll(handle)).finished and obs, self.timeout, "the end"
        )

    def deleted(self, runner: Runner, handle: Handle) -> bool:
        """``delete``, called until it says True when the kind verifies it later."""
        if self.deletes_at_once:
            return runner.delete(handle)
        return wait_until(lambda: runner.delete(handle), self.timeout, "the verified delete")

    def wait_output(self, runner: Runner, handle: Handle, output: bytes) -> None:
        """Until the attempt has printed ``output`` (so it is running, past that point)."""
        wait_until(lambda: read_all(runner, handle) == output, self.timeout, repr(output))

    # -- the contract ---------------------------------------------------------------------------

    def test_success_ends_succeeded_with_exactly_its_output(self, runner):
        handle = runner.start(self.attempt("two-lines", "echo first line; echo second"))
        obs = self.wait_finished(runner, handle)
        assert (obs.phase, obs.exit_code) == (AttemptPhase.SUCCEEDED, 0)
        whole = b"first line\nsecond\n"
        assert read_all(runner, handle) == whole
        pieces, offset = [], 0
        while piece := runner.read_output(handle, offset, 5):
            assert len(piece) <= 5
            pieces.append(piece)
            offset += len(piece)
        assert b"".join(pieces) == whole
        assert runner.read_output(handle, len(whole), 100) == b""

    def test_nonzero_exit_fails_with_its_code_and_is_not_retryable(self, runner):
        obs = self.wait_finished(runner, runner.start(self.attempt("exit-3", "exit 3")))
        assert (obs.phase, obs.exit_code, obs.retryable) == (AttemptPhase.FAILED, 3, False)

    def test_start_twice_is_one_attempt(self, runner):
        attempt = self.attempt("twice", "echo once; sleep 0.2")
        first, second = runner.start(attempt), runner.start(attempt)
        obs = self.wait_finished(runner, first)
        assert obs.phase == AttemptPhase.SUCCEEDED
        assert runner.poll(second) == obs
        assert read_all(runner, first) == read_all(runner, second) == b"once\n"
        assert [o.name for o in runner.list_owned()].count(attempt.name) == 1
        again = runner.start(attempt)  # after the end too: adopted, never run a second time
        assert runner.poll(again) == obs
        assert read_all(runner, again) == b"once\n"

    def test_poll_is_read_only(self, runner):
        handle = runner.start(self.attempt("read-only", "echo a; sleep 0.2; exit 4"))
        for _ in range(20):
            runner.poll(handle)
        obs = self.wait_finished(runner, handle)
        assert (obs.phase, obs.exit_code) == (AttemptPhase.FAILED, 4)
        for _ in range(50):
            assert runner.poll(handle) == obs
            assert read_all(runner, handle) == b"a\n"

    def test_stop_before_deadline_ends_the_attempt_promptly(self, runner):
        handle = runner.start(self.attempt("stop", "echo up; sleep 30"))
        self.wait_output(runner, handle, b"up\n")
        began = time.monotonic()
        runner.stop(handle, time.time() + 30)
        obs = self.wait_finished(runner, handle)
        assert time.monotonic() - began < 5
        assert obs.phase != AttemptPhase.SUCCEEDED

    def test_stop_forces_a_command_ignoring_term_once_the_deadline_passes(self, runner):
        if not self.stop_waits_for_deadline:
            pytest.skip(f"{type(self).__name__}: stop ends the attempt at once")
        command = "trap '' TERM; echo up; sleep 30  # ignore-term"
        handle = runner.start(self.attempt("ignore-term", command))
        self.wait_output(runner, handle, b"up\n")  # the trap is in place
        deadline = time.time() + 1
        runner.stop(handle, deadline)
        time.sleep(0.3)  # time enough for a TERM to have ended it, were it not ignored
        assert runner.poll(handle).phase == AttemptPhase.RUNNING
        assert read_all(runner, handle) == b"up\n"

        def stop_again():  # as the daemon does, every cycle
            runner.stop(handle, deadline)
            return runner.poll(handle).finished

        wait_until(stop_again, self.timeout, "the forced end")
        assert time.time() >= deadline
        assert runner.poll(handle).phase != AttemptPhase.SUCCEEDED

    def test_restarted_runner_adopts_a_running_attempt(self, runner):
        # 4 s: long enough to be adopted while it runs on a busy machine (1.5 s was not).
        attempt = self.attempt("restart", "echo first; sleep 4; echo second")
        runner.start(attempt)
        restarted = self.new_runner()
        owned = [o for o in restarted.list_owned() if o.name == attempt.name]
        assert len(owned) == 1 and not owned[0].finished
        handle = owned[0].handle
        obs = self.wait_finished(restarted, handle)
        assert (obs.phase, obs.exit_code) == (AttemptPhase.SUCCEEDED, 0)
        assert restarted.read_output(handle, len(b"first\n"), 1 << 20) == b"second\n"
        assert restarted.read_output(handle, 2, 4) == b"rst\n"

    def test_delete_is_verified_and_idempotent(self, runner):
        attempt = self.attempt("delete", "echo bye")
        handle = runner.start(attempt)
        self.wait_finished(runner, handle)
        assert self.deleted(runner, handle) is True
        assert attempt.name not in [o.name for o in runner.list_owned()]
        assert runner.delete(handle) is True

    def test_stop_and_delete_after_the_end_are_harmless(self, runner):
        handle = runner.start(self.attempt("ended", "echo done; exit 5"))
        obs = self.wait_finished(runner, handle)
        assert (obs.phase, obs.exit_code) == (AttemptPhase.FAILED, 5)
        runner.stop(handle, time.time() + 30)
        runner.stop(handle, time.time() - 1)
        assert runner.poll(handle) == obs
        assert read_all(runner, handle) == b"done\n"
        assert self.deleted(runner, handle) is True
        assert runner.delete(handle) is True

    def test_handle_is_not_changed_after_start_returns(self, runner):
        handle = runner.start(self.attempt("frozen", "echo still"))
        kept = copy.deepcopy(handle)
        self.wait_finished(runner, handle)
        read_all(runner, handle)
        runner.stop(handle, time.time() - 1)
        self.deleted(runner, handle)
        assert handle == kept  # the daemon stores it once; a change would be lost on restart

    def test_list_owned_reports_only_this_root(self, runner):
        if not self.isolates_roots:
            pytest.skip(f"{type(self).__name__} cannot isolate roots on one state")
        other_root = f"{self.root}-other"
        while base.root_tag(other_root) == base.root_tag(self.root):  # 4 hex digits may collide
            other_root += "-other"
        other = self.new_runner(root=other_root)
        mine = self.attempt("mine", "true")
        theirs = self.attempt("theirs", "true", root=other_root)
        self.wait_finished(runner, runner.start(mine))
        self.wait_finished(other, other.start(theirs))
        assert [o.name for o in runner.list_owned()] == [mine.name]
        assert [o.name for o in other.list_owned()] == [theirs.name]

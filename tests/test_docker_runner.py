"""The Docker runner against a real engine (tests/docker_engine.py starts it once)."""

from __future__ import annotations

import os
import random
import re
import time
import uuid

import pytest

from bastion.runners import base
from bastion.runners.base import Attempt, AttemptPhase, Handle, RunnerError, attempt_name
from bastion.runners.docker import DockerRunner, from_settings
from tests.runner_contract import RunnerContract


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "root"
    path.mkdir()
    return str(path)


@pytest.fixture
def docker_runner(docker_engine, root):
    runner = from_settings({"root": root, "image": docker_engine.base_image, "gpus": [0, 1]})
    yield runner
    for owned in runner.list_owned():
        runner.delete(owned.handle)
    runner.close()


def attempt(root: str, command: str, job: str = "job", n: int = 1, **kwargs) -> Attempt:
    submission = uuid.uuid4().hex[:8]
    return Attempt(
        name=attempt_name(root, job, submission, n, "run"),
        job=job,
        attempt=n,
        command=command,
        env=kwargs.pop("env", {"BASTION_JOB": job}),
        labels={"bastion.test": "1"},
        **kwargs,
    )


def wait_finished(runner: DockerRunner, handle: Handle, timeout: float = 30):
    end = time.time() + timeout
    while time.time() < end:
        seen = runner.poll(handle)
        if seen.finished:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"{handle['name']} still {seen} after {timeout} s")


def wait_output(runner: DockerRunner, handle: Handle, text: bytes, timeout: float = 30) -> None:
    end = time.time() + timeout
    while text not in runner.read_output(handle, 0, 1 << 20):
        assert time.time() < end, f"no {text!r} in the output of {handle['name']}"
        time.sleep(0.05)


def read_in_pieces(runner: DockerRunner, handle: Handle, limit: int, offset: int = 0) -> bytes:
    """Read like the daemon does: from where the log ends, until the attempt ended and a read
    after that returns nothing."""
    out = bytearray()
    while True:
        finished = runner.poll(handle).finished
        piece = runner.read_output(handle, offset + len(out), limit)
        assert len(piece) <= limit
        out += piece
        if not piece and finished:
            return bytes(out)
        if not piece:
            time.sleep(0.02)


def engine_output(docker_engine, handle: Handle) -> bytes:
    """What ``docker logs`` says: the truth the runner must reproduce byte for byte."""
    return docker_engine.client().api.logs(handle["id"], stdout=True, stderr=True)


def test_success_output_read_in_pieces_exactly_once(docker_runner, docker_engine, root):
    command = (
        'echo "job=$BASTION_JOB opt=$OPT"; '
        "for i in $(seq 1 60); do echo out $i; echo err $i >&2; done; "
        "printf 'no newline at the end'"
    )
    a = attempt(root, command, options={"env": {"OPT": "from-options"}})
    t0 = time.time()
    handle = docker_runner.start(a)
    started = time.time() - t0
    assert handle["name"] == a.name and handle["id"]
    seen = wait_finished(docker_runner, handle)
    assert (seen.phase, seen.exit_code) == (AttemptPhase.SUCCEEDED, 0), seen
    out = read_in_pieces(docker_runner, handle, limit=7)
    assert out == engine_output(docker_engine, handle)
    assert out.count(b"job=job opt=from-options\n") == 1  # (stamps may reorder the streams)
    assert out.count(b"out 60\n") == 1 and out.count(b"err 60\n") == 1
    assert out.endswith(b"no newline at the end")
    assert read_in_pieces(docker_runner, handle, limit=1 << 20) == out  # fresh, from 0
    assert started < 5, f"start took {started:.2f} s"


def test_output_read_while_it_grows(docker_runner, docker_engine, root):
    """Reads race the job's writes (stdout and stderr interleaved, lines sharing stamps)."""
    command = (
        "for i in $(seq 1 30); do echo out $i; echo err $i >&2; "
        "python3 -c \"print('y' * 40000)\"; sleep 0.01; done"
    )
    handle = docker_runner.start(attempt(root, command))
    out = read_in_pieces(docker_runner, handle, limit=10000)  # < a 16 KiB piece of a line
    assert docker_runner.poll(handle).phase == AttemptPhase.SUCCEEDED
    assert out == engine_output(docker_engine, handle)
    # The engine splits a line longer than 16 KiB into pieces and stamps each stream's pieces
    # as it reads them, so a stderr line can sit between two pieces of a stdout line, in the
    # engine's own output as in ours. Without the stderr lines, stdout is whole and in order.
    stdout = re.sub(rb"err \d+\n", b"", out)
    assert stdout.count(b"y" * 40000 + b"\n") == 30
    assert re.findall(rb"out (\d+)\n", stdout) == [str(i).encode() for i in range(1, 31)]


def test_reading_costs_the_new_bytes_not_the_whole_log(docker_runner, docker_engine, root):
    """Each read asks the engine only for lines stamped since (a little before) the last one
    it returned, so reading a long log in pieces fetches each line about once."""
    command = 'for i in $(seq 1 20); do seq 1 200 | sed "s/^/$i /"; sleep 0.05; done'
    handle = docker_runner.start(attempt(root, command))
    wait_finished(docker_runner, handle)
    fetched = 0
    lines = docker_runner._log_lines

    def counting(*args):
        nonlocal fetched
        for line in lines(*args):
            fetched += 1
            yield line

    docker_runner._log_lines = counting
    out = read_in_pieces(docker_runner, handle, limit=1000)
    assert out == engine_output(docker_engine, handle)
    assert out.count(b"\n") == 4000
    print(f"{fetched} lines fetched for 4000")
    assert fetched < 3 * 4000, fetched  # from the start every time would be ~ 60 times more


@pytest.mark.parametrize("limit", [1, 5, 64, 1000, 1 << 20])
@pytest.mark.parametrize("seed", range(3))
def test_read_output_against_a_modelled_log(limit, seed):
    """No engine: a log whose lines share stamps, arrive up to 5 ms out of stamp order (two
    streams) and grow between reads; read in pieces, then from an offset by a new runner."""
    rng = random.Random(seed)
    log: list[tuple[int, bytes]] = []
    stamp = 1_700_000_000 * 10**9
    for i in range(400):
        stamp += rng.choice([0, 0, 1, 1000, 3_000_000, 50_000_000])
        skew = rng.choice([0, 0, 0, -rng.randrange(5_000_000)])  # the other stream's stamp
        line = (b"%d " % i) + b"z" * rng.choice([0, 3, 40]) + rng.choice([b"\n", b""])
        log.append((stamp + skew, line))
    visible = 0

    def log_lines(ref, since_ns):  # the engine: lines stamped >= since (a float: ~1 us early)
        for line_stamp, line in log[:visible]:
            if line_stamp >= since_ns - 1000:
                yield line_stamp, line

    runner = DockerRunner("gs://b/model", docker_host="unix:///nonexistent", image="x")
    runner._log_lines = log_lines
    handle = {"name": "bst-model", "id": "model"}
    whole = b"".join(line for _, line in log)
    out = bytearray()
    while True:
        visible = min(len(log), visible + rng.randrange(0, 40))
        piece = runner.read_output(handle, len(out), limit)
        out += piece
        if not piece and visible == len(log):
            break
    assert bytes(out) == whole
    assert runner.read_output(handle, len(out), limit) == b""
    restarted = DockerRunner("gs://b/model", docker_host="unix:///nonexistent", image="x")
    restarted._log_lines = log_lines
    middle = len(whole) // 2
    assert restarted.read_output(handle, middle, 1 << 20) == whole[middle:]


def test_exit_code_is_a_failure(docker_runner, root):
    handle = docker_runner.start(attempt(root, "echo bad; exit 3"))
    seen = wait_finished(docker_runner, handle)
    assert (seen.phase, seen.exit_code) == (AttemptPhase.FAILED, 3)
    assert "exited with status 3" in seen.reason


def test_stop_sends_sigterm_before_the_deadline(docker_runner, root):
    command = "trap 'echo got TERM; exit 143' TERM; echo ready; while :; do sleep 0.1; done"
    handle = docker_runner.start(attempt(root, command))
    wait_output(docker_runner, handle, b"ready")
    t0 = time.time()
    docker_runner.stop(handle, deadline=time.time() + 60)
    docker_runner.stop(handle, deadline=time.time() + 60)  # repeated each cycle: no second TERM
    assert time.time() - t0 < 2, "stop must not wait for the attempt"
    seen = wait_finished(docker_runner, handle, timeout=10)
    assert (seen.phase, seen.exit_code) == (AttemptPhase.FAILED, 143)
    out = docker_runner.read_output(handle, 0, 1000)
    assert out.startswith(b"ready\n") and b"got TERM\n" in out  # and sh's "Terminated"


def test_sigterm_reaches_the_whole_job(docker_runner, root):
    """A program under the shell gets SIGTERM too (tini signals the process group). The shell
    waits for it before it ends: a shell killed by the same TERM took the container down with
    it, and the program with it before its handler printed (1 run in about 15)."""
    command = (
        "trap 'wait; exit 143' TERM; python3 -c 'import signal, sys, time\n"
        'signal.signal(signal.SIGTERM, lambda *_: (print("python got TERM", flush=True), '
        'sys.exit(5)))\nprint("ready", flush=True)\ntime.sleep(60)\'; echo shell after $?'
    )
    handle = docker_runner.start(attempt(root, command))
    wait_output(docker_runner, handle, b"ready")
    docker_runner.stop(handle, deadline=time.time() + 60)
    seen = wait_finished(docker_runner, handle, timeout=10)
    assert seen.phase == AttemptPhase.FAILED
    assert b"python got TERM" in docker_runner.read_output(handle, 0, 1000)


_SAVES_ON_TERM = (
    "python3 -c 'import signal, sys, time\n"
    "def saved(*_):\n"
    "    time.sleep(1)\n"
    '    print("python saved", flush=True)\n'
    "    sys.exit(5)\n"
    "signal.signal(signal.SIGTERM, saved)\n"
    'print("ready", flush=True)\n'
    "time.sleep(60)'"
)


def test_a_program_under_a_shell_without_a_handler_gets_its_grace(docker_runner, root):
    """The most common command form: the shell has no handler and dies of the TERM at once.
    The container used to end with it, 0.05 s after the stop, and python's 1 s save never
    finished. The status stays the shell's (143), as on the local runner."""
    handle = docker_runner.start(attempt(root, _SAVES_ON_TERM + "; echo shell after $?"))
    wait_output(docker_runner, handle, b"ready")
    stopped = time.time()
    docker_runner.stop(handle, deadline=time.time() + 60)
    seen = wait_finished(docker_runner, handle, timeout=20)
    assert time.time() - stopped >= 1.0
    assert (seen.phase, seen.exit_code) == (AttemptPhase.FAILED, 143)
    out = docker_runner.read_output(handle, 0, 1000)
    assert b"python saved" in out and b"shell after" not in out


def test_an_execed_program_ends_the_job_with_its_own_status(docker_runner, root):
    handle = docker_runner.start(attempt(root, "cd / && exec " + _SAVES_ON_TERM))
    wait_output(docker_runner, handle, b"ready")
    docker_runner.stop(handle, deadline=time.time() + 60)
    seen = wait_finished(docker_runner, handle, timeout=20)
    assert (seen.phase, seen.exit_code) == (AttemptPhase.FAILED, 5)
    assert b"python saved" in docker_runner.read_output(handle, 0, 1000)


def test_without_a_stop_the_container_ends_with_the_job_not_its_leftovers(docker_runner, root):
    handle = docker_runner.start(attempt(root, "sleep 60 & echo started"))
    seen = wait_finished(docker_runner, handle, timeout=10)
    assert (seen.phase, seen.exit_code) == (AttemptPhase.SUCCEEDED, 0)


def test_a_job_ignoring_sigterm_is_killed_at_the_deadline(docker_runner, root):
    handle = docker_runner.start(attempt(root, "trap '' TERM; echo ready; sleep 60"))
    wait_output(docker_runner, handle, b"ready")
    deadline = time.time() + 1.0
    docker_runner.stop(handle, deadline)
    time.sleep(0.5)
    assert docker_runner.poll(handle).phase == AttemptPhase.RUNNING  # TERM ignored
    while not docker_runner.poll(handle).finished:  # the daemon calls stop every cycle
        assert time.time() < deadline + 10
        docker_runner.stop(handle, deadline)
        time.sleep(0.1)
    seen = docker_runner.poll(handle)
    assert (seen.phase, seen.exit_code) == (AttemptPhase.FAILED, 137)
    assert time.time() >= deadline


def test_start_twice_adopts_one_container(docker_runner, docker_engine, root):
    a = attempt(root, "sleep 30")
    first = docker_runner.start(a)
    again = docker_runner.start(a)
    # A daemon restarted after a create whose answer was lost: a new runner, the same name.
    restarted = from_settings({"root": root, "image": docker_engine.base_image})
    adopted = restarted.start(a)
    assert first["id"] == again["id"] == adopted["id"]
    same_name = docker_engine.client().containers.list(all=True, filters={"name": a.name})
    assert [c.id for c in same_name] == [first["id"]]


def test_a_container_of_another_root_is_not_adopted(docker_runner, docker_engine, root, tmp_path):
    a = attempt(root, "sleep 30")
    docker_runner.start(a)
    other = from_settings({"root": str(tmp_path / "other"), "image": docker_engine.base_image})
    with pytest.raises(RunnerError, match="not this daemon's"):
        other.start(a)


def test_a_restarted_daemon_finds_its_containers_and_reads_from_an_offset(
    docker_runner, docker_engine, root
):
    a = attempt(root, "for i in $(seq 1 50); do echo line $i; done")
    handle = docker_runner.start(a)
    wait_finished(docker_runner, handle)
    head = docker_runner.read_output(handle, 0, 100)
    restarted = from_settings({"root": root, "image": docker_engine.base_image})
    owned = {o.name: o for o in restarted.list_owned()}
    assert owned[a.name].finished and owned[a.name].handle["id"] == handle["id"]
    rest = read_in_pieces(restarted, owned[a.name].handle, limit=33, offset=len(head))
    assert head + rest == b"".join(b"line %d\n" % i for i in range(1, 51))


def test_list_owned_says_what_still_runs(docker_runner, root):
    running = docker_runner.start(attempt(root, "sleep 30", job="runs"))
    done = docker_runner.start(attempt(root, "true", job="done"))
    wait_finished(docker_runner, done)
    owned = {o.handle["id"]: o.finished for o in docker_runner.list_owned()}
    assert owned == {running["id"]: False, done["id"]: True}


def test_delete_removes_the_container_and_is_idempotent(docker_runner, docker_engine, root):
    handle = docker_runner.start(attempt(root, "sleep 30"))
    assert docker_runner.delete(handle) is True
    assert docker_runner.delete(handle) is True
    seen = docker_runner.poll(handle)
    assert seen.phase == AttemptPhase.LOST and "gone" in seen.reason
    assert docker_runner.list_owned() == []
    docker_runner.stop(handle, deadline=0)  # nothing to stop: fine
    assert docker_runner.read_output(handle, 0, 10) == b""


def test_a_missing_image_is_a_readable_error(docker_runner, docker_engine, root):
    image = f"{docker_engine.registry}/bastion-test/no-such-image:1"
    with pytest.raises(RunnerError) as e:
        docker_runner.start(attempt(root, "true", options={"image": image}))
    assert f"image {image} not found locally or in its registry" in str(e.value)
    assert "\n" not in str(e.value)
    assert docker_runner.list_owned() == []


def test_an_image_only_in_the_registry_is_pulled(docker_runner, docker_engine, root):
    image = f"{docker_engine.registry}/{docker_engine.base_image}"
    client = docker_engine.client()
    if client.images.list(name=image):
        client.images.remove(image)
    handle = docker_runner.start(
        attempt(root, "python3 -c 'print(1 + 1)'", options={"image": image})
    )
    assert wait_finished(docker_runner, handle).phase == AttemptPhase.SUCCEEDED
    assert docker_runner.read_output(handle, 0, 100) == b"2\n"


def test_an_unknown_option_names_itself_and_the_allowed_ones(docker_runner, root):
    with pytest.raises(RunnerError, match=r"cpus.*image.*workdir"):
        docker_runner.start(attempt(root, "true", options={"cpus": 2}))


def test_an_unreachable_engine_is_a_runner_error(root, tmp_path):
    runner = DockerRunner(root, docker_host=f"unix://{tmp_path}/no.sock", image="x")
    with pytest.raises(RunnerError, match="unreachable"):
        runner.start(attempt(root, "true"))


def test_the_job_writes_into_a_local_root(docker_runner, root):
    command = f"echo written by $(id -u) > {root}/from-the-job.txt"
    handle = docker_runner.start(attempt(root, command, options={"workdir": "/tmp"}))
    assert wait_finished(docker_runner, handle).phase == AttemptPhase.SUCCEEDED
    with open(os.path.join(root, "from-the-job.txt")) as f:
        assert f.read() == "written by 0\n"


def test_extra_mounts_are_bound(docker_runner, root, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "in.txt").write_text("hello")
    mount = f"{tmp_path / 'data'}:/data:ro"
    handle = docker_runner.start(
        attempt(root, "cat /data/in.txt; touch /data/x", options={"mounts": [mount]})
    )
    seen = wait_finished(docker_runner, handle)
    assert seen.phase == AttemptPhase.FAILED  # read-only
    assert b"hello" in docker_runner.read_output(handle, 0, 1000)


def test_gpus_beyond_the_runners_are_refused(docker_runner, root):
    with pytest.raises(RunnerError, match="needs 3 GPUs but only 2 of 2 are free"):
        docker_runner.start(attempt(root, "true", resources={"gpu": 3}))
    assert docker_runner.list_owned() == []


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_a_gpu_job_on_an_engine_without_gpus_leaves_nothing(docker_runner, root):
    with pytest.raises(RunnerError, match="could not start"):
        docker_runner.start(attempt(root, "true", resources={"gpu": 1}))
    assert docker_runner.list_owned() == []


def test_out_of_memory_is_named(docker_runner, docker_engine, root):
    """The runner has no memory option; a container made with a tiny limit and our labels
    stands in for a job the kernel killed."""
    a = attempt(root, "")
    container = docker_engine.client().containers.create(
        docker_engine.base_image,
        ["python3", "-c", "b = bytearray(512 << 20)"],
        name=a.name,
        labels={"bastion.root": docker_runner.tag, "bastion.name": a.name, "bastion.test": "1"},
        mem_limit="32m",
        memswap_limit="32m",
        network_mode="host",
    )
    container.start()
    seen = wait_finished(docker_runner, {"name": a.name, "id": container.id})
    assert seen.phase == AttemptPhase.FAILED
    assert seen.reason == "killed: out of memory (OOMKilled)", seen


class TestDockerContract(RunnerContract):
    """The shared runner contract (tests/runner_contract.py) on the real engine."""

    __test__ = True
    kind = "docker"

    @pytest.fixture(autouse=True)
    def _engine(self, docker_engine):
        self.engine = docker_engine

    def make_runner(self, tmp_path):
        settings = {"root": self.root, "work_dir": str(tmp_path), "image": self.engine.base_image}
        return base.factory_for("docker")(settings)


def test_a_stale_daemon_cannot_create_a_container_after_a_newer_one_started(
    docker_runner, root, docker_engine
):
    """The host's fencing token covers containers too (bastion/runners/fence.py)."""
    from bastion.runners.base import Fenced

    newer = attempt(root, "true", job="newer", fence=6)
    wait_finished(docker_runner, docker_runner.start(newer))
    stale = attempt(root, "true", job="stale", fence=5)
    with pytest.raises(Fenced, match="term 6"):
        docker_runner.start(stale)
    names = {owned.name for owned in docker_runner.list_owned()}
    assert newer.name in names and stale.name not in names

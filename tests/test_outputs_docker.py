"""Outputs on the Docker runner, against the real engine: restored into a host directory bound
into the container, synced by a watcher on the host that outlives the daemon and the job."""

from __future__ import annotations

import time

from bastion.bucket.store import Store
from bastion.runners.base import AttemptPhase
from tests.test_docker_runner import attempt, docker_runner, root, wait_finished, wait_output

# The fixtures of tests/test_docker_runner.py (a runner on the real engine, a local root)
docker_runner, root = docker_runner, root

RESUMABLE = (
    'f="$BASTION_OUTPUT_DIR/ckpt.txt"; step=$(cat "$f" 2>/dev/null || echo 0); '
    'echo "start at $step"; '
    'trap \'sleep 1; cat "$f" > "$BASTION_OUTPUT_DIR/last-words"; exit 143\' USR1; '
    'while true; do step=$((step+1)); echo $step > "$f.tmp"; mv "$f.tmp" "$f"; sleep 0.1; done'
)


def env_for(store: Store, n: int) -> dict[str, str]:
    return {
        "BASTION_OUTPUT_URL": store.outputs.url("train"),
        "BASTION_STOP_SIGNAL": "USR1",
        "BASTION_SYNC_SECONDS": "0.3",
        "BASTION_ATTEMPT": str(n),
    }


def start_at(runner, handle) -> int:
    out = runner.read_output(handle, 0, 1 << 20).decode()
    return int(next(ln for ln in out.splitlines() if ln.startswith("start at")).split()[-1])


def test_an_updated_attempt_is_resumed_and_what_it_wrote_in_its_grace_is_kept(docker_runner, root):
    store = Store(root)
    first = attempt(root, RESUMABLE, job="train", n=1, env=env_for(store, 1))
    handle = docker_runner.start(first)
    wait_output(docker_runner, handle, b"start at 0")
    deadline = time.time() + 60
    while "ckpt.txt" not in store.outputs.list("train"):  # synced while it runs
        assert time.time() < deadline
        time.sleep(0.1)
    docker_runner.stop(handle, time.time() + 10)  # its stop signal: USR1, then 1 s of work
    seen = wait_finished(docker_runner, handle, timeout=20)
    assert (seen.phase, seen.exit_code) == (AttemptPhase.FAILED, 143)
    while not docker_runner.delete(handle):  # True only once the watcher's final sync is done
        assert time.time() < deadline
        time.sleep(0.1)
    files = store.outputs.list("train")
    assert "last-words" in files
    last = int(store.fs.cat_file(f"{store.root}/outputs/train/last-words").decode())
    second = attempt(root, RESUMABLE, job="train", n=2, env=env_for(store, 2))
    handle2 = docker_runner.start(second)
    wait_output(docker_runner, handle2, b"start at")
    assert start_at(docker_runner, handle2) >= last > 0
    summaries = store.outputs.read_summaries("train")
    # The summary counts every sync of the attempt: the watcher's periodic ones (ckpt.txt was
    # synced while it ran) as well as the final one (it once counted only the final sync's).
    first_summary = summaries[0]
    assert first_summary["attempt"] == 1 and first_summary["final"], summaries
    assert first_summary["syncs"] >= 2 and first_summary["synced_bytes"] > 0, summaries
    docker_runner.stop(handle2, time.time())


def test_a_job_killed_at_its_deadline_keeps_what_it_wrote_before(docker_runner, root):
    store = Store(root)
    env = {**env_for(store, 1), "BASTION_SYNC_SECONDS": "3600"}  # only the final sync
    job = "trap '' USR1; echo kept > \"$BASTION_OUTPUT_DIR/early\"; echo ready; sleep 300"
    handle = docker_runner.start(attempt(root, job, job="train", n=1, env=env))
    wait_output(docker_runner, handle, b"ready")
    deadline = time.time() + 1
    while not docker_runner.poll(handle).finished:
        docker_runner.stop(handle, deadline)
        time.sleep(0.1)
    assert docker_runner.poll(handle).exit_code == 137
    end = time.time() + 30
    while not docker_runner.delete(handle):
        assert time.time() < end
        time.sleep(0.1)
    assert "early" in store.outputs.list("train")


# -- the watcher's wait for its container ---------------------------------------------------


def _container(docker_engine, command: str, start: bool = True):
    import docker

    client = docker.DockerClient(base_url=docker_engine.docker_host)
    made = client.containers.create(docker_engine.base_image, command, network_mode="host")
    if start:
        made.start()
    return client, made


def test_the_watcher_is_woken_by_its_containers_end_not_by_a_look_each_second(docker_engine):
    """The engine's wait answers when the container stops: the watcher sleeps until then (or
    until its next sync), where it looked every second before."""
    from bastion.outputs.watch import container_ended, engine

    client, container = _container(docker_engine, "sleep 2")
    try:
        api = engine(docker_engine.docker_host)
        t0 = time.monotonic()
        assert container_ended(api, container.name, 60.0) is False  # (it stopped: look again)
        took = time.monotonic() - t0
        assert 1.0 < took < 30.0, f"returned after {took:.1f} s for a container that ran 2 s"
        assert container_ended(api, container.name, 60.0) is True
    finally:
        container.remove(force=True)
        client.close()


def test_the_watcher_waits_out_its_sync_period_while_the_container_runs(docker_engine):
    from bastion.outputs.watch import container_ended, engine

    client, container = _container(docker_engine, "sleep 60")
    try:
        t0 = time.monotonic()
        assert container_ended(engine(docker_engine.docker_host), container.name, 1.0) is False
        assert time.monotonic() - t0 >= 0.9  # blocked on the engine for the period
    finally:
        container.remove(force=True)
        client.close()


def test_a_created_container_lives_and_a_removed_one_has_ended(docker_engine):
    """Created but not started yet is not ended (the engine's wait would say it is)."""
    from bastion.outputs.watch import container_ended, engine

    client, container = _container(docker_engine, "true", start=False)
    api = engine(docker_engine.docker_host)
    try:
        assert container_ended(api, container.name, 0.2) is False
    finally:
        container.remove(force=True)
        client.close()
    assert container_ended(api, container.name, 0.2) is True


def test_an_engine_that_cannot_be_reached_is_asked_again_not_taken_for_an_end(tmp_path):
    import docker

    from bastion.outputs.watch import container_ended

    api = docker.APIClient(base_url=f"unix://{tmp_path}/no-engine.sock", version="1.41")
    assert container_ended(api, "anything", 5.0) is None

"""The Docker runner's watcher: syncs a container's outputs from the host, outliving the daemon.

``python -m bastion.outputs.watch --root=R --job=J --attempt=N --container=NAME --dir=DIR
[--docker_host=H] [--sync_seconds=S]``, started detached (a session of its own) by
:class:`bastion.runners.docker_outputs.DockerOutputs` once the container runs. DIR is bound
into the container at the same path (``$BASTION_OUTPUT_DIR``) and was restored before the
container was made; its manifest (``DIR.manifest.json``) says what the bucket already has.
Every ``S`` seconds it uploads what changed; once the container has ended (exited, killed,
removed) it syncs once more, writes the attempt's summary and exits. Being on the host, it is
never killed with the job: what the job wrote before its SIGKILL is synced. One watcher per
directory (an exclusive lock on ``DIR.watch``): a restarted daemon that starts a second finds
the first still at work.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from bastion.outputs.syncer import SYNC_SECONDS, Syncer

log = logging.getLogger("bastion.outputs.watch")


@contextlib.contextmanager
def watching(directory: str) -> Iterator[bool]:
    """True while this process holds the directory's watch lock; False: another does."""
    fd = os.open(directory + ".watch", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


RESTORED, SYNCED = ".restored", ".synced"  # beside DIR: restored by the runner; synced at the end
CHECK_SECONDS = 1.0  # before asking again an engine that did not answer


def final_sync(
    root: str,
    job: str,
    attempt: int,
    directory: str,
    purpose: str = "run",
    syncer: Syncer | None = None,
) -> None:
    """The last sync of an attempt whose container has ended, then its summary and the
    ``.synced`` mark; by whoever holds the watch lock (the watcher, with its own syncer, or
    the runner's delete when no watcher is left: a syncer made from the manifest and stats
    kept on disk). Nothing to do without ``.restored`` or with ``.synced``."""
    if not os.path.exists(directory + RESTORED) or os.path.exists(directory + SYNCED):
        return
    syncer = syncer or _syncer(root, job, attempt, directory)
    syncer.stats.purpose = purpose
    syncer.sync(final=True)
    syncer.write_summary()
    with open(directory + SYNCED, "w"):
        pass


def _syncer(root: str, job: str, attempt: int, directory: str) -> Syncer:
    from bastion.bucket.store import Store

    manifest = directory + ".manifest.json"
    return Syncer(Store(root).outputs, job, directory, attempt=attempt, manifest_path=manifest)


LIVE = ("created", "running", "restarting", "paused")  # a container that has not ended


def container_ended(api: Any, name: str, seconds: float) -> bool | None:
    """True once the container has ended (exited, killed, removed); False while it still
    lives after at most ``seconds``; None when the engine cannot be asked now (the caller
    waits ``CHECK_SECONDS`` and asks again).

    A running container is waited for with the engine's own wait (it answers when the
    container stops), not looked at every second: a look each second with a new client cost
    the watcher 2.4 ms of CPU a second per container here, and the engine an inspect each."""
    from docker.errors import DockerException, NotFound

    seconds = max(seconds, 0.1)
    started = time.monotonic()
    try:
        status = api.inspect_container(name)["State"].get("Status", "")
        if status not in LIVE:
            return True
        if status not in ("running", "paused"):  # created, restarting: not waitable yet
            time.sleep(min(CHECK_SECONDS, seconds))
            return False
        api.wait(name, timeout=seconds, condition="not-running")
        return False  # it stopped: the next call's look says whether it ended
    except NotFound:
        return True
    except (DockerException, OSError) as e:  # (requests' errors are OSErrors)
        if time.monotonic() - started >= seconds:
            return False  # the wait's own timeout: it runs on
        log.warning("cannot ask the engine about %s: %s", name, e)
        return None


def engine(docker_host: str | None) -> Any:
    """One client for the watcher's life (the engine is asked every few seconds)."""
    import docker

    return docker.APIClient(base_url=docker_host) if docker_host else docker.from_env().api


def watch(args: argparse.Namespace) -> int:
    with watching(args.dir) as mine:
        if not mine or not os.path.exists(args.dir + RESTORED) or os.path.exists(args.dir + SYNCED):
            return 0  # another watcher has it, or its final sync is done
        syncer = _syncer(args.root, args.job, args.attempt, args.dir)
        next_sync = time.monotonic() + args.sync_seconds
        api = None
        while True:
            try:
                api = api or engine(args.docker_host)
                ended = container_ended(api, args.container, next_sync - time.monotonic())
            except Exception as e:  # (no client: the engine is not there now)
                log.warning("cannot reach the engine: %s", e)
                ended = None
            if ended:
                break
            if ended is None:
                time.sleep(CHECK_SECONDS)
            if time.monotonic() >= next_sync:
                syncer.sync()
                next_sync = time.monotonic() + args.sync_seconds
        final_sync(args.root, args.job, args.attempt, args.dir, args.purpose, syncer)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bastion outputs watcher")
    parser.add_argument("--root", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--container", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--docker_host", default=None)
    parser.add_argument("--sync_seconds", type=float, default=SYNC_SECONDS)
    parser.add_argument("--purpose", default="run", help="run or cleanup: names the summary")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s bastion-watch %(message)s")
    return watch(args)


if __name__ == "__main__":
    sys.exit(main())

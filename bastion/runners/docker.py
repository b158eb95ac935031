"""The Docker runner: one container per attempt, on a Docker engine this daemon can reach.

The container *is* the record: it is named after the attempt and labelled with the daemon's
root, so a restarted daemon finds everything it made by asking the engine (``list_owned``), a
create whose answer was lost is adopted on the 409 Conflict of the second create, and GPUs
handed out survive a restart in each container's ``bastion.gpus`` label. The runner keeps no
files of its own.

Settings (``from_settings``):

- ``root``: the daemon's root URL (required). A local root (a path or ``file://``) is
  bind-mounted read-write at the same path, so the job reaches the bucket as the daemon does.
- ``work_dir``: the daemon's work directory (unused: the engine keeps the output).
- ``docker_host``: the engine, e.g. ``unix:///run/docker.sock`` (default: ``$DOCKER_HOST``,
  else the SDK's default).
- ``image``: the image of jobs whose options name none.
- ``network``: the network mode (default ``host``: the daemon's bucket on 127.0.0.1 and the
  host's names are reachable, and no bridge is needed).
- ``gpus``: the GPU indices this runner may hand out (default: ``nvidia-smi``'s).
- ``mounts``: extra ``host:container[:ro]`` binds for every job.

Per-job options (the spec's runner options): ``image``, ``network``, ``env`` (a mapping, under
the daemon's own variables), ``mounts`` (more binds), ``shm_size``, ``user``, ``workdir``.

Commands run as ``/bin/sh -c COMMAND`` under the engine's init (tini) with
``TINI_KILL_PROCESS_GROUP=1``, so SIGTERM reaches the whole job (a ``python`` under ``sh`` gets
it too, as with the local runner) and ends in status 143 unless the job handles it. That shell
runs under a small one of ours (``_WRAPPER``), because a container ends with its first process:
a shell without a handler dies of the signal at once, and a program under it would be killed
with the container before its handler had saved anything. Ours waits, after a stop, until every
other process in the container has ended (or the deadline's SIGKILL), then exits with the job
shell's status, as the local runner does.

A job asking for ``resources["gpu"] = N`` gets N of ``gpus`` that no live Bastion container on
this engine holds and no other attempt of this daemon holds (the host's GPU ledger,
bastion/runners/gpus.py, shared with the local runner: a local job and a container never get
the same GPU), as a device request; inside, they are the container's only GPUs, so
``CUDA_VISIBLE_DEVICES`` is ``0..N-1`` there (the host's indices would name GPUs it lacks).
``list_owned`` counts a created-but-not-started container as not finished: it holds its GPUs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest

from bastion.runners.base import (
    Attempt,
    AttemptPhase,
    Handle,
    Observation,
    Owned,
    Runner,
    RunnerError,
    StartRefused,
)
from bastion.runners.base import root_tag as make_root_tag
from bastion.runners.docker_logs import OutputReader, parse_stamp
from bastion.runners.docker_outputs import DockerOutputs
from bastion.runners.fence import fenced
from bastion.runners.gpus import GpuLedger, ledger_of
from bastion.runners.kit.retry import read_back
from bastion.runners.local import default_attempts_dir

OPTIONS = frozenset({"image", "network", "env", "mounts", "shm_size", "user", "workdir"})
_LIVE = frozenset({"created", "running", "restarting", "paused"})
_RUNNING = frozenset({"running", "restarting", "paused"})
_CLIENT_TIMEOUT = 30


def from_settings(settings: Mapping[str, Any]) -> DockerRunner:
    root = str(settings.get("root") or "")
    if not root:
        raise RunnerError("the docker runner needs settings['root'] (the daemon's root URL)")
    gpus = settings.get("gpus")
    return DockerRunner(
        root,
        docker_host=settings.get("docker_host") or os.environ.get("DOCKER_HOST") or None,
        image=settings.get("image") or None,
        network=str(settings.get("network") or "host"),
        gpus=None if gpus is None else [int(g) for g in gpus],
        mounts=list(settings.get("mounts") or []),
        work_dir=str(settings.get("work_dir") or ""),
        ledger=ledger_of(settings),
    )


def engine_unreachable(docker_host: str | None, error: BaseException) -> str:
    """What to fix when no engine answers: where we looked and the three ways to point us."""
    env = os.environ.get("DOCKER_HOST")
    where = docker_host or (f"$DOCKER_HOST={env}" if env else "the default socket")
    return (
        f"docker engine at {where} unreachable ({_one_line(error)}); start an engine "
        "(scripts/docker_setup.sh sets one up), or point the daemon at a running one with "
        "$DOCKER_HOST or the docker_host setting under [runners.docker] in --settings"
    )


class DockerRunner(Runner):
    accepted_options = OPTIONS
    kind = "docker"

    def __init__(
        self,
        root: str,
        docker_host: str | None = None,
        image: str | None = None,
        network: str = "host",
        gpus: Sequence[int] | None = None,
        mounts: Sequence[str] = (),
        work_dir: str = "",
        ledger: GpuLedger | None = None,
    ) -> None:
        self.root = root
        self.code_dir = os.path.join(os.path.abspath(work_dir or "."), "docker-code")
        self.tag = make_root_tag(root)
        self.fence_dir = default_attempts_dir(root)  # shared with the local runner's fence
        self.docker_host = docker_host
        self.image = image
        self.network = network
        self.mounts = list(mounts)
        split = urllib.parse.urlsplit(root)
        if split.scheme in ("", "file"):  # the job sees the bucket where the daemon does
            path = os.path.abspath(split.path if split.scheme else root)
            self.mounts.insert(0, f"{path}:{path}:rw")
        self._gpus = None if gpus is None else list(gpus)
        self._client: docker.DockerClient | None = None
        self._lock = threading.Lock()  # the client is made once
        # The host's GPUs, shared with the local runner. Our containers' labels say what they
        # hold: read (once, lazily: it asks the engine) before the ledger's next allocation.
        self.ledger = ledger or GpuLedger()
        self.ledger.join(self.kind, self._holding)
        self._termed: set[str] = set()  # container ids sent SIGTERM by this instance
        self.output = OutputReader(lambda ref, since_ns: self._log_lines(ref, since_ns))
        self.outputs = DockerOutputs(root, work_dir, docker_host)  # restore, watcher, removal

    # -- the contract ----------------------------------------------------------------------

    def start(self, attempt: Attempt) -> Handle:
        options = _check_options(attempt.options)
        self._unpack(attempt)
        attempt = dataclasses.replace(attempt, env={**attempt.env, **self.outputs.prepare(attempt)})
        count = int(attempt.resources.get("gpu", 0) or 0)
        try:
            # The host's fencing token (bastion/runners/fence.py): a stale daemon never creates
            # a container after a newer one started anything for this root on this host.
            with fenced(self.fence_dir, attempt.fence):
                gpus = self._allocate_gpus(attempt.name, count)
                try:
                    container_id = self._create(*self._container_spec(attempt, options, gpus))
                except BaseException:
                    self.ledger.free(attempt.name)  # nothing was made: its GPUs stay free
                    raise
        except (DockerException, requests.RequestException) as e:
            raise RunnerError(f"docker could not create {attempt.name}: {_one_line(e)}") from e
        try:
            if container_id is None:  # 409: it exists already
                handle = self._adopt(attempt.name)
            else:
                self._start(container_id, attempt.name, remove_on_failure=True)
                handle = {"kind": self.kind, "name": attempt.name, "id": container_id}
                handle.update(gpus=gpus, stop_signal=_stop_signal(attempt))
                handle.update(job=attempt.job, attempt=attempt.attempt)
        except RunnerError:
            self.ledger.free(attempt.name)  # removed, or not ours: it holds no GPU of ours
            raise
        self.outputs.watch(attempt)
        return handle

    def poll(self, handle: Handle) -> Observation:
        try:
            info = self._api().inspect_container(_ref(handle))
        except NotFound:
            self.ledger.free(str(handle["name"]))
            return Observation(
                AttemptPhase.LOST, f"container {handle['name']} is gone from the engine"
            )
        state = info["State"]
        status = state.get("Status", "")
        if status not in _LIVE:  # exited, dead, being removed: its GPUs are free again
            self.ledger.free(str(handle["name"]))
        if status == "created":
            return Observation(AttemptPhase.PROVISIONING, "container created, not started yet")
        checkpoint = self.outputs.checkpoint(str(handle["name"]))
        if status in _RUNNING:
            return Observation(AttemptPhase.RUNNING, checkpoint=checkpoint)
        if status == "removing":
            return Observation(AttemptPhase.LOST, f"container {handle['name']} is being removed")
        code = int(state.get("ExitCode", -1))
        if state.get("OOMKilled"):
            return Observation(AttemptPhase.FAILED, "killed: out of memory (OOMKilled)", code)
        if code == 0 and status == "exited":
            return Observation(AttemptPhase.SUCCEEDED, "exited with status 0", 0)
        reason = f"exited with status {code}"
        if code > 128:
            reason += f" (signal {code - 128})"
        if state.get("Error"):
            reason += f": {_one_line(state['Error'])}"
        return Observation(AttemptPhase.FAILED, reason, code, checkpoint=checkpoint)

    def stop(self, handle: Handle, deadline: float) -> None:
        """The job's stop signal (SIGTERM unless it chose another) once, SIGKILL from the
        deadline on; never waits (the daemon calls again)."""
        ref = _ref(handle)
        if time.time() >= deadline:
            signal = "SIGKILL"
        elif ref in self._termed:
            return
        else:
            signal = str(handle.get("stop_signal") or "SIGTERM")
        try:
            self._api().kill(ref, signal)
        except NotFound:
            return  # gone already
        except APIError as e:
            if e.status_code != 409:  # 409: not running, nothing to signal
                raise
        if signal != "SIGKILL":
            self._termed.add(ref)

    def delete(self, handle: Handle) -> bool:
        ref = _ref(handle)
        api = self._api()
        try:
            api.remove_container(ref, force=True)
        except NotFound:
            pass
        except APIError as e:
            if e.status_code != 409:  # 409: a removal is in progress already
                raise
        try:
            api.inspect_container(ref)
            return False
        except NotFound:
            if handle.get("name") and not self.outputs.release(
                str(handle["name"]), str(handle.get("job") or ""), int(handle.get("attempt") or 0)
            ):
                return False  # its watcher's final sync is under way: asked again next cycle
            self.ledger.free(str(handle.get("name") or ""))
            self._termed.discard(ref)
            self.output.forget(ref)
            if handle.get("name"):  # the extracted tar bundle, if it had one
                shutil.rmtree(os.path.join(self.code_dir, str(handle["name"])), ignore_errors=True)
            return True

    def list_owned(self) -> list[Owned]:
        found = self._api().containers(all=True, filters={"label": f"bastion.root={self.tag}"})
        # Labelled as this root's: ours, even without an attempt label (made by hand or by
        # another tool); its container name stands in for the attempt name then.
        return [
            Owned(_handle(c)["name"], _handle(c), finished=c["State"] not in _LIVE) for c in found
        ]

    def read_output(self, handle: Handle, offset: int, limit: int) -> bytes:
        """Bytes ``offset`` to ``offset + limit`` of the container's stdout and stderr (see
        docker_logs.OutputReader: the engine starts a log only at a time, not at a byte)."""
        return self.output.read(_ref(handle), offset, limit)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- internals -------------------------------------------------------------------------

    def _api(self) -> docker.APIClient:
        """The engine's low-level client, made on first use (making it asks the engine)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    try:
                        if self.docker_host:
                            self._client = docker.DockerClient(
                                base_url=self.docker_host, timeout=_CLIENT_TIMEOUT
                            )
                        else:
                            self._client = docker.from_env(timeout=_CLIENT_TIMEOUT)
                    except (DockerException, requests.RequestException) as e:
                        raise RunnerError(engine_unreachable(self.docker_host, e)) from e
        return self._client.api

    def _code(self, attempt: Attempt) -> str | None:
        """Where a tar bundle is extracted for the container (mounted at the same path)."""
        if (attempt.bundle or {}).get("kind") != "tar":
            return None
        return os.path.join(self.code_dir, attempt.name)

    def _unpack(self, attempt: Attempt) -> None:
        """A tar bundle is fetched, verified and extracted on the host, then mounted: the job
        runs inside its code as with the local runner."""
        code = self._code(attempt)
        if code is None:
            return
        from bastion.bucket.store import Store
        from bundlers import Bundle, BundleError, fetch

        try:
            os.makedirs(code, exist_ok=True)
            fetch(Bundle.from_json(dict(attempt.bundle or {})), Store(self.root), code)
        except BundleError as e:  # a digest that does not match will not match next time
            raise StartRefused(str(e)) from None

    def _container_spec(
        self, attempt: Attempt, options: Mapping[str, Any], gpus: list[int]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The arguments of ``create_container`` and of its host config."""
        bundle = attempt.bundle or {}
        built = bundle.get("uri") if bundle.get("kind") in ("docker", "cloudbuild") else None
        image = options.get("image") or built or self.image  # an image bundle is run by digest
        if not image:
            raise RunnerError(
                "the job names no image (runner option 'image') and the docker runner has no "
                "default image (setting 'image')"
            )
        labels = {
            **{str(k): str(v) for k, v in attempt.labels.items()},
            "bastion.root": self.tag,
            "bastion.job": attempt.job,
            "bastion.attempt": str(attempt.attempt),
            "bastion.name": attempt.name,
            "bastion.stop_signal": _stop_signal(attempt),
        }
        # tini (init) signals the whole process group, as the local runner does.
        env = {**options.get("env", {}), **attempt.env, "TINI_KILL_PROCESS_GROUP": "1"}
        code = self._code(attempt)
        host_config: dict[str, Any] = {
            "network_mode": options.get("network") or self.network,
            "binds": self.mounts
            + list(options.get("mounts", []))
            + ([f"{code}:{code}:rw"] if code else [])
            + ([self.outputs.bind(attempt.name)] if "BASTION_OUTPUT_DIR" in attempt.env else []),
            "init": True,
        }
        if gpus:
            labels["bastion.gpus"] = ",".join(map(str, gpus))
            # The container sees only its GPUs, numbered from 0 as on a host of that size.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(len(gpus))))
            host_config["device_requests"] = [
                DeviceRequest(device_ids=[str(g) for g in gpus], capabilities=[["gpu"]])
            ]
        if "shm_size" in options:
            host_config["shm_size"] = options["shm_size"]
        create = {
            "image": image,
            "entrypoint": ["/bin/sh", "-c"],  # replaces the image's, if any
            "command": [wrapper(_stop_signal(attempt)), "bastion", attempt.command],
            "name": attempt.name,
            "labels": labels,
            "environment": env,
            "user": options.get("user"),
            "working_dir": options.get("workdir") or self._code(attempt),
            "detach": True,
            "stop_signal": _stop_signal(attempt),
            "use_config_proxy": False,  # no proxies from ~/.docker/config.json
        }
        return create, host_config

    def _create(self, create: dict[str, Any], host_config: dict[str, Any]) -> str | None:
        """The new container's id; None when the name is taken (a create whose answer was
        lost). A missing image is pulled once, then the create is tried again."""
        api = self._api()
        create = {**create, "host_config": api.create_host_config(**host_config)}
        image = create["image"]
        try:
            return _create_once(api, create)
        except ImageNotFound:
            pass
        try:
            api.pull(image)  # "repo" alone pulls "repo:latest"
        except (APIError, requests.RequestException) as e:
            raise StartRefused(
                f"image {image} not found locally or in its registry: {_one_line(e)}"
            ) from e
        return _create_once(api, create)

    def _start(self, container_id: str, name: str, remove_on_failure: bool) -> None:
        try:
            self._api().start(container_id)
        except APIError as e:
            # It will never run (no such GPU driver, a bad bind): leave nothing behind.
            if remove_on_failure:
                with contextlib.suppress(APIError):
                    self._api().remove_container(container_id, force=True)
            # The engine refused to run it (no such entrypoint, exec's E2BIG, a bad bind): the
            # same container is refused again.
            raise StartRefused(f"docker could not start {name}: {_one_line(e)}") from e

    def _adopt(self, name: str) -> Handle:
        """A 409 on create: the container exists. Ours (a lost answer, a daemon killed after
        the create) when its labels name this root; anything else is a name clash."""
        back = read_back(
            lambda: self._inspect_or_none(name),
            lambda found: (found["Config"].get("Labels") or {}).get("bastion.root") == self.tag,
        )
        info = back.found
        if info is None:  # removed between our create and this look
            raise RunnerError(f"container {name} vanished while it was being adopted")
        labels = info["Config"].get("Labels") or {}
        if not back.ours:
            raise RunnerError(
                f"a container named {name} exists but is not this daemon's "
                f"(bastion.root={labels.get('bastion.root')!r}, ours is {self.tag!r})"
            )
        if info["State"].get("Status") == "created":  # created, then the daemon died
            self._start(info["Id"], name, remove_on_failure=False)
        return _handle({"Id": info["Id"], "Labels": labels})

    def _inspect_or_none(self, name: str) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = self._api().inspect_container(name)
        except NotFound:
            return None
        return info

    def _allocate_gpus(self, name: str, count: int) -> list[int]:
        """``count`` GPUs no live container of any Bastion daemon on this engine holds."""
        if count <= 0:
            return []
        if self._gpus is None:
            from bastion.runners.local import detect_gpus

            self._gpus = detect_gpus()
        busy: set[int] = set()  # (other daemons' containers: the ledger knows only ours)
        for c in self._api().containers(all=True, filters={"label": "bastion.gpus"}):
            if c["State"] in _LIVE and c["Labels"].get("bastion.name") != name:
                busy.update(_parse_gpus(c["Labels"]["bastion.gpus"]))
        return self.ledger.allocate(name, count, self._gpus, "this docker runner", busy=busy)

    def _holding(self) -> list[tuple[str, list[int]]]:
        """For the ledger: the GPUs that this root's live containers hold (their labels)."""
        return [(o.name, list(o.handle["gpus"])) for o in self.list_owned() if not o.finished]

    def _log_lines(self, ref: str, since_ns: int) -> Iterator[tuple[int, bytes]]:
        """(stamp in ns, bytes) per log line. Each line is one frame of the engine's stream, so
        a line without a newline (a 16 KiB piece, the last one) is never confused with the
        next line's stamp."""
        since = max(since_ns / 1e9 - 1e-6, 0.0) or None  # the float loses ns: ask a bit earlier
        stream = self._api().logs(
            ref, stdout=True, stderr=True, timestamps=True, stream=True, follow=False, since=since
        )
        try:
            for frame in stream:
                stamp, _, line = frame.partition(b" ")
                yield parse_stamp(stamp), line
        finally:
            stream.close()


def _create_once(api: docker.APIClient, create: dict[str, Any]) -> str | None:
    try:
        return api.create_container(**create)["Id"]
    except APIError as e:
        if e.status_code == 409:
            return None
        raise


def _check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise RunnerError(
            f"runner option(s) {', '.join(unknown)} not understood by the docker runner; "
            f"it takes {', '.join(sorted(OPTIONS))}"
        )
    checked = dict(options)
    env = checked.get("env", {})
    if not isinstance(env, Mapping):
        raise RunnerError("runner option 'env' must be a mapping of names to strings")
    checked["env"] = {str(k): str(v) for k, v in env.items()}
    mounts = checked.get("mounts", [])
    if isinstance(mounts, str) or not all(isinstance(m, str) and ":" in m for m in mounts):
        raise RunnerError("runner option 'mounts' must be a list of 'host:container[:ro]'")
    for key in ("image", "network", "user", "workdir"):
        if key in checked and not isinstance(checked[key], str):
            raise RunnerError(f"runner option {key!r} must be a string")
    return checked


def _ref(handle: Handle) -> str:
    return str(handle.get("id") or handle["name"])


def _handle(summary: Mapping[str, Any]) -> Handle:
    labels = summary.get("Labels") or {}
    names = [n.lstrip("/") for n in summary.get("Names") or []]
    return {
        "kind": DockerRunner.kind,
        "name": labels.get("bastion.name") or (names[0] if names else summary["Id"]),
        "id": summary["Id"],
        "gpus": _parse_gpus(labels.get("bastion.gpus", "")),
        "stop_signal": labels.get("bastion.stop_signal") or "SIGTERM",
        "job": labels.get("bastion.job") or "",
        "attempt": int(labels.get("bastion.attempt", ""))
        if labels.get("bastion.attempt", "").isdigit()
        else 0,
    }


# The container's first process. The job's own shell runs in the foreground, so the trap on
# the stop signal runs only once that shell has ended (POSIX defers it), whatever the shell
# died of; then the wait for every process but tini (pid 1) and this one. The trap's handler is
# reset to the default in the job's processes: they get the signal as before. Without a stop,
# leftovers are not waited for (the container ends with the job, as it always did).
_WRAPPER = (
    'trap "stopped=1" {signal}; /bin/sh -c "$1"; status=$?; '
    "others() {{ for p in /proc/[0-9]*; do case ${{p#/proc/}} in 1|$$) ;; *) return 0 ;; esac; "
    "done; return 1; }}; "
    'if [ -n "${{stopped:-}}" ]; then while others; do sleep 0.1; done; fi; exit $status'
)


def wrapper(stop_signal: str) -> str:
    """The script the container's shell runs with the job's command as ``$1``."""
    return _WRAPPER.format(signal=stop_signal.removeprefix("SIG"))


def _stop_signal(attempt: Attempt) -> str:
    """The engine's name of the job's stop signal (``SIGUSR1``); SIGTERM by default."""
    return "SIG" + (attempt.env.get("BASTION_STOP_SIGNAL") or "TERM").upper().removeprefix("SIG")


def _parse_gpus(label: str) -> list[int]:
    return [int(g) for g in label.split(",") if g.strip().isdigit()]


def _one_line(error: object) -> str:
    text = getattr(error, "explanation", None) or str(error)
    return " ".join(str(text).split())

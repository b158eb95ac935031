"""Cloud Build API v1 stand-in (Google's API documentation) for the real googleapiclient.

    server = CloudBuildServer(polls_per_tick=1).start()
    cb = discovery.build("cloudbuild", "v1", static_discovery=True,
                         credentials=AnonymousCredentials(),
                         client_options={"api_endpoint": server.endpoint})

Routes: ``projects.builds.create`` (also ``projects.locations.builds.create``) answers an
Operation ``operations/build/P/<base64(build id)>`` whose metadata carries the QUEUED Build;
``builds.get``, ``builds.list`` (``filter`` on ``tags``, ``status``, ``results.images.name``,
``images``; list fields match when any element does; ``pageSize``/``pageToken``),
``builds.cancel`` and ``operations.get``.

Virtual time (see common.py): per tick a QUEUED build starts (WORKING, ``startTime``) after
``queue_ticks``, and a WORKING one finishes after ``work_ticks``: SUCCESS with
``results.images[{name, digest}]`` for every entry of ``images`` and step statuses; the operation
is then done with the Build as its response (an ``error`` too when the build failed).

Digests are deterministic fakes (``sha256`` of the build id and the image name) unless an
``executor(build) -> {image name: digest}`` is given, which may run the steps for real; an
executor that raises fails the build (FAILURE, ``USER_BUILD_STEP``, the exception as detail).

Injections, for the next build created (or a given build id):
``fail(status, detail=...)`` with status FAILURE (``failureInfo.type`` USER_BUILD_STEP, or
``failure_type``), INTERNAL_ERROR, TIMEOUT (stays WORKING until ``timeout`` has passed in virtual
time), EXPIRED (stays QUEUED until ``queueTtl`` has passed), CANCELLED (cancelled while working,
as ``gcloud builds cancel`` would); and (common) ``rate_limit(n)``, ``transient_5xx(n)``.
"""

from __future__ import annotations

import base64
import hashlib
import re
import uuid

from .common import (
    ApiError,
    StandinServer,
    camel_keys,
    paginate,
    parse_filter,
    public,
    rpc_error,
    virtual_seconds,
)

BUILD_T = "type.googleapis.com/google.devtools.cloudbuild.v1.Build"
META_T = "type.googleapis.com/google.devtools.cloudbuild.v1.BuildOperationMetadata"
TERMINAL = ("SUCCESS", "FAILURE", "INTERNAL_ERROR", "TIMEOUT", "CANCELLED", "EXPIRED")
FAILURES = ("FAILURE", "INTERNAL_ERROR", "TIMEOUT", "CANCELLED", "EXPIRED")
TAG = re.compile(r"[\w][\w.-]{0,127}")
_OP_CODES = {"FAILURE": 2, "INTERNAL_ERROR": 13, "TIMEOUT": 4, "CANCELLED": 1, "EXPIRED": 4}
_DETAIL = {
    "FAILURE": 'Build step failure: build step 0 "gcr.io/cloud-builders/docker" failed: step '
    "exited with non-zero status: 1",
    "INTERNAL_ERROR": "Internal error: the build could not be completed; retry the build.",
    "TIMEOUT": "Build timeout exceeded.",
    "EXPIRED": "Build expired: it stayed in the queue longer than its queueTtl.",
    "CANCELLED": "Build was cancelled.",
}


def _duration(text: str | None, default: float) -> float:
    if not text:
        return default
    return float(str(text).rstrip("s"))


def _expand(record: dict, path: tuple[str, ...]) -> list[dict]:
    """Variants of ``record`` with the list at ``path`` replaced by each of its elements, so a
    scalar filter ``tags = x`` matches when any tag is x."""
    cur = record
    for part in path[:-1]:
        cur = cur.get(part) if isinstance(cur, dict) else None
    values = cur.get(path[-1]) if isinstance(cur, dict) else None
    if not isinstance(values, list) or not values:
        return [record]
    out = []
    for value in values:
        copy = dict(record)
        node = copy
        for part in path[:-1]:
            node[part] = dict(node[part])
            node = node[part]
        node[path[-1]] = value
        out.append(copy)
    return out


class CloudBuildServer(StandinServer):
    routes = [
        ("POST", r"/v1/projects/([^/]+)/builds", "_create"),
        ("POST", r"/v1/projects/([^/]+)/locations/[^/]+/builds", "_create"),
        ("GET", r"/v1/projects/([^/]+)/builds", "_list"),
        ("GET", r"/v1/projects/([^/]+)/builds/([^/:]+)", "_get"),
        ("POST", r"/v1/projects/([^/]+)/builds/([^/:]+):cancel", "_cancel"),
        ("GET", r"/v1/(operations/build/[^/]+/[^/]+)", "_get_op"),
    ]

    def __init__(self, queue_ticks: int = 1, work_ticks: int = 1, executor=None, **kw):
        super().__init__(**kw)
        self.queue_ticks, self.work_ticks, self.executor = queue_ticks, work_ticks, executor
        self.builds: dict[str, dict] = {}  # id -> Build (+ private keys)
        self.ops: dict[str, dict] = {}
        self._next_fault: tuple[str, str | None, str] | None = None

    # --- injections -------------------------------------------------------------------------
    def fail(
        self,
        status: str,
        detail: str | None = None,
        build_id: str | None = None,
        failure_type: str = "USER_BUILD_STEP",
    ):
        """The next build created (or ``build_id``) ends with ``status`` (one of FAILURES)."""
        if status not in FAILURES:
            raise ValueError(f"{status} is not one of {FAILURES}")
        with self.lock:
            if build_id is None:
                self._next_fault = (status, detail, failure_type)
            else:
                self.builds[build_id]["_fault"] = (status, detail, failure_type)

    def created(self) -> list[dict]:
        """Every build created, oldest first (public fields only)."""
        with self.lock:
            return [public(b) for b in self.builds.values()]

    # --- helpers ----------------------------------------------------------------------------
    def _rate_limit_error(self) -> ApiError:
        return rpc_error(
            429,
            "RESOURCE_EXHAUSTED",
            "Quota exceeded for quota metric "
            "'Build requests' of service 'cloudbuild.googleapis.com'.",
        )

    def _unavailable_error(self) -> ApiError:
        return rpc_error(503, "UNAVAILABLE", "The service is currently unavailable.")

    def _build(self, project: str, build_id: str) -> dict:
        build = self.builds.get(build_id)
        if build is None or build["projectId"] != project:
            raise rpc_error(404, "NOT_FOUND", "Requested entity was not found.")
        return build

    @staticmethod
    def op_name(project: str, build_id: str) -> str:
        return f"operations/build/{project}/{base64.b64encode(build_id.encode()).decode()}"

    # --- routes -----------------------------------------------------------------------------
    def _create(self, project, query, body):
        body = camel_keys(body)
        steps = body.get("steps") or []
        if not steps or any(not isinstance(s, dict) or not s.get("name") for s in steps):
            raise rpc_error(
                400,
                "INVALID_ARGUMENT",
                "invalid build: a build must have at least one step, and every step a name",
            )
        for tag in body.get("tags") or []:
            if not TAG.fullmatch(str(tag)):
                raise rpc_error(
                    400,
                    "INVALID_ARGUMENT",
                    f"invalid build: invalid build tag "
                    f'"{tag}": must match format "^[\\w][\\w.-]{{0,127}}$"',
                )
        storage = (body.get("source") or {}).get("storageSource")
        if storage is not None and not (storage.get("bucket") and storage.get("object")):
            raise rpc_error(
                400, "INVALID_ARGUMENT", "invalid build: storageSource needs a bucket and an object"
            )
        build_id = str(uuid.uuid4())
        build = {
            **body,
            "id": build_id,
            "projectId": project,
            "status": "QUEUED",
            "createTime": self.now(),
            "timeout": body.get("timeout") or "3600s",
            "queueTtl": body.get("queueTtl") or "3600s",
            "logUrl": f"https://console.cloud.google.com/cloud-build/builds/{build_id}"
            f"?project={project}",
            "logsBucket": f"gs://{project}_cloudbuild/logs",
            "name": f"projects/{project}/locations/global/builds/{build_id}",
            "_ticks": 0,
            "_fault": self._next_fault,
        }
        self._next_fault = None
        self.builds[build_id] = build
        op = {
            "name": self.op_name(project, build_id),
            "done": False,
            "metadata": {"@type": META_T, "build": public(build)},
        }
        self.ops[op["name"]] = op
        return 200, op

    def _get(self, project, build_id, query, body):
        return 200, public(self._build(project, build_id))

    def _list(self, project, query, body):
        pred = parse_filter(query.get("filter"))
        hits = []
        for build in sorted(self.builds.values(), key=lambda b: b["createTime"], reverse=True):
            if build["projectId"] != project:
                continue
            record = public(build)
            variants = [record]
            for path in (("tags",), ("images",), ("results", "images")):
                variants = [v for r in variants for v in _expand(r, path)]
            if any(pred(v) for v in variants):
                hits.append(record)
        page, token = paginate(hits, int(query.get("pageSize") or 0), query.get("pageToken"))
        answer = {"builds": page}
        if token:
            answer["nextPageToken"] = token
        return 200, answer

    def _cancel(self, project, build_id, query, body):
        build = self._build(project, build_id)
        if build["status"] not in TERMINAL:
            self._end(build, "CANCELLED", None, None)
        return 200, public(build)

    def _get_op(self, name, query, body):
        op = self.ops.get(name)
        if op is None:
            raise rpc_error(404, "NOT_FOUND", "Requested entity was not found.")
        build = self.builds[op["metadata"]["build"]["id"]]
        op["metadata"]["build"] = public(build)
        return 200, op

    # --- the state machine ------------------------------------------------------------------
    def _step(self):
        for build in self.builds.values():
            status = build["status"]
            if status in TERMINAL:
                continue
            build["_ticks"] += 1
            fault = build["_fault"]
            outcome = fault[0] if fault else None
            if status == "QUEUED":
                if outcome == "EXPIRED":
                    ttl = _duration(build["queueTtl"], 3600)
                    if self.clock - virtual_seconds(build["createTime"]) >= ttl:
                        self._end(build, "EXPIRED", fault[1], None)
                elif build["_ticks"] >= self.queue_ticks:
                    build["status"], build["startTime"], build["_ticks"] = "WORKING", self.now(), 0
                continue
            if outcome == "TIMEOUT":
                if self.clock - virtual_seconds(build["startTime"]) >= _duration(
                    build["timeout"], 3600
                ):
                    self._end(build, "TIMEOUT", fault[1], None)
                continue
            if build["_ticks"] < self.work_ticks:
                continue
            if outcome in ("FAILURE", "INTERNAL_ERROR", "CANCELLED"):
                self._end(build, outcome, fault[1], fault[2])
                continue
            try:
                digests = self._digests(build)
            except Exception as e:  # the executor's step failed
                failure_type = getattr(e, "failure_type", "USER_BUILD_STEP")
                self._end(build, "FAILURE", f"Build step failure: {e}", failure_type)
                continue
            build["results"] = {
                "images": [
                    {"name": name, "digest": digests[name]} for name in build.get("images") or []
                ]
            }
            self._end(build, "SUCCESS", None, None)

    def _digests(self, build: dict) -> dict[str, str]:
        if self.executor is not None:
            return self.executor(public(build))
        return {
            name: "sha256:" + hashlib.sha256(f"{build['id']}/{name}".encode()).hexdigest()
            for name in build.get("images") or []
        }

    def _end(self, build: dict, status: str, detail: str | None, failure_type: str | None):
        build["status"] = status
        build["finishTime"] = self.now()
        build.setdefault("startTime", build["finishTime"])
        for step in build.get("steps") or []:
            step["status"] = "SUCCESS" if status == "SUCCESS" else status
        if status != "SUCCESS":
            build["statusDetail"] = detail or _DETAIL[status]
            if status == "FAILURE":
                build["failureInfo"] = {
                    "type": failure_type or "USER_BUILD_STEP",
                    "detail": build["statusDetail"],
                }
        op = self.ops[self.op_name(build["projectId"], build["id"])]
        op["done"] = True
        op["metadata"]["build"] = public(build)
        if status == "SUCCESS":
            op["response"] = {"@type": BUILD_T, **public(build)}
        else:  # an Operation has a response or an error, never both
            op["error"] = {
                "code": _OP_CODES[status],
                "message": f"Build {status.lower()}: {build['statusDetail']}",
            }


class StepFailed(RuntimeError):
    def __init__(self, message: str, failure_type: str = "USER_BUILD_STEP"):
        super().__init__(message)
        self.failure_type = failure_type


class DockerExecutor:
    """Runs a build's ``gcr.io/cloud-builders/docker`` steps on a real engine, so the stand-in
    records true digests: ``build`` (``-f``, ``-t``, ``--build-arg``, ``--label``, ``--target``,
    ``--platform``, context ``.``) from the storageSource tarball, ``push``; then every entry of
    ``images`` is pushed (as Cloud Build does) and its registry digest returned.

    ``client``: a docker.DockerClient; ``fetch_source(bucket, object) -> bytes``. Use as
    ``CloudBuildServer(executor=DockerExecutor(client, fetch))``. A failing step raises, which the
    stand-in turns into FAILURE/USER_BUILD_STEP with the step's last log line as detail."""

    def __init__(self, client, fetch_source):
        self.client, self.fetch_source = client, fetch_source

    def __call__(self, build: dict) -> dict[str, str]:
        import io

        storage = build["source"]["storageSource"]
        context = self.fetch_source(storage["bucket"], storage["object"])
        for index, step in enumerate(build["steps"]):
            if step["name"] != "gcr.io/cloud-builders/docker":
                raise StepFailed(f"build step {index} {step['name']!r}: not supported here")
            args = list(step.get("args") or [])
            if args[:1] == ["build"]:
                self._build(index, args[1:], io.BytesIO(context))
            elif args[:1] == ["push"]:
                self._push(index, args[1])
            else:
                raise StepFailed(f"build step {index}: docker {args[:1]} is not supported here")
        return {name: self._push(len(build["steps"]), name) for name in build.get("images") or []}

    def _build(self, index: int, args: list[str], context) -> None:
        kw: dict = {"buildargs": {}, "labels": {}}
        names = {
            "-f": "dockerfile",
            "--file": "dockerfile",
            "-t": "tag",
            "--tag": "tag",
            "--target": "target",
            "--platform": "platform",
        }
        it = iter(args)
        for arg in it:
            if arg in names:
                kw[names[arg]] = next(it)
            elif arg in ("--build-arg", "--label"):
                key, _, value = next(it).partition("=")
                kw["buildargs" if arg == "--build-arg" else "labels"][key] = value
            elif arg != ".":
                raise StepFailed(f"build step {index}: docker build {arg} is not supported here")
        last = ""
        for chunk in self.client.api.build(
            fileobj=context, custom_context=True, rm=True, decode=True, **kw
        ):
            last = (chunk.get("stream") or "").strip() or last
            if "error" in chunk:
                raise StepFailed(
                    f'build step {index} "gcr.io/cloud-builders/docker" failed: '
                    f"{chunk['error'].strip()} (after: {last})"
                )

    def _push(self, index: int, ref: str) -> str:
        repository, _, tag = ref.rpartition(":")
        if "/" in tag:  # no tag, the colon was the registry's port
            repository, tag = ref, "latest"
        digest = None
        for chunk in self.client.api.push(repository, tag=tag, stream=True, decode=True):
            if "error" in chunk:
                raise StepFailed(f"pushing {ref} failed: {chunk['error']}", "PUSH_FAILED")
            aux = chunk.get("aux") or {}
            digest = aux.get("Digest") or digest
        if not digest:
            raise StepFailed(f"pushing {ref} gave no digest")
        return digest

"""The cloudbuild bundler: the source as the tar bundle, built and pushed by Cloud Build.

The source directory is bundled exactly as the tar bundler does (same excludes, content-addressed
``ROOT/bundles/sha256-<hex>.tar.gz``, uploaded only if absent), so the root must be on gs://;
Cloud Build gets that object as ``source.storageSource``. ``projects.builds.create`` (through
googleapiclient with its bundled discovery document) runs ``docker build`` and ``docker push``
of ``REPO/IMAGE:TAG``, lists the image in ``images`` (so Cloud Build records its digest) and tags
the build with ``name`` (the job name; default the image name) so it can be found later with
``builds.list(filter='tags="NAME"')``. The bundler then polls ``builds.get`` until the build
leaves QUEUED/WORKING; SUCCESS gives ``results.images[].digest``; any other end (FAILURE,
INTERNAL_ERROR, TIMEOUT, CANCELLED, EXPIRED) is a BundleError with the build's status, its
``failureInfo``/``statusDetail`` and its ``logUrl``.

Options: those of the docker bundler (``repo``, ``dockerfile``, ``image``, ``tag``,
``allow_dirty``, ``build_arg``, ``platform``, ``target``, ``exclude``, ``max_bytes``; not
``docker_host``), plus ``project`` (default ``$GOOGLE_CLOUD_PROJECT``, else the default
credentials' project), ``name`` (the build's tag), ``timeout`` (the build's, seconds, default
3600), ``wait`` (how long to wait for the build to end, seconds, default timeout + 3600 for the
queue), ``poll_interval`` (seconds, default 10), ``api_endpoint`` (default
``$BASTION_CLOUDBUILD_API_ENDPOINT``; with an explicit endpoint the client sends anonymous
credentials, as a stand-in or emulator wants; otherwise ``google.auth.default``).

Record: ``Bundle(kind="cloudbuild", uri="REPO/IMAGE@sha256:...", digest=results.images' digest,
size=0 (Cloud Build does not report an image's size), git_commit, git_dirty)``.
``dry_run``: bundles the source without uploading it, creates no build, and returns a record
whose ``uri`` is the ``REPO/IMAGE:TAG`` it would push, with ``digest=""``.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from bundlers.base import Bundle, BundleError, Bundler
from bundlers.docker import OPTIONS as DOCKER_OPTIONS
from bundlers.docker import ImageSpec, check_options, image_digest_hex, image_spec
from bundlers.tar import TarBundler, collect, parse_excludes

OPTIONS = (
    *(o for o in DOCKER_OPTIONS if o != "docker_host"),
    "project",
    "name",
    "timeout",
    "wait",
    "poll_interval",
    "api_endpoint",
)
ENDPOINT_ENV = "BASTION_CLOUDBUILD_API_ENDPOINT"
DOCKER_STEP = "gcr.io/cloud-builders/docker"
PENDING = ("STATUS_UNKNOWN", "PENDING", "QUEUED", "WORKING")
FAILED = ("FAILURE", "INTERNAL_ERROR", "TIMEOUT", "CANCELLED", "EXPIRED")
_BUILD_TAG = re.compile(r"[\w][\w.-]{0,127}")


class CloudBuildBundler(Bundler):
    kind = "cloudbuild"

    def __init__(self, sleep=time.sleep, clock=time.monotonic) -> None:
        self._sleep, self._clock = sleep, clock

    def bundle(
        self, source_dir: str, store: Any, options: Mapping[str, Any], dry_run: bool = False
    ) -> Bundle:
        check_options(self.kind, options, OPTIONS)
        spec = image_spec(self.kind, source_dir, options)
        timeout = _seconds(options, "timeout", 3600)
        wait = _seconds(options, "wait", timeout + 3600)
        poll = _seconds(options, "poll_interval", 10, zero_ok=True)
        build_tag = _build_tag(str(options.get("name") or "").strip() or spec.image)
        tar_options = {k: options[k] for k in ("exclude", "max_bytes") if k in options}
        if not dry_run:  # before uploading anything: Cloud Build can only fetch from gs://
            _gcs_object(store.bundles.url("sha256:" + "0" * 64))
        root = os.path.realpath(source_dir)
        if spec.dockerfile not in {
            e.name for e in collect(root, parse_excludes(options.get("exclude")))
        }:
            raise BundleError(
                f"{spec.dockerfile} is left out of the source bundle (by .gitignore or "
                "--bundler_exclude), so Cloud Build would not find it; stop ignoring it"
            )
        source = TarBundler().bundle(source_dir, store, tar_options, dry_run=dry_run)
        if dry_run:
            return Bundle(self.kind, spec.ref, "", 0, spec.git_commit, spec.git_dirty)
        bucket, obj = _gcs_object(source.uri)
        project = _project(options)
        endpoint = str(options.get("api_endpoint") or os.environ.get(ENDPOINT_ENV) or "").strip()
        builds = _client(endpoint).projects().builds()
        body = build_body(spec, bucket, obj, build_tag, timeout)
        try:
            op = builds.create(projectId=project, body=body).execute(num_retries=3)
        except Exception as e:
            raise BundleError(f"Cloud Build refused the build of {spec.ref}: {_why(e)}") from None
        build_id = ((op.get("metadata") or {}).get("build") or {}).get("id")
        if not build_id:
            raise BundleError(f"Cloud Build's answer names no build: {op}")
        build = self._wait(builds, project, build_id, wait, poll, spec)
        digest = _digest_of(build, spec)
        return Bundle(
            self.kind, f"{spec.repository}@{digest}", digest, 0, spec.git_commit, spec.git_dirty
        )

    def _wait(
        self, builds: Any, project: str, build_id: str, wait: float, poll: float, spec: ImageSpec
    ) -> dict[str, Any]:
        deadline = self._clock() + wait
        failures = 0
        build: dict[str, Any] = {}
        while True:
            try:
                build = builds.get(projectId=project, id=build_id).execute(num_retries=3)
                failures = 0
            except Exception as e:  # after the client's own retries: tolerate a few more
                failures += 1
                if failures > 5:
                    raise BundleError(
                        f"lost track of Cloud Build build {build_id} of {spec.ref}: {_why(e)}"
                    ) from None
                build = build or {}
            status = build.get("status", "STATUS_UNKNOWN")
            if status == "SUCCESS":
                return build
            if status in FAILED:
                raise BundleError(_failure(build, spec))
            if self._clock() >= deadline:
                with contextlib.suppress(Exception):  # best effort: the message says so
                    builds.cancel(projectId=project, id=build_id, body={}).execute()
                raise BundleError(
                    f"Cloud Build build {build_id} of {spec.ref} was still {status} after "
                    f"{wait:.0f} s, so it was cancelled; raise --bundler_spec=wait=SECONDS. "
                    f"Logs: {build.get('logUrl', '(no log URL)')}"
                )
            self._sleep(poll)


def build_body(spec: ImageSpec, bucket: str, obj: str, build_tag: str, timeout: float) -> dict:
    args = ["build", "-f", spec.dockerfile, "-t", spec.ref]
    for key, value in spec.build_args.items():
        args += ["--build-arg", f"{key}={value}"]
    for key, value in spec.labels().items():
        args += ["--label", f"{key}={value}"]
    if spec.platform:
        args += ["--platform", spec.platform]
    if spec.target:
        args += ["--target", spec.target]
    args.append(".")
    return {
        "source": {"storageSource": {"bucket": bucket, "object": obj}},
        "steps": [
            {"name": DOCKER_STEP, "id": "build", "args": args},
            {"name": DOCKER_STEP, "id": "push", "args": ["push", spec.ref]},
        ],
        "images": [spec.ref],
        "tags": [build_tag],
        "timeout": f"{int(timeout)}s",
    }


def _digest_of(build: dict[str, Any], spec: ImageSpec) -> str:
    images = (build.get("results") or {}).get("images") or []
    for image in images:
        if image.get("name") in (spec.ref, spec.repository) and image.get("digest"):
            digest = image["digest"]
            image_digest_hex(digest)
            return digest
    raise BundleError(
        f"Cloud Build build {build.get('id')} succeeded but recorded no digest for {spec.ref} "
        f"(results.images: {images}); logs: {build.get('logUrl', '(no log URL)')}"
    )


def _failure(build: dict[str, Any], spec: ImageSpec) -> str:
    status = build.get("status")
    info = build.get("failureInfo") or {}
    reasons = [r for r in (info.get("type"), info.get("detail"), build.get("statusDetail")) if r]
    reasons = list(dict.fromkeys(reasons))  # detail and statusDetail are often the same
    why = ": " + "; ".join(reasons) if reasons else ""
    hint = {
        "TIMEOUT": " (raise --bundler_spec=timeout=SECONDS)",
        "EXPIRED": " (it waited in the queue too long; try again, or use a private pool)",
    }.get(str(status), "")
    return (
        f"Cloud Build build {build.get('id')} of {spec.ref} ended {status}{why}{hint}; "
        f"logs: {build.get('logUrl', '(no log URL)')}"
    )


def _seconds(options: Mapping[str, Any], key: str, default: float, zero_ok=False) -> float:
    value = options.get(key)
    if value in (None, ""):
        return float(default)
    try:
        seconds = float(str(value).rstrip("s"))
    except ValueError:
        seconds = -1.0
    if seconds < 0 or (seconds == 0 and not zero_ok):
        raise BundleError(f"--bundler_spec={key}={value} is not a number of seconds")
    return seconds


def _build_tag(name: str) -> str:
    tag = re.sub(r"[^\w.-]+", "-", name).lstrip(".-")[:128] or "bastion"
    if not _BUILD_TAG.fullmatch(tag):  # pragma: no cover - the substitution makes it match
        raise BundleError(f"cannot make a Cloud Build tag of {name!r}")
    return tag


def _gcs_object(uri: str) -> tuple[str, str]:
    if not uri.startswith("gs://"):
        raise BundleError(
            f"the cloudbuild bundler needs the bastion root on gs:// so Cloud Build can fetch "
            f"the source; this root stores bundles at {uri}. Use a gs:// root, or build "
            "locally with --bundler=docker"
        )
    bucket, _, obj = uri.removeprefix("gs://").partition("/")
    return bucket, obj


def _project(options: Mapping[str, Any]) -> str:
    project = str(options.get("project") or os.environ.get("GOOGLE_CLOUD_PROJECT") or "").strip()
    if project:
        return project
    try:
        import google.auth

        _, project = google.auth.default()
    except Exception:  # no default credentials: the message below says what to set
        project = None
    if not project:
        raise BundleError(
            "the cloudbuild bundler needs a project: add --bundler_spec=project=PROJECT "
            "(or set GOOGLE_CLOUD_PROJECT)"
        )
    return project


def _client(endpoint: str) -> Any:
    try:
        from googleapiclient import discovery
    except ImportError as e:  # pragma: no cover - a dependency
        raise BundleError(f"the cloudbuild bundler needs google-api-python-client: {e}") from e
    kwargs: dict[str, Any] = {"static_discovery": True, "cache_discovery": False}
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        kwargs["credentials"] = AnonymousCredentials()
        kwargs["client_options"] = {"api_endpoint": endpoint}
    else:
        try:
            import google.auth

            kwargs["credentials"], _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"]
            )
        except Exception as e:
            raise BundleError(
                f"no Google credentials for Cloud Build ({e}); run gcloud auth "
                "application-default login, or set GOOGLE_APPLICATION_CREDENTIALS"
            ) from None
    return discovery.build("cloudbuild", "v1", **kwargs)


def _why(error: Exception) -> str:
    reason = getattr(error, "reason", None) or getattr(error, "_get_reason", lambda: None)()
    status = getattr(getattr(error, "resp", None), "status", None)
    return f"HTTP {status}: {reason}" if status else str(reason or error)

"""The docker bundler: ``docker build`` + ``push`` through the Docker SDK, recorded by digest.

Options (``--bundler_spec=key=value``):

* ``repo`` (required): ``REGISTRY/PATH`` the image goes under, e.g. ``127.0.0.1:5000/team`` or
  ``us-docker.pkg.dev/PROJECT/REPO``.
* ``dockerfile``: relative to the source directory (default ``Dockerfile``).
* ``image``: the image name (default: the source directory's name, lower-cased).
* ``tag``: default the git commit's short hash (``<hash>-dirty`` for an allowed dirty tree),
  ``latest`` outside a git work tree. The tag is only a convenience for humans: the record
  names the image by the digest the registry gave, so a job never runs a tag that moved.
* ``allow_dirty``: build a tree with uncommitted or untracked changes (default false).
* ``build_arg``: comma-separated ``KEY=VALUE`` pairs; ``platform``; ``target``.
* ``docker_host``: the engine (default ``$DOCKER_HOST``, else the local socket).
* ``exclude``, ``max_bytes``: as the tar bundler's, for the build context.

The build context is the tar bundler's canonical tree (same excludes, .gitignore, size limit,
sorted entries and fixed mtimes), so what the image's ``COPY . ...`` sees is exactly what a tar
bundle would ship; the Dockerfile is always sent even if ignored. The image is labelled
``bastion.git-commit``, ``bastion.git-dirty`` and ``bastion.context-digest``.

Record: ``Bundle(kind="docker", uri="REPO/IMAGE@sha256:<manifest digest>", digest=that digest,
size=the image's size in bytes as the engine reports it, git_commit, git_dirty)``.

``dry_run``: builds and pushes nothing (a repo digest exists only once the registry has the
manifest); it checks the options, the Dockerfile and the git state and returns a record whose
``uri`` is the ``REPO/IMAGE:TAG`` it would push, with ``digest=""`` and ``size=0``.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from bundlers.base import Bundle, BundleError, Bundler
from bundlers.tar import (
    Entry,
    _add,
    _HashingWriter,
    check_size,
    collect,
    git_state,
    parse_excludes,
    parse_max_bytes,
)

OPTIONS = (
    "repo",
    "dockerfile",
    "image",
    "tag",
    "allow_dirty",
    "build_arg",
    "platform",
    "target",
    "docker_host",
    "exclude",
    "max_bytes",
)
LOG_TAIL = 20  # build log lines quoted in an error
_REPO = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::\d+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
)
_NAME = re.compile(
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
)
_TAG = re.compile(r"[\w][\w.-]{0,127}")


class ImageSpec(NamedTuple):
    """What to build, checked: shared by the docker and cloudbuild bundlers."""

    repo: str
    image: str
    tag: str
    dockerfile: str  # relative, "/"-separated
    build_args: dict[str, str]
    platform: str | None
    target: str | None
    git_commit: str | None
    git_dirty: bool | None

    @property
    def repository(self) -> str:
        return f"{self.repo}/{self.image}"

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"

    def labels(self) -> dict[str, str]:
        labels = {}
        if self.git_commit is not None:
            labels["bastion.git-commit"] = self.git_commit
        if self.git_dirty is not None:
            labels["bastion.git-dirty"] = "true" if self.git_dirty else "false"
        return labels


def truthy(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value or "").strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise BundleError(f"--bundler_spec={key}={value} is not true or false")


def check_options(kind: str, options: Mapping[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise BundleError(
            f"--bundler_spec={unknown[0]}=... is not an option of the {kind} bundler "
            f"(its options: {', '.join(known)})"
        )


def image_spec(kind: str, source_dir: str, options: Mapping[str, Any]) -> ImageSpec:
    """Check the options, the Dockerfile and the git state (a dirty tree is refused unless
    ``allow_dirty``); BundleError naming the flag or the file otherwise."""
    root = os.path.realpath(source_dir)
    if not os.path.isdir(root):
        raise BundleError(f"{source_dir} is not a directory; run the launch from your project")
    repo = _checked_repo(kind, options)
    image = str(options.get("image") or "").strip() or default_image_name(root)
    if not _NAME.fullmatch(image):
        raise BundleError(
            f"--bundler_spec=image={image} is not an image name (lower-case letters, digits, "
            "'.', '_', '-' and '/')"
        )
    path = _checked_dockerfile(root, source_dir, options)
    commit, dirty = _checked_git_state(root, source_dir, options)
    tag = str(options.get("tag") or "").strip()
    if not tag:
        tag = (commit[:12] + ("-dirty" if dirty else "")) if commit else "latest"
    if not _TAG.fullmatch(tag):
        raise BundleError(f"--bundler_spec=tag={tag} is not a docker tag ([A-Za-z0-9_.-], ≤128)")
    return ImageSpec(
        repo,
        image,
        tag,
        os.path.relpath(path, root).replace(os.sep, "/"),
        parse_build_args(options.get("build_arg")),
        str(options.get("platform") or "").strip() or None,
        str(options.get("target") or "").strip() or None,
        commit,
        dirty,
    )


def _checked_repo(kind: str, options: Mapping[str, Any]) -> str:
    """The registry path of ``--bundler_spec=repo`` (required, REGISTRY/PATH)."""
    repo = str(options.get("repo") or "").strip().rstrip("/")
    if not repo:
        raise BundleError(
            f"the {kind} bundler needs a registry to push to: add "
            "--bundler_spec=repo=REGISTRY/PATH (e.g. --bundler_spec=repo=us-docker.pkg.dev/"
            "PROJECT/REPO, or 127.0.0.1:5000/team for a local registry)"
        )
    if "://" in repo or "@" in repo or not _REPO.fullmatch(repo) or "/" not in repo:
        raise BundleError(
            f"--bundler_spec=repo={repo} is not REGISTRY/PATH (lower case, no scheme, tag or "
            "digest), e.g. us-docker.pkg.dev/PROJECT/REPO or 127.0.0.1:5000/team"
        )
    return repo


def _checked_dockerfile(root: str, source_dir: str, options: Mapping[str, Any]) -> str:
    """The real path of the Dockerfile, which must exist inside the source directory."""
    dockerfile = str(options.get("dockerfile") or "Dockerfile").strip()
    path = os.path.realpath(os.path.join(root, dockerfile))
    if not path.startswith(root + os.sep):
        raise BundleError(
            f"--bundler_spec=dockerfile={dockerfile} is outside {source_dir}; the Dockerfile "
            "must be inside the directory being built"
        )
    if not os.path.isfile(path):
        raise BundleError(
            f"no Dockerfile at {os.path.join(source_dir, dockerfile)}; write one, or name yours "
            "with --bundler_spec=dockerfile=PATH (relative to the source directory)"
        )
    return path


def _checked_git_state(
    root: str, source_dir: str, options: Mapping[str, Any]
) -> tuple[str | None, bool | None]:
    """(commit, dirty); a dirty tree is refused unless ``allow_dirty``: an image must be
    reproducible from its commit."""
    commit, dirty = git_state(root)
    allow_dirty = truthy(options.get("allow_dirty"), "allow_dirty")
    if dirty and not allow_dirty:
        files = dirty_files(root)
        shown = ", ".join(files[:10]) + (f" and {len(files) - 10} more" if len(files) > 10 else "")
        raise BundleError(
            f"{source_dir} has uncommitted changes ({shown}); an image must be reproducible "
            "from its commit, so commit them, or build anyway with "
            "--bundler_spec=allow_dirty=true (the image is then labelled bastion.git-dirty=true)"
        )
    return commit, dirty


def default_image_name(root: str) -> str:
    name = re.sub(r"[^a-z0-9]+", "-", os.path.basename(root).lower()).strip("-")
    return name or "bundle"


def parse_build_args(value: Any) -> dict[str, str]:
    """``KEY=V,KEY2=V2`` (or a mapping) into a dict."""
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    args: dict[str, str] = {}
    for item in str(value or "").split(","):
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise BundleError(
                f"--bundler_spec=build_arg={value}: {item!r} is not KEY=VALUE "
                "(several: --bundler_spec=build_arg=A=1,B=2)"
            )
        args[key.strip()] = val
    return args


def dirty_files(root: str) -> list[str]:
    """The paths ``git status --porcelain`` lists (modified, staged, untracked)."""
    try:
        done = subprocess.run(
            ["git", "status", "--porcelain"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line[3:].strip() for line in done.stdout.splitlines() if line.strip()]


def build_context(source_dir: str, out: Path, options: Mapping[str, Any], dockerfile: str) -> str:
    """The canonical (uncompressed) tar of ``source_dir`` as the tar bundler selects it, with
    the Dockerfile always in; its digest."""
    root = os.path.realpath(source_dir)
    entries = collect(root, parse_excludes(options.get("exclude")))
    check_size(source_dir, entries, parse_max_bytes(options.get("max_bytes")))
    names = {e.name for e in entries}
    if dockerfile not in names:  # ignored or excluded: the builder still needs it
        parts = dockerfile.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent not in names:
                entries.append(Entry(parent, "dir", 0, 0o755))
        entries.append(
            Entry(dockerfile, "file", os.path.getsize(os.path.join(root, dockerfile)), 0o644)
        )
        entries.sort(key=lambda e: e.name)
    with open(out, "wb") as f:
        writer = _HashingWriter(f)
        with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for entry in entries:
                _add(tar, root, entry)
    return "sha256:" + writer.hash.hexdigest()


class DockerBundler(Bundler):
    kind = "docker"

    def bundle(
        self, source_dir: str, store: Any, options: Mapping[str, Any], dry_run: bool = False
    ) -> Bundle:
        check_options(self.kind, options, OPTIONS)
        spec = image_spec(self.kind, source_dir, options)
        if dry_run:
            return Bundle(self.kind, spec.ref, "", 0, spec.git_commit, spec.git_dirty)
        host = str(options.get("docker_host") or os.environ.get("DOCKER_HOST") or "").strip()
        client = docker_client(host)
        try:
            with tempfile.TemporaryDirectory(prefix="bastion-docker-") as tmp:
                context = Path(tmp, "context.tar")
                context_digest = build_context(source_dir, context, options, spec.dockerfile)
                labels = {**spec.labels(), "bastion.context-digest": context_digest}
                with open(context, "rb") as f:
                    image_id = _build(client, spec, f, labels)
            digest = _push(client, spec, image_id)
            size = int(client.api.inspect_image(image_id).get("Size") or 0)
        finally:
            client.close()
        uri = f"{spec.repository}@{digest}"
        return Bundle(self.kind, uri, digest, size, spec.git_commit, spec.git_dirty)


def docker_client(host: str) -> Any:
    try:
        import docker
    except ImportError as e:  # pragma: no cover - the SDK is a dependency
        raise BundleError(
            f"the docker bundler needs the docker SDK (pip install docker): {e}"
        ) from e
    where = host or "the local Docker engine"
    try:
        client = docker.DockerClient(base_url=host) if host else docker.from_env()
        client.ping()
    except Exception as e:  # DockerException, connection errors: all mean no engine
        raise BundleError(
            f"cannot reach {where} ({e}); start Docker, or name the engine with "
            "--bundler_spec=docker_host=unix:///path/docker.sock (or DOCKER_HOST)"
        ) from None
    return client


def _build(client: Any, spec: ImageSpec, context: Any, labels: dict[str, str]) -> str:
    """Stream the legacy builder's output; the built image's ID, or BundleError with the log's
    last lines."""
    import docker.errors

    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
    image_id = None
    kwargs: dict[str, Any] = {}
    if spec.platform:
        kwargs["platform"] = spec.platform
    if spec.target:
        kwargs["target"] = spec.target
    try:
        stream = client.api.build(
            fileobj=context,
            custom_context=True,
            tag=spec.ref,
            dockerfile=spec.dockerfile,
            buildargs=spec.build_args or None,
            labels=labels,
            rm=True,
            forcerm=True,
            decode=True,
            **kwargs,
        )
        for chunk in stream:
            if "stream" in chunk:
                for line in chunk["stream"].splitlines():
                    if line.strip():
                        tail.append(line.rstrip())
            if "error" in chunk or "errorDetail" in chunk:
                message = chunk.get("error") or chunk["errorDetail"].get("message", "")
                tail.append(str(message).rstrip())
                raise BundleError(_build_failed(spec, tail))
            aux = chunk.get("aux")
            if isinstance(aux, dict) and aux.get("ID"):
                image_id = aux["ID"]
    except docker.errors.APIError as e:
        tail.append(str(e.explanation or e))
        raise BundleError(_build_failed(spec, tail)) from None
    if image_id is None:
        for line in reversed(tail):
            if line.startswith("Successfully built "):
                image_id = line.split()[-1]
                break
    if image_id is None:
        raise BundleError(_build_failed(spec, tail, "the builder reported no image"))
    return image_id


def _build_failed(spec: ImageSpec, tail: collections.deque[str], why: str = "") -> str:
    log = "\n  ".join(tail) or "(no output)"
    return (
        f"docker build of {spec.ref} ({spec.dockerfile}) failed{': ' + why if why else ''}; "
        f"the build log ends:\n  {log}"
    )


def _push(client: Any, spec: ImageSpec, image_id: str) -> str:
    """Push ``spec.ref``; the manifest digest the registry gave (``sha256:...``)."""
    import docker.errors

    registry = spec.repo.split("/", 1)[0]
    digest = None
    errors: list[str] = []
    try:
        for chunk in client.api.push(spec.repository, tag=spec.tag, stream=True, decode=True):
            if "error" in chunk or "errorDetail" in chunk:
                errors.append(str(chunk.get("error") or chunk["errorDetail"].get("message")))
            aux = chunk.get("aux")
            if isinstance(aux, dict) and str(aux.get("Digest", "")).startswith("sha256:"):
                digest = aux["Digest"]
    except docker.errors.APIError as e:
        errors.append(str(e.explanation or e))
    if errors:
        raise BundleError(
            f"pushing {spec.ref} to the registry {registry} failed: {errors[-1]}; check that "
            f"{registry} is up and that you may push to {spec.repo} (for Artifact Registry: "
            f"gcloud auth configure-docker {registry})"
        )
    if digest is None:  # older engines: the digest is in the image's RepoDigests
        for repo_digest in client.api.inspect_image(image_id).get("RepoDigests") or []:
            name, _, found = repo_digest.partition("@")
            if name == spec.repository and found.startswith("sha256:"):
                digest = found
    if digest is None:
        raise BundleError(f"pushed {spec.ref} to {registry} but the registry gave no digest")
    return digest


def image_digest_hex(digest: str) -> str:
    """``sha256:<hex>`` -> ``<hex>``; BundleError for anything else."""
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexdigest):
        raise BundleError(f"{digest!r} is not an image digest (sha256:<64 hex digits>)")
    return hexdigest

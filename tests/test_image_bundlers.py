"""The image bundlers: docker against the real engine and a real local registry (tests/
docker_engine.py), cloudbuild through the real googleapiclient against the Cloud Build stand-in
(tests/standins/cloudbuild.py) with its source on gs:// (the GCS emulator)."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest

from bastion.bucket.artifacts import Bundles
from bastion.bucket.store import Store
from bundlers import BundleError
from bundlers.cloudbuild import CloudBuildBundler
from launch.bundling import bundler_for
from tests.conftest import fresh_gcs_root
from tests.standins.cloudbuild import CloudBuildServer, DockerExecutor

DOCKER = bundler_for("docker")


def git_project(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    git = [
        "git",
        "-c",
        "user.email=t@example.com",
        "-c",
        "user.name=t",
        "-c",
        "commit.gpgsign=false",
    ]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=root, check=True)
    return root


def head(root: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()


# -- docker --------------------------------------------------------------------------------------


@pytest.fixture
def engine(docker_engine):
    return docker_engine


@pytest.fixture
def repo(engine):
    """A registry path of its own, so every test's push is a first push."""
    return f"{engine.registry}/bst-{uuid.uuid4().hex[:8]}"


def dockerfile(engine, *lines: str) -> str:
    return "\n".join([f"FROM {engine.base_image}", *lines]) + "\n"


def app(tmp_path: Path, engine, *lines: str, name: str = "app") -> Path:
    marker = uuid.uuid4().hex  # a fresh layer each test: a cold build and push
    return git_project(
        tmp_path / name,
        {
            "Dockerfile": dockerfile(engine, "COPY hello.txt /app/hello.txt", *lines),
            "hello.txt": f"hello {marker}\n",
            "train.py": "print('train')\n",
        },
    )


def test_docker_build_push_pull_by_digest_and_run(engine, repo, tmp_path):
    src = app(tmp_path, engine)
    store = Store(str(tmp_path / "root"))
    started = time.monotonic()
    record = DOCKER.bundle(str(src), store, {"repo": repo, "docker_host": engine.docker_host})
    cold = time.monotonic() - started
    commit = head(src)
    assert record.kind == "docker"
    assert record.digest.startswith("sha256:") and len(record.digest) == 71
    assert record.uri == f"{repo}/app@{record.digest}"
    assert record.git_commit == commit and record.git_dirty is False
    assert record.size > 0
    # warm: the same tree again: cached layers, the registry has them: the same digest
    started = time.monotonic()
    again = DOCKER.bundle(str(src), store, {"repo": repo, "docker_host": engine.docker_host})
    warm = time.monotonic() - started
    assert again.digest == record.digest and again.uri == record.uri
    client = engine.client()
    try:
        image = client.images.get(f"{repo}/app:{commit[:12]}")  # the default tag: short hash
        assert image.labels["bastion.git-commit"] == commit
        assert image.labels["bastion.git-dirty"] == "false"
        assert image.labels["bastion.context-digest"].startswith("sha256:")
        assert f"{repo}/app@{record.digest}" in image.attrs["RepoDigests"]
        client.images.remove(image.id, force=True)  # so the pull below comes from the registry
        pulled = client.images.pull(record.uri)
        assert pulled.id == image.id
        out = client.containers.run(
            record.uri, ["cat", "/app/hello.txt"], remove=True, labels={"bastion.test": "1"}
        )
        assert out.decode() == (src / "hello.txt").read_text()
    finally:
        client.close()
    print(f"\ndocker build+push: cold {cold:.2f} s, warm {warm:.2f} s, image {record.size} B")


def test_docker_options_tag_image_build_args_target(engine, repo, tmp_path):
    src = git_project(
        tmp_path / "Proj_X",
        {
            "docker/App.dockerfile": "\n".join(
                [
                    f"FROM {engine.base_image} AS base",
                    "ARG GREETING=unset",
                    'RUN echo "$GREETING" > /greeting',
                    "FROM base AS final",
                    "RUN echo final > /final",
                ]
            )
            + "\n",
        },
    )
    record = DOCKER.bundle(
        str(src),
        None,
        {
            "repo": repo,
            "dockerfile": "docker/App.dockerfile",
            "tag": "v1",
            "build_arg": "GREETING=hi there,OTHER=1",
            "target": "base",
            "docker_host": engine.docker_host,
        },
    )
    assert record.uri.startswith(f"{repo}/proj-x@sha256:")  # default image: the dir's name
    client = engine.client()
    try:
        out = client.containers.run(
            f"{repo}/proj-x:v1",
            ["sh", "-c", "cat /greeting; ls /final 2>&1 || true"],
            remove=True,
            labels={"bastion.test": "1"},
        )
    finally:
        client.close()
    assert out.decode().splitlines()[0] == "hi there"
    assert "No such file" in out.decode()  # stopped at --target=base


def test_docker_refuses_a_dirty_tree_unless_allowed(engine, repo, tmp_path):
    src = app(tmp_path, engine)
    (src / "notes.txt").write_text("wip\n")
    (src / "train.py").write_text("print('changed')\n")
    with pytest.raises(BundleError) as e:
        DOCKER.bundle(str(src), None, {"repo": repo, "docker_host": engine.docker_host})
    assert "notes.txt" in str(e.value) and "train.py" in str(e.value)
    assert "--bundler_spec=allow_dirty=true" in str(e.value)
    record = DOCKER.bundle(
        str(src), None, {"repo": repo, "allow_dirty": "true", "docker_host": engine.docker_host}
    )
    assert record.git_dirty is True
    client = engine.client()
    try:
        image = client.images.get(f"{repo}/app:{head(src)[:12]}-dirty")
        assert image.labels["bastion.git-dirty"] == "true"
    finally:
        client.close()


def test_docker_names_the_missing_repo_and_dockerfile(engine, tmp_path):
    src = app(tmp_path, engine)
    with pytest.raises(BundleError, match=r"--bundler_spec=repo=REGISTRY/PATH"):
        DOCKER.bundle(str(src), None, {})
    with pytest.raises(BundleError, match=r"no Dockerfile at .*docker/Missing\.dockerfile"):
        DOCKER.bundle(
            str(src), None, {"repo": "127.0.0.1:5000/x", "dockerfile": "docker/Missing.dockerfile"}
        )
    with pytest.raises(BundleError, match="not an option of the docker bundler"):
        DOCKER.bundle(str(src), None, {"repo": "127.0.0.1:5000/x", "colour": "red"})
    with pytest.raises(BundleError, match="is not REGISTRY/PATH"):
        DOCKER.bundle(str(src), None, {"repo": "https://Registry/x"})


def test_docker_failed_run_step_quotes_the_build_log(engine, repo, tmp_path):
    src = app(tmp_path, engine, "RUN echo step-output-marker && exit 3")
    with pytest.raises(BundleError) as e:
        DOCKER.bundle(str(src), None, {"repo": repo, "docker_host": engine.docker_host})
    message = str(e.value)
    assert "docker build of" in message and "step-output-marker" in message
    assert "returned a non-zero code: 3" in message


def test_docker_push_error_names_the_registry(engine, tmp_path):
    src = app(tmp_path, engine)
    with pytest.raises(BundleError, match=r"registry 127\.0\.0\.1:9 failed"):
        DOCKER.bundle(
            str(src), None, {"repo": "127.0.0.1:9/team", "docker_host": engine.docker_host}
        )


def test_docker_context_is_the_tar_selection_and_dry_run_builds_nothing(engine, repo, tmp_path):
    src = app(tmp_path, engine, "COPY . /src/")
    (src / ".gitignore").write_text("data/\nDockerfile\n")  # an ignored Dockerfile is still sent
    (src / "data").mkdir()
    (src / "data" / "big.bin").write_text("x" * 1000)
    subprocess.run(["git", "add", ".gitignore"], cwd=src, check=True)
    subprocess.run(
        ["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "ig"],
        cwd=src,
        check=True,
    )
    dry = DOCKER.bundle(str(src), None, {"repo": repo, "tag": "dry"}, dry_run=True)
    assert dry.uri == f"{repo}/app:dry" and dry.digest == "" and dry.size == 0
    client = engine.client()
    try:
        with pytest.raises(Exception, match=r"(?i)not found|no such image"):
            client.images.get(f"{repo}/app:dry")
        DOCKER.bundle(
            str(src),
            None,
            {"repo": repo, "tag": "ctx", "exclude": "train.py", "docker_host": engine.docker_host},
        )
        out = client.containers.run(
            f"{repo}/app:ctx", ["ls", "-a", "/src"], remove=True, labels={"bastion.test": "1"}
        )
    finally:
        client.close()
    listed = set(out.decode().split())
    assert {".gitignore", "hello.txt"} <= listed
    assert not listed & {"data", "train.py", ".git"}


# -- cloudbuild ----------------------------------------------------------------------------------


@pytest.fixture
def cloudbuild(monkeypatch):
    server = CloudBuildServer(polls_per_tick=1, queue_ticks=2, work_ticks=2).start()
    monkeypatch.setenv("BASTION_CLOUDBUILD_API_ENDPOINT", server.endpoint)
    yield server
    server.stop()


@pytest.fixture
def gs_store(gcs_emulator):
    return Store(fresh_gcs_root())


def cb_project(tmp_path: Path) -> Path:
    return git_project(
        tmp_path / "proj",
        {"Dockerfile": "FROM python:3.11-slim\nCOPY . /app\n", "train.py": "print(1)\n"},
    )


CB_OPTIONS = {"repo": "us-docker.pkg.dev/p/r", "project": "p", "poll_interval": "0"}


def test_cloudbuild_success_records_the_digest(cloudbuild, gs_store, tmp_path):
    src = cb_project(tmp_path)
    bundler = CloudBuildBundler()
    record = bundler.bundle(str(src), gs_store, {**CB_OPTIONS, "name": "exp1", "tag": "t1"})
    [build] = cloudbuild.created()
    [image] = build["results"]["images"]
    assert image["name"] == "us-docker.pkg.dev/p/r/proj:t1"
    assert record.kind == "cloudbuild" and record.digest == image["digest"]
    assert record.uri == f"us-docker.pkg.dev/p/r/proj@{image['digest']}"
    assert record.git_commit == head(src) and record.git_dirty is False
    assert build["status"] == "SUCCESS" and build["tags"] == ["exp1"]
    assert build["images"] == ["us-docker.pkg.dev/p/r/proj:t1"]
    build_args, push_args = (s["args"] for s in build["steps"])
    assert build_args[:5] == ["build", "-f", "Dockerfile", "-t", "us-docker.pkg.dev/p/r/proj:t1"]
    assert f"bastion.git-commit={head(src)}" in build_args
    assert push_args == ["push", "us-docker.pkg.dev/p/r/proj:t1"]
    # the source is the tar bundle, content-addressed under ROOT/bundles/
    storage = build["source"]["storageSource"]
    tar = bundler_for("tar").bundle(str(src), gs_store, {}, dry_run=True)
    assert f"gs://{storage['bucket']}/{storage['object']}" == tar.uri
    assert gs_store.bundles.exists(tar.digest)
    # the build is found again by its tag, as AXLearn finds its builds
    from google.auth.credentials import AnonymousCredentials
    from googleapiclient import discovery

    cb = discovery.build(
        "cloudbuild",
        "v1",
        static_discovery=True,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": cloudbuild.endpoint},
    )
    found = cb.projects().builds().list(projectId="p", filter='tags = "exp1"').execute()
    assert [b["id"] for b in found["builds"]] == [build["id"]]
    assert cb.projects().builds().list(projectId="p", filter='tags = "x"').execute() == {
        "builds": []
    }


def test_cloudbuild_uploads_unchanged_source_once(cloudbuild, gs_store, tmp_path, monkeypatch):
    src = cb_project(tmp_path)
    uploads = []
    real_put = Bundles.put

    def put_bundle(self, digest, data, size):
        uploaded = real_put(self, digest, data, size)
        uploads.append(uploaded)
        return uploaded

    monkeypatch.setattr(Bundles, "put", put_bundle)
    first = CloudBuildBundler().bundle(str(src), gs_store, {**CB_OPTIONS, "tag": "a"})
    second = CloudBuildBundler().bundle(str(src), gs_store, {**CB_OPTIONS, "tag": "b"})
    assert uploads == [True, False]
    objects = [b["source"]["storageSource"]["object"] for b in cloudbuild.created()]
    assert objects[0] == objects[1]
    assert first.digest != second.digest  # two builds: the stand-in's digests differ per build


@pytest.mark.parametrize(
    ("status", "expect"),
    [
        ("FAILURE", r"ended FAILURE: USER_BUILD_STEP; Build step failure: .*exited"),
        ("INTERNAL_ERROR", r"ended INTERNAL_ERROR: Internal error"),
        ("TIMEOUT", r"ended TIMEOUT: Build timeout exceeded.*bundler_spec=timeout"),
        ("EXPIRED", r"ended EXPIRED: Build expired.*queue"),
        ("CANCELLED", r"ended CANCELLED: Build was cancelled"),
    ],
)
def test_cloudbuild_failed_build_gives_its_reason_and_log_url(
    cloudbuild, gs_store, tmp_path, status, expect
):
    src = cb_project(tmp_path)
    cloudbuild.fail(status)
    with pytest.raises(BundleError, match=expect) as e:
        CloudBuildBundler().bundle(str(src), gs_store, {**CB_OPTIONS, "timeout": "600"})
    [build] = cloudbuild.created()
    assert build["status"] == status
    assert f"logs: {build['logUrl']}" in str(e.value)
    assert build["id"] in str(e.value)


def test_cloudbuild_waits_bounded_then_cancels(cloudbuild, gs_store, tmp_path):
    src = cb_project(tmp_path)
    cloudbuild.fail("EXPIRED")  # stays QUEUED for an hour of virtual time
    now = [0.0]
    bundler = CloudBuildBundler(
        sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0]
    )
    with pytest.raises(BundleError, match=r"still QUEUED after 30 s, so it was cancelled"):
        bundler.bundle(str(src), gs_store, {**CB_OPTIONS, "wait": "30", "poll_interval": "10"})
    [build] = cloudbuild.created()
    assert build["status"] == "CANCELLED"


def test_cloudbuild_rides_out_transient_errors(cloudbuild, gs_store, tmp_path, monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)  # googleapiclient's retry backoff
    src = cb_project(tmp_path)
    cloudbuild.transient_5xx(2)
    record = CloudBuildBundler().bundle(str(src), gs_store, CB_OPTIONS)
    assert record.digest.startswith("sha256:")


def test_cloudbuild_needs_a_gs_root_and_a_project(cloudbuild, tmp_path, monkeypatch):
    src = cb_project(tmp_path)
    with pytest.raises(BundleError, match="needs the bastion root on gs://"):
        CloudBuildBundler().bundle(str(src), Store(str(tmp_path / "root")), CB_OPTIONS)
    assert cloudbuild.created() == []
    dry = CloudBuildBundler().bundle(
        str(src), Store(str(tmp_path / "root")), {**CB_OPTIONS, "tag": "t"}, dry_run=True
    )
    assert dry.uri == "us-docker.pkg.dev/p/r/proj:t" and dry.digest == ""
    assert not (tmp_path / "root" / "bundles").exists()
    with pytest.raises(BundleError, match="--bundler_spec=repo="):
        CloudBuildBundler().bundle(str(src), None, {"project": "p"})
    (src / ".gitignore").write_text("Dockerfile\n")
    with pytest.raises(BundleError, match=r"Dockerfile is left out of the source bundle"):
        CloudBuildBundler().bundle(str(src), None, {**CB_OPTIONS, "allow_dirty": "1"}, True)


def test_cloudbuild_steps_on_the_real_engine_give_a_pullable_digest(
    engine, gs_store, tmp_path, monkeypatch
):
    """The stand-in runs the build's docker steps on the real engine from the uploaded source
    tarball: the recorded digest is the registry's, and the image pulls and runs by it."""
    client = engine.client()

    def fetch(bucket, obj):
        with gs_store.fs.open(f"{bucket}/{obj}", "rb") as f:
            return f.read()

    server = CloudBuildServer(polls_per_tick=1, executor=DockerExecutor(client, fetch)).start()
    monkeypatch.setenv("BASTION_CLOUDBUILD_API_ENDPOINT", server.endpoint)
    repo = f"{engine.registry}/bst-cb-{uuid.uuid4().hex[:8]}"
    try:
        src = app(tmp_path, engine)
        record = CloudBuildBundler().bundle(str(src), gs_store, {**CB_OPTIONS, "repo": repo})
        assert record.uri == f"{repo}/app@{record.digest}"
        image = client.images.get(f"{repo}/app:{head(src)[:12]}")
        assert image.labels["bastion.git-commit"] == head(src)
        client.images.remove(image.id, force=True)
        client.images.pull(record.uri)
        out = client.containers.run(
            record.uri, ["cat", "/app/hello.txt"], remove=True, labels={"bastion.test": "1"}
        )
        assert out.decode() == (src / "hello.txt").read_text()
        bad = app(tmp_path, engine, "RUN echo cb-step-marker && exit 4", name="bad")
        with pytest.raises(BundleError) as e:
            CloudBuildBundler().bundle(str(bad), gs_store, {**CB_OPTIONS, "repo": repo})
        assert "ended FAILURE: USER_BUILD_STEP" in str(e.value)
        assert "returned a non-zero code: 4" in str(e.value)
    finally:
        server.stop()
        client.close()


def test_docker_names_an_unreachable_engine(tmp_path):
    src = git_project(tmp_path / "p", {"Dockerfile": "FROM scratch\n"})
    sock = f"unix://{tmp_path}/missing.sock"
    with pytest.raises(BundleError, match=rf"cannot reach {sock}.*docker_host="):
        DOCKER.bundle(str(src), None, {"repo": "127.0.0.1:5000/x", "docker_host": sock})

"""`bastion launch` bundles the current directory and the job runs inside it: through the real
CLI and daemon, on a local directory and on gs:// (the GCS emulator)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bastion.jobspec import SpecError
from launch.bundling import instance_type_runner
from tests.harness import REPO, Bastion


def _project(tmp: Path) -> Path:
    project = tmp / "my-project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text(
        "import os\nprint('training in', os.path.basename(os.getcwd()))\n"
        "print(open('data/config.txt').read().strip())\n"
    )
    (project / "data" / "config.txt").write_text("lr=0.1\n")
    (project / ".gitignore").write_text("checkpoints/\n")
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "big.bin").write_bytes(b"\0" * 1000)
    return project


def _launch(b: Bastion, cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", "launch", *args],
        env={**b.env, "PYTHONPATH": str(REPO)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check and proc.returncode:
        raise AssertionError(proc.stdout + proc.stderr)
    return proc


def test_a_job_runs_inside_its_bundle_and_reads_its_files_by_relative_path(bastion, tmp_path):
    project = _project(tmp_path)
    bastion.start()
    _launch(bastion, project, "--name=exp1", "--", "python3 train.py")
    record = bastion.wait_complete("exp1", timeout=60)
    assert record["state"]["outcome"] == "SUCCEEDED", record["state"]
    log = bastion.log("exp1")
    assert "lr=0.1" in log and "training in work" in log
    bundle = record["spec"]["bundle"]
    assert bundle["kind"] == "tar" and bundle["digest"].startswith("sha256:")
    assert bastion.listdir("bundles") == [f"sha256-{bundle['digest'][7:]}.tar.gz"]


def test_relaunching_unchanged_code_uploads_no_bundle_and_a_change_makes_a_new_one(
    local_bastion, tmp_path
):
    project = _project(tmp_path)
    _launch(local_bastion, project, "--name=a", "--", "true")
    bundles = local_bastion.listdir("bundles")
    stamp = (Path(local_bastion.root) / "bundles" / bundles[0]).stat().st_mtime_ns
    _launch(local_bastion, project, "--name=b", "--", "true")
    assert local_bastion.listdir("bundles") == bundles
    assert (Path(local_bastion.root) / "bundles" / bundles[0]).stat().st_mtime_ns == stamp
    (project / "train.py").write_text("print('changed')\n")
    _launch(local_bastion, project, "--name=c", "--", "true")
    assert len(local_bastion.listdir("bundles")) == 2


def test_gitignored_and_excluded_files_do_not_travel(local_bastion, tmp_path):
    project = _project(tmp_path)
    local_bastion.start()
    _launch(
        local_bastion,
        project,
        "--name=ls",
        "--bundler_exclude=data",
        "--",
        "ls -a; test ! -e checkpoints && test ! -e data && echo clean",
    )
    record = local_bastion.wait_complete("ls", timeout=60)
    assert record["state"]["outcome"] == "SUCCEEDED", local_bastion.log("ls")
    assert "clean" in local_bastion.log("ls")


def test_bundler_none_and_dry_run(local_bastion, tmp_path):
    project = _project(tmp_path)
    out = _launch(local_bastion, project, "--name=dry", "--dry_run", "--", "true").stdout
    spec = json.loads(out)
    assert spec["name"] == "dry" and spec["bundle"]["kind"] == "tar"
    assert not local_bastion.exists("jobs", "active", "dry")
    assert local_bastion.listdir("bundles") == []  # a dry run uploads nothing
    _launch(local_bastion, project, "--name=plain", "--bundler=none", "--", "true")
    assert "bundle" not in json.loads(local_bastion.read("jobs", "active", "plain"))


def test_a_bundle_whose_bytes_changed_fails_the_job_naming_the_digest(local_bastion, tmp_path):
    project = _project(tmp_path)
    _launch(local_bastion, project, "--name=tampered", "--", "python3 train.py")
    (name,) = local_bastion.listdir("bundles")
    path = Path(local_bastion.root) / "bundles" / name
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    local_bastion.start()
    record = local_bastion.wait_complete("tampered", timeout=60)
    assert record["state"]["outcome"] == "FAILED"
    assert "does not match its digest" in record["state"]["reason"]


def test_an_unknown_bundler_is_a_one_line_error(local_bastion, tmp_path):
    proc = _launch(local_bastion, _project(tmp_path), "--bundler=zip", "--", "true", check=False)
    assert proc.returncode == 1 and "--bundler=zip is not a bundler" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("instance_type", "replicas", "runner", "resources"),
    [
        ("tpu-v4-32", 1, {"kind": "tpu", "accelerator_type": "v4-32"}, {"v4": 32}),
        (
            "tpu-v5p-128",
            2,
            {"kind": "tpu-qr", "accelerator_type": "v5p-128", "num_replicas": 2},
            {"v5p": 256},
        ),
        (
            "tpu-v5litepod-16",
            1,
            {"kind": "tpu", "accelerator_type": "v5litepod-16"},
            {"v5litepod": 16},
        ),
        ("gpu-a3-highgpu-8g", 1, {"kind": "gce", "machine_type": "a3-highgpu-8g"}, {"gpu": 8}),
        # AXLearn's GPU names, as the gce runner maps them, and the G2 (L4) machine types
        ("gpu-h100-80gb-8", 1, {"kind": "gce", "machine_type": "a3-highgpu-8g"}, {"gpu": 8}),
        ("gpu-a100-40gb-1", 1, {"kind": "gce", "machine_type": "a2-highgpu-1g"}, {"gpu": 1}),
        ("gpu-h200-141gb-8", 1, {"kind": "gce", "machine_type": "a3-ultragpu-8g"}, {"gpu": 8}),
        ("gpu-g2-standard-8", 1, {"kind": "gce", "machine_type": "g2-standard-8"}, {"gpu": 1}),
        ("gpu-g2-standard-48", 1, {"kind": "gce", "machine_type": "g2-standard-48"}, {"gpu": 4}),
        ("gpu-a2-megagpu-16g", 1, {"kind": "gce", "machine_type": "a2-megagpu-16g"}, {"gpu": 16}),
    ],
)
def test_instance_types_imply_the_runner_and_the_resources(
    instance_type, replicas, runner, resources
):
    assert instance_type_runner(instance_type, replicas) == (runner, resources)


def test_an_unknown_instance_type_names_the_forms():
    with pytest.raises(SpecError, match="tpu-<version>-<cores>"):
        instance_type_runner("v4-32")


@pytest.mark.parametrize("instance_type", ["gpu-n1-standard-8", "gpu-g2-standard-5", "gpu-h100"])
def test_a_gpu_instance_type_without_known_gpus_is_refused_naming_the_forms(instance_type):
    with pytest.raises(SpecError, match=r"gpu-g2-standard-8, or AXLearn's gpu-h100-80gb-8"):
        instance_type_runner(instance_type)


def test_every_axlearn_gpu_name_the_gce_runner_maps_is_an_instance_type():
    from bastion.runners.google.gce import _AXLEARN, machine_type

    for name, machine in _AXLEARN.items():
        runner, resources = instance_type_runner(f"gpu-{name}")
        assert runner["machine_type"] == machine == machine_type({"instance_type": f"gpu-{name}"})
        assert resources["gpu"] == int(name.rsplit("-", 1)[1])


def test_history_and_list_json_show_the_bundle_record(local_bastion, tmp_path):
    project = _project(tmp_path)
    local_bastion.start()
    _launch(local_bastion, project, "--name=shown", "--", "true")
    record = local_bastion.wait_complete("shown", timeout=60)
    digest = record["spec"]["bundle"]["digest"]
    assert digest in local_bastion.cli("history", "shown").stdout
    listed = json.loads(local_bastion.cli("list", "--all", "--json").stdout)
    (job,) = [j for j in listed if j["name"] == "shown"]
    assert job["bundle"]["digest"] == digest and job["bundle"]["kind"] == "tar"

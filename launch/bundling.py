"""What ``bastion launch`` adds to a spec before submitting it: the code bundle, the runner
implied by an instance type, and the resources that type implies for the quota.

Bundling runs on the user's machine (the code is here); the daemon only ever sees the record.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from bastion.jobspec import SpecError
from bastion.registry import Registry
from bundlers.base import BundleError, Bundler

# AXLearn's instance types: tpu-<version>-<cores> (with --num_replicas slices) and
# gpu-<Compute Engine machine type or AXLearn GPU name>: whatever the gce runner maps to a GPU
# machine type (bastion.runners.google.gce.gpu_machine), which also says how many GPUs it has.
_TPU = re.compile(r"tpu-(v\d+[a-z]*(?:litepod)?)-(\d+)")


def instance_type_runner(
    instance_type: str, num_replicas: int = 1, spot: bool = False
) -> tuple[dict[str, Any], dict[str, int]]:
    """The ``runner`` object and the resources an instance type implies (as AXLearn's
    ``infer_resources``: ``tpu-v4-32`` with one replica is ``v4=32``)."""
    if num_replicas < 1:
        raise SpecError(f"--num_replicas={num_replicas}: must be at least 1")
    if match := _TPU.fullmatch(instance_type):
        version, cores = match.group(1), int(match.group(2))
        runner = {"kind": "tpu", "accelerator_type": f"{version}-{cores}"}
        if num_replicas > 1:  # multislice exists only as queued resources
            runner = {**runner, "kind": "tpu-qr", "num_replicas": num_replicas}
        resources = {version: cores * num_replicas}  # AXLearn's: tpu-v5litepod-16 is v5litepod
    elif gpu := _gpu_machine(instance_type):
        machine, gpus = gpu
        runner = {"kind": "gce", "machine_type": machine}
        resources = {"gpu": gpus * num_replicas}
        if num_replicas > 1:
            raise SpecError(
                f"--instance_type={instance_type}: GPU VMs run one replica; drop --num_replicas"
            )
    else:
        raise SpecError(
            f"--instance_type={instance_type!r} is not an instance type; use tpu-<version>-<cores> "
            "(e.g. tpu-v4-32, tpu-v5litepod-16) or gpu-<machine type> (e.g. gpu-a3-highgpu-8g, "
            "gpu-g2-standard-8, or AXLearn's gpu-h100-80gb-8)"
        )
    if spot:
        runner["spot"] = True
    return runner, resources


def _gpu_machine(instance_type: str) -> tuple[str, int] | None:
    """(machine type, GPUs) as the gce runner maps the name; imported only for a GPU name
    (the runner brings the Google API client with it)."""
    if not instance_type.startswith("gpu-"):
        return None
    from bastion.runners.google.gce import gpu_machine

    return gpu_machine(instance_type)


def make_bundle(
    kind: str,
    source_dir: str,
    root: str,
    spec_options: Iterable[str],
    excludes: Iterable[str],
    dry_run: bool,
) -> dict[str, Any] | None:
    """Bundle ``source_dir`` with the named bundler; None for ``none``. Errors name the flag."""
    if kind == "none":
        return None
    from bastion.bucket.store import Store
    from bundlers import parse_spec_options, with_excludes

    if not os.path.isdir(source_dir):
        raise SpecError(f"--source_dir={source_dir}: not a directory")
    try:
        options: Mapping[str, Any] = with_excludes(parse_spec_options(spec_options), excludes)
        bundler = bundler_for(kind)
        record = bundler.bundle(source_dir, Store(root), options, dry_run=dry_run)
    except BundleError as e:
        raise SpecError(f"bundle ({kind}): {e}") from None
    return record.to_json()


# -- which bundler a launch uses ---------------------------------------------------------------

BUNDLERS: Registry[Callable[[], Bundler]] = Registry(
    "bundler",
    group="bastion.bundlers",
    builtins={
        "tar": "bundlers.tar:TarBundler",
        "docker": "bundlers.docker:DockerBundler",
        "cloudbuild": "bundlers.cloudbuild:CloudBuildBundler",
    },
    error=BundleError,
)


def bundler_for(kind: str) -> Bundler:
    """The bundler of ``kind``; BundleError naming the flag and the known kinds, or the missing
    module."""
    if kind not in BUNDLERS:
        raise BundleError(
            f"--bundler={kind} is not a bundler; known: {', '.join(BUNDLERS.names())}, or none"
        )
    return BUNDLERS.get(kind)()

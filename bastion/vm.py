"""The VM that runs the daemon: ``bastion vm create|delete|status`` through Compute Engine v1.

    bastion vm create --vm_name=bastion-1 --zone=us-central1-a --root=gs://b/r \\
        --image=us-docker.pkg.dev/P/R/bastion:1 --service_account=bastion@P.iam.gserviceaccount.com

What the VM runs (its ``startup-script`` metadata, run by the guest agent on every boot):

- with ``--image`` (the ``bastion`` target of the top-level Dockerfile, pushed to a registry):
  a Container-Optimized OS VM runs ``docker run --restart=always --network=host ... IMAGE
  start`` with ``BASTION_ROOT=ROOT`` and the daemon's work directory on the VM's disk
  (``/var/lib/bastion``); a container that already exists is only started again, so a reboot
  (or a live migration's restart) resumes the same daemon installation. Artifact Registry and
  gcr.io images are pulled with the VM's service account (``docker-credential-gcr``).
- without ``--image``: a Debian 12 VM installs the package into ``/opt/bastion`` with pip
  (the requirement is the ``bastion-package`` metadata value, default ``bastion``: point it
  at a wheel or a private index you control) and runs ``bastion start`` under a systemd unit
  with ``Restart=always``.

The VM has labels ``bastion-root=<root tag>`` and ``bastion-role=daemon``, the given service
account with the cloud-platform scope, an external address (to reach the bucket and the
registry), and scheduling ``automaticRestart: true`` / ``onHostMaintenance: MIGRATE`` (a daemon
VM has no GPU, so it live-migrates and comes back after a host failure).

``create`` is idempotent: the insert's ``requestId`` is derived from project, zone, VM name and
root, so a retried or repeated ``create`` is one VM; a VM that already exists (HTTP 409) is
reported as such and is success when it serves the same root. ``delete`` deletes the VM only,
never anything in the bucket, and waits for the operation. ``status`` shows the VM and whether
the lease of ROOT is held by a daemon on that VM (the lease record's ``host``).

The API endpoint is ``$BASTION_COMPUTE_API_ENDPOINT`` (with anonymous credentials: tests and
stand-ins) or Google's, with ``google.auth.default()`` credentials.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, TextIO

from bastion.retry import read_back
from bastion.runners.base import root_tag

ENDPOINT_ENV = "BASTION_COMPUTE_API_ENDPOINT"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
COS_IMAGE = "projects/cos-cloud/global/images/family/cos-stable"
DEBIAN_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
DAEMON_UID = 10001  # the ``bastion`` user of the Dockerfile's ``bastion`` target
STATE_DIR = "/var/lib/bastion"  # the daemon's work directory on the VM's boot disk
WAIT_SECONDS = 600.0
GPU_FAMILIES = {"a2", "a3", "a4", "g2", "g4"}
VM_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")  # RFC 1035, as Compute Engine wants
_NAMESPACE = uuid.UUID("7f1c2b64-51e4-4d7e-9a0b-3d5c1f0a9e21")
_STOCKOUT = {
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "insufficientCapacity",
}


class VmError(Exception):
    """One line for the user: what went wrong, the flag it concerns, and the fix."""


@dataclass(frozen=True)
class VmConfig:
    name: str
    zone: str
    root: str
    project: str
    machine_type: str = "e2-standard-2"
    service_account: str | None = None
    image: str | None = None


# -- the API client ------------------------------------------------------------------------------


def compute_client(project: str | None = None):
    """(client, project): the endpoint from $BASTION_COMPUTE_API_ENDPOINT with anonymous
    credentials, else Google's with the default credential chain."""
    from googleapiclient import discovery

    endpoint = os.environ.get(ENDPOINT_ENV)
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        credentials, default_project = AnonymousCredentials(), None
        options: dict[str, str] | None = {"api_endpoint": endpoint}
    else:
        import google.auth

        credentials, default_project = google.auth.default(scopes=SCOPES)
        options = None
    project = project or default_project
    if not project:
        raise VmError("no project: give --project=PROJECT (the credentials name none)")
    client = discovery.build(
        "compute",
        "v1",
        static_discovery=True,
        cache_discovery=False,
        credentials=credentials,
        client_options=options,
    )
    return client, project


# -- what the VM runs ----------------------------------------------------------------------------


def startup_script(root: str, image: str | None) -> str:
    """The boot script: run the ``bastion`` image against ROOT, or install the package."""
    q = shlex.quote
    if image:
        registry = image.split("/", 1)[0] if "/" in image else ""
        login = ""
        if registry.endswith(("-docker.pkg.dev", "gcr.io")):
            login = f"docker-credential-gcr configure-docker --registries={q(registry)}\n"
        return f"""#!/bin/bash
# bastion daemon VM (Container-Optimized OS): runs the bastion image against its root.
set -euo pipefail
mkdir -p {STATE_DIR}/work
chown -R {DAEMON_UID}:{DAEMON_UID} {STATE_DIR}
export HOME=/var/lib/bastion-docker
mkdir -p "$HOME"
{login}if docker inspect bastion >/dev/null 2>&1; then
  docker start bastion
else
  docker run -d --name bastion --restart=always --network=host \\
    -v {STATE_DIR}:{STATE_DIR} -e BASTION_ROOT={q(root)} \\
    {q(image)} start --work_dir={STATE_DIR}/work
fi
"""
    return f"""#!/bin/bash
# bastion daemon VM (Debian 12): installs the package and runs the daemon under systemd.
set -euo pipefail
PKG=$(curl -fs -H 'Metadata-Flavor: Google' \\
  http://metadata.google.internal/computeMetadata/v1/instance/attributes/bastion-package \\
  || echo bastion)
if [ ! -x /opt/bastion/bin/bastion ]; then
  apt-get update -q && apt-get install -y -q python3-venv
  python3 -m venv /opt/bastion
  /opt/bastion/bin/pip install -q "$PKG"
fi
id bastion >/dev/null 2>&1 || useradd --system --uid {DAEMON_UID} --home {STATE_DIR} bastion
mkdir -p {STATE_DIR}/work && chown -R bastion:bastion {STATE_DIR}
cat >/etc/systemd/system/bastion.service <<'UNIT'
[Unit]
Description=bastion daemon
After=network-online.target
Wants=network-online.target
[Service]
User=bastion
Environment=BASTION_ROOT={root}
ExecStart=/opt/bastion/bin/bastion start --work_dir={STATE_DIR}/work
Restart=always
RestartSec=5
[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now bastion.service
"""


def _gpu_family(machine_type: str) -> bool:
    return machine_type.split("-", 1)[0] in GPU_FAMILIES


def instance_body(cfg: VmConfig) -> dict[str, Any]:
    """The ``instances.insert`` body for the daemon's VM."""
    metadata = [
        {"key": "startup-script", "value": startup_script(cfg.root, cfg.image)},
        {"key": "bastion-root", "value": cfg.root},
    ]
    if cfg.image:
        metadata.append({"key": "bastion-image", "value": cfg.image})
    return {
        "name": cfg.name,
        "description": f"bastion daemon for {cfg.root}",
        "machineType": f"zones/{cfg.zone}/machineTypes/{cfg.machine_type}",
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {
                    "sourceImage": COS_IMAGE if cfg.image else DEBIAN_IMAGE,
                    "diskSizeGb": "20",
                },
            }
        ],
        "networkInterfaces": [
            {
                "network": "global/networks/default",
                "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
            }
        ],
        "serviceAccounts": [{"email": cfg.service_account or "default", "scopes": SCOPES}],
        "scheduling": {
            "provisioningModel": "STANDARD",
            "automaticRestart": True,
            # Machine types with built-in GPUs cannot live-migrate (Google's API documentation).
            "onHostMaintenance": "TERMINATE" if _gpu_family(cfg.machine_type) else "MIGRATE",
        },
        "metadata": {"items": metadata},
        "labels": {"bastion-root": root_tag(cfg.root), "bastion-role": "daemon"},
    }


def request_id(cfg: VmConfig, verb: str = "create") -> str:
    """A stable UUID for this VM's insert: the server ignores a repeated request."""
    return str(uuid.uuid5(_NAMESPACE, f"{cfg.project}/{cfg.zone}/{cfg.name}/{cfg.root}/{verb}"))


# -- errors ---------------------------------------------------------------------------------------


def _http_error(e, cfg: VmConfig, verb: str) -> VmError:
    """An HttpError as one line naming the flag and the fix."""
    status = int(getattr(e.resp, "status", 0) or 0)
    details = e.error_details if isinstance(e.error_details, list) else []
    reason = next((d.get("reason") for d in details if isinstance(d, dict)), "") or ""
    message = " ".join(str(e.reason or "").split()) or f"HTTP {status}"
    return _one_line(reason, message, cfg, verb, status)


def _one_line(code: str, message: str, cfg: VmConfig, verb: str, status: int = 0) -> VmError:
    where = f"--machine_type={cfg.machine_type} in --zone={cfg.zone}"
    if code in _STOCKOUT:
        return VmError(
            f"vm {verb}: stockout: {where} has no capacity now ({message}); "
            "retry later or pick another --zone or --machine_type"
        )
    if code in ("quotaExceeded", "QUOTA_EXCEEDED"):
        return VmError(
            f"vm {verb}: quota exceeded for {where} ({message}); pick a smaller "
            "--machine_type, a --zone in another region, or request more quota"
        )
    if "machineType" in message or "machine type" in message.lower():
        return VmError(
            f"vm {verb}: bad --machine_type={cfg.machine_type} for "
            f"--zone={cfg.zone} ({message}); list valid ones with `gcloud compute "
            f"machine-types list --zones={cfg.zone}`"
        )
    if "'resource.name'" in message:
        return VmError(
            f"vm {verb}: bad --vm_name={cfg.name} ({message}); use 1-63 lowercase "
            "letters, digits and dashes, starting with a letter"
        )
    if "serviceAccount" in message or "service account" in message.lower():
        return VmError(
            f"vm {verb}: bad --service_account={cfg.service_account} ({message}); "
            "give an existing service account email of --project"
        )
    if status in (401, 403):
        return VmError(
            f"vm {verb}: permission denied in --project={cfg.project} ({message}); "
            "use credentials with roles/compute.instanceAdmin.v1"
        )
    if status == 404 and "zones/" in message and "/instances/" not in message:
        return VmError(
            f"vm {verb}: --zone={cfg.zone} or --project={cfg.project} not found "
            f"({message}); check both"
        )
    return VmError(
        f"vm {verb}: {message}"
        + (f" (HTTP {status}, {code})" if status else f" ({code})" if code else "")
    )


# -- operations -----------------------------------------------------------------------------------


def wait_operation(
    client, cfg: VmConfig, op: dict, verb: str, timeout: float = WAIT_SECONDS
) -> dict:
    """Loop ``zoneOperations.wait`` until DONE; an operation error raises VmError."""
    deadline = time.monotonic() + timeout
    while op.get("status") != "DONE":
        if time.monotonic() > deadline:
            raise VmError(
                f"vm {verb}: operation {op.get('name')} not done after {timeout:.0f} "
                "s; see it with `gcloud compute operations describe`"
            )
        op = (
            client.zoneOperations()
            .wait(project=cfg.project, zone=cfg.zone, operation=op["name"])
            .execute(num_retries=5)
        )
    errors = (op.get("error") or {}).get("errors") or []
    if errors:
        first = errors[0]
        raise _one_line(
            first.get("code", ""), " ".join(str(first.get("message", "")).split()), cfg, verb, 0
        )
    return op


def _get(client, cfg: VmConfig) -> dict | None:
    from googleapiclient.errors import HttpError

    try:
        return (
            client.instances()
            .get(project=cfg.project, zone=cfg.zone, instance=cfg.name)
            .execute(num_retries=5)
        )
    except HttpError as e:
        if e.resp.status == 404:
            return None
        raise _http_error(e, cfg, "status") from None


# -- verbs ----------------------------------------------------------------------------------------


def create(client, cfg: VmConfig) -> tuple[dict, bool]:
    """(instance, created): the daemon's VM, made if absent. Raises VmError."""
    from googleapiclient.errors import HttpError

    inst = _get(client, cfg)
    if inst is not None:
        _check_root(inst, cfg)
        return inst, False
    body = instance_body(cfg)
    ids = [request_id(cfg), str(uuid.uuid4())]
    for rid in ids:
        try:
            op = (
                client.instances()
                .insert(project=cfg.project, zone=cfg.zone, body=body, requestId=rid)
                .execute(num_retries=5)
            )
        except HttpError as e:
            if e.resp.status == 409:  # alreadyExists: made by an earlier create (ours?)
                back = read_back(lambda: _get(client, cfg), lambda found: _is_daemon_of(found, cfg))
                if back.found is None:
                    raise _http_error(e, cfg, "create") from None
                _check_root(back.found, cfg)  # not ours: says whose it is
                return back.found, False
            raise _http_error(e, cfg, "create") from None
        wait_operation(client, cfg, op, "create")
        inst = _get(client, cfg)
        if inst is not None:
            _check_root(inst, cfg)
            return inst, True
        # The server answered with the (done) insert of a VM since deleted: the requestId is
        # remembered for a while, so a create after a delete needs a fresh one.
    raise VmError(f"vm create: {cfg.name} did not appear after its insert; run create again")


def _is_daemon_of(inst: dict, cfg: VmConfig) -> bool:
    """Whether ``inst`` is the daemon VM of ``cfg.root`` (by its labels)."""
    labels = inst.get("labels") or {}
    return labels.get("bastion-role") == "daemon" and labels.get("bastion-root") == root_tag(
        cfg.root
    )


def _check_root(inst: dict, cfg: VmConfig) -> None:
    labels = inst.get("labels") or {}
    if not _is_daemon_of(inst, cfg):
        raise VmError(
            f"vm create: a VM named {cfg.name} already exists in {cfg.zone} but is "
            f"not the daemon of {cfg.root} (labels {labels}); pick another --vm_name"
        )


def delete(client, cfg: VmConfig) -> bool:
    """Delete the daemon's VM (never the bucket); False when it was already gone."""
    from googleapiclient.errors import HttpError

    inst = _get(client, cfg)
    if inst is None:
        return False
    if (inst.get("labels") or {}).get("bastion-role") != "daemon":
        raise VmError(
            f"vm delete: {cfg.name} is not a bastion daemon VM (no label "
            "bastion-role=daemon); check --vm_name, or delete it with gcloud"
        )
    try:
        op = (
            client.instances()
            .delete(
                project=cfg.project, zone=cfg.zone, instance=cfg.name, requestId=str(uuid.uuid4())
            )
            .execute(num_retries=5)
        )
    except HttpError as e:
        if e.resp.status == 404:
            return False
        raise _http_error(e, cfg, "delete") from None
    wait_operation(client, cfg, op, "delete")
    return True


def lease_holder(root: str) -> dict[str, Any] | None:
    """The lease record of ROOT (host, pid, renewed, duration, released), or None."""
    from bastion.bucket.store import Store

    found = Store(root).lease.read()
    return None if found is None else found[0]


def status(client, cfg: VmConfig, now: float | None = None) -> dict[str, Any]:
    """What ``bastion vm status`` prints, as a dict."""
    inst = _get(client, cfg)
    out: dict[str, Any] = {"vm": cfg.name, "zone": cfg.zone, "exists": inst is not None}
    if inst is not None:
        out.update(
            status=inst.get("status"),
            zone=str(inst.get("zone", cfg.zone)).rsplit("/", 1)[-1],
            machine_type=str(inst.get("machineType", "")).rsplit("/", 1)[-1],
            labels=inst.get("labels") or {},
        )
    record = lease_holder(cfg.root)
    now = time.time() if now is None else now
    if record:
        host = str(record.get("host", ""))
        renewed = float(record.get("renewed") or 0)
        duration = float(record.get("duration") or 0)
        fresh = not record.get("released") and (not duration or now - renewed < duration)
        out["lease"] = {
            "host": host,
            "pid": record.get("pid"),
            "renewed": renewed,
            "age_seconds": round(now - renewed, 1),
            "current": fresh,
        }
        out["holds_lease"] = bool(fresh and host.split(".", 1)[0] == cfg.name)
    else:
        out["lease"] = None
        out["holds_lease"] = False
    return out


def format_status(st: dict[str, Any]) -> str:
    lines = []
    if st["exists"]:
        lines.append(
            f"vm: {st['vm']}  status: {st['status']}  zone: {st['zone']}  "
            f"machine type: {st['machine_type']}"
        )
    else:
        lines.append(f"vm: {st['vm']}  does not exist in {st['zone']}")
    lease = st["lease"]
    if lease is None:
        lines.append("lease: never held (no daemon has run on this root)")
    else:
        state = "current" if lease["current"] else "expired or released"
        lines.append(
            f"lease: held by {lease['host']} pid {lease['pid']}, renewed "
            f"{lease['age_seconds']:.0f} s ago ({state})"
        )
    lines.append(f"daemon on this VM holds the lease: {'yes' if st['holds_lease'] else 'no'}")
    return "\n".join(lines)


def refuse_local_root(root: str) -> None:
    """A VM cannot reach a directory on this machine: its daemon would never see a job. The
    CLI refuses it (``bastion vm create``); the functions here take any root, so that tests
    drive them against the Compute stand-in with a local directory."""
    if "://" not in root or root.startswith("file://"):
        raise VmError(
            f"vm create: the root {root} is a directory on this machine, which a VM cannot "
            "reach; give a bucket root the VM's service account can use: "
            "--root=gs://BUCKET/PREFIX (or set $BASTION_ROOT)"
        )


def cli(
    verb: str,
    *,
    root: str,
    name: str | None,
    zone: str | None,
    machine_type: str | None = None,
    project: str | None = None,
    service_account: str | None = None,
    image: str | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """``bastion vm VERB``: 0 on success, 1 with one line on stderr otherwise."""
    try:
        if not name or not zone:
            raise VmError(f"vm {verb}: give --vm_name=NAME and --zone=ZONE")
        if not VM_NAME.fullmatch(name):
            raise VmError(
                f"vm {verb}: bad --vm_name={name}; use 1-63 lowercase letters, digits and "
                "dashes, starting with a letter and not ending with a dash"
            )
        client, project = compute_client(project)
        cfg = VmConfig(
            name=name,
            zone=zone,
            root=root,
            project=project,
            machine_type=machine_type or "e2-standard-2",
            service_account=service_account,
            image=image,
        )
        if verb == "create":
            inst, created = create(client, cfg)
            what = "created" if created else "already exists"
            print(
                f"vm {cfg.name}: {what} in {cfg.zone} ({inst.get('status')}), daemon of {cfg.root}",
                file=out,
            )
        elif verb == "delete":
            gone = delete(client, cfg)
            print(
                f"vm {cfg.name}: {'deleted' if gone else 'already gone'}; the root "
                f"{cfg.root} is untouched",
                file=out,
            )
        elif verb == "status":
            print(format_status(status(client, cfg)), file=out)
        else:
            raise VmError(f"vm: unknown verb {verb!r}; use create, delete or status")
    except VmError as e:
        print(f"bastion: error: {e}", file=err)
        return 1
    return 0

"""The startup script a cloud VM runs on every worker at boot: it runs the agent for one attempt.

Delivered as the ``startup-script`` metadata value (TPU node metadata, GCE metadata items). The
cloud runs it on each worker of the slice (and again after a reboot or repair; the agent's
``started`` claim makes a second run exit 0 without starting the command again). The worker's
index comes from the metadata server (``agent-worker-number``) inside the agent, so one script
serves every worker.

Getting the agent onto a bare image: if ``import bastion`` fails and the daemon gave a
``package_url`` (a wheel of its own version in the bucket), the script copies it with
``gcloud storage cp`` (any ``gs://`` URL; a local path or ``https`` URL is used as it is) and
``pip install``s it. The cloud runners publish the daemon's own code there by default
(:func:`package_wheel` then ``Store.put_package``: ``ROOT/packages/<sha256>/bastion-<version>+
<hash>-py3-none-any.whl``, written once per content), so a bare VM installs exactly the code the
daemon runs, its dependencies from its package index; settings ``package_url`` (a wheel of your
own) wins, ``publish_package = false`` turns publishing off (the image must have bastion).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import io
import os
import re
import shlex
import zipfile
from collections.abc import Mapping, Sequence

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def script(
    *,
    root: str,
    job: str,
    attempt: str,
    num_workers: int,
    command: str,
    env: Mapping[str, str],
    python: str = "python3",
    package_url: str | None = None,
    agent_args: Sequence[str] = (),
) -> str:
    """A bash script; every value is shell-quoted (job names and env come from users).

    The same script serves every worker of every slice: the agent finds its own index (and,
    given ``--num_slices``, its slice) on the VM (:func:`bastion.agent.worker_index`)."""
    q = shlex.quote
    lines = ["#!/bin/bash", "# bastion: runs this attempt's agent on every worker", "set -u"]
    lines += [f"export {k}={q(str(v))}" for k, v in sorted(env.items()) if _NAME.fullmatch(k)]
    py = q(python)
    install = (
        f"  url={q(package_url)}\n"
        '  case "$url" in gs://*) gcloud storage cp "$url" /tmp/ && url=/tmp/$(basename "$url");; '
        "esac\n"
        f'  {py} -m pip install --quiet "$url" || exit 1'
        if package_url
        else '  echo "bastion: python cannot import bastion and no package_url was given" >&2\n'
        "  exit 1"
    )
    lines.append(f"if ! {py} -c 'import bastion' 2>/dev/null; then\n{install}\nfi")
    argv = [python, "-m", "bastion.agent", f"--root={root}", f"--job={job}",
            f"--attempt={attempt}", f"--num_workers={num_workers}", *agent_args]  # fmt: skip
    lines.append("exec " + " ".join(q(a) for a in argv) + " -- " + q(command))
    return "\n".join(lines) + "\n"


# -- the daemon's own package as a wheel ------------------------------------------------------

PACKAGES = ("bastion", "launch", "quota", "bundlers")  # pyproject's packages.find


def package_wheel() -> tuple[str, bytes]:
    """The running code of this daemon as a pure-Python wheel: (file name, bytes).

    Deterministic (sorted entries, fixed timestamps), so the same code gives the same bytes
    and the same content address; the version carries a hash of the code (``0.1.0+<hash>``)
    so pip never takes a different build of the same version for this one."""
    files: dict[str, bytes] = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        top = next(iter(spec.submodule_search_locations))
        for directory, dirs, names in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in names:
                if not name.endswith((".pyc", ".pyo")):
                    path = os.path.join(directory, name)
                    rel = os.path.relpath(path, os.path.dirname(top)).replace(os.sep, "/")
                    with open(path, "rb") as f:
                        files[rel] = f.read()
    code = hashlib.sha256(b"".join(k.encode() + b"\0" + v for k, v in sorted(files.items())))
    try:
        base = importlib.metadata.version("bastion")
        requires = [r for r in importlib.metadata.requires("bastion") or [] if "extra ==" not in r]
    except importlib.metadata.PackageNotFoundError:
        base, requires = "0", []
    version = f"{base.split('+')[0]}+{code.hexdigest()[:12]}"
    info = f"bastion-{version}.dist-info"
    files[f"{info}/METADATA"] = "".join(
        ["Metadata-Version: 2.1\nName: bastion\n", f"Version: {version}\n"]
        + [f"Requires-Dist: {r}\n" for r in requires]
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: bastion\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [
        f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()}"
        f",{len(v)}"
        for k, v in sorted(files.items())
    ]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in sorted(files.items()):
            z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    return f"bastion-{version}-py3-none-any.whl", out.getvalue()

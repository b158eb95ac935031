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
(:func:`package_wheel` then ``store.packages.put``: ``ROOT/packages/<sha256>/bastion-<version>+
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
    bootstrap_url: str | None = None,
) -> str:
    """A bash script; every value is shell-quoted (job names and env come from users).

    The same script serves every worker of every slice: the agent finds its own index (and,
    given ``--num_slices``, its slice) on the VM (:func:`bastion.agent.worker_index`).

    ``bootstrap_url``: where the script copies what it printed (``{worker}`` standing for the
    worker's index; see :func:`bootstrap_lines`)."""
    q = shlex.quote
    lines = ["#!/bin/bash", "# bastion: runs this attempt's agent on every worker", "set -u"]
    lines += [f"export {k}={q(str(v))}" for k, v in sorted(env.items()) if _NAME.fullmatch(k)]
    py = q(python)
    if bootstrap_url:
        found = re.search(r"--num_slices=(\d+)", " ".join(agent_args))
        slices = int(found.group(1)) if found else 1
        lines += bootstrap_lines(bootstrap_url, attempt, num_workers // max(1, slices), slices)
    lines += python_check_lines(python, need_pip=bool(package_url))
    install = (
        f"  url={q(package_url)}\n"
        '  case "$url" in gs://*) gcloud storage cp "$url" /tmp/ && url=/tmp/$(basename "$url");; '
        "esac\n"
        f'  {py} -m pip install --quiet "$url" || exit 1'
        if package_url
        else '  echo "bastion: python cannot import bastion and no package_url was given" >&2\n'
        "  exit 1"
    )
    lines.append(f"if ! {py} -c 'import bastion.agent' 2>/dev/null; then\n{install}\nfi")
    argv = [
        python,
        "-m",
        "bastion.agent",
        f"--root={root}",
        f"--job={job}",
        f"--attempt={attempt}",
        f"--num_workers={num_workers}",
        *agent_args,
    ]
    if bootstrap_url:  # the agent reports from here on (its output is the worker's log)
        lines.append("trap - EXIT; exec 1>&3 2>&4 3>&- 4>&-")
    lines.append("exec " + " ".join(q(a) for a in argv) + " -- " + q(command))
    return "\n".join(lines) + "\n"


# -- what a worker that never starts leaves behind ---------------------------------------------

AGENT_PYTHON = (3, 10)  # the agent's oldest Python (TPU VM images ship 3.10; see the README)


def bootstrap_lines(url: str, attempt: str, hosts_per_slice: int = 1, slices: int = 1) -> list[str]:
    """Bash that tees everything the script prints (to the VM's console as before, and to a
    file) and copies that file to ``url`` (``{worker}``: this worker's index as the agent
    numbers it, the metadata server's ``agent-worker-number`` plus, in a multislice attempt,
    ``MEGASCALE_SLICE_ID`` of ``tpu-env`` times ``hosts_per_slice``): once right away, in the
    background, before anything that can fail or hang, and again when the script exits
    without handing over to the agent (which then reports on its own). ``gcloud storage
    cp`` for ``gs://``, ``cp`` for a local root (other schemes: not copied). The daemon
    shows its last lines when a worker never starts (:meth:`bastion.runners.google.zonal.
    ZonalProvisioner.not_started`), and ``bastion logs NAME --worker=K`` all of it."""
    q = shlex.quote
    before, _, after = url.rpartition("{worker}")
    attributes = "http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1/"
    attributes += "instance/attributes"
    ask = 'curl -sf -m 10 -H "Metadata-Flavor: Google"'
    lines = [
        "bastion_log=$(mktemp /tmp/bastion-bootstrap.XXXXXX)",
        f'bastion_w=$({ask} "{attributes}/agent-worker-number" 2>/dev/null)',
        'case "$bastion_w" in ""|*[!0-9]*) bastion_w=0;; esac',
    ]
    if slices > 1:
        lines += [
            f'bastion_s=$({ask} "{attributes}/tpu-env" 2>/dev/null'
            ' | sed -n "s/^MEGASCALE_SLICE_ID: *\'\\{0,1\\}\\([0-9]*\\).*/\\1/p" | head -n 1)',
            'case "$bastion_s" in ""|*[!0-9]*) bastion_s=0;; esac',
            f"bastion_w=$((bastion_w + bastion_s * {int(hosts_per_slice)}))",
        ]
    return [
        *lines,
        f'bastion_url={q(before)}"$bastion_w"{q(after)}',
        "bastion_copy() {\n"
        '  case "$bastion_url" in\n'
        '    gs://*) gcloud storage cp --quiet "$bastion_log" "$bastion_url" >/dev/null 2>&1;;\n'
        "    *://*) return 0;;\n"
        '    *) mkdir -p "$(dirname "$bastion_url")" && cp "$bastion_log" "$bastion_url";;\n'
        "  esac\n"
        "}",
        f'echo "bastion: worker $bastion_w of {attempt} boots on $(hostname) at '
        '$(date -u +%Y-%m-%dT%H:%M:%SZ)" | tee "$bastion_log"',
        "bastion_copy & bastion_early=$!",
        "exec 3>&1 4>&2",
        'exec > >(tee -a "$bastion_log") 2>&1',
        "bastion_tee=$!",
        "bastion_done() {\n"
        "  exec 1>&3 2>&4 3>&- 4>&-\n"
        '  wait "$bastion_tee" "$bastion_early" 2>/dev/null\n'
        "  bastion_copy || true\n"
        "}",
        "trap 'bastion_rc=$?; bastion_done; exit $bastion_rc' EXIT",
    ]


def python_check_lines(python: str, need_pip: bool) -> list[str]:
    """Bash that fails fast, with one line naming the settings to change, when ``python``
    cannot run the agent: it does not run, it is older than :data:`AGENT_PYTHON`, or (when
    the agent must be installed, ``need_pip``) it has no pip. Without this a too-old Python
    fails deep inside a ``pip install`` of a dependency, minutes later, or never says a word."""
    q = shlex.quote
    py = q(python)
    major, minor = AGENT_PYTHON
    fix = (
        "set the runner setting python to an interpreter on the image that has it, or "
        "the setting image (gce) / runtime_version (tpu) to an image that has one"
    )
    need = f"; the agent needs Python >= {major}.{minor}: {fix}"
    version = 'import sys; print("%d.%d.%d" % tuple(sys.version_info[:3]))'
    lines = [
        f"if ! bastion_v=$({py} -c {q(version)} 2>&1); then\n"
        f'  echo {q(f"bastion: cannot run the python setting {python}: ")}"$bastion_v"'
        f"{q(need)} >&2\n"
        "  exit 1\n"
        "fi",
        'IFS=. read -r bastion_major bastion_minor _ <<< "$bastion_v"',
        f'if ! {{ [ "$bastion_major" -gt {major} ] || {{ [ "$bastion_major" -eq {major} ] && '
        f'[ "$bastion_minor" -ge {minor} ]; }}; }} 2>/dev/null; then\n'
        f'  echo {q(f"bastion: the python setting {python} is Python ")}"$bastion_v"'
        f"{q(need)} >&2\n"
        "  exit 1\n"
        "fi",
    ]
    if need_pip:
        pip_fix = (
            "; installing the agent needs pip: install it in the image (python3-pip), or "
            + fix.replace("that has it", "that has pip")
        )
        said = f"bastion: the python setting {python} has no pip ({python} -m pip failed)"
        lines.append(
            f"if ! {py} -c 'import bastion.agent' 2>/dev/null && "
            f"! {py} -m pip --version >/dev/null 2>&1; then\n"
            f"  echo {q(said + pip_fix)} >&2\n"
            "  exit 1\n"
            "fi"
        )
    return lines


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
        [
            "Metadata-Version: 2.1\nName: bastion\n",
            f"Version: {version}\n",
            "Requires-Python: >={}.{}\n".format(*AGENT_PYTHON),
        ]
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

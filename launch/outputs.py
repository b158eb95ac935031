"""A job's outputs from the user's side: list, download (only what changed), delete.

``bastion outputs NAME`` and :meth:`launch.api.Client.outputs` both come here. A download
keeps a small manifest in the target directory (``.bastion-download.json``: each file's
bucket token as fetched), so a second download of a running job fetches only what the job
wrote since.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from bastion.bucket.outputs import SUMMARIES, OutputFile
from bastion.bucket.store import Store

DOWNLOAD_MANIFEST = ".bastion-download.json"


class OutputsError(ValueError):
    """A bad target or request, said with the flag to fix."""


@dataclass
class Downloaded:
    fetched: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    fetched_bytes: int = 0


def list_outputs(store: Store, name: str) -> dict[str, OutputFile]:
    """Every worker's files (worker k's under ``workers/<k>/``), Bastion's summaries left out."""
    files = store.outputs.list(name, worker=None)
    return {n: f for n, f in sorted(files.items()) if not n.startswith(SUMMARIES + "/")}


def check_target(directory: str) -> str:
    """The download directory, made if absent; OutputsError naming --download otherwise."""
    path = os.path.abspath(os.path.expanduser(directory))
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputsError(
            f"--download={directory}: {path} is a file, not a directory; give a directory "
            "(it is created if absent)"
        )
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise OutputsError(f"--download={directory}: cannot create {path}: {e.strerror}") from None
    return path


def download(store: Store, name: str, directory: str) -> Downloaded:
    """Fetch the job's files into ``directory``; a file whose bucket token and size match
    the last download (and is still there, as big) is not fetched again."""
    target = check_target(directory)
    manifest_path = os.path.join(target, DOWNLOAD_MANIFEST)
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
        manifest = manifest if isinstance(manifest, dict) else {}
    except (OSError, ValueError):
        manifest = {}
    done = Downloaded()
    for rel, remote in list_outputs(store, name).items():
        local = os.path.normpath(os.path.join(target, rel))
        if not local.startswith(target + os.sep):
            continue  # a name that would leave the directory: never written
        same = manifest.get(rel) == remote.token
        if same and os.path.isfile(local) and os.path.getsize(local) == remote.size:
            done.unchanged.append(rel)
            continue
        store.outputs.download(name, rel, local, worker=None)
        manifest[rel] = remote.token
        done.fetched.append(rel)
        done.fetched_bytes += remote.size
    with open(manifest_path + ".tmp", "w") as f:
        json.dump(manifest, f)
    os.replace(manifest_path + ".tmp", manifest_path)
    return done

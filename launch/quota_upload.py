"""``bastion quota upload FILE``: a quota file checked, then put where the root's daemon reads
it, whole. An invalid file is never written (the daemon would keep its last good quota and
warn); a file at the wrong path would never be read at all."""

from __future__ import annotations

from typing import TextIO

import fsspec

from launch.api import Client
from launch.status import check_root


def upload(path: str, root: str, out: TextIO) -> int:
    """Exit 1 (nothing written) when the file has a problem; 0 once it is in place."""
    from launch.why import daemon_quota_url
    from quota import commands

    if commands.check(path, out) != 0:
        print(f"{path}: not uploaded; fix the problems above and upload again", file=out)
        return 1
    check_root(root, reading=True)
    client = Client(root)
    with fsspec.open(path, "rb") as f:
        data = f.read()
    url = daemon_quota_url(client)
    client.store.quota.write(url, data)
    print(f"uploaded {path} to {url}; the daemon applies it on its next cycle", file=out)
    return 0

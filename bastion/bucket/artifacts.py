"""Content-addressed code in the bucket:

bundles/sha256-<hex>.tar.gz        users' code (written by the CLI, read by runners)
packages/<sha256>/<wheel file>     the daemon's own wheel, for the cloud VMs' startup script
"""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

from bastion.bucket.counted import CountedObjects
from bastion.bucket.objects import ObjectInfo

BUNDLES, PACKAGES = "bundles", "packages"


def bundle_name(digest: str) -> str:
    """``sha256:<hex>`` -> ``sha256-<hex>.tar.gz``; ValueError for anything else, so a
    record from a spec can never name a path outside bundles/."""
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256" or len(hexdigest) != 64 or hexdigest.strip("0123456789abcdef"):
        raise ValueError(f"{digest!r} is not a digest of the form sha256:<64 hex digits>")
    return f"sha256-{hexdigest}.tar.gz"


class Bundles:
    """Users' code by digest: two users racing upload the same bytes."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def url(self, digest: str) -> str:
        return self._bucket.url(BUNDLES, bundle_name(digest))

    def info(self, digest: str) -> ObjectInfo | None:
        return self._bucket.info(BUNDLES, bundle_name(digest))

    def exists(self, digest: str) -> bool:
        return self.info(digest) is not None

    def put(self, digest: str, data: bytes | os.PathLike[str], size: int) -> bool:
        """Store a bundle unless an object of that digest and ``size`` is already there: True
        when this call uploaded it. ``data``: the bytes, or a local file streamed to a bucket
        (a GCS/S3 object appears only once complete; a local root is written atomically).
        A wrong-sized leftover (a truncated or tampered object) is replaced, not trusted."""
        info = self.info(digest)
        if info is not None and info.size == size:
            return False
        if isinstance(data, bytes):
            self._bucket.write(data, BUNDLES, bundle_name(digest))
        else:
            self._bucket.put_file(data, BUNDLES, bundle_name(digest))
        return True

    def write(self, digest: str, data: bytes) -> None:
        """Replace a bundle's bytes unconditionally (a repair, or a test planting damage)."""
        self._bucket.write(data, BUNDLES, bundle_name(digest))

    def read(self, digest: str) -> bytes | None:
        return self._bucket.read(BUNDLES, bundle_name(digest))

    def open(self, digest: str) -> BinaryIO:
        """A binary file object to stream a bundle (FileNotFoundError when absent); callers
        verify the digest of what they read, so nothing unverified is ever used."""
        return self._bucket.open(BUNDLES, bundle_name(digest))

    def delete(self, digest: str) -> None:
        self._bucket.delete(BUNDLES, bundle_name(digest))


class Packages:
    """The directory is the digest of the wheel's bytes, the file keeps the name pip needs.
    Written once; a VM installs exactly this."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def put(self, filename: str, data: bytes) -> str:
        """Store the wheel unless it is there already; its URL either way."""
        if "/" in filename or not filename.endswith(".whl"):
            raise ValueError(f"{filename!r} is not a wheel file name")
        digest = hashlib.sha256(data).hexdigest()
        info = self._bucket.info(PACKAGES, digest, filename)
        if info is None or info.size != len(data):
            self._bucket.write(data, PACKAGES, digest, filename)
        return self._bucket.url(PACKAGES, digest, filename)

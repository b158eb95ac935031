"""What governs the daemon: the lease (``ROOT/lease``: one daemon acts on a root at a time)
and the quota file (by default ``ROOT/project-quotas/project-quotas.config``, or any URL),
with the last one that parsed (``ROOT/history/quota-last-good``)."""

from __future__ import annotations

import json
from typing import Any

import fsspec

from bastion.bucket.counted import CountedObjects, default_options
from bastion.bucket.objects import Objects, objects_for

LEASE = "lease"
QUOTA_DEFAULT = ("project-quotas", "project-quotas.config")
QUOTA_LAST_GOOD = ("history", "quota-last-good")


class Lease:
    """The generation-conditioned lease record (see bastion/lease.py for the protocol)."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def read(self) -> tuple[dict[str, Any], str] | None:
        """The lease record and its token, or None when nobody ever held it."""
        info = self._bucket.info(LEASE)
        raw = self._bucket.read(LEASE) if info else None
        if info is None or raw is None:
            return None
        try:
            return json.loads(raw), info.token
        except ValueError:
            return {}, info.token  # unreadable: treat as held by nobody we know

    def write(self, record: dict[str, Any], expected: str | None) -> str:
        data = json.dumps(record, sort_keys=True).encode()
        return self._bucket.write_if(data, expected, LEASE)


class QuotaFiles:
    """The quota file: the root's default one or any URL (another bucket, a local path)."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def default_url(self) -> str:
        return self._bucket.url(*QUOTA_DEFAULT)

    def write_default(self, text: str) -> None:
        """Install the root's default quota file (an admin's or a test's setup)."""
        self._bucket.write(text.encode(), *QUOTA_DEFAULT)

    def last_good_url(self) -> str:
        return self._bucket.url(*QUOTA_LAST_GOOD)

    def write_last_good(self, text: str) -> None:
        self._bucket.write(text.encode(), *QUOTA_LAST_GOOD)

    def read_last_good(self) -> str | None:
        raw = self._bucket.read(*QUOTA_LAST_GOOD)
        return raw.decode() if raw else None

    def _objects_of(self, url: str) -> tuple[Objects, str]:
        """The objects of any URL; this root's own (which follow no link) for a local path
        inside the root, such as the default quota file."""
        fs, path = fsspec.core.url_to_fs(url, **default_options(url, {}))
        bucket = self._bucket
        if (
            isinstance(fs, type(bucket.fs))
            and bucket.is_local
            and path.startswith(bucket.root + "/")
        ):
            return bucket.objects, path
        return objects_for(fs, reads_only=True), path

    def token(self, url: str) -> str | None:
        """Change token of any object (the quota file may live in another bucket)."""
        self._bucket.count("info")
        objects, path = self._objects_of(url)
        info = objects.info(path)
        return info.token if info else None

    def write(self, url: str, data: bytes) -> None:
        """Replace the object at any URL whole (a quota file upload): readers see the old
        bytes or the new, never a part (a local file is written aside and renamed)."""
        self._bucket.count("write")
        objects, path = self._objects_of(url)
        if objects is not self._bucket.objects:
            fs, path = fsspec.core.url_to_fs(url, **default_options(url, {}))
            objects = objects_for(fs)
        objects.write(path, data)

    def read(self, url: str) -> bytes:
        """Through the backend's primitives, so every backend's timeouts and errors apply."""
        self._bucket.count("read")
        objects, path = self._objects_of(url)
        data = objects.read(path)
        if data is None:
            raise FileNotFoundError(url)
        return data

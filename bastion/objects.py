"""Object primitives per fsspec backend: the few things a bucket must do that fsspec lacks.

fsspec gives one interface for listing, reading and writing; what differs between a local
directory, GCS and S3 is how to replace an object atomically, create it only if absent,
replace it only if nobody else changed it (compare-and-swap on a generation), and append.
One class per backend, picked by ``objects_for(fs)`` from a small registry, like fsspec's own.
These classes know nothing of Bastion's paths; ``bastion.store`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.asyn import sync
from fsspec.implementations.local import LocalFileSystem

log = logging.getLogger(__name__)


class PreconditionFailed(Exception):
    """A conditional write lost: the object changed (or appeared) since it was read."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing says about one object: enough to tell whether it changed."""

    name: str
    size: int
    token: str  # generation (GCS), ETag (S3) or inode:mtime:size (local); new on every write


class Objects:
    """Generic fsspec backend: plain writes, best-effort conditions, read-modify-write append."""

    def __init__(self, fs: AbstractFileSystem) -> None:
        self.fs = fs

    @staticmethod
    def token(info: dict[str, Any]) -> str:
        for key in ("generation", "ETag", "etag"):
            if info.get(key):
                return str(info[key]).strip('"')
        return f"{info.get('mtime')}:{info.get('size')}"

    def list(self, directory: str) -> dict[str, ObjectInfo]:
        self.fs.invalidate_cache(directory)
        try:
            entries = self.fs.ls(directory, detail=True)
        except FileNotFoundError:
            return {}
        found = {}
        for entry in entries:
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if entry.get("type") == "directory" or name.startswith("."):
                continue  # temporary files and parts start with "."
            found[name] = ObjectInfo(name, int(entry.get("size") or 0), self.token(entry))
        return found

    def info(self, path: str) -> ObjectInfo | None:
        self.fs.invalidate_cache(path)
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        return ObjectInfo(path.rsplit("/", 1)[-1], int(info.get("size") or 0), self.token(info))

    def read(self, path: str, start: int | None = None) -> bytes | None:
        try:
            return self.fs.cat_file(path, start=start)
        except FileNotFoundError:
            return None
        except Exception as e:
            if start and getattr(e, "code", None) == 416:  # offset at the end: nothing new
                return b""
            raise

    def write(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)

    def create(self, path: str, data: bytes) -> bool:
        """Write only if absent; False when another object already exists there.

        Creating the same bytes twice succeeds: a bucket client retries a create whose answer
        was lost, and the retry must not report its own first try as a conflict."""
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            # A retried request may have created it on its first try: then it is ours.
            return self.read(path) == data
        return True

    def write_if(self, path: str, data: bytes, expected: str | None) -> str:
        """Replace only if the object's token is ``expected`` (None: absent); new token."""
        current = self.info(path)
        if (current.token if current else None) != expected:
            raise PreconditionFailed(f"{path} changed (token {current and current.token})")
        self.write(path, data)
        try:
            after = self.info(path)
        except Exception:  # written; the next conditional write re-reads to learn the token
            return ""
        return after.token if after else ""

    def append(self, path: str, data: bytes, size: int | None = None) -> None:
        """Add ``data`` at the end. ``size``: the object's current size when the caller knows
        it (0: it does not exist yet), which saves a request per append."""
        old = b"" if size == 0 else (self.read(path) or b"")
        self.write(path, old + data)

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(path)


class LocalObjects(Objects):
    """A local directory: rename for atomicity, link for create, a lock file for conditions."""

    @staticmethod
    def token(info: dict[str, Any]) -> str:
        return f"{info.get('ino')}:{info.get('mtime')}:{info.get('size')}"

    def _stat_token(self, path: str) -> str | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return self.token({"ino": st.st_ino, "mtime": st.st_mtime, "size": st.st_size})

    def info(self, path: str) -> ObjectInfo | None:
        token = self._stat_token(path)
        if token is None:
            return None
        return ObjectInfo(path.rsplit("/", 1)[-1], os.path.getsize(path), token)

    def _temp(self, path: str, data: bytes) -> str:
        directory, name = path.rsplit("/", 1)
        os.makedirs(directory, exist_ok=True)
        tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        return tmp

    def write(self, path: str, data: bytes) -> None:
        os.replace(self._temp(path, data), path)  # readers see old or new bytes, never half

    def create(self, path: str, data: bytes) -> bool:
        tmp = self._temp(path, data)
        try:
            os.link(tmp, path)  # atomic create-if-absent
        except FileExistsError:
            return self.read(path) == data  # idempotent, as on a bucket that retries
        finally:
            os.unlink(tmp)
        return True

    def write_if(self, path: str, data: bytes, expected: str | None) -> str:
        directory = path.rsplit("/", 1)[0]
        os.makedirs(directory, exist_ok=True)
        with open(f"{directory}/.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = self._stat_token(path)
            if current != expected:
                raise PreconditionFailed(f"{path} changed since it was read")
            self.write(path, data)
            return self._stat_token(path) or ""

    def append(self, path: str, data: bytes, size: int | None = None) -> None:
        os.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with open(path, "ab") as f:
            f.write(data)


class GcsObjects(Objects):
    """GCS via gcsfs: generation preconditions on multipart uploads, compose for appends,
    listings split into name ranges fetched in parallel."""

    PAGE = 1000  # GCS returns at most 1,000 names per page
    SPLIT_EVERY = 800  # names per range: room to grow by a quarter before it takes two pages
    RANGES_IN_FLIGHT = 16
    _FIELDS = "items(name,size,generation),prefixes,nextPageToken"  # a tenth of the bytes

    def __init__(self, fs: AbstractFileSystem) -> None:
        super().__init__(fs)
        self._splits: dict[str, list[str]] = {}  # directory -> names that split its listing

    def list(self, directory: str) -> dict[str, ObjectInfo]:
        """One page after another is 10 round trips for 10,000 names. The names seen last time
        split the key space into ranges of 800 names (startOffset inclusive, endOffset
        exclusive, the first and last open), listed concurrently: one round trip in a steady
        state, and still every name whatever was added or deleted since, as the ranges cover
        the whole key space (a range that grew past a page takes more pages, in turn)."""
        bucket, key, _ = self.fs.split_path(directory)
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        splits = self._splits.get(directory, [])
        bounds = list(zip([None, *splits], [*splits, None], strict=True))
        try:
            pages = sync(self.fs.loop, self._list_ranges, bucket, prefix, bounds)
        except FileNotFoundError:
            return {}
        found = {}
        names = []
        for items in pages:
            for item in items:
                names.append(item["name"])
                name = item["name"][len(prefix) :]
                if name and "/" not in name and not name.startswith("."):
                    size, token = int(item.get("size") or 0), str(item["generation"])
                    found[name] = ObjectInfo(name, size, token)
        if len(names) > self.SPLIT_EVERY:
            self._splits[directory] = names[self.SPLIT_EVERY :: self.SPLIT_EVERY]
        else:  # one page does: remember nothing for small directories
            self._splits.pop(directory, None)
        return found

    async def _list_ranges(
        self, bucket: str, prefix: str, bounds: list[tuple[str | None, str | None]]
    ) -> list[list[dict[str, Any]]]:
        gate = asyncio.Semaphore(self.RANGES_IN_FLIGHT)

        async def one(start: str | None, end: str | None) -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = []
            token = None
            async with gate:
                while True:
                    page = await self.fs._call(
                        "GET",
                        "b/{}/o",
                        bucket,
                        prefix=prefix,
                        delimiter="/",
                        startOffset=start,
                        endOffset=end,
                        maxResults=self.PAGE,
                        pageToken=token,
                        fields=self._FIELDS,
                        json_out=True,
                    )
                    items.extend(page.get("items", []))
                    token = page.get("nextPageToken")
                    if not token:
                        return items

        tasks = [asyncio.ensure_future(one(start, end)) for start, end in bounds]
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # one range failed: the listing has; stop retrying the others
                task.cancel()
            raise

    def write_if(self, path: str, data: bytes, expected: str | None) -> str:
        bucket, key, _ = self.fs.split_path(path)
        body = (
            b"--==0==\nContent-Type: application/json; charset=UTF-8\n\n"
            + json.dumps({"name": key}).encode()
            + b"\n--==0==\nContent-Type: application/octet-stream\n\n"
            + data
            + b"\n--==0==--"
        )
        try:
            result = self.fs.call(
                "POST",
                f"{self.fs._location}/upload/storage/v1/b/{bucket}/o",
                uploadType="multipart",
                ifGenerationMatch=expected or "0",
                headers={"Content-Type": 'multipart/related; boundary="==0=="'},
                data=body,
                json_out=True,
            )
        except Exception as e:
            if getattr(e, "code", None) == 412 or isinstance(e, FileExistsError):
                if self.read(path) == data:  # our own first try succeeded, then was retried
                    current = self.info(path)
                    return current.token if current else ""
                raise PreconditionFailed(f"{path} changed since it was read") from e
            raise
        self.fs.invalidate_cache(path)
        return str(result["generation"])

    def append(self, path: str, data: bytes, size: int | None = None) -> None:
        """Upload the bytes as a part, compose [object, part] into the object: O(new bytes).

        The compose is sent exactly once per try (no client-side retry): when its answer is
        lost, the object's size says whether it happened, so bytes are never appended twice.
        With ``size`` known, a new log costs one request and a growing one three.
        """
        if size is None:
            before = self.info(path)
            size = before.size if before else 0
        if size == 0:
            self.write(path, data)
            return
        directory, name = path.rsplit("/", 1)
        part = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.part"
        self.write(part, data)
        try:
            for attempt in range(5):
                try:
                    self._compose(path, part)
                    return
                except Exception as e:
                    now = self.info(path)
                    if now is None:  # deleted under us (by hand): start it again
                        self.write(path, data)
                        return
                    if now.size == size + len(data):
                        return
                    if attempt == 4:
                        raise
                    log.warning("compose of %s failed (%s); retrying", path, e)
                    time.sleep(min(8.0, 0.5 * 2**attempt))
        finally:
            self.delete(part)

    def _compose(self, path: str, part: str) -> None:
        """compose [path, part] -> path, sent exactly once (see append)."""
        bucket, key, _ = self.fs.split_path(path)
        body = {
            "kind": "storage#composeRequest",
            "sourceObjects": [{"name": key}, {"name": self.fs.split_path(part)[1]}],
            "destination": {"name": key, "bucket": bucket},
        }
        url = self.fs._format_path("b/{}/o/{}/compose", [bucket, key])
        sync(self.fs.loop, self._post_once, url, {}, body)
        self.fs.invalidate_cache(path)

    async def _post_once(self, url: str, params: dict[str, str], body: dict[str, Any]) -> None:
        """One POST without gcsfs's retry loop: a lost answer must surface to our check."""
        await self.fs._set_session()
        headers = self.fs._get_headers({"Content-Type": "application/json"})
        async with self.fs.session.request(
            "POST",
            url,
            params=params,
            json=body,
            headers=headers,
            timeout=self.fs.requests_timeout,
        ) as response:
            content = await response.read()
            if response.status >= 400:
                error = OSError(f"POST {url}: HTTP {response.status}: {content[:300]!r}")
                error.code = response.status  # type: ignore[attr-defined]
                raise error


# protocol -> class, or "module:Class" imported on first use (as fsspec's own registry does)
_REGISTRY: dict[str, type[Objects] | str] = {
    "gs": GcsObjects,
    "gcs": GcsObjects,
    "s3": "bastion.objects_s3:S3Objects",
    "s3a": "bastion.objects_s3:S3Objects",
}


def register(protocol: str, objects: type[Objects] | str) -> None:
    _REGISTRY[protocol] = objects


def objects_for(fs: AbstractFileSystem) -> Objects:
    if isinstance(fs, LocalFileSystem):
        return LocalObjects(fs)
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    for protocol in protocols:
        entry = _REGISTRY.get(protocol)
        if isinstance(entry, str):
            module, _, name = entry.partition(":")
            entry = _REGISTRY[protocol] = getattr(importlib.import_module(module), name)
        if entry is not None:
            return entry(fs)
    return Objects(fs)

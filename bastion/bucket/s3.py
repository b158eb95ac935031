"""S3 via s3fs: conditional PUTs on the ETag for create and compare-and-swap, and appends.

What S3 offers and how each primitive uses it:

* ``create``: ``PutObject`` with ``If-None-Match: *`` (what s3fs ``pipe_file(mode="create")``
  sends; on ``CompleteMultipartUpload`` for bodies over 100 MiB).
* ``write_if``: ``PutObject`` with ``If-Match: <ETag>`` (``If-None-Match: *`` when the object
  must be absent). The answer carries the new ETag, so no extra request is needed to learn it.
* tokens: the ETag, quotes stripped, from listings, ``HeadObject`` and ``PutObject`` alike, so
  a token from a listing can be handed straight to ``write_if``. An ETag is (for single-part
  uploads) a hash of the content, not a generation: writing identical bytes again gives the
  same token. That is harmless here (a token only has to change when the content does), but a
  compare-and-swap cannot tell "unchanged" from "changed and changed back".
* ``list``: ListObjectsV2 with a delimiter, one request per 1,000 objects (s3fs ``ls`` lists
  the parent too when a folder is empty); ``info``: one HeadObject.
* ``append``: standard buckets have no append. Below 5 MiB (S3's minimum part size) the object
  is read and written back whole with ``If-Match`` (cost O(object), at most 5 MiB each way).
  From 5 MiB on, a multipart upload whose first parts are server-side copies of the object
  (``UploadPartCopy`` with ``x-amz-copy-source-if-match``) and whose last part is the new bytes,
  completed with ``If-Match``: the client sends only the new bytes (S3 copies the old ones
  internally, 5 GiB per part at most), so a growing job log costs O(new bytes) per sync.
* ``read`` with a start at or after the end: S3 answers 416, which here means "nothing new".
* ``read_with_token``: one GetObject, whose ETag header is the token of the bytes it carries
  (a spec read by name after a submission marker costs one request, as on GCS).
* ``delete_many``: DeleteObjects, up to 1,000 keys per request (consumed submission markers,
  an attempt's agent records).

Every request has a connect and a read timeout. botocore retries transient failures (5xx,
throttling codes such as SlowDown, timeouts, connection errors) with exponential backoff and
jitter ("standard" mode, 5 attempts); s3fs wraps that in up to 5 tries of its own for dropped
connections, read timeouts and SlowDown; a 429 under any other code and a 409
``ConditionalRequestConflict`` (conditional writes racing on AWS) are retried here. Failures
surface as OSError, as from the other backends. The defaults below are applied to a filesystem
that has not connected yet; storage options given by the caller (``config_kwargs``) win.

Endpoint and credentials come from the standard AWS chain, so ``AWS_ENDPOINT_URL`` (or
``AWS_ENDPOINT_URL_S3``), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and
``AWS_DEFAULT_REGION`` are enough to point ``s3://`` at any S3-compatible server; fsspec's
``FSSPEC_S3_ENDPOINT_URL`` works too.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError
from fsspec import AbstractFileSystem
from fsspec.asyn import sync

from bastion.bucket.objects import (
    ConditionalWrite,
    Created,
    ObjectInfo,
    Objects,
    PreconditionFailed,
    TokenRead,
    TokenWrite,
    created_by_writes,
    in_flight,
    in_range,
)
from bastion.retry import each, read_back

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 5
READ_TIMEOUT_SECONDS = 20
MAX_ATTEMPTS = 5  # botocore's count: the first try and four retries

CLIENT_CONFIG: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT_SECONDS,
    "read_timeout": READ_TIMEOUT_SECONDS,
    "retries": {"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
    # botocore's default is 10: a cycle's batched reads and writes keep more in flight
    "max_pool_connections": 64,
}

MIN_PART = 5 << 20  # S3's smallest part (all but the last); below it, append rewrites
MAX_COPY_PART = 5 << 30  # S3's largest UploadPartCopy range
APPEND_ATTEMPTS = 5  # the object changed under an append: read its new state, try again

T = TypeVar("T")


def _response(error: BaseException | None) -> dict[str, Any] | None:
    """The botocore response behind an s3fs error (s3fs keeps it as the cause)."""
    seen = 0
    while error is not None and seen < 5:
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            return response
        error = error.__cause__ or error.__context__
        seen += 1
    return None


def _status(error: BaseException) -> int | None:
    response = _response(error)
    if response is None:
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status else None


def _code(error: BaseException) -> str | None:
    response = _response(error)
    return response.get("Error", {}).get("Code") if response else None


@contextlib.contextmanager
def _as_oserror() -> Iterator[None]:
    """Bucket failures surface as OSError, as from the other backends.

    s3fs turns answers with an error status into OSError subclasses already; what is left are
    transport failures after botocore's retries (e.g. EndpointConnectionError), which are not."""
    try:
        yield
    except BotoCoreError as e:
        if isinstance(e, OSError):
            raise
        raise ConnectionError(f"S3 request failed: {e}") from e


def _just_before(name: str) -> str:
    """A key below ``name`` that no key between it and ``name`` is likely to extend: its last
    character one less (a name ending in the lowest character: the name without it)."""
    last = ord(name[-1])
    return name[:-1] + (chr(last - 1) + "\U0010ffff" if last > 1 else "")


def _condition(expected: str | None) -> dict[str, str]:
    """A conditional PutObject's header: If-Match on the token, If-None-Match: * for None."""
    return {"IfMatch": f'"{expected}"'} if expected else {"IfNoneMatch": "*"}


def _etag(value: Any) -> str:
    return str(value).strip('"')


class S3Objects(Objects):
    """S3 (and S3-compatible servers) through s3fs and its aiobotocore client."""

    REQUESTS_IN_FLIGHT = 64  # of one read_many_with_token or write_many_if (the client's pool)

    def __init__(self, fs: AbstractFileSystem) -> None:
        super().__init__(fs)
        if getattr(fs, "_s3", None) is None:  # the client is built from these on first use
            given = fs.config_kwargs  # type: ignore[attr-defined]
            fs.config_kwargs = {**CLIENT_CONFIG, **given}  # type: ignore[attr-defined]

    @staticmethod
    def token(info: dict[str, Any]) -> str:
        etag = info.get("ETag") or info.get("etag")
        if etag:
            return _etag(etag)
        return Objects.token(info)

    def _request(self, send: Callable[[], T], what: str) -> T:
        """One bucket request, as an OSError on failure, retrying what botocore does not.

        botocore's "standard" retries cover 5xx, throttling codes, timeouts and connection
        errors; a 429 under another code, and a 409 ConditionalRequestConflict (conditional
        writes racing on AWS, which asks clients to retry), are retried here, with jitter."""
        for attempt in range(MAX_ATTEMPTS):
            try:
                with _as_oserror():
                    return send()
            except OSError as e:
                retry = _status(e) == 429 or _code(e) == "ConditionalRequestConflict"
                if not retry or attempt + 1 == MAX_ATTEMPTS:
                    raise
                pause = random.uniform(0, min(10.0, 0.2 * 2**attempt))
                log.info("%s: %s; retrying in %.2fs", what, e, pause)
                time.sleep(pause)
        raise AssertionError("unreachable")

    def _call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        call_s3 = self.fs.call_s3  # type: ignore[attr-defined]
        return self._request(lambda: call_s3(method, **kwargs), f"{method} {kwargs.get('Key')}")

    def _split(self, path: str) -> tuple[str, str]:
        bucket, key, _ = self.fs.split_path(path)  # type: ignore[attr-defined]
        return bucket, key

    # -- reading -----------------------------------------------------------------------------

    def list(self, directory: str) -> dict[str, ObjectInfo]:
        """One ListObjectsV2 request per 1,000 objects; subfolders and dot-names skipped."""
        return self.list_range(directory)

    def list_range(
        self,
        directory: str,
        start: str | None = None,
        end: str | None = None,
        limit: int | None = None,
    ) -> dict[str, ObjectInfo]:
        """ListObjectsV2 from just before ``start`` (StartAfter is exclusive, so it starts
        after the last name below ``start`` can share its beginning), pages until ``end`` or
        ``limit``."""
        bucket, key = self._split(directory)
        prefix = key.strip("/") + "/" if key.strip("/") else ""
        request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/"}
        if start:
            request["StartAfter"] = prefix + _just_before(start)
        if limit is not None:
            request["MaxKeys"] = min(1000, max(1, limit))
        found: dict[str, ObjectInfo] = {}
        while True:
            try:
                page = self._call("list_objects_v2", **request, **self.fs.req_kw)
            except FileNotFoundError:  # no such bucket
                return {}
            for entry in page.get("Contents", []):
                name = entry["Key"][len(prefix) :]
                if (end is not None and name >= end) or len(found) == limit:
                    return found
                listed = name and "/" not in name and not name.startswith(".")
                if listed and in_range(name, start, end):
                    size = int(entry.get("Size") or 0)
                    found[name] = ObjectInfo(name, size, _etag(entry["ETag"]))
            if not page.get("IsTruncated"):
                return found
            request["ContinuationToken"] = page["NextContinuationToken"]

    def info(self, path: str) -> ObjectInfo | None:
        """One HeadObject (s3fs ``info`` also lists the prefix when the object is missing)."""
        bucket, key = self._split(path)
        try:
            head = self._call("head_object", Bucket=bucket, Key=key, **self.fs.req_kw)
        except FileNotFoundError:
            return None
        return ObjectInfo(
            path.rsplit("/", 1)[-1], int(head.get("ContentLength") or 0), _etag(head["ETag"])
        )

    def read(self, path: str, start: int | None = None, limit: int | None = None) -> bytes | None:
        """The object from ``start`` on, in one GET; b"" when ``start`` is at or past the end.
        ``limit``: at most ``limit + 1`` bytes are fetched; more is UnacceptableObject."""
        end = None if limit is None else (start or 0) + limit + 1
        try:
            data = self._request(  # max_concurrency=1: one GET, without asking for the size first
                lambda: self.fs.cat_file(path, start=start or None, end=end, max_concurrency=1),
                f"read {path}",
            )
        except FileNotFoundError:
            return None
        except OSError as e:
            if (start or end) and _status(e) == 416:  # InvalidRange: nothing at or after start
                return b""
            raise
        return self._within(path, data, limit)

    def read_with_token(self, path: str, limit: int | None = None) -> tuple[bytes, str] | None:
        """One GetObject (at most ``limit + 1`` bytes): the bytes and the ETag they carry."""
        try:
            out, data = self._request(
                lambda: sync(self.fs.loop, self._get, path, limit), f"read {path}"
            )
        except FileNotFoundError:
            return None
        except OSError as e:
            if _status(e) != 416:  # an empty object refuses a range: the generic two requests
                raise
            return super().read_with_token(path, limit)
        return self._within(path, data, limit), _etag(out["ETag"])

    def read_many_with_token(
        self, paths: Sequence[str], limit: int | None = None, pool: Executor | None = None
    ) -> list[TokenRead]:
        """Every GetObject sent from one call into s3fs's event loop, ``REQUESTS_IN_FLIGHT``
        at a time (the pool unused). A GET that fails is sent again on its own, through
        ``read_with_token``: its retries, its fallback for an empty object, its errors."""
        calls = [functools.partial(self._get, path, limit) for path in paths]
        got_all = sync(self.fs.loop, in_flight, calls, self.REQUESTS_IN_FLIGHT)
        return each(self._got, ((p, g, limit) for p, g in zip(paths, got_all, strict=True)))

    def _got(
        self, path: str, got: tuple[dict[str, Any], bytes] | BaseException, limit: int | None
    ) -> tuple[bytes, str] | None:
        """A batched GET's answer, as ``read_with_token`` answers (a failed one: sent again)."""
        if isinstance(got, FileNotFoundError):
            return None
        if isinstance(got, BaseException):
            if not isinstance(got, Exception):
                raise got
            return self.read_with_token(path, limit)
        out, data = got
        return self._within(path, data, limit), _etag(out["ETag"])

    async def _get(self, path: str, limit: int | None) -> tuple[dict[str, Any], bytes]:
        bucket, key = self._split(path)
        extra = {} if limit is None else {"Range": f"bytes=0-{limit}"}
        out = await self.fs._call_s3(  # type: ignore[attr-defined]
            "get_object", Bucket=bucket, Key=key, **extra, **self.fs.req_kw
        )
        body = out["Body"]
        try:
            return out, await body.read()
        finally:
            body.close()

    # -- writes ------------------------------------------------------------------------------

    def write(self, path: str, data: bytes) -> None:
        """One PutObject (multipart above 100 MiB): readers see the old or the new bytes."""
        self._request(lambda: self.fs.pipe_file(path, data), f"write {path}")

    def delete(self, path: str) -> None:
        """DeleteObject answers 204 whether or not the object existed."""
        bucket, key = self._split(path)
        try:
            with contextlib.suppress(FileNotFoundError):
                self._call("delete_object", Bucket=bucket, Key=key)
        finally:
            self.fs.invalidate_cache(path)

    BATCH = 1000  # keys per DeleteObjects request (S3's limit)

    def delete_many(self, paths: list[str]) -> list[str]:
        """DeleteObjects, 1,000 keys per request; an absent key counts as deleted. Returns the
        paths it could not delete (every key of a request that failed; the keys a request
        answered with an error)."""
        by_bucket: dict[str, list[str]] = {}
        for path in paths:
            bucket, key = self._split(path)
            by_bucket.setdefault(bucket, []).append(key)
        failed: list[str] = []
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), self.BATCH):
                failed.extend(self._delete_batch(bucket, keys[i : i + self.BATCH]))
        for path in paths:
            self.fs.invalidate_cache(path)
        return failed

    def _delete_batch(self, bucket: str, keys: list[str]) -> list[str]:
        """One DeleteObjects request; the ``bucket/key`` paths that were not deleted."""
        try:
            out = self._call(
                "delete_objects",
                Bucket=bucket,
                Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True},
            )
        except OSError as e:
            log.warning("s3://%s: DeleteObjects of %d keys failed: %s", bucket, len(keys), e)
            return [f"{bucket}/{k}" for k in keys]
        errors = [e for e in out.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if errors:
            first = errors[0]
            log.warning(
                "s3://%s/%s: could not delete: %s: %s (%d of %d keys failed)",
                bucket,
                first.get("Key"),
                first.get("Code"),
                first.get("Message"),
                len(errors),
                len(keys),
            )
        return [f"{bucket}/{e.get('Key')}" for e in errors]

    def create(self, path: str, data: bytes) -> bool:
        """PutObject with If-None-Match: *; False when another object is already there."""
        try:
            self._request(lambda: self.fs.pipe_file(path, data, mode="create"), f"create {path}")
        except OSError as e:
            if isinstance(e, FileExistsError) or _status(e) == 412:
                # A retried request may have created it on its first try: then it is ours.
                return read_back(lambda: self.read(path), lambda now: now == data).ours
            raise
        return True

    def write_many_if(
        self, writes: Sequence[ConditionalWrite], pool: Executor | None = None
    ) -> list[TokenWrite]:
        """Every conditional PutObject sent from one call into s3fs's event loop,
        ``REQUESTS_IN_FLIGHT`` at a time (the pool unused). A put that fails, its
        precondition included, is sent again on its own, through ``write_if``: its retries,
        and its read-back of a lost precondition (the first put may have landed)."""
        calls = [functools.partial(self._put_if, *write) for write in writes]
        sent_all = sync(self.fs.loop, in_flight, calls, self.REQUESTS_IN_FLIGHT)
        return each(self._put, ((*w, s) for w, s in zip(writes, sent_all, strict=True)))

    def create_many(
        self, items: Sequence[tuple[str, bytes]], pool: Executor | None = None
    ) -> list[Created]:
        """Every create as a conditional write that the object be absent, from one call."""
        return created_by_writes(self, items)

    def _put(
        self, path: str, data: bytes, expected: str | None, sent: dict[str, Any] | BaseException
    ) -> str:
        """A batched put's answer, as ``write_if`` answers (a failed one: sent again)."""
        self.fs.invalidate_cache(path)
        if isinstance(sent, BaseException):
            if not isinstance(sent, Exception):
                raise sent
            return self.write_if(path, data, expected)
        return _etag(sent["ETag"])

    async def _put_if(self, path: str, data: bytes, expected: str | None) -> dict[str, Any]:
        bucket, key = self._split(path)
        return await self.fs._call_s3(  # type: ignore[attr-defined]
            "put_object", Bucket=bucket, Key=key, Body=data, **_condition(expected)
        )

    def write_if(self, path: str, data: bytes, expected: str | None) -> str:
        """PutObject with If-Match on ``expected`` (If-None-Match: * for None); new token."""
        bucket, key = self._split(path)
        condition = _condition(expected)
        try:
            out = self._call("put_object", Bucket=bucket, Key=key, Body=data, **condition)
        except OSError as e:
            # 412: the ETag differs (or, for None, the object exists); 404 NoSuchKey: the
            # object we expected was deleted meanwhile.
            gone = expected is not None and _status(e) == 404 and _code(e) == "NoSuchKey"
            if _status(e) == 412 or gone or isinstance(e, FileExistsError):
                # our own first try may have won, and was then retried
                if read_back(lambda: self.read(path), lambda now: now == data).ours:
                    current = self.info(path)
                    return current.token if current else ""
                raise PreconditionFailed(f"{path} changed since it was read") from e
            raise
        finally:
            self.fs.invalidate_cache(path)
        return _etag(out["ETag"])

    # -- append ------------------------------------------------------------------------------

    def append(self, path: str, data: bytes, size: int | None = None) -> None:
        """Add ``data`` at the end, conditioned on the object not changing meanwhile.

        Below 5 MiB: read-modify-write with If-Match (O(object size), bounded by 5 MiB).
        From 5 MiB: server-side copy plus one new part (O(new bytes) sent by us). When the
        object changed under us (a 412), its new state is read and the append tried again.
        ``size`` (the caller's idea of the current size): 0 saves the HEAD of a new object
        (a create that finds one there falls back to reading it); any other value is not
        needed, If-Match covers it.
        """
        if not data:
            return
        if size == 0 and self.create(path, data):
            return
        for _ in range(APPEND_ATTEMPTS):
            before = self.info(path)
            try:
                if before is None:
                    if self.create(path, data):
                        return
                    continue  # someone else created it first: append to theirs
                if before.size < MIN_PART:
                    old = self.read(path) or b""
                    if len(old) != before.size:
                        continue  # changed between HEAD and GET
                    self.write_if(path, old + data, before.token)
                    return
                self._append_by_copy(path, before, data)
                return
            except PreconditionFailed as e:
                log.info("%s changed during an append (%s); trying again", path, e)
        raise PreconditionFailed(f"{path} kept changing; gave up appending")

    def _append_by_copy(self, path: str, before: ObjectInfo, data: bytes) -> None:
        bucket, key = self._split(path)
        match = f'"{before.token}"'
        upload = self._call("create_multipart_upload", Bucket=bucket, Key=key)
        upload_id = upload["UploadId"]
        common = {"Bucket": bucket, "Key": key, "UploadId": upload_id}
        try:
            parts = []
            count = -(-before.size // MAX_COPY_PART)  # copies of at most 5 GiB each
            edges = [before.size * i // count for i in range(count + 1)]
            for number, (lo, hi) in enumerate(itertools.pairwise(edges), start=1):
                out = self._call(
                    "upload_part_copy",
                    **common,
                    PartNumber=number,
                    CopySource={"Bucket": bucket, "Key": key},
                    CopySourceRange=f"bytes={lo}-{hi - 1}",
                    CopySourceIfMatch=match,
                )
                parts.append({"PartNumber": number, "ETag": out["CopyPartResult"]["ETag"]})
            out = self._call("upload_part", **common, PartNumber=count + 1, Body=data)
            parts.append({"PartNumber": count + 1, "ETag": out["ETag"]})
            self._call(
                "complete_multipart_upload",
                **common,
                MultipartUpload={"Parts": parts},
                IfMatch=match,
            )
        except Exception as e:
            with contextlib.suppress(Exception):
                self._call("abort_multipart_upload", **common)
            # A completion that succeeded but whose answer was lost and then retried fails
            # its If-Match against our own new object: check before reporting a conflict.
            if self._appended(path, before, data):
                return
            if _status(e) == 412:
                raise PreconditionFailed(f"{path} changed during an append") from e
            raise
        finally:
            self.fs.invalidate_cache(path)

    def _appended(self, path: str, before: ObjectInfo, data: bytes) -> bool:
        def ours(now: ObjectInfo) -> bool:
            return (
                now.token != before.token
                and now.size == before.size + len(data)
                and self.read(path, start=before.size) == data
            )

        try:
            return read_back(lambda: self.info(path), ours).ours
        except Exception:
            return False

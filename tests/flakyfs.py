"""A bucket that fails: fsspec over a real local directory, raising on chosen calls.

``flaky:///some/dir`` reads and writes ``/some/dir`` through a real ``LocalFileSystem``, but a
``FailurePlan`` installed for that directory makes a deterministic, seeded fraction of calls raise
``Simulated503`` (an ``OSError``, never a ``FileNotFoundError``). A failing call that changes the
bucket fails either *before* doing anything or *after* doing it (the request reached the bucket,
the answer was lost), which is the ambiguous case real clients must survive.

The filesystem is not a ``LocalFileSystem``, so ``bastion.bucket.store.Store`` takes its generic
(object-store) code paths with it. Writes are whole-object and atomic (temporary file outside the
listed directories, then ``os.replace``), as in a real bucket.

fsspec creates a new instance for every ``url_to_fs`` (``cachable = False``), so the plans live on
the class, keyed by the directory they cover; paths outside every plan never fail.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem

from bastion.bucket.objects import Objects
from bastion.bucket.objects import register as register_bucket

PROTOCOL = "flaky"
READS = frozenset({"ls", "info", "size", "cat_file"})
WRITES = frozenset({"pipe_file", "rm_file"})
_TMP_DIR = ".flaky-tmp"  # beside the covered directory's content, never inside a listed folder

T = TypeVar("T")


class Simulated503(OSError):
    """What a bucket says when it is overloaded; not a FileNotFoundError."""


class FailurePlan:
    """Decides which calls fail: a seeded fraction, optionally only some ops or paths.

    The decision for the n-th call of (op, path) is a hash of (seed, op, path, n), so it does not
    depend on how threads interleave. ``first_calls`` makes the first calls of each (op, path)
    fail for sure, for tests that need one particular failure to happen; ``when`` pins whether a
    failing write fails before or after it happened.
    """

    def __init__(
        self,
        fraction: float = 0.0,
        seed: int = 0,
        ops: Iterable[str] | None = None,
        where: str = "",
        first_calls: int = 0,
        when: str = "either",
        silent: bool = False,
    ) -> None:
        self.fraction = fraction
        self.seed = seed
        self.ops = None if ops is None else frozenset(ops)
        self.where = where
        self.first_calls = first_calls
        self.when = when  # for writes: "before", "after" or "either" (seeded)
        self.silent = silent  # fail with a TimeoutError() that says nothing, as a timeout does
        self.calls: collections.Counter[str] = collections.Counter()
        self.failures: collections.Counter[str] = collections.Counter()  # "op:before|after"
        self._seen: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = threading.Lock()

    def _unit(self, *parts: object) -> float:
        digest = hashlib.sha256(":".join(map(str, (self.seed, *parts))).encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def decide(self, op: str, path: str) -> str | None:
        """None to let the call through, "before" or "after" to fail it."""
        with self._lock:
            self.calls[op] += 1
            if (self.ops is not None and op not in self.ops) or self.where not in path:
                return None
            n = self._seen[(op, path)]
            self._seen[(op, path)] += 1
        fail = n < self.first_calls or self._unit(op, path, n) < self.fraction
        if not fail:
            return None
        if op not in WRITES or self.when == "before":
            when = "before"
        elif self.when == "after":
            when = "after"
        else:
            when = "after" if self._unit("when", op, path, n) < 0.5 else "before"
        with self._lock:
            self.failures[f"{op}:{when}"] += 1
        return when

    @property
    def total_failures(self) -> int:
        return sum(self.failures.values())


class FlakyFileSystem(AbstractFileSystem):
    protocol = PROTOCOL
    cachable = False
    plans: ClassVar[dict[str, FailurePlan]] = {}
    _plans_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.local = LocalFileSystem(auto_mkdir=True)

    # -- plans -------------------------------------------------------------------------------

    @classmethod
    def install(cls, directory: str, plan: FailurePlan) -> str:
        """Cover ``directory`` with ``plan``; returns the flaky URL of the directory."""
        directory = os.path.abspath(directory)
        with cls._plans_lock:
            cls.plans[directory] = plan
        return f"{PROTOCOL}://{directory}"

    @classmethod
    def uninstall(cls, directory: str) -> None:
        with cls._plans_lock:
            cls.plans.pop(os.path.abspath(directory), None)

    @classmethod
    def _covering(cls, path: str) -> tuple[str, FailurePlan] | None:
        with cls._plans_lock:
            found = [
                (base, plan)
                for base, plan in cls.plans.items()
                if path == base or path.startswith(base + "/")
            ]
        return max(found, key=lambda item: len(item[0])) if found else None

    def _call(self, op: str, path: str, action: Callable[[], T]) -> T:
        covering = self._covering(path)
        when = covering[1].decide(op, path) if covering else None
        if when == "before":
            raise self._failure(covering[1], f"before {op} {path}")
        result = action()
        if when == "after":
            raise self._failure(covering[1], f"after {op} {path} (it happened)")
        return result

    @staticmethod
    def _failure(plan: FailurePlan, where: str) -> Exception:
        return (
            TimeoutError()
            if plan.silent
            else Simulated503(f"simulated 503 Service Unavailable {where}")
        )

    def _tmp_path(self, path: str) -> str:
        covering = self._covering(path)
        base = covering[0] if covering else os.path.dirname(path)
        tmp_dir = os.path.join(base, _TMP_DIR)
        os.makedirs(tmp_dir, exist_ok=True)
        return os.path.join(tmp_dir, uuid.uuid4().hex)

    # -- the calls Store makes ---------------------------------------------------------------

    def invalidate_cache(self, path: str | None = None) -> None:
        return None  # nothing is cached

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)

        def listing() -> list[Any]:
            entries = self.local.ls(path, detail=True)
            entries = [e for e in entries if e["name"].rstrip("/").rsplit("/", 1)[-1] != _TMP_DIR]
            return entries if detail else [e["name"] for e in entries]

        return self._call("ls", path, listing)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        return self._call("info", path, lambda: self.local.info(path))

    def size(self, path: str) -> int:
        path = self._strip_protocol(path)
        return self._call("size", path, lambda: self.local.size(path))

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        path = self._strip_protocol(path)
        return self._call("cat_file", path, lambda: self.local.cat_file(path, start, end))

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        path = self._strip_protocol(path)

        def put() -> None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = self._tmp_path(path)
            with open(tmp, "wb") as f:
                f.write(value)
            try:
                if mode == "create":
                    os.link(tmp, path)  # FileExistsError when present, like ifGenerationMatch=0
                else:
                    os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)

        self._call("pipe_file", path, put)

    def rm_file(self, path: str) -> None:
        path = self._strip_protocol(path)
        self._call("rm_file", path, lambda: os.remove(path))

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        raise NotImplementedError("the flaky bucket only supports whole-object calls")


fsspec.register_implementation(PROTOCOL, FlakyFileSystem, clobber=True)
# The daemon refuses a protocol without a bucket backend; flaky:// runs on the generic one
# (plain writes, read-modify-write appends), the weakest backend a root can have.
register_bucket(PROTOCOL, Objects, clobber=True)

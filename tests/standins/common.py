"""Shared plumbing for the loopback Google API stand-ins (Google's API documentation).

A stand-in is a stdlib ThreadingHTTPServer on 127.0.0.1 whose routes are (method, regex, handler)
triples. Handlers run under one lock and return ``(status, json)`` or raise ``ApiError`` carrying a
Google error envelope. Time is virtual: ``tick()`` advances the clock by ``seconds_per_tick`` and
calls the subclass's ``_step()``; with ``polls_per_tick=N`` every N-th GET (or operation wait) also
ticks, so a client poll loop makes progress without a test driving it. Never wall clock.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)  # virtual time 0


def rfc3339(seconds: float) -> str:
    return (EPOCH + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def virtual_seconds(timestamp: str) -> float:
    """RFC3339 timestamp -> virtual seconds since EPOCH."""
    t = dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return (t - EPOCH).total_seconds()


class ApiError(Exception):
    """An HTTP error answer: ``status`` and the full ``{"error": {...}}`` body."""

    def __init__(self, status: int, body: dict):
        super().__init__(body["error"].get("message"))
        self.status, self.body = status, body


def rpc_error(code: int, status: str, message: str, details: list | None = None) -> ApiError:
    """AIP-style envelope (TPU v2): ``HttpError.error_details`` is ``details`` if given."""
    err = {"code": code, "message": message, "status": status}
    if details:
        err["details"] = details
    return ApiError(code, {"error": err})


def gce_error(code: int, reason: str, message: str, domain: str = "global") -> ApiError:
    """Compute v1 envelope: ``HttpError.error_details`` is the ``errors`` list."""
    errors = [{"message": message, "domain": domain, "reason": reason}]
    return ApiError(code, {"error": {"code": code, "message": message, "errors": errors}})


def public(record: dict) -> dict:
    """A deep copy without the stand-in's private ``_``-prefixed bookkeeping keys."""
    return {k: copy.deepcopy(v) for k, v in record.items() if not k.startswith("_")}


def camel_keys(obj):
    """proto3 JSON accepts snake_case: rewrite keys to camelCase, except inside label and
    string-map metadata (TPU ``metadata``; compute's ``metadata.items`` list is recursed)."""
    if isinstance(obj, list):
        return [camel_keys(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for k, v in obj.items():
        key = re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), k)
        string_map = key == "labels" or (
            key == "metadata" and isinstance(v, dict) and not isinstance(v.get("items"), list)
        )
        out[key] = v if string_map else camel_keys(v)
    return out


def paginate(items: list, size: int | None, token: str | None) -> tuple[list, str | None]:
    """Offset pagination with an opaque-enough token; ``size`` None/0 means everything."""
    start = int(token) if token else 0
    if not size:
        return items[start:], None
    end = start + size
    return items[start:end], (str(end) if end < len(items) else None)


# --- the list-filter subset (AIP-160 as Compute uses it) --------------------------------------
_TOKEN = re.compile(
    r"""\s*(?:(?P<paren>[()])|(?P<op>AND|OR)\b|"""
    r"""(?P<field>[A-Za-z_][\w.\-]*)\s*(?P<cmp>!=|=|:)\s*(?P<value>"(?:[^"\\]|\\.)*"|[^\s()]+))"""
)


def parse_filter(text: str | None):
    """``labels.k = "v" AND (status = RUNNING OR status = STAGING)``, ``labels.k:*``, parentheses,
    implicit AND. Returns a predicate over a resource dict. OR binds tighter than AND (AIP-160)."""
    if not text or not text.strip():
        return lambda _r: True
    tokens, pos = [], 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if not m:
            raise rpc_error(400, "INVALID_ARGUMENT", f"Invalid list filter expression '{text}'.")
        tokens.append(m)
        pos = m.end()
    i = 0

    def atom():
        nonlocal i
        t = tokens[i]
        i += 1
        if t["paren"] == "(":
            pred = conj()
            i += 1  # ')'
            return pred
        field, cmp, value = t["field"], t["cmp"], t["value"]
        if value.startswith('"'):
            value = json.loads(value)

        def pred(r, field=field, cmp=cmp, value=value):
            cur = r
            for part in field.split("."):
                cur = cur.get(part) if isinstance(cur, dict) else None
            if cmp == ":":
                return cur is not None and (value == "*" or str(cur) == value)
            return (str(cur) == value) == (cmp == "=") if cur is not None else cmp == "!="

        return pred

    def disj():
        nonlocal i
        preds = [atom()]
        while i < len(tokens) and tokens[i]["op"] == "OR":
            i += 1
            preds.append(atom())
        return lambda r: any(p(r) for p in preds)

    def conj():
        nonlocal i
        preds = [disj()]
        while i < len(tokens) and tokens[i]["paren"] != ")":
            if tokens[i]["op"] == "AND":
                i += 1
            preds.append(disj())
        return lambda r: all(p(r) for p in preds)

    return conj()


# --- the server --------------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _serve(self):
        self.server.standin._handle(self)

    do_GET = do_POST = do_DELETE = do_PATCH = _serve


class CapacityInjections:
    """Zones out of capacity and quota refusals, set by tests; each server's class says what
    they do to a create there."""

    def stockout(self, zone: str) -> None:
        with self.lock:  # type: ignore[attr-defined]
            self._stocked_out.add(zone)  # type: ignore[attr-defined]

    def restock(self, zone: str) -> None:
        with self.lock:  # type: ignore[attr-defined]
            self._stocked_out.discard(zone)  # type: ignore[attr-defined]

    def quota(self, zone: str | None = None) -> None:
        """Creates in ``zone`` (None: anywhere) are refused for quota."""
        with self.lock:  # type: ignore[attr-defined]
            self._quota.add(zone)  # type: ignore[attr-defined]

    def lift_quota(self, zone: str | None = None) -> None:
        with self.lock:  # type: ignore[attr-defined]
            self._quota.discard(zone)  # type: ignore[attr-defined]

    def fail_creates(
        self, code, message: str, zone: str | None = None, times: int | None = None
    ) -> None:
        """Creates accepted from now on (in ``zone``, or anywhere; the next ``times`` of them,
        or all) fail asynchronously: their operation ends with this error (``code`` as the
        API writes it: a ``google.rpc.Code`` number for TPU, a string for Compute) and
        nothing is left. ``fail_creates(None, "")`` clears every such injection."""
        with self.lock:  # type: ignore[attr-defined]
            if code is None:
                self._failing.clear()  # type: ignore[attr-defined]
            else:
                self._failing.append([zone, code, message, times])  # type: ignore[attr-defined]

    def _create_failure(self, zone: str) -> tuple | None:
        """(code, message) for a create in ``zone`` that an injection fails, counted; or None.
        Called under the lock by the server's ``_step``."""
        for item in self._failing:  # type: ignore[attr-defined]
            where, code, message, left = item
            if where in (None, zone) and (left is None or left > 0):
                if left is not None:
                    item[3] -= 1
                return code, message.replace("{zone}", zone)
        return None


class StandinServer:
    """Base class: routing, injected 429/5xx, the virtual clock, the ``on_ready`` hook.

    Subclasses define ``routes`` (list of (METHOD, regex, method-name)), ``_step()`` (one tick of
    every state machine; returns nothing, queues hook calls with ``_ready(...)``),
    ``_rate_limit_error()`` and ``_unavailable_error()``.
    """

    routes: list[tuple[str, str, str]] = []

    def __init__(
        self, seconds_per_tick: float = 60, polls_per_tick: int | None = None, on_ready=None
    ):
        self.lock = threading.RLock()
        self.clock = 0.0
        self.seconds_per_tick = seconds_per_tick
        self.polls_per_tick = polls_per_tick
        self.on_ready = on_ready  # callable(resource dict, worker index, metadata dict)
        self.requests: list[tuple[str, str, dict, dict]] = []  # (method, path, query, body)
        self._polls = 0
        self._seq = 0
        self._rate_limited = 0
        self._unavailable = 0
        self._pending_hooks: list[tuple] = []
        self._compiled = [(m, re.compile(rx), name) for m, rx, name in self.routes]
        self._httpd: ThreadingHTTPServer | None = None

    # lifecycle
    def start(self):
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.standin = self
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self):
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    # injections shared by every API
    def rate_limit(self, n: int = 1):
        """The next ``n`` requests (any route) answer 429."""
        with self.lock:
            self._rate_limited += n

    def transient_5xx(self, n: int = 1):
        """The next ``n`` requests (any route) answer 503."""
        with self.lock:
            self._unavailable += n

    # virtual time
    def tick(self, n: int = 1):
        """Advance virtual time by ``n`` ticks, then run queued ``on_ready`` hooks unlocked."""
        for _ in range(n):
            with self.lock:
                self.clock += self.seconds_per_tick
                self._step()
                hooks, self._pending_hooks = self._pending_hooks, []
            for args in hooks:
                if self.on_ready:
                    self.on_ready(*args)

    def now(self) -> str:
        return rfc3339(self.clock)

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _ready(self, resource: dict, worker: int, metadata: dict):
        self._pending_hooks.append((public(resource), worker, dict(metadata)))

    # request handling
    def _handle(self, h: BaseHTTPRequestHandler):
        path, _, qs = h.path.partition("?")
        path = unquote(path)
        query = {k: v[-1] for k, v in parse_qs(qs, keep_blank_values=True).items()}
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            body = None
        try:
            status, obj = self._dispatch(h.command, path, query, body)
        except ApiError as e:
            status, obj = e.status, e.body
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json; charset=UTF-8")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _dispatch(self, method, path, query, body):
        polling = method == "GET" or path.endswith("/wait")
        if polling and self.polls_per_tick:
            with self.lock:
                self._polls += 1
                due = self._polls % self.polls_per_tick == 0
            if due:
                self.tick()
        with self.lock:
            self.requests.append((method, path, query, body))
            if self._rate_limited:
                self._rate_limited -= 1
                raise self._rate_limit_error()
            if self._unavailable:
                self._unavailable -= 1
                raise self._unavailable_error()
            if body is None:
                raise rpc_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
            for m, rx, name in self._compiled:
                match = rx.fullmatch(path)
                if m == method and match:
                    return getattr(self, name)(*match.groups(), query=query, body=body)
            raise self._no_route(method, path)

    def _no_route(self, method, path) -> ApiError:
        return rpc_error(404, "NOT_FOUND", f"Method not found: {method} {path}")

    # subclass hooks
    def _step(self):
        raise NotImplementedError

    def _rate_limit_error(self) -> ApiError:
        raise NotImplementedError

    def _unavailable_error(self) -> ApiError:
        raise NotImplementedError

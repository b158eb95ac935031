"""A fault-injecting HTTP proxy for the GCS emulator (test code, no dependencies).

It sits on 127.0.0.1 in front of fake-gcs-server and forwards every request, method, headers
and body, keeping the client's ``Host`` header (the emulator builds the absolute URLs it returns,
such as a resumable upload's ``Location``, from it; any URL naming the emulator itself is
rewritten to the proxy too). A seeded ``FaultPlan``, replaceable at runtime, makes a fraction of
requests go wrong in one of these ways:

- ``503``: answered 503 *before* forwarding (the request had no effect);
- ``drop``: forwarded and answered by the emulator, then the client's connection is reset
  without a byte of the answer (the request took effect but the client cannot know: the
  ambiguous case every retry must survive);
- ``slow``: held for ``slow_seconds`` before forwarding (it then succeeds);
- ``hang`` (targeted only, see ``fail_next``): never answered, until ``release()`` or ``stop()``
  resets the connection (a stalled TCP connection, which only a client timeout ends).

``latency`` adds a fixed delay to every request (the benchmark uses 20 ms, a GCS-like round
trip). ``fail_next`` queues targeted faults for requests matching a regular expression, which
makes a single ambiguous failure reproducible. Requests are counted by method, by route (list,
media, upload, compose...) and by kind of fault; ``GET /__faultproxy__/stats`` returns them
and ``POST /__faultproxy__/plan`` changes the plan, so a proxy in another process is usable too.

The proxy is bounded: at most ``max_inflight`` requests are forwarded at once, idle client
connections time out, and it shuts itself down after ``lifetime`` seconds if nobody stops it.

    python -m tests.faultproxy --upstream http://127.0.0.1:PORT [--latency 0.02] [--fail_rate 0.2]

prints ``READY http://127.0.0.1:PORT`` once it listens and serves until killed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import http.client
import json
import random
import re
import socket
import struct
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONTROL = "/__faultproxy__/"
KINDS = ("503", "drop", "slow", "hang")
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
}


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    """What goes wrong: ``fail_rate`` of requests fail, each in a kind drawn by ``weights``."""

    fail_rate: float = 0.0
    weights: tuple[tuple[str, float], ...] = (("503", 1.0), ("drop", 1.0), ("slow", 1.0))
    slow_seconds: float = 1.0
    latency: float = 0.0  # added to every request, faulty or not
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.fail_rate <= 1.0:
            raise ValueError(f"fail_rate must be in [0, 1], got {self.fail_rate}")
        for kind, weight in self.weights:
            if kind not in KINDS or weight < 0:
                raise ValueError(f"unknown fault kind or negative weight: {kind}={weight}")

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["weights"] = dict(self.weights)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FaultPlan:
        data = dict(data)
        if "weights" in data:
            data["weights"] = tuple(dict(data["weights"]).items())
        return cls(**data)


@dataclasses.dataclass
class _Targeted:
    pattern: re.Pattern[str]  # searched in "METHOD /path?query"
    kind: str
    left: int


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    proxy: FaultProxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up early is normal (gcsfs cancels the loser of parallel
        requests); anything else is printed as usual."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class FaultProxy:
    """``with FaultProxy(upstream, FaultPlan(fail_rate=0.2)) as proxy: ... proxy.endpoint``."""

    def __init__(
        self,
        upstream: str,
        plan: FaultPlan | None = None,
        port: int = 0,
        lifetime: float = 900.0,
        max_inflight: int = 64,
        upstream_timeout: float = 60.0,
    ) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or not parsed.hostname or not parsed.port:
            raise ValueError(f"upstream must be http://HOST:PORT, got {upstream!r}")
        self.upstream = f"http://{parsed.hostname}:{parsed.port}"
        self._upstream_addr = (parsed.hostname, parsed.port)
        self.upstream_timeout = upstream_timeout
        self.lifetime = lifetime
        self._port = port
        self._inflight = threading.BoundedSemaphore(max_inflight)
        self._lock = threading.Lock()
        self._plan = plan or FaultPlan()
        self._rng = random.Random(self._plan.seed)
        self._targeted: list[_Targeted] = []
        self.requests: collections.Counter[str] = collections.Counter()  # by method
        self.faults: collections.Counter[str] = collections.Counter()  # by kind
        self.routes: collections.Counter[str] = collections.Counter()  # by route()
        self.recent: collections.deque[str] = collections.deque(maxlen=500)  # "METHOD target"
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None
        self._connections: set[socket.socket] = set()
        self._released = threading.Event()  # set: hung requests give up

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        server = _Server(("127.0.0.1", self._port), _Handler)
        server.proxy = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self._timer = threading.Timer(self.lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        """Stop serving and cut every open client connection; idempotent."""
        server, self._server = self._server, None
        self._released.set()
        if self._timer is not None and threading.current_thread() is not self._timer:
            self._timer.cancel()
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- configuration, changeable while it runs -------------------------------------------

    @property
    def plan(self) -> FaultPlan:
        return self._plan

    def set_plan(self, plan: FaultPlan) -> None:
        """Replace the plan; the random sequence restarts from the new plan's seed."""
        with self._lock:
            self._plan = plan
            self._rng = random.Random(plan.seed)

    def configure(self, **changes: Any) -> FaultPlan:
        """Change some fields of the plan (``fail_rate=0`` to heal, ``latency=0.02`` ...)."""
        plan = dataclasses.replace(self._plan, **changes)
        self.set_plan(plan)
        return plan

    def fail_next(self, pattern: str, kind: str = "drop", count: int = 1) -> None:
        """The next ``count`` requests whose "METHOD /path?query" matches ``pattern`` fail
        with ``kind`` (or answer with that HTTP status, if ``kind`` is a number such as 403)."""
        if kind not in KINDS and not kind.isdigit():
            raise ValueError(f"unknown fault kind {kind!r}")
        with self._lock:
            self._targeted.append(_Targeted(re.compile(pattern), kind, count))

    def release(self) -> None:
        """Let go of every hung request (their connections are reset) and of later ones."""
        self._released.set()

    def pending_targeted(self) -> int:
        with self._lock:
            return sum(t.left for t in self._targeted)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": dict(self.requests),
                "total": sum(self.requests.values()),
                "faults": dict(self.faults),
                "routes": dict(self.routes),
                "plan": self._plan.to_json(),
            }

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()
            self.faults.clear()
            self.routes.clear()

    def total(self) -> int:
        with self._lock:
            return sum(self.requests.values())

    # -- used by the handler ---------------------------------------------------------------

    def _decide(self, method: str, target: str) -> tuple[str | None, FaultPlan]:
        with self._lock:
            self.requests[method] += 1
            self.routes[route(method, target)] += 1
            self.recent.append(f"{method} {target}")
            plan = self._plan
            kind: str | None = None
            for rule in self._targeted:
                if rule.left > 0 and rule.pattern.search(f"{method} {target}"):
                    rule.left -= 1
                    kind = rule.kind
                    break
            self._targeted = [t for t in self._targeted if t.left > 0]
            if kind is None and plan.fail_rate and self._rng.random() < plan.fail_rate:
                kinds = [k for k, w in plan.weights if w > 0]
                weights = [w for _, w in plan.weights if w > 0]
                if kinds:
                    kind = self._rng.choices(kinds, weights)[0]
            if kind is not None:
                self.faults[kind] += 1
            return kind, plan

    def _track(self, conn: socket.socket, alive: bool) -> None:
        with self._lock:
            if alive:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120  # an idle keep-alive connection frees its thread after this
    disable_nagle_algorithm = True  # headers and body go out as two writes: no delayed-ACK stall
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.proxy._track(self.connection, True)
        self._upstream: http.client.HTTPConnection | None = None

    def finish(self) -> None:
        self.server.proxy._track(self.connection, False)
        if self._upstream is not None:
            self._upstream.close()
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: thousands of requests per test

    def handle_expect_100(self) -> bool:
        return True  # forward the body as usual; the Expect header is not passed on

    def do_GET(self) -> None:
        self._proxy()

    do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_GET

    # -- one request -----------------------------------------------------------------------

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _proxy(self) -> None:
        proxy = self.server.proxy
        body = self._body()
        if self.path.startswith(CONTROL):
            self._control(body)
            return
        kind, plan = proxy._decide(self.command, self.path)
        if plan.latency:
            time.sleep(plan.latency)
        if kind == "503":
            self._reply(
                503,
                [("Content-Type", "application/json")],
                json.dumps({"error": {"code": 503, "message": "faultproxy: unavailable"}}).encode(),
            )
            return
        if kind is not None and kind.isdigit():
            code = int(kind)
            message = f"faultproxy: injected {code}"
            self._reply(
                code,
                [("Content-Type", "application/json")],
                json.dumps({"error": {"code": code, "message": message}}).encode(),
            )
            return
        if kind == "slow":
            time.sleep(plan.slow_seconds)
        if kind == "hang":
            self.server.proxy._released.wait(self.server.proxy.lifetime)
            self._reset()
            return
        with proxy._inflight:
            try:
                status, headers, data = self._forward(body)
            except OSError as e:
                self._reply(
                    502,
                    [("Content-Type", "application/json")],
                    json.dumps({"error": {"code": 502, "message": f"faultproxy: {e}"}}).encode(),
                )
                return
        if kind == "drop":
            self._reset()
            return
        self._reply(status, headers, data)

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """Send the request upstream (one keep-alive connection per client connection)."""
        proxy = self.server.proxy
        for attempt in (1, 2):
            fresh = self._upstream is None
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(
                    *proxy._upstream_addr, timeout=proxy.upstream_timeout
                )
            conn = self._upstream
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for key, value in self.headers.items():
                    if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                        conn.putheader(key, value)
                if "Host" not in self.headers:
                    conn.putheader("Host", f"127.0.0.1:{proxy.port}")
                if body or self.command in ("POST", "PUT", "PATCH"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
                response = conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                self._upstream = None
                if fresh or attempt == 2:
                    raise
                continue  # an idle keep-alive connection the emulator had closed: once more
            except OSError:
                conn.close()
                self._upstream = None
                raise
            if response.will_close:
                conn.close()
                self._upstream = None
            headers = [
                (k, self._rewrite(v) if k.lower() == "location" else v)
                for k, v in response.getheaders()
                if k.lower() not in _HOP_BY_HOP
            ]
            return response.status, headers, data
        raise AssertionError("unreachable")

    def _rewrite(self, url: str) -> str:
        """An absolute URL naming the emulator itself points at the proxy instead."""
        proxy = self.server.proxy
        return url.replace(proxy.upstream, f"http://127.0.0.1:{proxy.port}")

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response_only(status)
        length = None
        for key, value in headers:
            if key.lower() == "content-length":
                length = value
                continue
            self.send_header(key, value)
        if self.command == "HEAD":
            self.send_header("Content-Length", length or "0")
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD" and data:
            self.wfile.write(data)
        self.wfile.flush()

    def _reset(self) -> None:
        """Abort the client connection with a TCP reset, sending nothing of the answer."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()  # the fd closes (RST) once rfile/wfile let go in finish()

    def _control(self, body: bytes) -> None:
        proxy = self.server.proxy
        action = self.path[len(CONTROL) :].split("?")[0]
        if action == "stats":
            result: Any = proxy.stats()
        elif action == "reset" and self.command == "POST":
            proxy.reset_counts()
            result = proxy.stats()
        elif action == "plan" and self.command == "POST":
            result = proxy.configure(**json.loads(body or b"{}")).to_json()
        else:
            self._reply(404, [], b"")
            return
        self._reply(200, [("Content-Type", "application/json")], json.dumps(result).encode())


def route(method: str, target: str) -> str:
    """A request's kind in GCS JSON-API terms, for counts: "GET list", "POST compose" ..."""
    path, _, query = target.partition("?")
    params = urllib.parse.parse_qs(query)
    if path.startswith("/upload/"):
        what = "upload " + params.get("uploadType", ["?"])[0]
    elif path.endswith("/compose"):
        what = "compose"
    elif re.fullmatch(r"/storage/v1/b/[^/]+/o/?", path):
        what = "list"
    elif re.fullmatch(r"/storage/v1/b/[^/]+/o/.+", path) or path.startswith("/download/"):
        what = "media" if params.get("alt") == ["media"] else "object"
    elif re.fullmatch(r"/storage/v1/b/?[^/]*", path):
        what = "bucket"
    else:
        what = "other"
    return f"{method} {what}"


# -- a client for a proxy in another process ------------------------------------------------


def control(endpoint: str, action: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call a running proxy's control API: ``stats``, ``reset`` or ``plan`` (with fields)."""
    import urllib.request

    request = urllib.request.Request(
        f"{endpoint}{CONTROL}{action}",
        data=None if data is None and action == "stats" else json.dumps(data or {}).encode(),
        method="GET" if action == "stats" else "POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def running(upstream: str, plan: FaultPlan | None = None, **kwargs: Any) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream, plan, **kwargs).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fault-injecting HTTP proxy (tests only)")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added per request")
    parser.add_argument("--fail_rate", type=float, default=0.0)
    parser.add_argument("--slow_seconds", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lifetime", type=float, default=3600.0)
    parser.add_argument("--max_inflight", type=int, default=256)
    args = parser.parse_args(argv)
    plan = FaultPlan(
        fail_rate=args.fail_rate,
        slow_seconds=args.slow_seconds,
        latency=args.latency,
        seed=args.seed,
    )
    proxy = FaultProxy(
        args.upstream, plan, port=args.port, lifetime=args.lifetime, max_inflight=args.max_inflight
    ).start()
    print(f"READY {proxy.endpoint}", flush=True)
    try:
        while proxy._server is not None:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()

"""A GCE metadata-server stand-in on 127.0.0.1 (Google's API documentation).

The in-guest agent finds the metadata server through ``GCE_METADATA_HOST`` as google-auth
does, so pointing that variable at ``server.host`` lets the real agent read its worker number
and watch ``instance/preempted`` in a test. Like the real server it refuses requests without
``Metadata-Flavor: Google`` (403) and answers with that header, and ``?wait_for_change=true``
on ``instance/preempted`` long-polls until the value changes (or ``timeout_sec``, default
``wait_seconds``), so an agent that waits for the notice is tested as it runs on a VM.

    with MetadataServer({"agent-worker-number": "1"}) as md:
        env["GCE_METADATA_HOST"] = md.host
        ...
        md.preempt()
"""

from __future__ import annotations

import contextlib
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "/computeMetadata/v1/"


class MetadataServer:
    def __init__(
        self,
        attributes: dict[str, str] | None = None,
        *,
        hostname: str = "bastion-test-vm",
        project_id: str = "bastion-test",
        wait_seconds: float = 30.0,
    ) -> None:
        self.attributes: dict[str, str] = dict(attributes or {})  # tests may change it live
        self.hostname = hostname
        self.project_id = project_id
        self.wait_seconds = wait_seconds
        self.requests: list[str] = []  # paths asked, for assertions
        self._preempted = False
        self._changed = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control -------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``: the form ``GCE_METADATA_HOST`` takes."""
        assert self._server is not None, "not started"
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def preempted(self) -> bool:
        return self._preempted

    def preempt(self, *, answer_waiters: bool = True) -> None:
        """The provider's notice: ``instance/preempted`` turns TRUE, waiters are answered.

        ``answer_waiters=False`` leaves a long-poll in flight unanswered (until its timeout),
        as when the VM's SIGTERM reaches the agent before the watcher hears of the change."""
        with self._changed:
            self._preempted = True
            if answer_waiters:
                self._changed.notify_all()

    def start(self) -> MetadataServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True  # a long-poll in flight must not block stop()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            with self._changed:
                self._changed.notify_all()
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> MetadataServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- serving -------------------------------------------------------------------------------

    def _value(self, path: str, query: dict[str, list[str]]) -> str | None:
        if path.startswith("instance/attributes/"):
            return self.attributes.get(path[len("instance/attributes/") :])
        if path == "instance/preempted":
            if query.get("wait_for_change", [""])[0].lower() == "true":
                timeout = float(query.get("timeout_sec", [self.wait_seconds])[0])
                with self._changed:
                    seen = self._preempted
                    self._changed.wait_for(
                        lambda: self._preempted != seen or self._server is None, timeout
                    )
            return "TRUE" if self._preempted else "FALSE"
        return {"instance/hostname": self.hostname, "project/project-id": self.project_id}.get(path)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet in test output
                pass

            def _answer(self, code: int, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # An agent waiting for a change (wait_for_change) may be gone by then.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                server.requests.append(url.path)
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._answer(403, "Missing Metadata-Flavor: Google header\n")
                if not url.path.startswith(PREFIX):
                    return self._answer(404, "Not Found\n")
                value = server._value(url.path[len(PREFIX) :], urllib.parse.parse_qs(url.query))
                if value is None:
                    return self._answer(404, "Not Found\n")
                return self._answer(200, value)

        return Handler

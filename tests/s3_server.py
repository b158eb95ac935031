"""moto's S3 server (the real HTTP server from the pinned ``moto[server]``) on 127.0.0.1.

Run as its own process, like a bucket service would be: the daemon and CLI subprocesses and
the test process all talk to it over HTTP. Its state lives in memory for the session.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.local_server import free_port, wait_until_serving

REGION = "us-west-2"  # not us-east-1: s3fs mkdir and LocationConstraint disagree there
ACCESS_KEY = "testing"
SECRET_KEY = "testing"


class MotoS3Server:
    def __init__(self, log_dir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a process needs so that plain ``s3://bucket/...`` URLs reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
        }

    def start(self) -> MotoS3Server:
        log = open(self.log_dir / f"moto-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            wait_until_serving(f"{self.endpoint}/moto-api/", self.proc, "moto server", 30)
        except RuntimeError:
            self.stop()
            raise
        return self

    def client(self):  # a plain botocore client, for setting up buckets
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(
            Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION}
        )

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ResponseDropper:
    """A TCP proxy to the server that can lose one answer: the network failing after the
    server acted, so the client retries a request that already took effect.

    ``arm(method, marker)``: the next request whose request line starts with ``method`` and whose
    head contains ``marker`` reaches the server in full (interim ``100 Continue`` answers are
    passed on, or botocore would never send the body), but the connection is closed without
    the server's final answer. ``arm(..., reply=(status, code))`` instead answers that request
    here with an S3 error, without passing it on (a throttled or failing front end). moto closes
    every connection after its answer, so one connection carries one request.
    ``exchanges`` records (request line, final status line, "forwarded"/"dropped"/"refused").
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.exchanges: list[tuple[str, str, str]] = []
        self._armed: tuple[bytes, bytes, tuple[int, str] | None] | None = None
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arm(self, method: str, marker: str, reply: tuple[int, str] | None = None) -> None:
        with self._lock:
            self._armed = (method.encode() + b" ", marker.lower().encode(), reply)

    @property
    def dropped(self) -> list[tuple[str, str]]:
        """(request line, status the client never saw) of each lost answer."""
        with self._lock:
            return [(line, status) for line, status, how in self.exchanges if how == "dropped"]

    def statuses(self, method: str) -> list[str]:
        """Final status codes of the requests with ``method``, in order."""
        with self._lock:
            return [s.split()[1] for line, s, _ in self.exchanges if line.startswith(method + " ")]

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        try:
            self._exchange(client, upstream)
        finally:
            for sock in (client, upstream):  # shutdown wakes the pump thread's recv too
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _exchange(self, client: socket.socket, upstream: socket.socket) -> None:
        if True:
            client.settimeout(30)
            upstream.settimeout(30)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            request_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
            with self._lock:
                armed = self._armed
                hit = bool(
                    armed
                    and head.startswith(armed[0])
                    and armed[1] in head.split(b"\r\n\r\n", 1)[0].lower()
                )
                if hit:
                    self._armed = None
                reply = armed[2] if hit and armed else None
                if reply:
                    self.exchanges.append(
                        (request_line, f"HTTP/1.1 {reply[0]} {reply[1]}", "refused")
                    )
            if reply:
                body = (
                    f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{reply[1]}</Code>"
                    f"<Message>refused by the test proxy</Message></Error>"
                ).encode()
                client.sendall(
                    f"HTTP/1.1 {reply[0]} {reply[1]}\r\nContent-Type: application/xml\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                return
            drop = hit
            upstream.sendall(head)
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            buffer, status = b"", None
            while True:  # the answer, until the server closes the connection
                try:
                    chunk = upstream.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                if status is not None:
                    client.sendall(chunk)
                    continue
                buffer += chunk
                while status is None and b"\r\n\r\n" in buffer:
                    answer, rest = buffer.split(b"\r\n\r\n", 1)
                    line = answer.split(b"\r\n", 1)[0].decode(errors="replace")
                    if line.split()[1].startswith("1"):  # interim (100 Continue): pass on
                        client.sendall(answer + b"\r\n\r\n")
                        buffer = rest
                        continue
                    status = line
                    with self._lock:
                        self.exchanges.append(
                            (request_line, status, "dropped" if drop else "forwarded")
                        )
                    if drop:
                        return  # the server acted; its answer is lost with the connection
                    client.sendall(buffer)
                    buffer = b""

    @staticmethod
    def _pump(client: socket.socket, upstream: socket.socket) -> None:
        """The rest of the request body, client to server."""
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                upstream.sendall(chunk)


S3_BUCKET = "bastion-s3-test"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3Server]:
    """One moto server for the session (conftest imports this fixture), its bucket made and
    the AWS variables set. One, not one per module: fsspec caches an S3 filesystem per set of
    arguments, and the endpoint comes from the environment, so a second server's tests would
    reach the first one's filesystem while their fault proxies stood before the second."""
    server = MotoS3Server(tmp_path_factory.mktemp("s3")).start()
    try:
        server.create_bucket(S3_BUCKET)
        with pytest.MonkeyPatch.context() as env:
            for key, value in server.env().items():
                env.setenv(key, value)
            yield server
    finally:
        server.stop()

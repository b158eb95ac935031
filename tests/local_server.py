"""What the stand-in servers the tests start on 127.0.0.1 (GCS emulator, moto S3) share."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(
    url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 20.0
) -> None:
    """Poll ``url`` until it answers; RuntimeError if ``proc`` exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{what} did not start at {url}") from None
            time.sleep(0.05)

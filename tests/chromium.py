"""A real headless Chromium (Debian's ``chromium``) for the status page's tests: the DOM after
the page's own script ran, and a screenshot decoded to pixels (a small PNG reader: no imaging
library is needed)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium: install Debian's chromium (scripts/test.sh does)")
    raise AssertionError  # unreachable


def _run(args: list[str], profile: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def dump_dom(page: Path, profile: Path) -> str:
    """The DOM as Chromium serializes it after load (and 2 s of the page's timers)."""
    proc = _run(["--virtual-time-budget=2000", "--dump-dom", page.resolve().as_uri()], profile)
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


def screenshot(page: Path, out: Path, profile: Path, size: str = "1280,2400") -> Path:
    proc = _run([f"--screenshot={out}", f"--window-size={size}", page.resolve().as_uri()], profile)
    assert proc.returncode == 0 and out.exists(), proc.stderr[-2000:]
    return out


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of RGB(A) bytes of an 8-bit, non-interlaced PNG (what Chromium
    writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and color in (2, 6), (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b = previous[x]
            c = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, rows


def count_color(path: Path, rgb: tuple[int, int, int], tolerance: int = 40) -> int:
    """Pixels within ``tolerance`` of ``rgb`` (a plot's fill, blended with white at 70%)."""
    width, _, rows = png_pixels(path)
    channels = len(rows[0]) // width if rows else 3
    found = 0
    for row in rows:
        for i in range(0, len(row), channels):
            if all(abs(row[i + k] - rgb[k]) <= tolerance for k in range(3)):
                found += 1
    return found

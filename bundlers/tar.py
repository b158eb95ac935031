"""The tar bundler: the source directory as a canonical, content-addressed .tar.gz.

Canonical so the same tree gives the same bytes (and so the same digest, and no upload on a
relaunch): entries in sorted order, mtime 0, owner 0/"" , modes reduced to 0o644/0o755, a gzip
header without time or file name. What travels is what git would (.gitignore files, nested
ones relative to their directory, negations included) minus what AXLearn never ships (.git,
virtualenvs, caches) minus the user's ``exclude`` globs, which .gitignore cannot re-include.

Symbolic links are stored as links when they point inside the tree (absolute targets are made
relative, so they still work once extracted); a link pointing outside is an error naming it,
because silently shipping a dangling link makes a job fail far from the cause. Sockets, FIFOs
and devices are skipped. The tarball is built in a temporary file, so memory stays bounded.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import os
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from pathspec import GitIgnoreSpec

from bundlers.base import Bundle, BundleError, Bundler, format_size

# AXLearn's BUNDLE_EXCLUDE (venv .venv .git .idea .cache .pytest_cache __pycache__ .ruff_cache
# .DS_Store), plus other caches nobody means to ship; matched by name at any depth.
DEFAULT_EXCLUDE_NAMES = frozenset(
    {
        "venv",
        ".venv",
        ".git",
        ".idea",
        ".cache",
        ".pytest_cache",
        "__pycache__",
        ".ruff_cache",
        ".mypy_cache",
        "node_modules",
        ".DS_Store",
        ".ipynb_checkpoints",
    }
)
EXCLUDE_GLOBS = ("*.pyc",)
DEFAULT_MAX_BYTES = 256 * 1024**2  # before compression
OPTIONS = ("exclude", "max_bytes")
CHUNK = 1 << 20


class Entry(NamedTuple):
    name: str  # relative, "/"-separated
    kind: str  # "dir", "file", "link"
    size: int
    mode: int
    linkname: str = ""


class TarBundler(Bundler):
    kind = "tar"

    def bundle(
        self, source_dir: str, store: Any, options: Mapping[str, Any], dry_run: bool = False
    ) -> Bundle:
        """Build, then upload to ROOT/bundles/ only if absent; ``dry_run``: upload nothing."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise BundleError(
                f"--bundler_spec={unknown[0]}=... is not an option of the tar bundler "
                f"(its options: {', '.join(OPTIONS)})"
            )
        commit, dirty = git_state(source_dir)
        with tempfile.TemporaryDirectory(prefix="bastion-bundle-") as tmp:
            path = Path(tmp, "bundle.tar.gz")
            digest, size = build(source_dir, path, options)
            if not dry_run:
                store.bundles.put(digest, path, size)
        return Bundle("tar", store.bundles.url(digest), digest, size, commit, dirty)


def build(source_dir: str, out: Path, options: Mapping[str, Any]) -> tuple[str, int]:
    """Write the canonical tarball of ``source_dir`` to ``out``: its digest and size."""
    root = os.path.realpath(source_dir)
    if not os.path.isdir(root):
        raise BundleError(f"{source_dir} is not a directory; run the launch from your project")
    entries = collect(root, parse_excludes(options.get("exclude")))
    check_size(source_dir, entries, parse_max_bytes(options.get("max_bytes")))
    with open(out, "wb") as f:
        writer = _HashingWriter(f)
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=writer, mtime=0, compresslevel=6)
        with gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for entry in entries:
                _add(tar, root, entry)
    return "sha256:" + writer.hash.hexdigest(), writer.size


def parse_excludes(value: Any) -> GitIgnoreSpec | None:
    """``exclude``: comma-separated globs (or a list), gitignore syntax relative to the root."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    patterns = [p.strip() for p in items if p and p.strip()]
    return GitIgnoreSpec.from_lines(patterns) if patterns else None


def parse_max_bytes(value: Any) -> int:
    if value in (None, ""):
        return DEFAULT_MAX_BYTES
    try:
        limit = int(value)
    except (TypeError, ValueError):
        limit = -1
    if limit <= 0:
        raise BundleError(f"--bundler_spec=max_bytes={value} is not a positive number of bytes")
    return limit


def collect(root: str, user: GitIgnoreSpec | None) -> list[Entry]:
    """Every entry to ship, in the order written (sorted, depth first)."""
    entries: list[Entry] = []
    _walk(root, "", [], user, entries)
    return entries


def _walk(root: str, rel: str, specs: list, user: GitIgnoreSpec | None, out: list[Entry]) -> None:
    directory = os.path.join(root, rel) if rel else root
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return  # removed while we walked (a build or a test writing in the tree): not shipped
    except OSError as e:
        raise BundleError(f"cannot read {rel or '.'}: {e.strerror}; fix or exclude it") from e
    ignore_file = os.path.join(directory, ".gitignore")
    if os.path.isfile(ignore_file) and not os.path.islink(ignore_file):
        with open(ignore_file, encoding="utf-8", errors="replace") as f:
            specs = [*specs, (rel, GitIgnoreSpec.from_lines(f.read().splitlines()))]
    for name in names:
        child = f"{rel}/{name}" if rel else name
        path = os.path.join(root, child)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # removed since the directory was listed: not part of the bundle
        is_dir = stat.S_ISDIR(st.st_mode)
        if _excluded(name, child, is_dir, specs, user):
            continue
        if stat.S_ISLNK(st.st_mode):
            out.append(Entry(child, "link", 0, 0o777, _link_target(root, child, path)))
        elif is_dir:
            out.append(Entry(child, "dir", 0, 0o755))
            _walk(root, child, specs, user, out)
        elif stat.S_ISREG(st.st_mode):
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            out.append(Entry(child, "file", st.st_size, mode))


def _excluded(name: str, rel: str, is_dir: bool, specs: list, user: GitIgnoreSpec | None) -> bool:
    if name in DEFAULT_EXCLUDE_NAMES or any(fnmatch.fnmatch(name, g) for g in EXCLUDE_GLOBS):
        return True
    probe = rel + "/" if is_dir else rel  # so "build/" patterns match directories only
    if user is not None and user.match_file(probe):
        return True
    ignored = False
    for base, spec in specs:  # outer .gitignore first; a deeper decision (or negation) wins
        result = spec.check_file(probe[len(base) + 1 :] if base else probe)
        if result.include is not None:
            ignored = result.include
    return ignored


def _link_target(root: str, rel: str, path: str) -> str:
    target = os.readlink(path)
    resolved = os.path.realpath(os.path.join(os.path.dirname(path), target))
    if resolved != root and not resolved.startswith(root + os.sep):
        raise BundleError(
            f"{rel} is a symbolic link to {target}, outside the directory being bundled, so "
            f"the job would not find it; copy what it points to into the project, or leave it "
            f"out with --bundler_exclude={rel}"
        )
    return os.path.relpath(resolved, os.path.dirname(path)) if os.path.isabs(target) else target


def check_size(source_dir: str, entries: list[Entry], limit: int) -> None:
    files = [e for e in entries if e.kind == "file"]
    total = sum(e.size for e in files)
    if total <= limit:
        return
    biggest = sorted(files, key=lambda e: (-e.size, e.name))[:5]
    named = ", ".join(f"{e.name} ({format_size(e.size)})" for e in biggest)
    raise BundleError(
        f"the bundle of {source_dir} would be {format_size(total)} ({len(files)} files) before "
        f"compression, over the limit of {format_size(limit)}; the biggest files: {named}. Leave "
        f"out what the job does not need with --bundler_exclude=PATTERN (or .gitignore), or "
        f"raise the limit with --bundler_spec=max_bytes=BYTES"
    )


def _add(tar: tarfile.TarFile, root: str, entry: Entry) -> None:
    info = tarfile.TarInfo(entry.name)
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = entry.mode, 0, 0, 0, "", ""
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif entry.kind == "link":
        info.type, info.linkname = tarfile.SYMTYPE, entry.linkname
        tar.addfile(info)
    else:
        info.size = entry.size
        try:
            with open(os.path.join(root, entry.name), "rb") as f:
                tar.addfile(info, f)
        except OSError as e:  # unreadable, or shrank while we read it
            raise BundleError(
                f"cannot bundle {entry.name}: {e.strerror or e}; fix its permissions, wait for "
                f"whatever writes it, or leave it out with --bundler_exclude={entry.name}"
            ) from e


class _HashingWriter:
    """The gzip stream's sink: hashes and counts the bytes as they go to the file."""

    def __init__(self, f: Any) -> None:
        self.f, self.hash, self.size = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def git_state(source_dir: str) -> tuple[str | None, bool | None]:
    """HEAD's commit and whether the work tree has changes (untracked files count, as in
    AXLearn's porcelain summary); (None, None) outside a git work tree or without git."""
    try:
        head = _git(source_dir, "rev-parse", "HEAD")
        if head.returncode != 0:
            return None, None
        status = _git(source_dir, "status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return None, None
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return head.stdout.strip() or None, dirty


def _git(cwd: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def fetch(bundle: Bundle, store: Any, dest_dir: str) -> None:
    """Download ``bundle``, verify its digest, extract it into ``dest_dir`` safely (tarfile's
    "data" filter: no absolute paths, no "..", no links leaving dest_dir, no device files)."""
    if bundle.kind != "tar":
        raise BundleError(f"a {bundle.kind} bundle is an image ({bundle.uri}); its runner pulls it")
    with tempfile.TemporaryDirectory(prefix="bastion-fetch-") as tmp:
        path = os.path.join(tmp, "bundle.tar.gz")
        digest = hashlib.sha256()
        try:
            with store.bundles.open(bundle.digest) as src, open(path, "wb") as out:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        except FileNotFoundError:
            raise BundleError(
                f"bundle {bundle.digest} is missing ({bundle.uri}); relaunch to upload it again"
            ) from None
        got = "sha256:" + digest.hexdigest()
        if got != bundle.digest:
            store.bundles.delete(bundle.digest)  # corrupt by definition: let a relaunch replace it
            raise BundleError(
                f"bundle {bundle.digest} does not match its digest (got {got}); "
                "relaunch to upload it again"
            )
        os.makedirs(dest_dir, exist_ok=True)
        try:
            with tarfile.open(path, "r:gz") as tar:
                tar.extractall(dest_dir, filter="data")
        except (tarfile.TarError, OSError) as e:
            raise BundleError(f"bundle {bundle.digest} cannot be extracted: {e}") from e

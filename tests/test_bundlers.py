"""The tar bundler on a local root and on gs:// (the GCS emulator): canonical bytes, what is
left out, the size limit, no upload for unchanged code, and a verified, safe fetch."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import bundlers
from bastion.bucket.store import Store
from bundlers import Bundle, BundleError, parse_spec_options, with_excludes
from launch.bundling import bundler_for
from tests.conftest import fresh_gcs_root

TAR = bundler_for("tar")


@pytest.fixture(params=["local", "gcs"])
def store(request, tmp_path):
    if request.param == "gcs":
        request.getfixturevalue("gcs_emulator")
        return Store(fresh_gcs_root())
    return Store(str(tmp_path / "root"))


def write(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def tree(root: Path) -> dict[str, object]:
    """Relative path -> content (files), link target (links) or None (directories)."""
    found: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            found[rel] = None
        else:
            found[rel] = (path.read_bytes(), path.stat().st_mode & 0o111 != 0)
    return found


PROJECT = {"train.py": "print('hi')\n", "pkg/__init__.py": "", "pkg/model.py": "W = 1\n"}


def test_same_tree_same_bytes_whenever_made(store, tmp_path):
    a = write(tmp_path / "a", PROJECT)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    for path in b.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    (b / "pkg/model.py").chmod(0o600)  # permissions beyond "executable" do not count
    first, second = TAR.bundle(str(a), store, {}), TAR.bundle(str(b), store, {})
    assert first.digest == second.digest and first.size == second.size
    assert first.uri == store.bundles.url(first.digest)
    assert first.uri.endswith(f"/bundles/sha256-{first.digest[7:]}.tar.gz")
    data = store.bundles.read(first.digest)
    assert data[3] == 0 and data[4:8] == bytes(4)  # gzip header: no file name, mtime 0
    assert gzip.decompress(data)  # a plain .tar.gz anyone can open
    (b / "pkg/model.py").write_text("W = 2\n")
    assert TAR.bundle(str(b), store, {}).digest != first.digest


def test_unchanged_code_uploads_nothing(store, tmp_path):
    src = write(tmp_path / "src", PROJECT)
    first = TAR.bundle(str(src), store, {})
    writes = store.ops["write"]
    assert writes == 1
    again = TAR.bundle(str(src), store, {})
    assert again.digest == first.digest and store.ops["write"] == writes  # only an info
    dry = TAR.bundle(str(write(src, {"new.py": "x"})), store, {}, dry_run=True)
    assert not store.bundles.exists(dry.digest) and store.ops["write"] == writes


def test_fetch_gives_back_the_tree(store, tmp_path):
    src = write(tmp_path / "src", {**PROJECT, "run.sh": "#!/bin/sh\n", "empty/.keep": ""})
    (src / "run.sh").chmod(0o755)
    (src / "pkg/alias.py").symlink_to("model.py")
    (src / "abs").symlink_to(src / "pkg")  # absolute, inside: stored relative
    bundle = Bundle.from_json(TAR.bundle(str(src), store, {}).to_json())
    dest = tmp_path / "dest"
    bundlers.fetch(bundle, store, str(dest))
    expected = tree(src)
    expected["abs"] = ("link", "pkg")
    assert tree(dest) == expected
    assert (dest / "abs/model.py").read_text() == "W = 1\n"


def test_tampered_bundle_fails_fetch_then_relaunch_repairs(store, tmp_path):
    src = write(tmp_path / "src", PROJECT)
    bundle = TAR.bundle(str(src), store, {})
    good = store.bundles.read(bundle.digest)
    store.bundles.write(bundle.digest, good[:-1] + bytes([good[-1] ^ 1]))  # same size, other bytes
    with pytest.raises(BundleError, match=f"bundle {bundle.digest} does not match its digest"):
        bundlers.fetch(bundle, store, str(tmp_path / "dest"))
    assert TAR.bundle(str(src), store, {}).digest == bundle.digest  # uploads it again
    bundlers.fetch(bundle, store, str(tmp_path / "dest"))
    assert tree(tmp_path / "dest") == tree(src)
    store.bundles.delete(bundle.digest)
    with pytest.raises(BundleError, match=r"missing.*relaunch"):
        bundlers.fetch(bundle, store, str(tmp_path / "dest2"))


def test_excludes(store, tmp_path):
    src = write(
        tmp_path / "src",
        {
            **PROJECT,
            ".git/config": "x",
            ".venv/bin/python": "x",
            "venv/x": "x",
            "pkg/__pycache__/model.cpython-311.pyc": "x",
            "stray.pyc": "x",
            ".pytest_cache/v": "x",
            "node_modules/m/index.js": "x",
            ".gitignore": "*.log\n!keep.log\nbuild/\n/top_only.txt\n",
            "a.log": "x",
            "keep.log": "kept",
            "build/out.o": "x",
            "top_only.txt": "x",
            "sub/top_only.txt": "kept: / anchors to the root's .gitignore",
            "sub/.gitignore": "secret.txt\n!important.log\n",
            "sub/secret.txt": "x",
            "sub/important.log": "kept: a deeper negation wins",
            "sub/other.log": "x",
            "secret.txt": "kept: sub/.gitignore is relative to sub/",
            "data/big.bin": "x",
            "model.ckpt": "x",
            "sub/model.ckpt": "x",
        },
    )
    options = with_excludes(parse_spec_options(["exclude=data/"]), ["*.ckpt", "keep.log"])
    assert options == {"exclude": "data/,*.ckpt,keep.log"}
    bundle = TAR.bundle(str(src), store, options)
    bundlers.fetch(bundle, store, str(tmp_path / "dest"))
    files = {k for k, v in tree(tmp_path / "dest").items() if v is not None}
    assert files == {
        ".gitignore",
        "train.py",
        "pkg/__init__.py",
        "pkg/model.py",
        "secret.txt",
        "sub/.gitignore",
        "sub/top_only.txt",
        "sub/important.log",
    }  # (keep.log: the user's exclude wins over the negation)


def test_size_limit_names_the_biggest_files(store, tmp_path):
    sizes = {"a.bin": 900, "b.bin": 800, "c.bin": 700, "d.bin": 600, "e.bin": 500, "f.bin": 400}
    src = write(tmp_path / "src", {name: b"x" * size for name, size in sizes.items()})
    with pytest.raises(BundleError) as error:
        TAR.bundle(str(src), store, {"max_bytes": "3000"})
    message = str(error.value)
    assert "3.8 KiB (6 files)" in message and "2.9 KiB" in message, message
    assert "a.bin (900 bytes), b.bin (800 bytes), c.bin" in message and "e.bin (500" in message
    assert "f.bin" not in message and "--bundler_exclude" in message
    assert store.ops["write"] == 0
    assert TAR.bundle(str(src), store, {"max_bytes": "3000", "exclude": "a.bin,b.bin"}).size


def test_symlink_outside_the_tree_is_an_error_naming_it(store, tmp_path):
    outside = write(tmp_path / "outside", {"secret": "x"})
    src = write(tmp_path / "src", PROJECT)
    (src / "pkg/data").symlink_to(outside)
    with pytest.raises(BundleError, match=r"pkg/data is a symbolic link to .*--bundler_exclude"):
        TAR.bundle(str(src), store, {})
    (src / "pkg/data").unlink()
    (src / "pkg/data").symlink_to("../../outside/secret")  # relative, still outside
    with pytest.raises(BundleError, match="pkg/data"):
        TAR.bundle(str(src), store, {})
    assert TAR.bundle(str(src), store, {"exclude": "pkg/data"}).digest


def test_git_commit_and_dirty_flag(tmp_path):
    store = Store(str(tmp_path / "root"))
    src = write(tmp_path / "repo", PROJECT)
    assert (
        TAR.bundle(str(src), store, {}).git_commit,
        TAR.bundle(str(src), store, {}).git_dirty,
    ) == (None, None)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=src, check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "-q")
    git("config", "user.name", "Test")
    git("config", "user.email", "test@example.com")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    clean = TAR.bundle(str(src), store, {})
    assert clean.git_commit == git("rev-parse", "HEAD") and clean.git_dirty is False
    (src / "train.py").write_text("print('changed')\n")
    dirty = TAR.bundle(str(src), store, {})
    assert dirty.git_commit == clean.git_commit and dirty.git_dirty is True
    assert dirty.digest != clean.digest


def test_options_records_and_registry(tmp_path):
    assert parse_spec_options(["a=1", "b=x=y", "a=2"]) == {"a": "2", "b": "x=y"}
    with pytest.raises(BundleError, match="--bundler_spec=oops is not key=value"):
        parse_spec_options(["oops"])
    with pytest.raises(BundleError, match="--bundler=zip is not a bundler; known: cloudbuild"):
        bundler_for("zip")
    store = Store(str(tmp_path / "root"))
    with pytest.raises(
        BundleError, match=re.escape("--bundler_spec=remote_dir=... is not an option")
    ):
        TAR.bundle(str(tmp_path), store, {"remote_dir": "gs://x"})
    with pytest.raises(BundleError, match="max_bytes=lots"):
        TAR.bundle(str(tmp_path), store, {"max_bytes": "lots"})
    with pytest.raises(BundleError, match="nope is not a directory"):
        TAR.bundle(str(tmp_path / "nope"), store, {})
    record = Bundle("tar", "u", "sha256:" + "0" * 64, 3, "abc", True, 5.0)
    assert Bundle.from_json(record.to_json()) == record
    assert Bundle.from_json({**record.to_json(), "future": 1}) == record
    with pytest.raises(BundleError, match="lacks digest"):
        Bundle.from_json({"kind": "tar", "uri": "u", "size": 1})
    for bad in ("sha256:../../etc", "md5:" + "0" * 64, "sha256:" + "G" * 64):
        with pytest.raises(ValueError):
            store.bundles.url(bad)


def test_files_removed_while_the_tree_is_walked_are_left_out(tmp_path, monkeypatch):
    """Launching from a directory something else writes in (a build, a test run): what
    vanishes between the listing and the look is not shipped, and the launch goes on."""
    from bundlers import tar

    src = write(tmp_path / "src", {"keep.py": "x", "gone.txt": "y", "tmpdir/inner.txt": "z"})
    real_listdir = os.listdir

    def listdir_then_remove(path):
        names = real_listdir(path)
        if Path(path) == src:
            (src / "gone.txt").unlink()
            shutil.rmtree(src / "tmpdir")
        return names

    monkeypatch.setattr(tar.os, "listdir", listdir_then_remove)
    entries = tar.collect(str(src), None)
    assert [(e.name, e.kind) for e in entries] == [("keep.py", "file")]

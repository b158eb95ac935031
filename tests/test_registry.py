"""One registry for runners, bundlers and bucket backends (bastion/registry.py): no silent
clobbering, plugins from entry points seen by the settings check, an install hint for a kind
that cannot load, and a root on a protocol without a backend refused instead of run on the
non-atomic generic backend."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from bastion.bucket.objects import UnknownBucket
from bastion.bucket.store import Store
from bastion.registry import Registry
from bastion.runners.base import RunnerError
from bundlers import BundleError
from launch.bundling import bundler_for


def test_registering_a_taken_name_with_another_target_is_refused_unless_clobbered():
    registry: Registry[object] = Registry("thing", group="bastion.tests-none", builtins={})
    registry.register("a", "os:getcwd")
    registry.register("a", "os:getcwd")  # the same target again: nothing to refuse
    with pytest.raises(ValueError, match="thing 'a' is already registered \\(os:getcwd\\)"):
        registry.register("a", "os:getpid")
    registry.register("a", "os:getpid", clobber=True)
    assert registry.get("a") is os.getpid


def test_a_kind_whose_module_is_missing_names_the_hint_and_an_unknown_one_the_known_kinds():
    registry: Registry[object] = Registry(
        "runner kind",
        group="bastion.tests-none",
        builtins={"x": "no_such_module_here:f"},
        error=RunnerError,
        hints={"x": "pip install 'bastion[x]'"},
    )
    with pytest.raises(RunnerError, match=r"cannot load: .*no_such_module_here.*bastion\[x\]"):
        registry.get("x")
    with pytest.raises(RunnerError, match="runner kind 'y' is not known; use one of x"):
        registry.get("y")


def test_an_unknown_bundler_names_the_flag_and_the_known_ones():
    with pytest.raises(BundleError, match="--bundler=zip is not a bundler; known: cloudbuild"):
        bundler_for("zip")


class _PlainFileSystem(MemoryFileSystem):
    """An fsspec filesystem Bastion has no bucket backend for."""

    protocol = ("plainfs",)


def test_a_root_on_a_protocol_without_a_backend_is_refused_with_the_fix():
    fsspec.register_implementation("plainfs", _PlainFileSystem, clobber=True)
    with pytest.raises(UnknownBucket, match=r"plainfs:// has no Bastion bucket backend.*gs://"):
        Store("plainfs://bucket/root")


def test_a_quota_file_on_such_a_protocol_is_still_readable(tmp_path):
    """Reading needs no atomic writes: the generic backend serves a quota file anywhere."""
    fsspec.register_implementation("plainfs", _PlainFileSystem, clobber=True)
    with fsspec.open("plainfs://elsewhere/quota.toml", "wb") as f:
        f.write(b"x")
    store = Store(str(tmp_path / "root"))
    assert store.quota.token("plainfs://elsewhere/quota.toml") is not None


def test_a_runner_kind_from_an_installed_plugin_passes_the_settings_check(tmp_path):
    """A package that names a runner under the ``bastion.runners`` entry point group is
    known to the daemon's settings check without any code of ours importing it."""
    site = tmp_path / "site"
    (site / "bastion_plugin_demo-0.1.dist-info").mkdir(parents=True)
    (site / "bastion_plugin_demo-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: bastion-plugin-demo\nVersion: 0.1\n"
    )
    (site / "bastion_plugin_demo-0.1.dist-info" / "entry_points.txt").write_text(
        "[bastion.runners]\nslurm-demo = bastion_plugin_demo:from_settings\n"
    )
    (site / "bastion_plugin_demo.py").write_text("from bastion.runners.fake import from_settings\n")
    settings = tmp_path / "settings.toml"
    settings.write_text('default_runner = "slurm-demo"\n[runners.slurm-demo]\n')
    code = textwrap.dedent(f"""
        from bastion.runners.base import factory_for, known_kinds
        from bastion.daemon.start import load_settings
        load_settings({str(settings)!r})
        print("slurm-demo" in known_kinds(), factory_for("slurm-demo").__module__)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.getcwd()]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "bastion.runners.fake"]
    # without the plugin the same file is refused, naming the kinds there are
    env["PYTHONPATH"] = os.getcwd()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "unknown runner kind" in out.stderr

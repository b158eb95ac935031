"""scripts/store_renames.py: old flat Store calls become namespace calls, for merging branches
written against the old API."""

from __future__ import annotations

import ast
import importlib
import importlib.util

from bastion.bucket.store import Store
from tests.harness import REPO

_spec = importlib.util.spec_from_file_location("store_renames", REPO / "scripts/store_renames.py")
assert _spec is not None and _spec.loader is not None
store_renames = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(store_renames)

OLD = """from bastion.bucket.store import Store


def f(ctx, root, job):
    raw = ctx.store.read_spec(job)
    Store(root).write_run_record(job, "a1", 0, "exit", {})
    return Store.log_name(job, cleanup=True), self.store.list_agents(), raw
"""

NEW = """from bastion.bucket.store import Store
from bastion.bucket.logs import job_log_name


def f(ctx, root, job):
    raw = ctx.store.specs.read(job)
    Store(root).agents.write(job, "a1", 0, "exit", {})
    return job_log_name(job, cleanup=True), self.store.agents.list_all(), raw
"""


def test_old_calls_become_namespace_calls_with_their_imports():
    assert store_renames.rewrite(OLD) == NEW
    ast.parse(NEW)


def test_every_rename_names_a_method_that_exists(tmp_path):
    store = Store(str(tmp_path / "root"))
    for old, new in store_renames.MAP.items():
        namespace, method = new.split(".")
        assert callable(getattr(getattr(store, namespace), method)), f"{old} -> {new}"
        assert not hasattr(store, old), f"Store.{old} still exists"
    for old, (module, name) in store_renames.STATIC.items():
        assert callable(getattr(importlib.import_module(module), name)), f"{old} -> {name}"


def test_code_already_renamed_is_left_alone():
    assert store_renames.rewrite(NEW) == NEW

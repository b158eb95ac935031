"""The store is the only code that knows bucket paths (docs/architecture.md): product code
outside ``bastion/bucket/`` asks a namespace (``store.specs.url(name)``, ``store.logs.url(log)``,
``store.runs.bootstrap_url(...)``) instead of joining ``jobs/``, ``logs/``, ``runs/``... to a
root. This scan keeps that rule holding as code is added."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from tests.harness import REPO

PRODUCT = ("bastion", "launch", "quota", "bundlers")
ALLOWED = Path("bastion") / "bucket"  # the store and its namespaces: paths live here
# The top-level prefixes of a root (bastion/bucket/store.py lists them).
PREFIXES = (
    "jobs",
    "logs",
    "runs",
    "agents",
    "history",
    "bundles",
    "packages",
    "lease",
    "project-quotas",
)
ROOTISH = ("root", "store", "bucket")  # names of things a bucket path is built on


def _rootish(node: ast.AST) -> bool:
    """An expression that names a root, a store or a bucket (``root``, ``self.store.root_url``,
    ``ctx.store``), or a call on one (``store.root_url.rstrip("/")``)."""
    for sub in ast.walk(node):
        name = sub.id if isinstance(sub, ast.Name) else getattr(sub, "attr", None)
        if isinstance(name, str) and any(word in name.lower() for word in ROOTISH):
            return True
    return False


def _prefix_text(text: str) -> bool:
    """Text that starts a bucket path: ``logs/...``, ``/jobs/active``, or a bare ``runs``."""
    head = text.lstrip("/").split("/", 1)[0]
    return head in PREFIXES and (text.lstrip("/") == head or "/" in text)


def _constants(nodes: list[ast.expr]) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _builds_path(node: ast.AST) -> bool:
    """One way of building ``ROOT/<prefix>...`` outside the store."""
    if isinstance(node, ast.JoinedStr):  # f"{root}/logs/{name}"
        parts = node.values
        return any(
            isinstance(a, ast.FormattedValue) and _rootish(a.value) and _prefix_text(b.value)
            for a, b in itertools.pairwise(parts)
            if isinstance(b, ast.Constant) and isinstance(b.value, str)
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # store.root + "/jobs"
        right = _constants([node.right])
        return _rootish(node.left) and any(_prefix_text(text) for text in right)
    if isinstance(node, ast.Call):  # os.path.join(root, "logs"), "/".join((root, "runs"))
        args = list(node.args)
        if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
            args = list(args[0].elts)
        on_root = _rootish(node.func) or any(_rootish(a) for a in args)
        return on_root and any(text in PREFIXES for text in _constants(args))
    return False


def bucket_paths_built(source: str) -> list[int]:
    """Line numbers where ``source`` builds a bucket path (docstrings and comments say
    ``ROOT/logs/NAME`` freely: only code counts)."""
    return sorted({node.lineno for node in ast.walk(ast.parse(source)) if _builds_path(node)})


def _product_files() -> list[Path]:
    return [
        path
        for top in PRODUCT
        for path in sorted((REPO / top).rglob("*.py"))
        if ALLOWED not in path.relative_to(REPO).parents
    ]


def test_no_product_code_outside_the_bucket_package_builds_a_bucket_path():
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in _product_files()
        for line in bucket_paths_built(path.read_text())
    ]
    assert not found, (
        f"bucket paths built outside bastion/bucket/ at {', '.join(found)}; ask the store's "
        "namespace instead (store.specs.url(name), store.logs.url(log), store.quota.default_url()"
        ", store.runs.bootstrap_url(...)), or add a method to the namespace in bastion/bucket/"
    )


def test_the_scan_covers_the_product_packages():
    files = {path.relative_to(REPO).parts[0] for path in _product_files()}
    assert files == set(PRODUCT)
    assert not any(ALLOWED in p.relative_to(REPO).parents for p in _product_files())


@pytest.mark.parametrize(
    "code",
    [
        'url = f"{root}/logs/{name}"',
        'url = f"{self.store.root_url}/jobs/active/{name}"',
        'path = store.root + "/runs/" + job',
        'path = "/".join((self.root, "history", "queue"))',
        'path = os.path.join(root, "bundles", name)',
        'url = ctx.store.bucket.url("jobs", "active", name)',
        'url = f"{store.root_url.rstrip(chr(47))}/packages/{digest}"',
    ],
)
def test_the_scan_finds_each_way_of_building_a_bucket_path(code):
    assert bucket_paths_built(code) == [1], code


@pytest.mark.parametrize(
    "code",
    [
        'def f():\n    """Writes ROOT/logs/NAME and ROOT/jobs/active/NAME."""',
        'HELP = "logs/launch: keep printing until the job is finished."',
        'spool = os.path.join(work_dir, "logs")',
        "url = store.specs.url(name)",
        'message = f"no daemon has run on {root}; start one"',
        'name = f"{job}/logs/{seq}"',
    ],
)
def test_the_scan_leaves_prose_and_local_paths_alone(code):
    assert bucket_paths_built(code) == [], code

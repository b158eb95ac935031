"""Rewrite calls of the old flat Store API to its namespaces (issue 22), for merging branches
that were written against it: ``store.read_spec(n)`` -> ``store.specs.read(n)``,
``Store.run_name(...)`` -> ``run_name(...)`` with its import added. Receivers are expressions
ending in ``store`` (``self.store``, ``ctx.store``, ``any_store``) or ``Store(...)``; review
the diff, then run ``ruff check --fix`` and ``ruff format`` to sort the imports.

    python3 scripts/store_renames.py FILE...
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

# old Store method -> namespace.method
MAP = {
    "list_specs": "specs.list",
    "write_capabilities": "capabilities.write",
    "read_capabilities": "capabilities.read",
    "write_url": "quota.write",
    "save_finished_run": "finished_runs.save",
    "list_finished_runs": "finished_runs.list",
    "read_finished_run": "finished_runs.read",
    "read_spec": "specs.read",
    "read_spec_with_token": "specs.read_with_token",
    "submit_spec": "specs.submit",
    "replace_spec": "specs.replace",
    "delete_spec": "specs.delete",
    "list_states": "states.list",
    "read_state": "states.read",
    "write_state": "states.write",
    "read_state_with_token": "states.read_with_token",
    "delete_state": "states.delete",
    "list_requests": "requests.list",
    "read_request": "requests.read",
    "write_request": "requests.write",
    "delete_request": "requests.delete",
    "write_marker": "requests.write_marker",
    "delete_markers": "requests.delete_markers",
    "list_complete": "complete.list",
    "read_complete": "complete.read",
    "write_complete": "complete.write",
    "list_logs": "logs.list",
    "log_size": "logs.size",
    "read_log": "logs.read",
    "append_log": "logs.append",
    "read_log_chunks": "logs.read_chunks",
    "save_history": "history.save",
    "read_history": "history.read",
    "write_decisions": "decisions.write",
    "list_decisions": "decisions.list",
    "prune_decisions": "decisions.prune",
    "write_queue": "queue.write",
    "read_queue": "queue.read",
    "write_daemon_info": "daemon_info.write",
    "read_daemon_info": "daemon_info.read",
    "write_last_good_quota": "quota.write_last_good",
    "read_last_good_quota": "quota.read_last_good",
    "read_usage": "usage.read",
    "write_usage": "usage.write",
    "bundle_url": "bundles.url",
    "bundle_info": "bundles.info",
    "bundle_exists": "bundles.exists",
    "put_bundle": "bundles.put",
    "read_bundle": "bundles.read",
    "open_bundle": "bundles.open",
    "delete_bundle": "bundles.delete",
    "read_lease": "lease.read",
    "write_lease": "lease.write",
    "default_quota_url": "quota.default_url",
    "url_token": "quota.token",
    "read_url": "quota.read",
    "list_run": "runs.list",
    "list_agent_records": "agents.list",
    "list_agents": "agents.list_all",
    "delete_agent_records": "agents.delete",
    "bootstrap_url": "runs.bootstrap_url",
    "read_bootstrap": "runs.read_bootstrap",
    "write_provision": "runs.write_provision",
    "read_provision": "runs.read_provision",
    "claim_run_worker": "agents.claim",
    "write_run_record": "agents.write",
    "read_run_record": "agents.read",
    "write_run_chunk": "runs.write_chunk",
    "read_run_chunk": "runs.read_chunk",
    "delete_run": "runs.delete",
    "put_package": "packages.put",
}
# old static method -> (module, new function name)
STATIC = {
    "run_name": ("bastion.bucket.runs", "run_name"),
    "parse_run_name": ("bastion.bucket.runs", "parse_run_name"),
    "bootstrap_worker": ("bastion.bucket.runs", "bootstrap_worker"),
    "log_name": ("bastion.bucket.logs", "job_log_name"),
    "daemon_log_name": ("bastion.bucket.logs", "daemon_log_name"),
    "marker_name": ("bastion.bucket.jobs", "marker_name"),
    "is_marker": ("bastion.bucket.jobs", "is_marker"),
    "marked_job": ("bastion.bucket.jobs", "marked_job"),
    "bundle_name": ("bastion.bucket.artifacts", "bundle_name"),
}
_NAMES = "|".join(sorted(MAP, key=len, reverse=True))
_CALL = re.compile(r"(\b\w*store|\bStore\((?:[^()]|\([^()]*\))*\))\.(" + _NAMES + r")\b")
_STATIC = re.compile(r"\bStore\.(" + "|".join(STATIC) + r")\b")


def rewrite(source: str) -> str:
    """``source`` with every old call renamed and the imports the static helpers need."""
    source = _CALL.sub(lambda m: f"{m.group(1)}.{MAP[m.group(2)]}", source)
    used = sorted(set(_STATIC.findall(source)))
    source = _STATIC.sub(lambda m: STATIC[m.group(1)][1], source)
    if not used:
        return source
    by_module: dict[str, list[str]] = {}
    for old in used:
        module, new = STATIC[old]
        by_module.setdefault(module, []).append(new)
    imports = [f"from {module} import {', '.join(names)}" for module, names in by_module.items()]
    tree = ast.parse(source)
    last = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))][-1]
    lines = source.split("\n")
    lines[last.end_lineno : last.end_lineno] = imports
    return "\n".join(lines)


def main(paths: list[str]) -> None:
    for path in map(Path, paths):
        before = path.read_text()
        after = rewrite(before)
        if after != before:
            path.write_text(after)
            print(f"rewrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""The quota verbs through the real `bastion` command."""

from __future__ import annotations

import json

from tests.harness import REPO


def test_quota_check_good_and_bad(local_bastion, tmp_path):
    good = local_bastion.cli("quota", "check", str(REPO / "configs" / "project-quotas.toml"))
    assert "research" in good.stdout and "v4" in good.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[toml-schema]\nversion = "1"\n[total_resources]\nv4 = -8\n'
        '[project_membership]\np1 = ["(unclosed"]\n[project_resources.p1]\nv4 = "half"\n'
    )
    proc = local_bastion.cli("quota", "check", str(bad), check=False)
    assert proc.returncode == 1
    for key in ("total_resources", "project_membership", "project_resources.p1"):
        assert key in proc.stdout + proc.stderr


def test_simulate_prints_metrics(local_bastion, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps(line)
            for line in [
                {
                    "name": "a",
                    "project_id": "research",
                    "user_id": "alice",
                    "submit": 0,
                    "duration": 600,
                    "resources": {"v4": 512},
                    "priority": 3,
                },
                {
                    "name": "b",
                    "project_id": "product",
                    "user_id": "carol",
                    "submit": 60,
                    "duration": 300,
                    "resources": {"v4": 256},
                    "priority": 3,
                },
            ]
        )
        + "\n"
    )
    proc = local_bastion.cli(
        "simulate",
        f"--quota_file={REPO / 'configs' / 'project-quotas.toml'}",
        f"--trace={trace}",
        "--poll_seconds=10",
        "--json",
    )
    metrics = json.loads(proc.stdout)
    for key in (
        "utilization",
        "share_attainment",
        "wait_seconds",
        "preemptions",
        "makespan_seconds",
    ):
        assert key in metrics
    assert metrics["preemptions"] == 0 and metrics["makespan_seconds"] >= 600


def test_why_for_unknown_job_is_a_clear_error(local_bastion):
    proc = local_bastion.cli("why", "ghost", check=False)
    assert proc.returncode == 1 and "ghost" in proc.stderr

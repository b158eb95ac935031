"""The usage ledger through the real daemon (local runner, short jobs): `bastion usage` figures
checked to the second against the times the jobs' own histories recorded."""

from __future__ import annotations

import json
import signal

import pytest

from tests.harness import wait_for

QUOTA = """\
[toml-schema]
version = "1"
[total_resources]
cpu = 4
[project_membership]
research = ["alice"]
prod = ["bob"]
[project_resources.research]
cpu = 0.5
[project_resources.prod]
cpu = 0.5
[scheduling]
min_runtime_seconds = 0
preemption_grace_seconds = 1
"""
ENDS = {"REQUEUED", "PROVIDER_PREEMPTED", "LOST", "SUCCEEDED", "FAILED", "CANCELLED"}


def _launch(bastion, name: str, project: str, user: str, command: str) -> None:
    bastion.cli(
        "launch",
        f"--name={name}",
        f"--project_id={project}",
        f"--user_id={user}",
        "--resources=cpu=2",
        "--",
        command,
    )


def _attempts(record: dict) -> list[dict]:
    """Each attempt's start and end as the job's history recorded them."""
    events = record["state"]["events"]
    found = []
    for e in events:
        if e["event"] == "STARTED":
            found.append({"attempt": e["attempt"], "start": e["time"]})
        elif e["event"] in ENDS and found and found[-1]["attempt"] == e["attempt"]:
            found[-1].setdefault("end", e["time"])
    preempted = {e["attempt"] for e in events if e["event"] in ("PREEMPT", "PROVIDER_PREEMPTED")}
    for a in found:
        a["preempted"] = a["attempt"] in preempted
    return found


def _borrowing_starts(bastion) -> dict[tuple[str, int], bool]:
    """Whether each START decision admitted its job beyond its project's quota, in order per
    job (the decision log, apart from the jobs' own histories)."""
    starts: dict[str, list[bool]] = {}
    for stamp in bastion.listdir("history", "decisions"):
        for d in json.loads(bastion.read("history", "decisions", stamp))["decisions"]:
            if d["verdict"] == "START":
                starts.setdefault(d["name"], []).append("borrowing" in d["reason"])
    return {(n, i + 1): b for n, bs in starts.items() for i, b in enumerate(bs)}


def _usage(bastion, *flags: str) -> dict:
    return json.loads(bastion.cli("usage", "--json", "--since=1h", *flags).stdout)


def test_usage_matches_the_trace_to_the_second_with_a_reclaim(bastion, tmp_path):
    bastion.put("project-quotas", "project-quotas.config", data=QUOTA)
    bastion.start()
    gate = tmp_path / "gate"  # prod's jobs run until the test opens it
    for name in ("b1", "b2"):  # prod borrows research's idle half for b2
        _launch(bastion, name, "prod", "bob", f"until [ -e {gate} ]; do sleep 0.1; done")
        wait_for(lambda n=name: (bastion.state(n) or {}).get("status") == "ACTIVE", what=name)
    _launch(bastion, "a1", "research", "alice", "sleep 1")  # reclaims b2's borrowed room
    records = {"a1": bastion.wait_complete("a1", timeout=60)}
    gate.touch()
    records.update({n: bastion.wait_complete(n, timeout=60) for n in ("b1", "b2")})
    assert sum(r["state"]["preemptions"] for r in records.values()) == 1
    borrowing = _borrowing_starts(bastion)

    expected: dict[tuple[str, str], dict[str, float]] = {}
    for name, record in records.items():
        project, user = ("research", "alice") if name == "a1" else ("prod", "bob")
        sums = expected.setdefault((project, user), {"used": 0, "borrowed": 0, "lost": 0, "n": 0})
        for a in _attempts(record):
            seconds = 2 * (a["end"] - a["start"])  # cpu=2
            sums["used"] += seconds
            sums["n"] += 1
            sums["borrowed"] += seconds if borrowing[(name, a["attempt"])] else 0
            sums["lost"] += seconds if a["preempted"] else 0
    assert expected[("prod", "bob")]["lost"] > 0 and expected[("prod", "bob")]["borrowed"] > 0

    rows = {(r["project"], r["user"]): r for r in _usage(bastion, "--by=user")["rows"]}
    assert set(rows) == set(expected)
    for key, sums in expected.items():
        row = rows[key]
        assert row["attempts"] == sums["n"], key
        assert row["used_resource_seconds"]["cpu"] == pytest.approx(sums["used"], abs=1e-2)
        assert row["borrowed_resource_seconds"].get("cpu", 0) == pytest.approx(
            sums["borrowed"], abs=1e-2
        )
        assert row["lost_resource_seconds"].get("cpu", 0) == pytest.approx(sums["lost"], abs=1e-2)
    assert rows[("prod", "bob")]["preempted_attempts"] == 1

    by_project = {r["project"]: r for r in _usage(bastion, "--by=project")["rows"]}
    assert by_project["prod"]["used_resource_seconds"]["cpu"] == pytest.approx(
        expected[("prod", "bob")]["used"], abs=1e-2
    )
    (cpu,) = _usage(bastion, "--by=resource")["rows"]
    assert cpu["resource"] == "cpu"
    total = sum(s["used"] for s in expected.values())
    assert cpu["used_resource_seconds"]["cpu"] == pytest.approx(total, abs=1e-2)

    csv_text = bastion.cli("usage", "--csv", "--since=1h", "--by=project").stdout
    lines = csv_text.splitlines()
    assert lines[0].startswith("project,resource,used_hours,borrowed_hours")
    (prod_line,) = [ln for ln in lines if ln.startswith("prod,cpu,")]
    assert float(prod_line.split(",")[2]) == pytest.approx(
        expected[("prod", "bob")]["used"] / 3600, abs=1e-5
    )
    table = bastion.cli("usage", "--since=1h", "--by=user").stdout
    assert "LOST TO PREEMPTION(h)" in table and "bob" in table and "alice" in table

    bastion.put("prices.toml", data='currency = "USD"\n[prices]\ncpu = 3600\n')
    priced = _usage(bastion, "--by=project", f"--prices={bastion.root}/prices.toml")
    prod = {r["project"]: r for r in priced["rows"]}["prod"]
    assert prod["cost"] == pytest.approx(expected[("prod", "bob")]["used"], abs=1e-2)
    assert priced["currency"] == "USD"
    bastion.put("usage", "prices.toml", data="[prices]\ncpu = 7200\n")  # the root's own table
    priced = {r["project"]: r for r in _usage(bastion, "--by=project")["rows"]}
    assert priced["prod"]["cost"] == pytest.approx(2 * expected[("prod", "bob")]["used"], abs=1e-2)

    before = _usage(bastion, "--by=project", "--until=30m")  # a window before everything ran
    assert before["rows"] == []

    def page_usage() -> dict:  # the status page's figures for the last day, once it has them
        raw = bastion.read("status", "status.json")
        rows = json.loads(raw)["usage"]["day"] if raw else []
        return {
            r["project"]: r for r in rows if r["attempts"] == by_project[r["project"]]["attempts"]
        }

    shown = wait_for(lambda: len(page_usage()) == 2 and page_usage(), what="the page's usage")
    for project, row in shown.items():
        used = by_project[project]["used_resource_seconds"]["cpu"]
        assert row["used_hours"]["cpu"] == pytest.approx(used / 3600, abs=1e-5)


def test_daemon_killed_mid_attempt_counts_the_attempt_once(local_bastion):
    bastion = local_bastion
    daemon = bastion.start()
    _launch(bastion, "long", "default", "tester", "sleep 4")
    wait_for(lambda: (bastion.state("long") or {}).get("status") == "ACTIVE", what="running")
    wait_for(lambda: bastion.listdir("usage"), what="the open record")
    daemon.send_signal(signal.SIGKILL)
    daemon.wait(10)
    bastion.start()  # adopts the running attempt, records it again, then its end
    record = bastion.wait_complete("long", timeout=40)
    (attempt,) = _attempts(record)
    lines = [
        json.loads(line)
        for day in bastion.listdir("usage")
        for name in bastion.listdir("usage", day)
        for line in bastion.read("usage", day, name).decode().splitlines()
    ]
    mine = [r for r in lines if r["job"] == "long"]
    assert [r["kind"] for r in mine].count("open") == 2, mine  # each daemon declared it
    assert [r["kind"] for r in mine].count("end") == 1, mine
    assert len({r["id"] for r in mine}) == 1
    (row,) = _usage(bastion, "--by=project")["rows"]
    assert row["attempts"] == 1
    seconds = attempt["end"] - attempt["start"]
    assert row["used_resource_seconds"]["cpu"] == pytest.approx(2 * seconds, abs=1e-2)


def test_usage_refuses_bad_flags_with_the_fix(local_bastion):
    bastion = local_bastion
    bastion.once()
    bad = bastion.cli("usage", "--since=yesterday", check=False)
    assert bad.returncode == 2 and "--since='yesterday' is not a time" in bad.stderr
    bad = bastion.cli("usage", "--by=team", check=False)
    assert bad.returncode == 2 and "--by='team': give one of project, user, resource" in bad.stderr
    bad = bastion.cli("usage", "--since=1h", "--until=2h", check=False)
    assert bad.returncode == 2 and "is not after --since" in bad.stderr
    bastion.put("prices.toml", data="[prices]\ngpu = 'cheap'\n")
    bad = bastion.cli("usage", f"--prices={bastion.root}/prices.toml", check=False)
    assert bad.returncode == 2 and "prices.gpu = 'cheap' is not a price" in bad.stderr
    assert "prices.toml" in bad.stderr
    bad = bastion.cli("usage", f"--prices={bastion.root}/nothing.toml", check=False)
    assert bad.returncode == 2 and "--prices: no file at" in bad.stderr
    bad = bastion.cli("usage", "--csv", "--json", check=False)
    assert bad.returncode == 2 and "not both" in bad.stderr

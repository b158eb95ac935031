"""The status page through the real daemon (local runner, short jobs), loaded in a real
headless Chromium: what a user looks for is on it, its plot renders, a hostile job name is
text and runs no script, and a page older than a minute says so."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bastion.status.html import render
from tests.chromium import count_color, dump_dom, screenshot
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
HOSTILE = "<script>document.title='pwned'"
FIRST_PLOT_COLOR = (0x4E, 0x79, 0xA7)  # bastion.status.svg.COLORS[0], the first project


def _launch(bastion, name: str, project: str, user: str, cpu: int, command: str) -> None:
    bastion.cli(
        "launch",
        f"--name={name}",
        f"--project_id={project}",
        f"--user_id={user}",
        f"--resources=cpu={cpu}",
        "--",
        command,
    )


def _status(bastion, name: str) -> str | None:
    return (bastion.state(name) or {}).get("status")


def _page_data(bastion) -> dict:
    raw = bastion.read("status", "status.json")
    return json.loads(raw) if raw else {}


def _busy_root(bastion) -> None:
    """Running, waiting, preempted and failed jobs of two projects, and a spec whose name is
    a script (rejected, and listed among the failures)."""
    bastion.put("project-quotas", "project-quotas.config", data=QUOTA)
    bastion.start()
    _launch(bastion, "r-fail", "research", "alice", 1, "echo boom; exit 3")
    bastion.wait_complete("r-fail")
    _launch(bastion, "p-run", "prod", "bob", 2, "sleep 120")
    wait_for(lambda: _status(bastion, "p-run") == "ACTIVE", what="p-run")
    _launch(bastion, "p-borrow", "prod", "bob", 2, "sleep 120")  # beyond prod's quota
    wait_for(lambda: _status(bastion, "p-borrow") == "ACTIVE", what="p-borrow")
    _launch(bastion, "r-reclaim", "research", "alice", 2, "sleep 120")  # preempts p-borrow
    wait_for(lambda: (bastion.state("p-borrow") or {}).get("preemptions") == 1, what="reclaim")
    wait_for(lambda: _status(bastion, "r-reclaim") == "ACTIVE", timeout=60, what="r-reclaim")
    _launch(bastion, "r-wait", "research", "alice", 2, "sleep 1")  # the pool is full: waits
    spec = json.loads(bastion.read("jobs", "active", "r-wait"))
    bastion.put("jobs", "active", HOSTILE, data=json.dumps({**spec, "name": HOSTILE}))

    def page_has_everything() -> bool:
        data = _page_data(bastion)
        waiting = {j["name"] for p in data.get("queue", []) for j in p["jobs"]}
        recent = {(r["name"], r["what"]) for r in data.get("recent", [])}
        return (
            {"r-wait", "p-borrow"} <= waiting
            and {("p-borrow", "PREEMPTED"), ("r-fail", "FAILED"), (HOSTILE, "REJECTED")} <= recent
            and {r["name"] for r in data.get("running", [])} >= {"p-run", "r-reclaim"}
        )

    wait_for(page_has_everything, timeout=60, what="the page to show every job")


def test_page_in_chromium_shows_queue_quota_plot_and_escapes_names(local_bastion, tmp_path):
    bastion = local_bastion
    _busy_root(bastion)
    page = Path(bastion.root) / "status" / "index.html"
    dom = dump_dom(page, tmp_path / "profile")

    assert "<title>Bastion status" in dom and "pwned" not in dom.split("</title>")[0]
    assert dom.count("<script") == 1  # the page's own staleness check, nothing else
    assert "&lt;script&gt;document.title='pwned'" in dom  # the name, as text
    text = re.sub(r"<[^>]+>", " ", dom)
    text = " ".join(text.split())
    for wanted in (
        "Pool and quotas",
        "quota (reserved) in use borrowed lent waiting",
        "research: 1 waiting",
        "prod: 1 waiting",
        "1 r-wait alice cpu=2",  # its position, name, user and resources
        "PREEMPTED",
        "r-fail research alice FAILED command exited with status 3",
        "REJECTED",
        "p-run prod bob cpu=2 ACTIVE local",
        "Last 7 days",
    ):
        assert wanted in text, (wanted, text[:3000])
    (wait_row,) = re.findall(r"1 r-wait alice cpu=2 ([^#]*?)(?: prod:| Running)", text)
    assert "quota" in wait_row or "free" in wait_row or "preempt" in wait_row, wait_row
    assert re.search(r"research cpu 2 2 0 0 1", text), text[:2000]  # quota, use, none borrowed
    assert 'id="stale" class="stale" hidden=""' in dom  # rendered just now: not stale
    assert "<svg" in dom and "<polygon" in dom and 'class="quota"' in dom
    assert 'href="../logs/r-wait"' in dom

    shot = screenshot(page, tmp_path / "status-page.png", tmp_path / "profile")
    print(f"status page screenshot: {shot}")
    assert shot.stat().st_size > 20_000
    first_plot = re.search(r"<svg class=\"plot\".*?</svg>", page.read_text(), re.S)
    assert first_plot is not None
    plot_page = tmp_path / "plot.html"
    plot_page.write_text(f"<!doctype html><body style='margin:0'>{first_plot.group(0)}</body>")
    plot_shot = screenshot(plot_page, tmp_path / "plot.png", tmp_path / "profile", "760,200")
    # The stacked area of the first project, drawn (at 70% opacity over white): a sliver at
    # the right edge, as its jobs ran for a minute of the 24 hours plotted.
    blended = tuple(int(0.7 * c + 0.3 * 255) for c in FIRST_PLOT_COLOR)
    assert count_color(plot_shot, blended, tolerance=12) > 50


def test_a_page_older_than_a_minute_says_so_at_the_top(local_bastion, tmp_path):
    bastion = local_bastion
    bastion.once()
    proc = bastion.cli("status", "--html", f"--html_path={tmp_path / 'page.html'}", check=False)
    assert proc.returncode == 3 and "status page written to" in proc.stdout, proc.stderr
    fresh = dump_dom(tmp_path / "page.html", tmp_path / "profile")
    assert 'id="stale" class="stale" hidden=""' in fresh
    from launch.page import build_page

    _, data = build_page(bastion.store)
    data["rendered"] -= 300
    old = tmp_path / "old.html"
    old.write_text(render(data))
    dom = dump_dom(old, tmp_path / "profile")
    assert "This page is 5 minute(s) old" in dom, dom[:2000]
    assert dom.index("This page is 5 minute(s) old") < dom.index("Pool and quotas")


def test_status_html_flags_are_checked_with_the_fix(local_bastion, tmp_path):
    bastion = local_bastion
    bastion.once()
    bad = bastion.cli("status", "--open", check=False)
    assert bad.returncode == 2 and "--open and --html_path go with --html" in bad.stderr
    bad = bastion.cli("status", "--html", f"--html_path={tmp_path}", check=False)
    assert bad.returncode == 2 and f"--html_path={tmp_path} is a directory" in bad.stderr
    bad = bastion.cli("status", "--html", f"--html_path={tmp_path}/no/page.html", check=False)
    assert bad.returncode == 2 and "no directory" in bad.stderr
    assert not list(tmp_path.glob("**/*.html"))

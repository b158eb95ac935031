"""The status page as one static HTML file: inline CSS and SVG, no framework, no external
font, script or image, so it renders from file://, a bucket's authenticated URL or a static
website alike.

Everything that comes from a spec or the bucket (names, users, projects, reasons) goes
through ``html.escape``; and a Content-Security-Policy allows only the page's own inline
script (by its hash), so even text that escaped escaping could not run.

Staleness: the page carries its render time (``<body data-rendered>``). A tiny inline script
compares it with the viewer's clock every 10 s and, past STALE_SECONDS, says at the top how
old the page is (the daemon that writes it may have stopped); ``<meta http-equiv=refresh>``
reloads an open tab every 30 s, and ``<noscript>`` states the render time for readers
without scripts.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import html
from collections.abc import Mapping, Sequence
from typing import Any

from bastion.status.svg import color, queue_plot, usage_plot

STALE_SECONDS = 60
REFRESH_SECONDS = 30
PLOTTED_RESOURCES = 4
PROJECTS_OPEN = 5  # queues shown unfolded; the others fold (the browser lays out less)

STALE_SCRIPT = (
    "(function(){var t=Number(document.body.dataset.rendered)*1000;"
    "function check(){var age=(Date.now()-t)/1000,b=document.getElementById('stale');"
    f"if(age>{STALE_SECONDS})"
    "{b.hidden=false;b.textContent='This page is '+Math.round(age/60)+' minute(s) old "
    "(rendered '+new Date(t).toISOString()+'): the daemon has not rewritten it since; "
    "it may have stopped (bastion status).';}}"
    "check();setInterval(check,10000);})();"
)
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(STALE_SCRIPT.encode()).digest()).decode()
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    f"script-src 'sha256-{_SCRIPT_HASH}'; base-uri 'none'; form-action 'none'"
)

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1em 2em;color:#222;background:#fff}
h1{font-size:1.4em;margin:.2em 0}
h2{font-size:1.15em;margin:1.2em 0 .4em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.3em 0}td,th{padding:2px 8px;text-align:left;
vertical-align:top;border-bottom:1px solid #eee}th{background:#f5f5f5}
td.num{text-align:right;font-variant-numeric:tabular-nums}.why{max-width:60em}
.stale{background:#fde2e1;border:1px solid #e15759;padding:.5em;font-weight:bold}
.meta{color:#555}.swatch{display:inline-block;width:.8em;height:.8em;margin-right:.3em}
details>summary{cursor:pointer;font-weight:bold}.plot{display:block;margin:.5em 0}
"""


def e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return dt.datetime.fromtimestamp(stamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float | None) -> str:
    """``1d02h``, ``2h05m``, ``3m12s``, ``45s``."""
    if seconds is None:
        return "-"
    total = int(max(0.0, seconds))
    for big, size, small in (
        ("d", 86400, ("h", 3600)),
        ("h", 3600, ("m", 60)),
        ("m", 60, ("s", 1)),
    ):
        if total >= size:
            return f"{total // size}{big}{total % size // small[1]:02d}{small[0]}"
    return f"{total}s"


def units(resources: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(resources.items())) or "-"


def hours(values: Mapping[str, float]) -> str:
    """``gpu 12.50, cpu 0.0213``: two decimals, or three significant digits below one hour
    (a few minutes of a short job must not show as 0.00)."""
    return (
        ", ".join(
            f"{k} {v:.2f}" if v >= 1 else f"{k} {v:.3g}" for k, v in sorted(values.items()) if v
        )
        or "0"
    )


def table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """``rows`` are cells already escaped (they may hold links)."""
    out = [f'<table class="{e(cls)}"><thead><tr>']
    out += [f"<th>{e(h)}</th>" for h in head]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def link(text: str, href: str) -> str:
    return f'<a href="{e(href)}">{e(text)}</a>'


def pool_section(data: Mapping[str, Any]) -> str:
    rows = []
    for row in data["pool"]:
        resources = sorted(set(row["quota"]) | set(row["usage"]))
        for r in resources or ["-"]:
            rows.append(
                [
                    e(row["project"]),
                    e(r),
                    f'<span class="num">{row["quota"].get(r, 0):g}</span>',
                    f'<span class="num">{row["usage"].get(r, 0):g}</span>',
                    f'<span class="num">{row["borrowed"].get(r, 0):g}</span>',
                    f'<span class="num">{row["lent"].get(r, 0):g}</span>',
                    f'<span class="num">{row["waiting"]}</span>',
                ]
            )
    free = units(data["free"])
    head = ["project", "resource", "quota (reserved)", "in use", "borrowed", "lent", "waiting"]
    body = table(head, rows, "pool") if rows else "<p>No quota figures yet.</p>"
    return f'<section id="pool"><h2>Pool and quotas</h2><p>Free now: {e(free)}</p>{body}</section>'


def plot_section(data: Mapping[str, Any]) -> str:
    plot = data["plot"]
    projects = sorted({p for s in plot["series"].values() for p in s} | set(plot["quotas"]))
    legend = " ".join(
        f'<span><span class="swatch" style="background:{color(i)}"></span>{e(p)}</span>'
        for i, p in enumerate(projects)
    )
    charts = [
        usage_plot(r, plot["series"][r], plot["quotas"], projects)
        for r in sorted(plot["series"])[:PLOTTED_RESOURCES]
    ] or ["<p>No attempt ran in the last 24 hours.</p>"]
    charts.append(queue_plot(data["queue_lengths"], data["rendered"]))
    return f'<section id="plots"><h2>Last 24 hours</h2><p>{legend}</p>{"".join(charts)}</section>'


def queue_section(data: Mapping[str, Any]) -> str:
    parts = ['<section id="queue"><h2>Queue</h2>']
    if not data["queue"]:
        parts.append("<p>No job is waiting.</p>")
    for i, project in enumerate(data["queue"]):
        rows = [
            [
                f'<span class="num">{j["position"]}</span>',
                link(j["name"], j["log"]),
                e(j["user"]),
                e(units(j["resources"])),
                f'<span class="why">{e(j["why"])}</span>',
            ]
            for j in project["jobs"]
        ]
        more = (
            f"<p>… and {project['more']} more waiting (bastion list; bastion why NAME)</p>"
            if project["more"] > 0
            else ""
        )
        parts.append(
            f"<details{' open' if i < PROJECTS_OPEN else ''}><summary>{e(project['project'])}: "
            f"{project['waiting']} waiting"
            f"</summary>{table(['#', 'job', 'user', 'resources', 'why it waits'], rows)}"
            f"{more}</details>"
        )
    parts.append("</section>")
    return "".join(parts)


def running_section(data: Mapping[str, Any]) -> str:
    rows = [
        [
            link(j["name"], j["log"]),
            e(j["project"]),
            e(j["user"]),
            e(units(j["resources"])),
            e(j["status"]),
            e(j["runner"]),
            e(j["workers"] or "-"),
            e(duration(j["running_for"])),
            e(f"stopping ({j['stopping']}): {duration(j['time_left'])}" if j["stopping"] else "-"),
            f'<span class="why">{e(j["reason"])}</span>',
        ]
        for j in data["running"]
    ]
    head = ["job", "project", "user", "resources", "state", "runner", "workers", "running for"]
    head += ["time left", "reason"]
    body = table(head, rows) if rows else "<p>Nothing is running.</p>"
    more = data["counts"]["running"] - len(rows)
    if more > 0:
        body += f"<p>… and {more} more running (bastion list)</p>"
    return f'<section id="running"><h2>Running ({data["counts"]["running"]})</h2>{body}</section>'


def recent_section(data: Mapping[str, Any]) -> str:
    rows = [
        [
            e(when(r["time"])),
            link(r["name"], r["log"]),
            e(r["project"]),
            e(r["user"]),
            e(r["what"]),
            f'<span class="why">{e(r["reason"])}</span>',
        ]
        for r in data["recent"]
    ]
    body = (
        table(["ended", "job", "project", "user", "what", "reason"], rows)
        if rows
        else ("<p>No preemption or failure in the last 24 hours.</p>")
    )
    return f'<section id="recent"><h2>Preemptions and failures, last 24 hours</h2>{body}</section>'


def usage_section(data: Mapping[str, Any]) -> str:
    parts = ['<section id="usage"><h2>Usage (resource-hours, from the ledger)</h2>']
    for label, title in (("day", "Last day"), ("week", "Last 7 days")):
        rows = [
            [
                e(r["project"]),
                e(hours(r["used_hours"])),
                e(hours(r["borrowed_hours"])),
                e(hours(r["lost_hours"])),
                f'<span class="num">{r["attempts"]} ({r["preempted"]} preempted)</span>',
            ]
            for r in data["usage"][label]
        ]
        head = ["project", "used", "of which borrowed", "lost to preemption", "attempts"]
        body = table(head, rows) if rows else "<p>No attempts.</p>"
        parts.append(f"<h3>{title}</h3>{body}")
    parts.append("</section>")
    return "".join(parts)


def render(data: Mapping[str, Any]) -> str:
    rendered = float(data["rendered"])
    counts = data["counts"]
    head = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{e(CSP)}">'
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
        '<meta name="viewport" content="width=device-width">'
        f"<title>Bastion status: {e(data['root'])}</title><style>{CSS}</style></head>"
    )
    top = (
        f'<body data-rendered="{rendered:.3f}"><div id="stale" class="stale" hidden></div>'
        f'<noscript><div class="stale">Rendered {e(when(rendered))}: if that is more than a '
        "minute ago, the daemon may have stopped.</div></noscript>"
        f'<h1>Bastion status</h1><p class="meta">{e(data["root"])} · rendered '
        f'<time id="rendered" datetime="{e(when(rendered))}">{e(when(rendered))}</time> · '
        f"{counts['jobs']} jobs: {counts['running']} running, {counts['waiting']} waiting"
        + (f" · {e(data['daemon'])}" if data.get("daemon") else "")
        + "</p>"
    )
    sections = [
        pool_section(data),
        plot_section(data),
        queue_section(data),
        running_section(data),
        recent_section(data),
        usage_section(data),
    ]
    return head + top + "".join(sections) + f"<script>{STALE_SCRIPT}</script></body></html>"

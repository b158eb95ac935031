"""The page's plots as inline SVG: use per project over the last day (stacked areas, each
project's quota as a dashed line) and the queue's length. No script, no external resource:
the SVG is markup in the page. Every label is escaped."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

WIDTH, HEIGHT, PAD = 720, 180, 36
COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")


def color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def _x(i: int, n: int) -> float:
    return PAD + (WIDTH - 2 * PAD) * (i / max(1, n - 1))


def _y(v: float, top: float) -> float:
    return HEIGHT - PAD + 0.0 - (HEIGHT - 2 * PAD) * (v / top if top else 0.0)


def _frame(title: str, top: float, unit: str) -> list[str]:
    e = html.escape
    return [
        f'<svg class="plot" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg"><title>{e(title)}</title>',
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" '
        'stroke="#888"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>',
        f'<text x="{PAD - 4}" y="{PAD + 4}" text-anchor="end" font-size="10">{top:g}</text>',
        f'<text x="{PAD - 4}" y="{HEIGHT - PAD}" text-anchor="end" font-size="10">0</text>',
        f'<text x="{PAD}" y="{HEIGHT - 8}" font-size="10">24h ago</text>',
        f'<text x="{WIDTH - PAD}" y="{HEIGHT - 8}" text-anchor="end" font-size="10">now</text>',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="12">{e(title)}'
        f"{(' (' + e(unit) + ')') if unit else ''}</text>",
    ]


def usage_plot(
    resource: str,
    series: Mapping[str, Sequence[float]],
    quotas: Mapping[str, Mapping[str, float]],
    projects: Sequence[str],
) -> str:
    """Stacked use of ``resource`` per project, with each project's quota (dashed)."""
    n = max((len(v) for v in series.values()), default=0)
    stacked_top = max((sum(series[p][i] for p in series) for i in range(n)), default=0.0)
    quota_top = max((q.get(resource, 0.0) for q in quotas.values()), default=0.0)
    top = max(1.0, stacked_top, quota_top)
    parts = _frame(f"{resource} in use per project, last 24 hours", top, "units")
    below = [0.0] * n
    for p in projects:
        values = series.get(p)
        if not values:
            continue
        above = [below[i] + values[i] for i in range(n)]
        upper = " ".join(f"{_x(i, n):.1f},{_y(above[i], top):.1f}" for i in range(n))
        lower = " ".join(f"{_x(i, n):.1f},{_y(below[i], top):.1f}" for i in reversed(range(n)))
        parts.append(
            f'<polygon class="area" points="{upper} {lower}" fill="{color(projects.index(p))}" '
            f'fill-opacity="0.7"><title>{html.escape(p)}</title></polygon>'
        )
        below = above
    for p in projects:
        q = quotas.get(p, {}).get(resource)
        if q:
            y = _y(q, top)
            parts.append(
                f'<line class="quota" x1="{PAD}" y1="{y:.1f}" x2="{WIDTH - PAD}" y2="{y:.1f}" '
                f'stroke="{color(projects.index(p))}" stroke-dasharray="6 4">'
                f"<title>{html.escape(p)} quota {q:g}</title></line>"
            )
    parts.append("</svg>")
    return "".join(parts)


def queue_plot(points: Sequence[Sequence[float]], now: float) -> str:
    """Waiting jobs over the last day, from the samples the page keeps."""
    top = max([1.0, *(p[1] for p in points)])
    parts = _frame("jobs waiting, last 24 hours", top, "")
    if points:
        span = 86400.0
        xy = [
            (PAD + (WIDTH - 2 * PAD) * max(0.0, 1 - (now - t) / span), _y(v, top))
            for t, v in points
        ]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        parts.append(f'<polyline class="queue" points="{path}" fill="none" stroke="#333"/>')
    parts.append("</svg>")
    return "".join(parts)

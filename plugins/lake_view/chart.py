"""An aggregate over windows as an inline SVG line chart, rendered on the server (no JavaScript, no CDN)."""

from __future__ import annotations

import datetime as dt
from html import escape

from spark_jobs.inspection import Series

__all__ = ["COLORS", "svg_chart"]

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
WIDTH, HEIGHT = 860, 340
LEFT, RIGHT, TOP, BOTTOM = 70, 50, 20, 50
_STEPS = (60, 300, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400, 30 * 86400)


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** (len(str(int(value))) - 1) if value >= 1 else 1  # so value <= 10 * magnitude
    return float(next(step * magnitude for step in (1, 2, 2.5, 5, 10) if step * magnitude >= value))


def _fmt(value: float) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:.3g}M"
    return f"{value / 1e3:.3g}k" if abs(value) >= 1e3 else f"{value:.4g}"


def svg_chart(series: Series, *, x_label: str = "window_start") -> str:
    """The series as one ``<svg>`` element: axes, a polyline and point markers (with tooltips) per key;
    ``x_label`` names the time on the x axis (a rollup draws its buckets' ``start``)."""
    points = [(x, y) for _, line in series.lines for x, y in line if x is not None and y is not None]
    title = f"{series.metric} by {x_label}, {series.table} version {series.version}"
    svg = (f'<svg id="chart-svg" role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg" '
           f'width="{WIDTH}"')
    if not points:
        return f'{svg} height="80"><text x="10" y="40">no points to draw</text></svg>'
    xs = [p[0].timestamp() for p in points]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1800, x_hi + 1800
    y_lo = min(0.0, min(p[1] for p in points))
    y_hi = _nice_max(max(p[1] for p in points))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(t: dt.datetime) -> float:
        return LEFT + (t.timestamp() - x_lo) / (x_hi - x_lo) * plot_w

    def sy(v: float) -> float:
        return TOP + plot_h - (v - y_lo) / (y_hi - y_lo or 1) * plot_h

    height = HEIGHT + 24 * ((len(series.lines) + 3) // 4)  # and the legend's rows, four keys a row
    out = [f'{svg} height="{height}" viewBox="0 0 {WIDTH} {height}" font-size="11" font-family="sans-serif">',
           f"<title>{escape(title)}</title>"]
    for i in range(5):  # y grid and labels
        y = sy(v := y_lo + (y_hi - y_lo) * i / 4)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(_fmt(v))}</text>')
    step = next((s for s in _STEPS if (x_hi - x_lo) / s <= 8), _STEPS[-1])
    first = -(-x_lo // step) * step  # x labels on round times (UTC)
    for k in range(int((x_hi - first) // step) + 1):
        t = dt.datetime.fromtimestamp(first + k * step, dt.UTC)
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" y2="{TOP + plot_h + 4}" stroke="#555"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{t:%m-%d %H:%M}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" y2="{TOP + plot_h}" stroke="#555"/>')
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#555"/>')
    out.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h + 34}" text-anchor="middle">{escape(x_label)} (UTC)</text>')
    for n, (label, line) in enumerate(series.lines):
        color = COLORS[n % len(COLORS)]
        pts = [(sx(x), sy(y), x, y) for x, y in line if x is not None and y is not None]
        coords = " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in pts)
        out.append(f'<g class="series" data-label="{escape(label)}">')
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{coords}"/>')
        for px, py, at, y in pts:
            tip = f"{label}  {at:%Y-%m-%d %H:%M}  {series.metric}={_fmt(y)}"
            out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{color}"><title>{escape(tip)}</title></circle>')
        out.append("</g>")
        lx, ly = LEFT + (n % 4) * (plot_w / 4), HEIGHT + 10 + 24 * (n // 4)
        out.append(f'<rect x="{lx:.0f}" y="{ly - 9}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{lx + 16:.0f}" y="{ly + 1}">{escape(label[:40])}</text>')
    out.append("</svg>")
    return "".join(out)

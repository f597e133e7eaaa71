"""SVG charts without a plotting dependency: bars, histograms and lines, built as markup, every
label escaped (labels come from the web: URLs, languages, reasons). `pipeline report` puts them in
its page and `gristmill.stats` returns them (`_repr_svg_`: Jupyter draws them inline).
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

KEPT, DROPPED, BEFORE, AFTER, LINE = "#3b7dd8", "#e0703a", "#9aa5b1", "#3b7dd8", "#c0392b"


def esc(value) -> str:
    return escape("" if value is None else str(value), quote=True)


class Figure:
    """An SVG figure; Jupyter draws it inline (`_repr_svg_`), `str()` is the SVG markup."""

    def __init__(self, svg: str):
        self.svg = svg

    def _repr_svg_(self) -> str:
        return self.svg

    def __str__(self) -> str:
        return self.svg

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.svg)


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e3:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def bar_chart(items: list[tuple[str, float]], title: str = "", color: str = KEPT, width: int = 560) -> Figure:
    """Horizontal bars, one per (label, value)."""
    row, left, top = 20, 210, 26 if title else 6
    h = top + row * max(len(items), 1) + 8
    vmax = max((v for _, v in items), default=0) or 1
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" viewBox="0 0 {width} {h}" '
        f'font-family="sans-serif" font-size="12">'
    ]
    if title:
        parts.append(f'<text x="4" y="16" font-weight="bold">{esc(title)}</text>')
    for i, (label, v) in enumerate(items):
        y = top + i * row
        w = (width - left - 70) * v / vmax
        parts.append(
            f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{esc(str(label)[:34])}</text>'
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{color}"/>'
            f'<text x="{left + w + 4:.1f}" y="{y + 14}">{esc(f"{v:,.0f}")}</text>'
        )
    parts.append("</svg>")
    return Figure("".join(parts))


def _plot_frame(width: int, height: int, title: str, ml: float, mt: float, pw: float, ph: float) -> list[str]:
    """The opening of a plot's SVG: the element, its title, the x and y axes of the plot area
    (`pw` × `ph` at left margin `ml`, top margin `mt`)."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<text x="4" y="15" font-weight="bold" font-size="12">{esc(title)}</text>',
        f'<line x1="{ml}" y1="{mt + ph}" x2="{ml + pw}" y2="{mt + ph}" stroke="#333"/>',
        f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{mt + ph}" stroke="#333"/>',
    ]


def histogram(
    edges: list[float],
    series: dict[str, list[int]],
    title: str = "",
    log_x: bool = False,
    threshold: float | None = None,
    threshold_label: str = "",
    colors: dict[str, str] | None = None,
    width: int = 560,
    height: int = 230,
) -> Figure:
    """Overlaid step histograms over shared bin `edges` (log10 x axis if `log_x`), a red line at
    `threshold`."""
    colors = colors or {}
    palette = [KEPT, DROPPED, BEFORE, LINE]
    ml, mr, mt, mb = 48, 12, 26, 36
    pw, ph = width - ml - mr, height - mt - mb
    xs = [math.log10(e) if log_x else e for e in edges]
    x0, x1 = xs[0], xs[-1]
    ymax = max((max(c) for c in series.values() if c), default=0) or 1
    X = lambda x: ml + (x - x0) / (x1 - x0) * pw  # noqa: E731
    Y = lambda y: mt + ph - y / ymax * ph  # noqa: E731
    p = _plot_frame(width, height, title, ml, mt, pw, ph)
    for frac in (0, 0.5, 1):
        y = ymax * frac
        p.append(f'<text x="{ml - 4}" y="{Y(y) + 4:.1f}" text-anchor="end">{_fmt(y)}</text>')
    ticks = 6
    for i in range(ticks + 1):
        x = x0 + (x1 - x0) * i / ticks
        label = _fmt(10**x) if log_x else _fmt(round(x, 3))
        p.append(f'<text x="{X(x):.1f}" y="{mt + ph + 14}" text-anchor="middle">{label}</text>')
    legend_x = ml + pw
    for k, (name, counts) in enumerate(series.items()):
        color = colors.get(name, palette[k % len(palette)])
        pts = [f"{X(xs[0]):.1f},{Y(0):.1f}"]
        for i, c in enumerate(counts):
            pts += [f"{X(xs[i]):.1f},{Y(c):.1f}", f"{X(xs[i + 1]):.1f},{Y(c):.1f}"]
        pts.append(f"{X(xs[-1]):.1f},{Y(0):.1f}")
        p.append(f'<polygon points="{" ".join(pts)}" fill="{color}" fill-opacity="0.35" stroke="{color}"/>')
        label = f"{name} ({sum(counts):,})"
        p.append(
            f'<rect x="{legend_x - 150}" y="{mt + 2 + 14 * k}" width="10" height="10" fill="{color}"/>'
            f'<text x="{legend_x - 136}" y="{mt + 11 + 14 * k}">{esc(label)}</text>'
        )
    if threshold is not None and (threshold > 0 or not log_x):
        tx = math.log10(threshold) if log_x else threshold
        if x0 <= tx <= x1:
            p.append(
                f'<line x1="{X(tx):.1f}" y1="{mt}" x2="{X(tx):.1f}" y2="{mt + ph}" stroke="{LINE}" '
                f'stroke-width="2" stroke-dasharray="5,3"/>'
                f'<text x="{width - 4}" y="15" text-anchor="end" fill="{LINE}">- - {esc(threshold_label)} '
                f"{_fmt(threshold)}</text>"
            )
    p.append(
        f'<text x="{ml + pw / 2}" y="{height - 4}" text-anchor="middle" fill="#555">'
        f"{'log scale' if log_x else ''}</text></svg>"
    )
    return Figure("".join(p))


def line_chart(
    series: dict[str, list[tuple[float, float]]], title: str = "", width: int = 560, height: int = 230
) -> Figure:
    ml, mr, mt, mb = 48, 12, 26, 30
    pw, ph = width - ml - mr, height - mt - mb
    pts_all = [pt for s in series.values() for pt in s]
    if not pts_all:
        return Figure("")
    xmin, xmax = min(x for x, _ in pts_all), max(x for x, _ in pts_all)
    ymin, ymax = min(y for _, y in pts_all), max(y for _, y in pts_all)
    xmax, ymax = (xmax if xmax > xmin else xmin + 1), (ymax if ymax > ymin else ymin + 1)
    X = lambda x: ml + (x - xmin) / (xmax - xmin) * pw  # noqa: E731
    Y = lambda y: mt + ph - (y - ymin) / (ymax - ymin) * ph  # noqa: E731
    p = [
        *_plot_frame(width, height, title, ml, mt, pw, ph),
        f'<text x="{ml - 4}" y="{Y(ymax) + 4:.1f}" text-anchor="end">{_fmt(ymax)}</text>',
        f'<text x="{ml - 4}" y="{Y(ymin) + 4:.1f}" text-anchor="end">{_fmt(ymin)}</text>',
        f'<text x="{ml}" y="{mt + ph + 14}">{_fmt(xmin)}</text>',
        f'<text x="{ml + pw}" y="{mt + ph + 14}" text-anchor="end">{_fmt(xmax)}</text>',
    ]
    for k, (name, pts) in enumerate(series.items()):
        color = [KEPT, DROPPED, LINE][k % 3]
        p.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
            f'points="{" ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in pts)}"/>'
            f'<text x="{ml + pw - 100}" y="{mt + 12 + 14 * k}" fill="{color}">{esc(name)}</text>'
        )
    p.append("</svg>")
    return Figure("".join(p))

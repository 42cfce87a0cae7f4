"""An SVG picture of a chunk grid: one bar per dimension, chunk boundaries drawn at their real
(irregular) positions, chunks padded inside the array marked.

Archives reach 10^5 chunks along time, more than a picture has pixels. Boundaries are therefore
drawn as one path with at most one stroke per pixel column (a dense stretch reads as a solid
band, and the label says how many chunks there are), so the SVG stays a few KB and renders in
milliseconds whatever the chunk count. Only numpy is used: the HTML index of ``refgrid serve``
and the notebook reprs draw it without matplotlib.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

import numpy as np

Axis = tuple[np.ndarray, np.ndarray]
"""One dimension: its chunks' logical lengths and encoded (stored) lengths."""

BAR_WIDTH = 420
"""Pixels of a bar: the longest dimension's length maps onto it."""
BAR_HEIGHT = 18
ROW_HEIGHT = 48
MARK_WIDTH = 3
MARK_HEIGHT = 4
LABEL_WIDTH = 96
EDGE_COLOUR = "#1f3b5c"
CHUNK_COLOUR = "#9ecae1"
PADDED_COLOUR = "#e6550d"


def grid_svg(axes: Sequence[Axis], dims: Sequence[str] | None = None,
             title: str | None = None) -> str:
    """The picture of a grid whose dimensions have the chunks ``axes`` (see
    :meth:`refgrid.RectilinearGrid.svg`) as an SVG document (a string), dimensions named
    ``dims``."""
    ndim = len(axes)
    names = list(dims) if dims is not None else [f"dim_{i}" for i in range(ndim)]
    width = LABEL_WIDTH + BAR_WIDTH + 8
    top = 22 if title else 4
    height = top + ROW_HEIGHT * max(ndim, 1) + 4
    label = escape(title or "chunk grid", quote=True)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{label}" '
             'font-family="sans-serif" font-size="11">']
    if title:
        parts.append(f'<text x="0" y="14" font-weight="bold">{escape(title)}</text>')
    if ndim == 0:
        parts.append(f'<text x="0" y="{top + 14}">scalar: one chunk</text>')
    for row, (name, (logical, encoded)) in enumerate(zip(names, axes, strict=True)):
        parts.append(_bar(np.asarray(logical), np.asarray(encoded), name, top + row * ROW_HEIGHT))
    parts.append("</svg>")
    return "".join(parts)


def _bar(logical: np.ndarray, encoded: np.ndarray, name: str, y: int) -> str:
    """One dimension: its name, a bar with the chunk boundaries, padded chunks and a caption."""
    bounds = np.concatenate(([0], np.cumsum(logical)))
    length = max(int(bounds[-1]), 1)
    scale = BAR_WIDTH / length
    x0 = LABEL_WIDTH
    parts = [f'<text x="0" y="{y + 13}">{escape(_clip(name, 14))}</text>',
             f'<rect x="{x0}" y="{y}" width="{BAR_WIDTH}" height="{BAR_HEIGHT}" '
             f'fill="{CHUNK_COLOUR}" stroke="{EDGE_COLOUR}"/>']
    if len(logical) > 1:
        columns = _columns(bounds[1:-1], scale)
        path = "".join(f"M{x0 + c}.5 {y}v{BAR_HEIGHT}" for c in columns.tolist())
        parts.append(f'<path d="{path}" stroke="{EDGE_COLOUR}" stroke-width="1"/>')
    padded = np.flatnonzero(encoded[:-1] != logical[:-1])
    if len(padded):
        starts = _columns(bounds[padded], scale)
        ends = np.maximum(_columns(bounds[padded + 1], scale), starts + MARK_WIDTH)
        spans = _merged(starts, ends)  # below the bar, at least MARK_WIDTH wide: visible
        marks = "".join(f"M{x0 + a} {y + BAR_HEIGHT + 1}h{b - a}v{MARK_HEIGHT}h{a - b}z"
                        for a, b in spans)
        parts.append(f'<path d="{marks}" fill="{PADDED_COLOUR}"><title>{len(padded)} padded '
                     'chunk(s): stored longer than their extent</title></path>')
    parts.append(f'<text x="{x0}" y="{y + BAR_HEIGHT + MARK_HEIGHT + 13}" fill="#444">'
                  f'{escape(_caption(logical, encoded, len(padded)))}</text>')
    return "".join(parts)


def _columns(positions: np.ndarray, scale: float) -> np.ndarray:
    """The distinct pixel columns of ``positions`` (element indices)."""
    return np.unique(np.minimum((positions * scale).astype(np.int64), BAR_WIDTH - 1))


def _merged(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """Pixel spans ``[start, end)`` with touching or overlapping ones joined."""
    order = np.argsort(starts, kind="stable")
    spans: list[tuple[int, int]] = []
    for a, b in zip(starts[order].tolist(), ends[order].tolist(), strict=True):
        if spans and a <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], b))
        else:
            spans.append((a, b))
    return spans


def _caption(logical: np.ndarray, encoded: np.ndarray, padded: int) -> str:
    """``"365 · 12 chunks of 28-31"``: the length, the chunk count and the chunk lengths."""
    count = len(logical)
    if count == 0:
        return "0 · no chunks"
    low, high = int(logical.min()), int(logical.max())
    regular = (encoded == encoded[0]).all() and (logical[:-1] == encoded[0]).all()
    if regular:
        sizes = f"of {int(encoded[0])}"
    else:
        sizes = f"of {low}" if low == high else f"of {low}-{high}"
    text = f"{int(logical.sum()):,} · {count:,} chunk{'s' if count > 1 else ''} {sizes}"
    return f"{text} · {padded:,} padded (marked)" if padded else text


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"

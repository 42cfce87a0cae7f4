"""The SVG chunk picture: boundaries at their real positions, padded chunks marked, and
pictures of 10^5 chunks that stay small and fast."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

import numpy as np

from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.grid.svg import BAR_WIDTH, LABEL_WIDTH, PADDED_COLOUR

SVG = "{http://www.w3.org/2000/svg}"


def _paths(svg: str) -> list[ET.Element]:
    return ET.fromstring(svg).findall(f".//{SVG}path")


def test_boundaries_are_drawn_where_the_chunks_end():
    grid = RectilinearGrid.from_lengths([[31, 28, 31, 30], [6]])
    svg = grid.svg(["time", "lat"], "tas")
    root = ET.fromstring(svg)
    assert root.get("aria-label") == "tas"
    edges = _paths(svg)[0].get("d")
    scale = BAR_WIDTH / 120
    expected = [LABEL_WIDTH + int(b * scale) for b in (31, 59, 90)]
    assert [int(float(m.split()[0])) for m in edges.split("M")[1:]] == expected
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "time" in texts and "lat" in texts
    assert "120 · 4 chunks of 28-31" in texts and "6 · 1 chunk of 6" in texts


def test_padded_chunks_inside_the_array_are_marked_and_counted():
    grid = RectilinearGrid.from_lengths([[10, 10, 1, 10, 8]], [[10, 10, 10, 10, 10]])
    svg = grid.svg(["time"])
    padded = [p for p in _paths(svg) if p.get("fill") == PADDED_COLOUR]
    assert len(padded) == 1 and padded[0].get("d").count("M") == 1  # the 1 (not the last)
    assert "1 padded chunk(s)" in padded[0].find(f"{SVG}title").text
    assert "39 · 5 chunks of 1-10 · 1 padded (marked)" in svg
    assert PADDED_COLOUR not in RectilinearGrid.regular((39,), (10,)).svg(["t"])


def test_a_hundred_thousand_chunks_render_small_and_fast():
    rng = np.random.default_rng(0)
    lengths = rng.integers(28, 32, 100_000)
    encoded = lengths.copy()
    encoded[::7] = 40
    grid = RectilinearGrid.from_lengths([lengths, [180], [360]], [encoded, None, None])
    started = time.process_time()  # (CPU time: a loaded machine does not trip it)
    svg = grid.svg(["time", "lat", "lon"], "a century of daily files")
    elapsed = time.process_time() - started
    assert elapsed < 0.2, elapsed
    assert len(svg.encode()) < 50_000, len(svg.encode())
    ET.fromstring(svg)  # well-formed
    assert "100,000 chunks" in svg


def test_scalars_and_empty_dimensions():
    assert "scalar: one chunk" in RectilinearGrid.from_lengths([]).svg([])
    empty = RectilinearGrid.regular((0, 4), (5, 4)).svg(["time", "x"])
    assert "0 · no chunks" in empty
    ET.fromstring(empty)

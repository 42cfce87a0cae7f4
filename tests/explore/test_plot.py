"""refgrid.explore.plot: what each picture draws is the references' own numbers (file boundaries,
padded chunks, chunk lengths, the cost of a selection), and it renders to PNG."""

from __future__ import annotations

import sys

import matplotlib
import numpy as np
import pytest

import refgrid
from refgrid import plot
from refgrid.grid.svg import PADDED_COLOUR
from tests.combining.test_combine import _files

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def tas():
    return refgrid.combine([refgrid.scan(f) for f in _files("monthly/chunk10")], "time")["tas"]


def test_the_time_axis_shows_file_boundaries_and_padded_chunks(tas, tmp_path):
    ax = plot.time_axis(tas)
    months = np.cumsum([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30])
    np.testing.assert_array_equal(plot.file_boundaries(tas), months)
    dashed = [c for c in ax.collections if c.get_linestyle()[0][1] is not None]
    segments = np.array([s[0][0] for s in dashed[0].get_segments()])
    np.testing.assert_array_equal(segments, months)
    padded = [c for c in ax.collections if len(c.get_facecolor())
              and matplotlib.colors.to_hex(c.get_facecolor()[0]) == PADDED_COLOUR]
    assert len(padded[0].get_paths()) == 7
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["chunk edge", "file boundary (12 files)", "padded chunk (7)"]
    ax.figure.savefig(tmp_path / "time.png")
    assert (tmp_path / "time.png").stat().st_size > 5000


def test_chunk_lengths_histogram(tas):
    ax = plot.chunk_lengths(tas)
    heights = {round(p.get_x() + p.get_width() / 2): p.get_height() for p in ax.patches}
    lengths, counts = np.unique(tas.grid.axes[0].logical, return_counts=True)
    assert heights == dict(zip(lengths.tolist(), counts.tolist(), strict=True))
    assert plot.chunk_lengths(tas, "lat").patches[0].get_height() == 1


def test_the_cost_of_a_time_series_and_a_map(tas):
    series, a_map = plot.selection_numbers(tas, True), plot.selection_numbers(tas, False)
    assert series == (43, int(tas.manifest.length.sum()))
    assert a_map == (1, int(tas.manifest.length[0, 0, 0]))
    ax = plot.selection_cost(tas)
    assert [p.get_height() for p in ax.patches] == [43, 1]


def test_bad_requests_are_clear_errors(tas, monkeypatch):
    with pytest.raises(refgrid.ArgumentError, match="no dimension 'height'"):
        plot.chunk_lengths(tas, "height")
    time = refgrid.combine([refgrid.scan(f) for f in _files("monthly/chunk10")], "time")["time"]
    with pytest.raises(refgrid.ArgumentError, match="need two or more"):
        plot.selection_cost(time)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(refgrid.MissingExtraError, match="'plot' extra"):
        plot.time_axis(tas)

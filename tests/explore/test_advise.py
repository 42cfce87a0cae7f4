"""The chunk-shape advisor: the seed notebook's worked examples exactly, then the general
method on any rank, access mix and native layout, and clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import refgrid
from refgrid.explore.advise import advise_chunks, parse_size
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ChunkManifest
from refgrid.model.virtual import VirtualArray


def _array(shape, native, dims, dtype="f4") -> VirtualArray:
    grid = RectilinearGrid.from_lengths(native) if isinstance(native[0], list) else \
        RectilinearGrid.regular(shape, native)
    return VirtualArray("v", tuple(dims), np.dtype(dtype), grid,
                        ChunkManifest.empty(grid.chunk_counts))


def _mean_seconds(advice) -> float:
    return sum(p.seconds * p.weight for p in advice.patterns) / sum(p.weight for p in
                                                                     advice.patterns)


def test_the_notebooks_toy_example():
    advice = advise_chunks((365, 240, 150), 2**20, method="balanced-3d", itemsize=4,
                           partial_fraction=0.5)
    assert advice.chunks == (53, 88, 54)
    assert advice.partial_fraction == pytest.approx(0.5016199733180866)
    assert advice.chunk_bytes == 53 * 88 * 54 * 4


def test_the_notebooks_prism_example():
    advice = advise_chunks((1555, 621, 1405), 2_618_952 * 4, method="balanced-3d",
                           itemsize=4)
    assert list(advice.chunks) == [68, 131, 294]
    assert advice.partial_fraction == pytest.approx(0.5004165788452786)


def test_the_general_method_does_better_on_the_toy_example():
    dims = ("time", "lat", "lon")
    balanced = advise_chunks((365, 240, 150), 2**20, method="balanced-3d", itemsize=4,
                             dims=dims)
    general = advise_chunks((365, 240, 150), 2**20, itemsize=4, dims=dims)
    assert _mean_seconds(general) < _mean_seconds(balanced)
    assert general.partial_fraction >= 0.5
    assert 2**19 <= general.chunk_bytes <= 2**21
    assert general.candidates[0][0] == general.chunks
    assert [p.dims for p in general.patterns] == [("time",), ("lat", "lon")]


def test_weights_move_the_shape_towards_the_pattern_that_matters():
    dims = ("time", "lat", "lon")
    series = advise_chunks((3650, 180, 360), "10MiB", {"time": 1}, itemsize=4, dims=dims)
    maps = advise_chunks((3650, 180, 360), "10MiB", {("lat", "lon"): 1}, itemsize=4,
                         dims=dims)
    assert series.chunks[0] > maps.chunks[0]
    assert series.patterns[0].chunks < maps.chunks[0]
    assert maps.chunks[1] * maps.chunks[2] > series.chunks[1] * series.chunks[2]


def test_four_and_two_dimensional_arrays():
    four = advise_chunks((3650, 10, 180, 360), "20MiB", {"time": 1, ("lat", "lon"): 2},
                         itemsize=4, dims=("time", "lev", "lat", "lon"))
    assert len(four.chunks) == 4 and 10 * 2**20 <= four.chunk_bytes <= 40 * 2**20
    assert four.partial_fraction >= 0.5
    two = advise_chunks((100_000, 500), "10MiB", {"row": 1, "col": 1}, itemsize=8,
                        dims=("row", "col"))
    assert 5 * 2**20 <= two.chunk_bytes <= 20 * 2**20 and two.partial_fraction >= 0.5


def test_shapes_that_align_with_the_native_chunks_copy_each_source_chunk_once():
    from refgrid.explore.advise import _copy_reads

    array = _array((14600, 180, 360), (73, 45, 90), ("time", "lat", "lon"))
    aligned = advise_chunks(array, "20MiB")
    free = advise_chunks(array, "20MiB", align=False)
    assert aligned.copy_reads == 1.0 and free.copy_reads is None
    assert [c % n for c, n in zip(aligned.chunks, (73, 45, 90), strict=True)] == [0, 0, 0]
    reads = math.prod(_copy_reads(a, c) for a, c in zip(array.grid.axes, free.chunks,
                                                                strict=True))
    assert reads > 1.0  # unaware of the sources, a copy would read some twice or more


def test_on_an_irregular_archive_the_advice_rereads_fewer_source_chunks():
    from refgrid.explore.advise import _copy_reads

    years = [[73] * 5 + [1] if y % 4 == 0 else [73] * 5 for y in range(2000, 2040)]
    array = _array(None, [[n for year in years for n in year], [180], [360]],
                   ("time", "lat", "lon"))
    aligned = advise_chunks(array, "20MiB")
    free = advise_chunks(array, "20MiB", align=False)
    reads = math.prod(_copy_reads(a, c) for a, c in zip(array.grid.axes, free.chunks,
                                                                strict=True))
    assert aligned.copy_reads < reads


def test_a_dataset_is_advised_on_its_largest_array(tmp_path):
    from tests.combining.test_combine import _files

    group = refgrid.combine([refgrid.scan(f) for f in _files("monthly/chunk10")], "time")
    advice = advise_chunks(group, "1MiB")
    assert advice.dims == ("time", "lat", "lon") and advice.chunks[1:] == (6, 8)
    assert advise_chunks(group, variable="time").dims == ("time",)
    with pytest.raises(refgrid.ArgumentError, match="no array 'nope'"):
        advise_chunks(group, variable="nope")


@pytest.mark.parametrize("kwargs, message", [
    ({"size": 2}, "smaller than one value"),
    ({"access": {"height": 1}}, "no dimension 'height'"),
    ({"access": {"time": -1}}, "must be >= 0"),
    ({"size": "ten megs"}, "expected bytes"),
    ({"partial_fraction": 1.5}, r"must lie in \[0, 1\]"),
    ({"method": "balanced-3d", "dims": ("a", "b")}, "3-D arrays"),
    ({"window": ("2KiB", "3KiB"), "partial_fraction": 1.0}, "no chunk shape"),
])
def test_invalid_requests_are_clear_errors(kwargs, message):
    shape = (100, 7) if kwargs.get("dims") == ("a", "b") else (367, 241, 151)  # primes
    options = {"itemsize": 4, "dims": ("time", "lat", "lon"), **kwargs}
    with pytest.raises(refgrid.ArgumentError, match=message):
        advise_chunks(shape, **options)


def test_sizes_parse_with_units():
    assert parse_size("10MiB") == 10 * 2**20 and parse_size("1.5 GB") == 1_500_000_000
    assert parse_size(4096) == 4096 and math.isclose(parse_size("2kib"), 2048)


def test_the_cli_advises_and_names_bad_patterns(tmp_path):
    import json

    from click.testing import CliRunner

    from refgrid.cli import main
    from tests.combining.test_combine import _files

    refs = refgrid.write(refgrid.combine([refgrid.scan(f) for f in _files("monthly/chunk10")],
                                         "time"), tmp_path / "year.json")
    runner = CliRunner()
    text = runner.invoke(main, ["advise", str(refs), "--size", "16KiB", "--access", "time=1",
                                "--access", "lat,lon=2"])
    assert text.exit_code == 0, text.output
    expected = advise_chunks(refgrid.scan(refs), "16KiB", {"time": 1, ("lat", "lon"): 2})
    assert repr(expected) in text.output and "--chunks time:" in text.output
    as_json = json.loads(runner.invoke(main, ["advise", str(refs), "--json"]).output)
    assert tuple(as_json["chunks"]) == advise_chunks(refgrid.scan(refs)).chunks
    bad = runner.invoke(main, ["advise", str(refs), "--access", "height=1"])
    assert bad.exit_code == 1 and "no dimension 'height'" in bad.output
    assert runner.invoke(main, ["advise", str(refs), "--access", "time"]).exit_code == 2

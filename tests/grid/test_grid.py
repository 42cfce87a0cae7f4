"""RectilinearGrid: construction, validation, queries, slicing and concatenation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grid_strategies import chunk_ids, grid_and_selection, grids
from refgrid import GridError, RectilinearGrid
from refgrid.grid.json_forms import emit_chunk_grid
from refgrid.grid.selection import orthogonal_index


def test_regular_grid_pads_only_the_last_chunk():
    g = RectilinearGrid.regular([25, 7], [10, 7])
    assert g.shape == (25, 7)
    assert g.chunk_counts == (3, 1)
    assert g.lengths(0).tolist() == [10, 10, 5]
    assert g.encoded_lengths(0).tolist() == [10, 10, 10]
    assert g.is_regular and g.chunk_shape == (10, 7)
    assert g.bounds(0).tolist() == [0, 10, 20, 25]


def test_monthly_files_concatenated_keep_interior_padding():
    months = [RectilinearGrid.regular([n], [10]) for n in (31, 28, 31)]
    g = RectilinearGrid.concat(months, 0)
    assert g.lengths(0).tolist() == [10, 10, 10, 1, 10, 10, 8, 10, 10, 10, 1]
    assert g.encoded_lengths(0).tolist() == [10] * 11
    assert not g.is_regular and g.chunk_shape is None
    assert g.locate(0, 31) == (4, 0)
    assert g.locate(0, 30) == (3, 0)
    assert g.locate(0, -1) == (10, 0)


def test_empty_dimension_has_no_chunks():
    g = RectilinearGrid.regular([0, 4], [512, 2])
    assert g.chunk_counts == (0, 2)
    assert g.nchunks == 0
    assert g.select(np.s_[:, 1]).shape == (0,)
    assert emit_chunk_grid(g) == {"name": "regular", "configuration": {"chunk_shape": [512, 2]}}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([[3, 0, 2]], None), "chunk 1 has length 0"),
        (([[3, -1]], None), "lengths must be >= 1"),
        (([[3, 3]], [[3, 2]]), "chunk 1 is encoded with 2 elements, shorter than its logical"),
        (([[3, 3]], [[3, 3, 3]]), "encoded and logical edge counts must be equal"),
        (([[3, 3], [2]], [[3, 3]]), "encoded lengths given for 1 dimensions, logical for 2"),
        (([[[1, 2]]], None), "must be a 1-d sequence of integers"),
        (([[1.5, 2]], None), "must be a 1-d sequence of integers"),
    ],
)
def test_from_lengths_validation(args, message):
    with pytest.raises(GridError, match=message):
        RectilinearGrid.from_lengths(*args)


def test_regular_validation():
    with pytest.raises(GridError, match="rank 1, array shape"):
        RectilinearGrid.regular([10, 10], [5])
    with pytest.raises(GridError, match="chunk lengths must be >= 1"):
        RectilinearGrid.regular([10], [0])


def test_locate_out_of_bounds_names_dimension():
    g = RectilinearGrid.from_lengths([[3, 4]])
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with length 7"):
        g.locate(0, 7)
    with pytest.raises(IndexError, match="index -8"):
        g.locate(0, np.array([1, -8]))


@given(grids(), st.data())
def test_locate_matches_brute_force(grid, data):
    dim = data.draw(st.integers(0, grid.ndim - 1))
    n = grid.shape[dim]
    if n == 0:
        return
    idx = np.array(data.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=20)))
    chunk, offset = grid.locate(dim, idx)
    ids = chunk_ids(grid, dim)
    assert chunk.tolist() == ids[idx].tolist()
    assert offset.tolist() == (np.arange(n)[idx] - grid.bounds(dim)[ids[idx]]).tolist()


def _assemble(grid: RectilinearGrid, selection, limit: int):
    """Read ``selection`` box by box from padded chunks of a known array, as the reader does."""
    source = np.arange(max(1, int(np.prod(grid.shape)))).reshape(grid.shape) \
        if all(grid.shape) else np.zeros(grid.shape, dtype=np.int64)
    chosen = grid.select(selection)
    out = np.full(chosen.kept_shape, -1, dtype=np.int64)
    writes = np.zeros(chosen.kept_shape, dtype=np.int64)
    touched = []
    for box in chosen.boxes(8, limit):
        counts = [len(t.chunks) for t in box]
        tile = [t.length for t in box]
        tiled = np.full([c * t for c, t in zip(counts, tile, strict=True)], -9, dtype=np.int64)
        for ranks in itertools.product(*(range(c) for c in counts)):
            coords = tuple(int(t.chunks[r]) for t, r in zip(box, ranks, strict=True))
            touched.append(coords)
            chunk = np.full(grid.encoded_chunk_shape(coords), -7, dtype=np.int64)
            region = grid.chunk_region(coords)
            chunk[tuple(slice(0, r.stop - r.start) for r in region)] = source[region]
            tiled[tuple(slice(r * t, r * t + n) for r, t, n in
                        zip(ranks, tile, chunk.shape, strict=True))] = chunk
        target = orthogonal_index([t.out for t in box], out.shape)
        out[target] = tiled[orthogonal_index([t.tiled for t in box], tiled.shape)]
        writes[target] += 1
    return out.reshape(chosen.shape), writes.reshape(chosen.shape), source, touched


@settings(max_examples=400, deadline=None)
@given(grid_and_selection(), st.integers(8, 400))
def test_selection_boxes_read_what_numpy_reads(case, limit):
    grid, selection = case
    out, writes, source, _ = _assemble(grid, selection, limit)
    expected = source
    for axis, index in reversed(list(enumerate(selection))):
        expected = np.take(expected, np.arange(grid.shape[axis])[index], axis=axis)
    assert out.shape == expected.shape
    np.testing.assert_array_equal(out, expected)
    # every output element comes from exactly one box, never from padding (-7) or a gap (-9)
    assert (writes == 1).all()


@given(grid_and_selection(), st.integers(8, 400))
def test_selection_touches_exactly_the_chunks_brute_force_finds(case, limit):
    grid, selection = case
    _, _, _, touched = _assemble(grid, selection, limit)
    per_axis = [set(chunk_ids(grid, d)[np.arange(n)[i]].reshape(-1).tolist())
                for d, (i, n) in enumerate(zip(selection, grid.shape, strict=True))]
    expected = set()
    if all(per_axis):
        expected = set(itertools.product(*per_axis))
    assert sorted(touched) == sorted(expected)  # each chunk in exactly one box
    assert grid.select(selection).nchunks == len(expected)


def test_selection_forms():
    g = RectilinearGrid.from_lengths([[31, 28, 31], [5, 5]])
    assert g.select(np.s_[..., 3]).shape == (90,)
    assert g.select(np.s_[40]).shape == (10,)
    assert g.select((np.array([89, 0, 31]), slice(None, None, -1))).shape == (3, 10)
    with pytest.raises(IndexError, match="too many indices"):
        g.select((0, 0, 0))
    with pytest.raises(IndexError, match="out of bounds for axis 1 with size 10"):
        g.select((0, 10))
    with pytest.raises(IndexError, match="boolean index on axis 0"):
        g.select(np.ones(3, dtype=bool))
    with pytest.raises(IndexError, match="single ellipsis"):
        g.select((..., ...))
    with pytest.raises(IndexError, match="1-d integer or boolean array"):
        g.select(np.ones((2, 2), dtype=int))


def test_slice_starts_on_a_boundary_and_may_stop_inside_a_chunk():
    g = RectilinearGrid.regular([100], [10])
    part, chunks = g.slice(0, 20, 45)
    assert chunks == slice(2, 5)
    assert part.lengths(0).tolist() == [10, 10, 5]
    assert part.encoded_lengths(0).tolist() == [10, 10, 10]
    with pytest.raises(GridError, match="start 25 falls inside chunk 2"):
        g.slice(0, 25, 30)
    with pytest.raises(GridError, match="cannot slice"):
        g.slice(0, 20, 101)
    empty, chunks = g.slice(0, 30, 30)
    assert empty.shape == (0,) and chunks == slice(3, 3)


def test_concat_checks_other_dimensions():
    a = RectilinearGrid.regular([10, 6], [5, 3])
    b = RectilinearGrid.regular([7, 6], [5, 2])
    with pytest.raises(GridError, match="grid 1 is chunked differently from grid 0 along "
                                        "dimension 1"):
        RectilinearGrid.concat([a, b], 0)
    with pytest.raises(GridError, match="grid 1 has 1 dimensions"):
        RectilinearGrid.concat([a, RectilinearGrid.regular([3], [3])], 0)
    joined = RectilinearGrid.concat([a, RectilinearGrid.regular([7, 6], [5, 3])], 0)
    assert joined.shape == (17, 6)
    assert joined.lengths(0).tolist() == [5, 5, 5, 2]


@given(grids(), st.data())
def test_slice_then_concat_restores_the_grid(grid, data):
    dim = data.draw(st.integers(0, grid.ndim - 1))
    cut = data.draw(st.sampled_from(grid.bounds(dim).tolist()))
    left, _ = grid.slice(dim, 0, cut)
    right, _ = grid.slice(dim, cut, grid.shape[dim])
    assert RectilinearGrid.concat([left, right], dim) == grid

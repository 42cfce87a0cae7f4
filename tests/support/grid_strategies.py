"""Hypothesis strategies for grids and selections, and the brute-force model they are checked
against: an array of chunk ids per axis, indexed with numpy."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from refgrid import RectilinearGrid


@st.composite
def axes(draw, max_chunks: int = 8) -> tuple[list[int], list[int]]:
    logical = draw(st.lists(st.integers(1, 6), min_size=0, max_size=max_chunks))
    pad = draw(st.lists(st.integers(0, 3), min_size=len(logical), max_size=len(logical)))
    return logical, [n + p for n, p in zip(logical, pad, strict=True)]


@st.composite
def grids(draw, max_ndim: int = 3) -> RectilinearGrid:
    dims = draw(st.lists(axes(), min_size=1, max_size=max_ndim))
    return RectilinearGrid.from_lengths([d[0] for d in dims], [d[1] for d in dims])


def axis_index(length: int):
    """One orthogonal index for an axis of ``length``: int, slice, int array or bool mask."""
    bound = st.one_of(st.none(), st.integers(-length - 3, length + 3))
    step = st.one_of(st.none(), st.integers(1, 5), st.integers(-5, -1))
    options = [
        st.builds(slice, bound, bound, step),
        st.lists(st.booleans(), min_size=length, max_size=length).map(
            lambda v: np.array(v, dtype=bool)),
    ]
    if length:
        options += [
            st.integers(-length, length - 1),
            st.lists(st.integers(-length, length - 1), max_size=12).map(
                lambda v: np.array(v, dtype=np.int64)),
        ]
    return st.one_of(options)


@st.composite
def grid_and_selection(draw):
    grid = draw(grids())
    return grid, tuple(draw(axis_index(n)) for n in grid.shape)


def chunk_ids(grid: RectilinearGrid, dim: int) -> np.ndarray:
    """Brute force: the chunk id of every element along ``dim``."""
    return np.repeat(np.arange(grid.chunk_counts[dim]), grid.lengths(dim))

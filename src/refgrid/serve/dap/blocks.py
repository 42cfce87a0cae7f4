"""A hyperslab cut into blocks read one after another, so a response of any size is streamed
in bounded memory.

DAP sends an array's values in C order. A block is a run of that order: a single index on
each leading axis, a range along one axis ``k``, and all of the hyperslab along the axes
after it; ``k`` is the first axis at which one index of it, with everything after, fits in
``limit`` bytes. Along ``k`` a block covers whole native chunks where it can (a chunk cut by
two blocks would be fetched and decoded twice), as many as fit in ``limit``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from refgrid.serve.dap.constraint import Projection

BLOCK_BYTES = 8 * 2**20
"""Decoded bytes a block holds at most (but for a single chunk run larger than this)."""


def blocks(projection: Projection, itemsize: int,
           limit: int | None = None) -> Iterator[tuple[slice, ...]]:
    """The selections of ``projection``'s blocks, in C order (see the module docstring);
    ``limit`` defaults to :data:`BLOCK_BYTES`."""
    limit = limit or BLOCK_BYTES
    slices = projection.slices
    shape = projection.shape
    if not slices:
        yield ()
        return
    if 0 in shape:
        return
    k = next((k for k in range(len(shape))
              if math.prod(shape[k + 1:]) * itemsize <= limit), len(shape) - 1)
    row = max(1, math.prod(shape[k + 1:]) * itemsize)
    runs = _runs(projection, k, max(1, limit // row))
    leading = [range(s.start, s.stop, s.step) for s in slices[:k]]
    for index in itertools.product(*leading):
        for run in runs:
            yield (*(slice(i, i + 1, 1) for i in index), run, *slices[k + 1:])


def _runs(projection: Projection, axis: int, most: int) -> list[slice]:
    """Runs of ``projection``'s hyperslab along ``axis``, each at most ``most`` elements,
    cut at a native chunk boundary where a run would otherwise split a chunk (found per
    run from the grid's bounds: nothing the length of the axis is made)."""
    s = projection.slices[axis]
    n = len(range(s.start, s.stop, s.step))
    edges = projection.variable.array.grid.axes[axis].bounds
    out: list[slice] = []
    first = 0
    while first < n:
        last = min(first + most, n)
        if last < n:
            at = s.start + s.step * last  # the element after the run: its chunk's start
            start = int(edges[int(np.searchsorted(edges, at, side="right")) - 1])
            boundary = -(-(start - s.start) // s.step)  # the first position in that chunk
            if first < boundary < last:
                last = boundary
        out.append(slice(s.start + s.step * first, s.start + s.step * (last - 1) + 1, s.step))
        first = last
    return out

"""Cutting contiguous (uncompressed) data into virtual chunks.

Contiguous data is one byte range, so any run of rows along the first axis is a byte range
too: a reader should not fetch a whole 2 GB variable to read one row. The cut keeps the grid
regular with every chunk full, so the last chunk never reaches past the data.
"""

from __future__ import annotations

import math


def rows_per_chunk(shape: tuple[int, ...], itemsize: int, target: int) -> int:
    """The largest divisor of the first dimension whose rows fit ``target`` bytes, so the
    virtual grid of contiguous data stays regular with full-size chunks."""
    if not shape or shape[0] == 0:
        return max(1, shape[0]) if shape else 1
    row = max(1, math.prod(shape[1:]) * itemsize)
    limit = max(1, target // row)
    n = shape[0]
    if n <= limit:
        return n
    best = 1
    for d in range(1, math.isqrt(n) + 1):  # divisors come in pairs (d, n // d)
        if n % d == 0:
            for k in (d, n // d):
                if best < k <= limit:
                    best = k
    return best

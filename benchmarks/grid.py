"""Grid cost at archive scale: 10^6 chunks along one dimension.

Builds a grid of 10^6 irregular chunks (28-31 long, HDF5-style padding on each), round-trips
it through rectilinear JSON, and locates 10^6 random indices. The peer is the floor: bare
numpy (cumsum + searchsorted) doing the same arithmetic, measured in the same run.
Target: building and locating each well under a second.

    python benchmarks/grid.py
"""

from __future__ import annotations

import json

import numpy as np

from _common import best_of
from refgrid import RectilinearGrid
from refgrid.grid.json_forms import emit_chunk_grid, parse_chunk_grid

N = 1_000_000


def main() -> None:
    rng = np.random.default_rng(0)
    logical = rng.integers(28, 32, N)
    encoded = np.full(N, 31)
    t_build, grid = best_of(lambda: RectilinearGrid.from_lengths([logical], [encoded]))
    t_floor_build, _ = best_of(lambda: np.concatenate(([0], np.cumsum(logical))))
    t_emit, doc = best_of(lambda: json.dumps(emit_chunk_grid(grid)))
    t_parse, parsed = best_of(lambda: parse_chunk_grid(json.loads(doc), grid.shape))
    assert parsed == grid
    idx = rng.integers(0, grid.shape[0], N)
    grid.bounds(0)  # built once per grid, like any reader would
    t_locate, (chunk, _offset) = best_of(lambda: grid.locate(0, idx))
    bounds = grid.bounds(0)
    t_floor_locate, floor_chunk = best_of(lambda: np.searchsorted(bounds, idx, side="right") - 1)
    assert np.array_equal(chunk, floor_chunk)
    t_select, sel = best_of(lambda: grid.select(np.s_[::7]), repeat=1)

    print(f"grid of {N:,} chunks, length {grid.shape[0]:,}")
    rows = [
        ("build from lengths (+bounds)", t_build, t_floor_build),
        ("emit rectilinear JSON", t_emit, None),
        ("parse rectilinear JSON", t_parse, None),
        (f"locate {N:,} random indices", t_locate, t_floor_locate),
        (f"decompose [::7] ({sel.nchunks:,} chunks)", t_select, None),
    ]
    print(f"{'operation':44s} {'refgrid':>10s} {'numpy floor':>12s} {'ratio':>7s}")
    for name, t, floor in rows:
        ratio = f"{t / floor:7.1f}" if floor else "      -"
        floor_s = f"{floor * 1e3:9.1f} ms" if floor else "           -"
        print(f"{name:44s} {t * 1e3:7.1f} ms {floor_s} {ratio}")
    print(f"JSON size: {len(doc):,} bytes; targets (build, locate < 1 s): "
          f"{'met' if max(t_build, t_locate) < 1 else 'MISSED'}")


if __name__ == "__main__":
    main()

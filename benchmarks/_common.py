"""Shared helpers for the benchmarks: cached inputs and timing."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "_data"


def best_of(fn: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    """Best wall time of ``repeat`` runs, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def netcdf4_file(name: str, shape: tuple[int, ...], chunks: tuple[int, ...]) -> Path:
    """A NetCDF4 float32 zlib variable ``v`` of ``shape`` in ``chunks``, built once."""
    import netCDF4
    import numpy as np

    path = DATA / name
    if path.exists():
        return path
    DATA.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with netCDF4.Dataset(partial, "w", format="NETCDF4") as ds:
        for k, n in enumerate(shape):
            ds.createDimension(f"d{k}", n)
        v = ds.createVariable("v", "f4", tuple(f"d{k}" for k in range(len(shape))),
                              zlib=True, complevel=1, chunksizes=chunks)
        v[...] = np.random.default_rng(0).random(shape, dtype="f4")
    partial.rename(path)
    return path

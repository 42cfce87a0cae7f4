"""materialize against the xarray way of doing the same copy.

Ten yearly NetCDF4 files (365 or 366 days of 100 x 100 float32, zlib, chunks of 10 days: an
irregular archive, 146 MB) are combined into references and copied into a regular Zarr v3
store with zstd (level 3), in chunks of (365, 50, 50), two ways on this machine's cores:
``refgrid.materialize`` and ``xr.open_dataset(refs, engine="refgrid", chunks=...)
.to_zarr(...)`` with the same chunks and codec (dask's threads). Both stores are checked equal.
Printed: MB/s (uncompressed) of each and the ratio. Target: materialize >= 1.5x faster.

    python benchmarks/materialize.py
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import refgrid
from _common import DATA

YEARS = range(2001, 2011)
SIDE = 100
CHUNKS = {"time": 365, "lat": 50, "lon": 50}
TARGET = 1.5


def sources() -> list[Path]:
    import netCDF4

    folder = DATA / "materialize"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    paths = []
    start = 0
    for year in YEARS:
        days = 366 if year % 4 == 0 else 365
        path = folder / f"tas_{year}.nc"
        if not path.exists():
            with netCDF4.Dataset(path.with_suffix(".tmp"), "w") as nc:
                nc.createDimension("time", None)
                nc.createDimension("lat", SIDE)
                nc.createDimension("lon", SIDE)
                t = nc.createVariable("time", "f8", ("time",))
                t.units = "days since 2001-01-01"
                t[:] = np.arange(start, start + days)
                for dim in ("lat", "lon"):
                    nc.createVariable(dim, "f8", (dim,))[:] = np.linspace(-50, 50, SIDE)
                v = nc.createVariable("tas", "f4", ("time", "lat", "lon"), zlib=True,
                                      complevel=1, chunksizes=(10, SIDE, SIDE))
                v[:] = rng.normal(280, 10, (days, SIDE, SIDE)).astype("f4")
            path.with_suffix(".tmp").rename(path)
        start += days
        paths.append(path)
    return paths


def main() -> None:
    import xarray as xr
    from zarr.codecs import ZstdCodec

    files = sources()
    work = Path(tempfile.mkdtemp(prefix="refgrid-materialize-bench-"))
    refs = refgrid.write(refgrid.combine([refgrid.scan(f) for f in files], "time"),
                         work / "refs.json")
    nbytes = sum(366 if y % 4 == 0 else 365 for y in YEARS) * SIDE * SIDE * 4
    ours_times, peer_times = [], []
    for _ in range(2):
        shutil.rmtree(work / "ours.zarr", ignore_errors=True)
        shutil.rmtree(work / "peer.zarr", ignore_errors=True)
        t0 = time.perf_counter()
        refgrid.materialize(refs, work / "ours.zarr", CHUNKS, progress=False)
        ours_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = xr.open_dataset(refs, engine="refgrid", chunks=CHUNKS)
            encoding = {v: {"compressors": (ZstdCodec(level=3),)} for v in ds.variables}
            ds.to_zarr(work / "peer.zarr", zarr_format=3, encoding=encoding)
        peer_times.append(time.perf_counter() - t0)
    ours, peer = xr.open_zarr(work / "ours.zarr"), xr.open_zarr(work / "peer.zarr")
    xr.testing.assert_identical(ours.load(), peer.load())
    best_ours, best_peer = min(ours_times), min(peer_times)
    print(f"copy {nbytes / 1e6:.0f} MB ({len(files)} yearly files, native chunks of 10 days) "
          f"into zstd chunks {tuple(CHUNKS.values())}:")
    print(f"  refgrid.materialize            {best_ours:6.2f} s  {nbytes / 1e6 / best_ours:7.1f} "
          "MB/s")
    print(f"  xr.open_dataset(...).to_zarr   {best_peer:6.2f} s  {nbytes / 1e6 / best_peer:7.1f} "
          "MB/s")
    print(f"materialize is {best_peer / best_ours:.2f}x faster (target >= {TARGET}x)")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()

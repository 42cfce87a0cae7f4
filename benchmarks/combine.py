"""Combine cost: 10,000 single-file manifests (monthly files of 28-31 daily steps, time
chunk 10, like ~830 years of monthly files) in memory, and a ratio to kerchunk's
MultiZarrToZarr on a small regular archive (both from already-scanned references).
Target: 10,000 manifests in <= 5 s, memory linear in the number of chunks.

    python benchmarks/combine.py
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np

import refgrid
from _common import DATA, best_of
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import INLINE, ChunkManifest
from refgrid.model.virtual import VirtualArray, VirtualGroup

BYTES_LE = {"name": "bytes", "configuration": {"endian": "little"}}


def synthetic_file(k: int, start: int, ndays: int) -> VirtualGroup:
    url = f"s3://archive/tas_{k:05d}.nc"
    grid = RectilinearGrid.regular([ndays, 4, 5], [10, 4, 5])
    n = grid.chunk_counts
    tas = VirtualArray("tas", ("time", "lat", "lon"), np.dtype("f4"), grid,
                       ChunkManifest((url,), np.zeros(n, np.int32),
                                     (4096 + 200 * np.arange(np.prod(n))).reshape(n),
                                     np.full(n, 180)), np.float32(np.nan),
                       (BYTES_LE, {"name": "numcodecs.zlib", "configuration": {"level": 4}}),
                       {"units": "K"})
    times = np.arange(start, start + ndays, dtype="<f8")
    tgrid = RectilinearGrid.regular([ndays], [ndays])
    time_ = VirtualArray("time", ("time",), np.dtype("<f8"), tgrid,
                         ChunkManifest((), np.array([INLINE]), np.zeros(1), np.zeros(1),
                                       {(0,): times.tobytes()}), None, (BYTES_LE,),
                         {"units": "days since 1200-01-01", "calendar": "noleap"})
    lat_grid = RectilinearGrid.regular([4], [4])
    lat = VirtualArray("lat", ("lat",), np.dtype("<f8"), lat_grid,
                       ChunkManifest(("s3://archive/grid.nc",), np.zeros(1, np.int32),
                                     np.array([100]), np.array([32])), None, (BYTES_LE,), {})
    return VirtualGroup({"title": "synthetic"}, {"time": time_, "lat": lat, "tas": tas})


def synthetic_archive(count: int) -> list[VirtualGroup]:
    rng = np.random.default_rng(0)
    groups, start = [], 0
    for k in range(count):
        ndays = int(rng.integers(28, 32))
        groups.append(synthetic_file(k, start, ndays))
        start += ndays
    return groups


def regular_archive(nfiles: int = 40):
    """Daily files of 10 steps, one step per chunk: regular, so kerchunk can combine it."""
    import netCDF4

    folder = DATA / "regular_archive"
    paths = [folder / f"f{k:03d}.nc" for k in range(nfiles)]
    if not all(p.exists() for p in paths):
        folder.mkdir(parents=True, exist_ok=True)
        for k, p in enumerate(paths):
            with netCDF4.Dataset(p, "w") as ds:
                ds.createDimension("time", None)
                ds.createDimension("x", 50)
                t = ds.createVariable("time", "f8", ("time",))
                t.units = "days since 2000-01-01"
                t[:] = np.arange(10 * k, 10 * k + 10)
                v = ds.createVariable("v", "f4", ("time", "x"), zlib=True, chunksizes=(1, 50))
                v[:] = np.random.default_rng(k).random((10, 50))
    return paths


def main() -> None:
    refgrid.combine(synthetic_archive(3), "time")  # warm: lazy imports are not the job's
    for count in (2_500, 5_000):  # memory per chunk stays flat: linear in chunks
        part = synthetic_archive(count)
        n = sum(g.arrays["tas"].grid.nchunks for g in part)
        tracemalloc.start()
        refgrid.combine(part, "time", sources=[f"f{k}" for k in range(count)])
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"{count:6,d} files, {n:7,d} chunks: traced peak {peak / 2**20:5.1f} MB "
              f"({peak / n:.0f} B per chunk)")
    groups = synthetic_archive(10_000)
    chunks = sum(g.arrays["tas"].grid.nchunks for g in groups)
    sources = [f"f{k}" for k in range(len(groups))]
    t0 = time.perf_counter()
    combined = refgrid.combine(groups, "time", sources=sources)
    elapsed = time.perf_counter() - t0
    tracemalloc.start()  # a separate run: tracing slows every allocation
    refgrid.combine(groups, "time", sources=sources)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tas = combined["tas"]
    print(f"10,000 files, {chunks:,} chunks: combined in {elapsed:.2f} s "
          f"(target <= 5 s: {'met' if elapsed <= 5 else 'MISSED'}); tas {tas.shape}, "
          f"{tas.grid.nchunks:,} chunks; traced peak {peak / 2**20:.0f} MB "
          f"({peak / chunks:.0f} B per chunk)")

    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.hdf import SingleHdf5ToZarr

    paths = regular_archive()
    singles = [SingleHdf5ToZarr(str(p), inline_threshold=0).translate() for p in paths]
    scans = [refgrid.scan(p) for p in paths]
    t_kc, _ = best_of(lambda: MultiZarrToZarr(singles, concat_dims=["time"]).translate())
    t_ours, _ = best_of(lambda: refgrid.combine(scans, "time"))
    print(f"regular archive of {len(paths)} files: refgrid {t_ours * 1e3:.0f} ms, kerchunk "
          f"MultiZarrToZarr {t_kc * 1e3:.0f} ms (kerchunk / refgrid = {t_kc / t_ours:.1f}x)")


if __name__ == "__main__":
    main()

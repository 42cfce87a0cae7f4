"""A generated archive for batch tests and benchmarks: daily ``tas`` in files of 28-31
steps (chunks of 10 along time, so most files end in a padded chunk), lat/lon coordinates
identical in every file, and every seventh file's times in other units."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

LAT, LON, CHUNK = 3, 4, 10


def lengths(indices: Iterable[int]) -> list[int]:
    return [28 + (k * 7919) % 4 for k in indices]


def write_archive(directory: Path, indices: Iterable[int], lat: int = LAT,
                  lon: int = LON) -> list[Path]:
    """Files ``tas_{k:05d}.nc`` for each index ``k``; file k starts the day after file k-1
    ends, whichever files are written (an archive can grow by later indices). A larger
    ``lat`` by ``lon`` makes padded chunks too large to inline. Each file lands whole (written
    under a hidden name, then renamed), as a transfer tool lands it: a follower scanning the
    directory with no settle time must never meet a file half written."""
    import netCDF4

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for k in indices:
        start = sum(lengths(range(k)))
        n = lengths([k])[0]
        path = directory / f"tas_{k:05d}.nc"
        partial = directory / f".{path.name}.part"
        with netCDF4.Dataset(partial, "w", format="NETCDF4") as ds:
            ds.title = f"daily tas, file {k}"
            ds.createDimension("time", None)
            ds.createDimension("lat", lat)
            ds.createDimension("lon", lon)
            time = ds.createVariable("time", "f8", ("time",))
            hourly = k % 7 == 3
            time.units = "hours since 2000-01-01" if hourly else "days since 2000-01-01"
            time.calendar = "standard"
            days = np.arange(start, start + n, dtype="f8")
            time[:] = days * 24 if hourly else days
            ds.createVariable("lat", "f4", ("lat",))[:] = np.linspace(-10, 10, lat)
            ds.createVariable("lon", "f4", ("lon",))[:] = np.linspace(0, 30, lon)
            tas = ds.createVariable("tas", "f4", ("time", "lat", "lon"), zlib=True,
                                    chunksizes=(CHUNK, lat, lon), fill_value=np.float32(-999))
            tas.units = "K"
            rng = np.random.default_rng(k)
            tas[:] = 250 + 50 * rng.random((n, lat, lon), dtype="f4")
        os.replace(partial, path)
        out.append(path)
    return out


def write_corrupt(directory: Path, good: Path) -> list[Path]:
    """Three files that match ``tas_*.nc`` but cannot be scanned: truncated, not NetCDF,
    empty."""
    data = good.read_bytes()
    files = {"tas_90001.nc": data[: len(data) // 2], "tas_90002.nc": b"not a netCDF file\n",
             "tas_90003.nc": b""}
    for name, content in files.items():
        (directory / name).write_bytes(content)
    return [directory / name for name in files]

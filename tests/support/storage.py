"""Archives written by many tools: one variable stored in other ways from file to file.

Each kind is what a real archive holds (issue #53): a year passed through ``nccopy`` (HDF5's
fill turned off), a year re-saved by xarray (a NaN ``_FillValue`` on float coordinates),
NETCDF3 among NetCDF4 (big-endian, uncompressed, contiguous), compression and shuffle
switched on mid-archive, float64 among float32, IMOS-like packing (int16, float32
``scale_factor``, an ``add_offset`` that drifts every file), lat/lon chunked another way —
and all of them at once. The values of file ``k`` depend on ``k`` only, so an archive's
ground truth is xarray's ``open_mfdataset`` of its files.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import netCDF4
import numpy as np
import xarray as xr

DAYS = 30
LAT, LON = 4, 5
KINDS = ("nccopy", "xarray", "netcdf3", "compression", "float64", "packing", "chunking",
         "everything")
"""Every archive :func:`archive` writes (``chunking`` is refused: its grids differ)."""


def _file(path: Path, k: int, *, fmt: str = "NETCDF4", zlib: bool = False,
          dtype: str = "f4", packing: tuple[float, float] | None = None,
          chunks: tuple[int, int, int] = (10, 4, 5)) -> Path:
    """File ``k`` of an archive: 30 days of ``tas`` from day 30·k, a NaN on day 3."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(k)
    values = 250 + k + rng.random((DAYS, LAT, LON)) * 10
    values[3, 0, 0] = np.nan
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("time", None)
        ds.createDimension("lat", LAT)
        ds.createDimension("lon", LON)
        time = ds.createVariable("time", "f8", ("time",))
        time.units, time.calendar = "days since 2000-01-01", "standard"
        time[:] = np.arange(DAYS) + DAYS * k
        lat = ds.createVariable("lat", "f4", ("lat",))
        lat.units = "degrees_north"
        lat[:] = np.linspace(-45, 45, LAT)
        lon = ds.createVariable("lon", "f4", ("lon",))
        lon.units = "degrees_east"
        lon[:] = np.linspace(0, 288, LON)
        options: dict[str, object] = {}
        if fmt == "NETCDF4":
            options = {"zlib": zlib, "shuffle": zlib, "chunksizes": chunks}
        if packing is None:
            tas = ds.createVariable("tas", dtype, ("time", "lat", "lon"), fill_value=1e20,
                                    **options)
        else:
            tas = ds.createVariable("tas", "i2", ("time", "lat", "lon"), fill_value=-32768,
                                    **options)
            tas.scale_factor = np.float32(packing[0])
            tas.add_offset = np.float32(packing[1])
        tas.units = "K"
        tas.long_name = "air temperature"
        tas[:] = np.ma.array(np.nan_to_num(values), mask=np.isnan(values))
    return path


def _nccopy(path: Path) -> Path:
    """``path`` passed through ``nccopy`` (HDF5's fill off: storage fill 0, ``_FillValue``
    still 1e20), in place."""
    copied = path.with_suffix(".copy")
    subprocess.run(["nccopy", str(path), str(copied)], check=True)
    copied.replace(path)
    return path


def _resaved(path: Path) -> Path:
    """``path`` re-saved by xarray, in place."""
    with xr.open_dataset(path) as ds:
        loaded = ds.load()
    loaded.to_netcdf(path.with_suffix(".x"))
    path.with_suffix(".x").replace(path)
    return path


VARIANTS = ("netcdf4", "nccopy", "xarray", "netcdf3", "compression", "float64", "packed",
            "repacked")
"""How one file of a drawn archive is written (:func:`variant`)."""


def variant(path: Path, k: int, kind: str) -> Path:
    """File ``k`` written as ``kind`` (see :data:`VARIANTS`)."""
    if kind == "nccopy":
        return _nccopy(_file(path, k))
    if kind == "xarray":
        return _resaved(_file(path, k))
    if kind in ("packed", "repacked"):
        return _file(path, k, packing=(0.01, 250.0 + (0.37 * k if kind == "repacked" else 0)))
    return _file(path, k, fmt="NETCDF3_CLASSIC" if kind == "netcdf3" else "NETCDF4",
                 zlib=kind == "compression", dtype="f8" if kind == "float64" else "f4")


def archive(root: Path, kind: str) -> list[Path]:
    """The files of archive ``kind`` (see :data:`KINDS`), written under ``root/kind``."""
    d = root / kind
    name = [d / f"tas_{k}.nc" for k in range(6)]
    if kind == "packing":  # IMOS-like: the offset drifts every file
        return [_file(name[k], k, packing=(0.01, 250.0 + 0.37 * k)) for k in range(6)]
    base = [_file(name[k], k) for k in range(3)]
    if kind == "nccopy":
        return [base[0], _nccopy(base[1]), base[2]]
    if kind == "xarray":
        return [base[0], _resaved(base[1]), base[2]]
    if kind == "netcdf3":
        return [base[0], _file(name[1], 1, fmt="NETCDF3_CLASSIC"), base[2]]
    if kind == "compression":
        return [base[0], _file(name[1], 1, zlib=True), _file(name[2], 2, zlib=True)]
    if kind == "float64":
        return [base[0], _file(name[1], 1, dtype="f8"), base[2]]
    if kind == "chunking":
        return [base[0], _file(name[1], 1, chunks=(10, 2, 5)), base[2]]
    assert kind == "everything", kind
    return [base[0], _nccopy(base[1]), _file(name[2], 2, fmt="NETCDF3_CLASSIC"),
            _file(name[3], 3, zlib=True), _file(name[4], 4, dtype="f8"),
            _resaved(_file(name[5], 5, zlib=True))]

"""Archives as real ones are: monthly files of daily data whose time units are relative to
each file's start (or change epoch, unit or type along the way), with ``time_bnds``, a
``climatology`` variable, a ``forecast_reference_time(time)`` in its own units, a per-file
scalar ``reference_time``, packed ``pr`` (int16 with float32 factors), ``tas`` in chunks that
do not divide the files, and ``orog(lat, lon)`` in every file — written by netCDF4-python."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

LAT, LON, CHUNK = 3, 4, 10


@dataclass(frozen=True)
class Month:
    """One file: ``days`` daily steps (at noon) from ``start`` (``"YYYY-MM-DD"``), its times
    in ``units`` stored as ``dtype``."""

    start: str
    days: int
    units: str
    dtype: str = "f8"
    calendar: str = "standard"
    extra: dict[str, object] = field(default_factory=dict)
    """Attributes to set on variables, ``{"tas.units": "degC"}``, or to drop (value None)."""


def months(year: int, count: int, units: str, calendar: str = "standard",
           dtype: str = "f8") -> list[Month]:
    """``count`` files of one year's months, ``{start}`` in ``units`` naming each file's start."""
    out = []
    for m in range(1, count + 1):
        days = 30 if calendar == "360_day" else _month_days(year, m, calendar)
        start = f"{year}-{m:02d}-01"
        out.append(Month(start, days, units.format(start=start), dtype, calendar))
    return out


def _month_days(year: int, month: int, calendar: str) -> int:
    if month == 2:
        leap = calendar not in ("noleap", "365_day") and (
            calendar == "all_leap" or (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)))
        return 29 if leap else 28
    return 30 if month in (4, 6, 9, 11) else 31


def write(directory: Path, files: list[Month], prefix: str = "clim", lat: int = LAT,
          lon: int = LON) -> list[Path]:
    import cftime
    import netCDF4

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for k, month in enumerate(files):
        path = directory / f"{prefix}_{month.start[:7].replace('-', '')}.nc"
        y, m, d = (int(x) for x in month.start.split("-"))
        first = cftime.datetime(y, m, d, calendar=month.calendar)
        days = [first + np.timedelta64(i, "D").item() for i in range(month.days)]
        noon = [t + np.timedelta64(12, "h").item() for t in days]
        ends = [t + np.timedelta64(1, "D").item() for t in days]

        def num(dates, units=month.units, calendar=month.calendar):
            return cftime.date2num(dates, units, calendar=calendar)

        with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
            ds.title = f"daily data, file {k}"
            ds.createDimension("time", None)
            ds.createDimension("nv", 2)
            ds.createDimension("lat", lat)
            ds.createDimension("lon", lon)
            time = ds.createVariable("time", month.dtype, ("time",))
            time.setncatts({"units": month.units, "calendar": month.calendar,
                            "bounds": "time_bnds", "climatology": "climatology_bnds",
                            "standard_name": "time"})
            time[:] = num(noon)
            bnds = ds.createVariable("time_bnds", month.dtype, ("time", "nv"))
            bnds[:] = np.stack([num(days), num(ends)], axis=1)
            clim = ds.createVariable("climatology_bnds", month.dtype, ("time", "nv"))
            clim[:] = np.stack([num(days), num(ends)], axis=1)
            frt = ds.createVariable("forecast_reference_time", "f8", ("time",))
            frt_units = f"hours since {month.start}"
            frt.setncatts({"units": frt_units, "calendar": month.calendar})
            frt[:] = num(days, frt_units)
            ref = ds.createVariable("reference_time", "f8", ())
            ref.setncatts({"units": month.units, "calendar": month.calendar})
            ref[...] = num([cftime.datetime(1999, 12, 1, calendar=month.calendar)])[0]
            ds.createVariable("lat", "f4", ("lat",))[:] = np.linspace(-10, 10, lat)
            ds.createVariable("lon", "f4", ("lon",))[:] = np.linspace(0, 30, lon)
            orog = ds.createVariable("orog", "f4", ("lat", "lon"))
            orog.units = "m"
            orog[:] = np.arange(lat * lon, dtype="f4").reshape(lat, lon) * 10
            rng = np.random.default_rng(k)
            tas = ds.createVariable("tas", "f4", ("time", "lat", "lon"), zlib=True,
                                    shuffle=True, chunksizes=(CHUNK, lat, lon),
                                    fill_value=np.float32(1e20))
            tas.units = "K"
            tas[:] = 250 + 50 * rng.random((month.days, lat, lon), dtype="f4")
            pr = ds.createVariable("pr", "i2", ("time", "lat", "lon"), zlib=True,
                                   chunksizes=(CHUNK, lat, lon), fill_value=np.int16(-32767))
            pr.set_auto_maskandscale(False)
            pr.setncatts({"scale_factor": np.float32(0.001), "add_offset": np.float32(0),
                          "units": "kg m-2 s-1"})
            pr[:] = rng.integers(0, 20000, (month.days, lat, lon), dtype="i2")
            for key, value in month.extra.items():
                name, attr = key.split(".")
                if value is None:
                    ds[name].delncattr(attr)
                else:
                    ds[name].setncattr(attr, value)
        out.append(path)
    return out

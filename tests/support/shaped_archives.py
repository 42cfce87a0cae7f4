"""Archives as they really are, written as NetCDF4 files, with xarray's reading of them.

- :func:`cmip_like`: two variables in separate file sets (``tas`` in files of one month,
  ``pr`` in files of two), three members in directories of their own (a global attribute
  ``realization`` too), daily steps in months of 28-31 days (irregular), time units per file
  (``days since <file start>``), ``time_bnds``, float32 data with ``_FillValue``, chunks of
  10 days (padded at file ends) compressed.
- :func:`drifting`: daily files ``sst_YYYYMMDD.nc`` with no time at all (their date is in
  the name only), a variable ``ice`` added halfway.
- :func:`dated`: daily files ``sst_YYYYMMDD.nc`` holding their time each way a file can — a
  scalar ``time`` (at noon, in units of their own day), a ``time`` coordinate of one step, a
  dimension ``time`` of one step without coordinate, no time at all — in any calendar.
"""

from __future__ import annotations

from pathlib import Path

import cftime
import netCDF4
import numpy as np
import pandas as pd
import xarray as xr

from helpers import closed

MEMBERS = ("r1i1p1f1", "r2i1p1f1", "r3i1p1f1")
MONTHS = 4
FILL = np.float32(1e20)


def _month_file(path: Path, variable: str, start: pd.Timestamp, end: pd.Timestamp,
                member: int, seed: int) -> Path:
    days = pd.date_range(start, end, freq="D", inclusive="left")
    units = f"days since {start:%Y-%m-%d}"
    rng = np.random.default_rng(seed)
    values = rng.random((len(days), 3, 4)).astype("f4")
    values[0, 0, 0] = np.nan  # a gap: written as the fill value
    bounds = np.stack([days, days + pd.Timedelta(days=1)], axis=1)
    ds = xr.Dataset(
        {variable: (("time", "lat", "lon"), values, {"units": "K" if variable == "tas"
                                                     else "kg m-2 s-1"}),
         "time_bnds": (("time", "bnds"), bounds)},
        coords={"time": ("time", days, {"bounds": "time_bnds"}),
                "lat": ("lat", np.linspace(-30, 30, 3), {"units": "degrees_north"}),
                "lon": ("lon", np.arange(4) * 90.0, {"units": "degrees_east"})},
        attrs={"realization": np.int32(member), "source": "synthetic"})
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.to_netcdf(path, encoding={
        variable: {"_FillValue": FILL, "zlib": True, "chunksizes": (10, 3, 4)},
        "time": {"units": units, "dtype": "f8"}, "time_bnds": {"units": units, "dtype": "f8"}})
    return path


def cmip_like(root: Path, months: int = MONTHS, members: tuple[str, ...] = MEMBERS,
              start: str = "2001-01-01") -> list[Path]:
    """The files of the CMIP-like archive (see the module docstring)."""
    edges = pd.date_range(start, periods=months + 1, freq="MS")
    out = []
    for m, member in enumerate(members, start=1):
        for k in range(months):  # tas: a file a month
            out.append(_month_file(root / member / f"tas_{edges[k]:%Y%m}.nc", "tas",
                                   edges[k], edges[k + 1], m, 100 * m + k))
        for k in range(0, months, 2):  # pr: a file per two months
            last = min(k + 2, months)
            out.append(_month_file(root / member / f"pr_{edges[k]:%Y%m}.nc", "pr",
                                   edges[k], edges[last], m, 1000 * m + k))
    return sorted(out)


def cmip_expected(files: list[Path], by: str = "name") -> xr.Dataset:
    """xarray's reading: per member, each file set concatenated along time
    (``open_mfdataset``), the sets merged (``xr.merge``), the members concatenated along a
    new dimension (``xr.concat``); bounds are coordinates (``decode_coords="all"``), kept
    once."""
    members: dict[str, list[Path]] = {}
    for f in files:
        members.setdefault(f.parent.name, []).append(f)
    parts = []
    for name in sorted(members):
        sets = []
        for variable in ("tas", "pr"):
            chosen = sorted(f for f in members[name] if f.name.startswith(variable))
            sets.append(closed(xr.open_mfdataset(chosen, combine="nested", concat_dim="time",
                                                 data_vars="minimal", coords="minimal",
                                                 compat="override", decode_coords="all")))
        parts.append(xr.merge(sets, compat="equals", join="exact",
                              combine_attrs="override"))
    values = sorted(members) if by == "name" else [
        int(p.attrs["realization"]) for p in parts]
    return xr.concat(parts, dim="member", data_vars="all", coords="different",
                     compat="equals", join="exact", combine_attrs="override"
                     ).assign_coords(member=values)


def drifting(root: Path, days: int = 8, added: int = 4) -> list[Path]:
    """Daily files whose date is in their name only, ``ice`` from file ``added`` on."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for k, day in enumerate(pd.date_range("2003-01-01", periods=days, freq="D")):
        rng = np.random.default_rng(k)
        variables = {"sst": (("lat", "lon"), rng.random((3, 4)).astype("f4"),
                             {"units": "K"})}
        if k >= added:
            variables["ice"] = (("lat", "lon"), rng.random((3, 4)).astype("f4"), {})
        ds = xr.Dataset(variables, coords={"lat": np.arange(3.0), "lon": np.arange(4.0)})
        path = root / f"sst_{day:%Y%m%d}.nc"
        ds.to_netcdf(path, encoding={n: {"_FillValue": np.float32(-999), "zlib": True}
                                     for n in variables})
        out.append(path)
    return out


def drifting_expected(files: list[Path]) -> xr.Dataset:
    dates = pd.to_datetime([f.stem.split("_")[1] for f in files])
    return closed(xr.open_mfdataset(files, combine="nested",
                                    concat_dim=[pd.Index(dates, name="time")], data_vars="all",
                                    coords="different", compat="equals", join="outer"))


FORMS = ("scalar", "step", "dimension", "none")
"""How a file of :func:`dated` holds its time: a scalar ``time``, a coordinate of one step,
a dimension of one step without coordinate, nothing."""


def dated(root: Path, forms: str | list[str], days: list[str], *, hour: int = 12,
          calendar: str = "standard", bounds: bool = False) -> list[Path]:
    """A file ``sst_YYYYMMDD.nc`` per day of ``days`` (``"2003-01-01"``: dates of
    ``calendar``, a 360-day February has a 30th), its time held as its form of ``forms``
    says (:data:`FORMS`); own times at ``hour`` in ``hours since <its day>`` (with bounds of
    the day, ``bounds``); ``sst`` (lat, lon) holds the file's number."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for k, day in enumerate(days):
        form = forms if isinstance(forms, str) else forms[k]
        path = root / f"sst_{day.replace('-', '')}.nc"
        with netCDF4.Dataset(path, "w") as nc:
            nc.createDimension("lat", 2)
            nc.createDimension("lon", 3)
            nc.createVariable("lat", "f8", ("lat",))[:] = [10.0, 20.0]
            nc.createVariable("lon", "f8", ("lon",))[:] = [0.0, 1.0, 2.0]
            if form != "none" and form != "scalar":
                nc.createDimension("time", 1)
            dims = ("time", "lat", "lon") if form in ("step", "dimension") else ("lat", "lon")
            sst = nc.createVariable("sst", "f4", dims, fill_value=np.float32(-999))
            sst[:] = np.full(sst.shape, 270 + k, "f4")
            if form in ("scalar", "step"):
                time = nc.createVariable("time", "f8", () if form == "scalar" else ("time",))
                time.units, time.calendar = f"hours since {day}", calendar
                time[...] = hour
                if form == "scalar":
                    sst.coordinates = "time"
                if bounds:
                    nc.createDimension("nv", 2)
                    time.bounds = "time_bnds"
                    nc.createVariable("time_bnds", "f8", ("nv",) if form == "scalar" else
                                      ("time", "nv"))[:] = [0.0, 24.0]
        out.append(path)
    return out


def name_date(path: Path, calendar: str = "standard") -> object:
    """The date a :func:`dated` file's name gives, in ``calendar``, as xarray decodes it."""
    text = Path(path).stem.split("_")[1]
    fields = int(text[:4]), int(text[4:6]), int(text[6:8])
    if calendar in ("standard", "gregorian", "proleptic_gregorian"):
        return pd.Timestamp(*fields).as_unit("ns")
    return cftime.datetime(*fields, calendar=calendar)


def dated_expected(files: list[Path], calendar: str = "standard") -> xr.Dataset:
    """xarray's reading: ``open_mfdataset(files, combine="nested", concat_dim="time")``
    whose ``preprocess`` gives a file without a time coordinate the date its name gives —
    the files' own times as they are. (Its steps without dask, which cannot concatenate
    cftime bounds: each file opened, preprocessed, then ``combine_nested``.)"""
    def preprocess(ds: xr.Dataset, path: Path) -> xr.Dataset:
        if "time" in ds.variables:
            return ds
        date = name_date(path, calendar)
        return ds.assign_coords(time=[date]) if "time" in ds.dims else \
            ds.expand_dims(time=[date])

    opened = [preprocess(closed(xr.open_dataset(f, decode_coords="all")).load(), f)
              for f in files]
    return xr.combine_nested(opened, concat_dim="time", data_vars="all", coords="different",
                             compat="equals", join="exact", combine_attrs="override")

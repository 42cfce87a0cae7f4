"""Archives as they really are, written as NetCDF4 files, with xarray's reading of them.

- :func:`cmip_like`: two variables in separate file sets (``tas`` in files of one month,
  ``pr`` in files of two), three members in directories of their own (a global attribute
  ``realization`` too), daily steps in months of 28-31 days (irregular), time units per file
  (``days since <file start>``), ``time_bnds``, float32 data with ``_FillValue``, chunks of
  10 days (padded at file ends) compressed.
- :func:`drifting`: daily files ``sst_YYYYMMDD.nc`` with no time at all (their date is in
  the name only), a variable ``ice`` added halfway.
"""

from __future__ import annotations

from pathlib import Path

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

"""The job ``make demo`` runs on the bundled fixtures: scan, combine, write, verify.

Outside the repository (``pip install refgrid`` anywhere) it first writes a small monthly
archive of its own with h5py — NetCDF4 files as netCDF-C lays them out: dimension scales,
CF attributes, zlib and shuffle — so the demo needs nothing but the core install.

It scans the monthly archive (12 files of 28-31 daily steps, chunked 10 along time), writes one
kerchunk reference file per source (regular grids: stock zarr reads them; every value checked
against h5py), combines the year into one virtual dataset whose time axis needs the
rectilinear chunk grid no regular Zarr array can express, and checks it against
the sources read with h5py and joined along time.
"""

from __future__ import annotations

import calendar
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from refgrid.combining import combine
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.scanners import scan
from refgrid.writers import write

if TYPE_CHECKING:
    import xarray as xr


def inputs(fixtures: Path | None, out: Path, echo: Callable[[str], object] = print
           ) -> list[Path]:
    """The monthly files of ``fixtures/monthly/chunk10``; with no ``fixtures`` given, those
    of ``./fixtures`` when there are any, else a monthly archive written to
    ``out/inputs``."""
    found = Path("fixtures") if fixtures is None else fixtures
    sources = sorted((found / "monthly" / "chunk10").glob("*.nc"))
    if sources:
        return sources
    if fixtures is not None:
        raise FileNotFoundError(f"no monthly files under {fixtures / 'monthly' / 'chunk10'} "
                                "(leave FIXTURES out and the demo writes its own)")
    folder = out / "inputs"
    echo(f"No fixtures here: writing a monthly archive of 2001 to {folder}")
    return write_monthly_archive(folder)


def write_monthly_archive(folder: Path, nlat: int = 6, nlon: int = 8, chunk: int = 10
                          ) -> list[Path]:
    """12 NetCDF4 files of daily ``tas`` (28-31 days each) stored in chunks of ``chunk``
    days: the archive no regular chunk grid describes."""
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2001)
    paths, start = [], 0
    for month in range(1, 13):
        ndays = calendar.monthrange(2001, month)[1]
        path = folder / f"tas_2001{month:02d}.nc"
        with h5py.File(path, "w") as f:
            f.attrs["title"] = f"daily tas, 2001-{month:02d}"
            f.attrs["Conventions"] = "CF-1.8"
            scales = {"time": np.arange(start, start + ndays, dtype="f8"),
                      "lat": np.linspace(-75, 75, nlat), "lon": np.linspace(0, 360, nlon,
                                                                           endpoint=False)}
            attrs = {"time": {"units": "days since 2001-01-01", "calendar": "standard"},
                     "lat": {"units": "degrees_north"}, "lon": {"units": "degrees_east"}}
            for name, values in scales.items():
                d = f.create_dataset(name, data=values, maxshape=(None,) if name == "time"
                                     else None, chunks=(ndays,) if name == "time" else None)
                d.attrs.update(attrs[name])
                d.make_scale(name)
            tas = f.create_dataset("tas", data=(270 + 15 * rng.standard_normal(
                (ndays, nlat, nlon))).astype("f4"), chunks=(chunk, nlat, nlon),
                maxshape=(None, nlat, nlon), compression="gzip", compression_opts=4,
                shuffle=True)
            tas.attrs.update({"units": "K", "standard_name": "air_temperature"})
            for k, name in enumerate(("time", "lat", "lon")):
                tas.dims[k].attach_scale(f[name])
        paths.append(path)
        start += ndays
    return paths


def run(sources: list[Path], out: Path, echo: Callable[[str], object] = print) -> list[Path]:
    """Scan the monthly files ``sources`` (:func:`inputs`), write references to ``out``;
    return the files written."""
    written = []
    for source in sources:
        group = scan(source)
        target = write(group, out / "monthly" / f"{source.stem}.json")
        tas = group["tas"]
        assert isinstance(tas, VirtualArray)
        _verify(source, group, target)
        written.append(target)
        echo(f"  {source.name}: tas {tas.shape}, {tas.grid.nchunks} chunks -> {target}")
    year = combine([scan(source) for source in sources], "time")
    combined = write(year, out / "tas_2001.json")
    tas = year["tas"]
    assert isinstance(tas, VirtualArray)
    grid = tas.grid
    document = json.loads(combined.read_text())["refs"]["tas/zarr.json"]
    doc = json.loads(document)["chunk_grid"]  # as written: padded chunks stored cropped
    (out / "monthly" / "year_chunk_grid.json").write_text(json.dumps(doc, indent=1) + "\n")
    _verify_combined(sources, combined)
    echo(f"\nCombined the year into {combined}: tas {grid.shape}, time chunks "
         f"{grid.lengths(0).tolist()[:8]}... ({grid.chunk_counts[0]} along time), equal to "
         "the 12 files read with h5py")
    echo(f"its Zarr v3 chunk_grid: {json.dumps(doc)}")
    return [*written, combined]


def _verify_combined(sources: list[Path], refs: Path) -> None:
    """The combined year, opened with the engine, equals the sources read with h5py and
    joined along time (decoded by xarray from the files' own attributes)."""
    import xarray as xr

    ours = xr.open_dataset(refs, engine="refgrid")
    expected = xr.concat([_as_xarray(source) for source in sources], "time",
                         data_vars="minimal", coords="minimal", compat="equals")
    for name in expected.variables:
        if not np.array_equal(ours[name].values, expected[name].values):
            raise AssertionError(f"{refs}: {name} differs from the sources joined along time")


def _as_xarray(source: Path) -> xr.Dataset:
    """One fixture file as h5py reads it, CF-decoded by xarray (no netCDF library needed)."""
    import h5py
    import xarray as xr

    with h5py.File(source, "r") as f:
        variables = {}
        for name, d in f.items():
            dims = [f[ref].attrs["NAME"].decode() if "NAME" in f[ref].attrs else name
                    for ref in (d.attrs["DIMENSION_LIST"][k][0] for k in range(d.ndim))] \
                if "DIMENSION_LIST" in d.attrs else [name]
            attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in d.attrs.items()
                     if k in ("units", "calendar", "_FillValue", "scale_factor", "add_offset")}
            variables[name] = xr.Variable(dims, d[()], attrs)
    return xr.decode_cf(xr.Dataset(variables))


def _verify(source: Path, group: VirtualGroup, refs: Path) -> None:
    """Every value read through the references by stock zarr equals h5py's read of the
    source (no decoding on either side)."""
    import fsspec
    import h5py
    import zarr

    fs = fsspec.filesystem("reference", fo=str(refs), asynchronous=True)
    with warnings.catch_warnings(), h5py.File(source, "r") as f:
        warnings.filterwarnings("ignore", "Numcodecs codecs are not in the Zarr version 3")
        stored = zarr.open_group(zarr.storage.FsspecStore(fs, read_only=True), mode="r")
        for name in group.arrays:
            array = stored[name]
            assert isinstance(array, zarr.Array)
            if not np.array_equal(array[...], f[name][()]):
                raise AssertionError(f"{refs}: {name} differs from {source}")

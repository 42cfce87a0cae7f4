"""The job ``make demo`` runs on the bundled fixtures: scan, combine, write, verify.

It scans the monthly archive (12 files of 28-31 daily steps, chunked 10 along time), writes one
kerchunk reference file per source (regular grids: stock zarr reads them; every value checked
against h5py), combines the year into one virtual dataset whose time axis needs the
rectilinear chunk grid no regular Zarr array can express, and checks it against
the sources read with h5py and joined along time.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from refgrid.combine import combine
from refgrid.grid.json_forms import emit_chunk_grid
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.scan import scan
from refgrid.writers import write


def run(fixtures: Path, out: Path, echo: Callable[[str], object] = print) -> list[Path]:
    """Scan ``fixtures/monthly/chunk10``, write references to ``out``; return the files."""
    sources = sorted((fixtures / "monthly" / "chunk10").glob("*.nc"))
    if not sources:
        raise FileNotFoundError(f"no monthly fixtures under {fixtures}; run from the repo root")
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
    doc = emit_chunk_grid(grid)
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


def _as_xarray(source: Path) -> Any:
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

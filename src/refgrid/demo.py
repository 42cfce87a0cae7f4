"""The job ``make demo`` runs on the bundled fixtures: scan, combine, write, verify.

It scans the monthly archive (12 files of 28-31 daily steps, chunked 10 along time), writes one
kerchunk reference file per source (regular grids: stock zarr reads them; every value checked
against netCDF4), combines the year into one virtual dataset whose time axis needs the
rectilinear chunk grid no regular Zarr array can express, and checks it against
``xarray.open_mfdataset`` of the sources.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from refgrid.combine import combine
from refgrid.grid_json import emit_chunk_grid
from refgrid.model import VirtualArray
from refgrid.scan import scan
from refgrid.write import write


def run(fixtures: Path, out: Path, echo=print) -> list[Path]:
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
        _verify(source, target)
        written.append(target)
        echo(f"  {source.name}: tas {tas.shape}, {tas.grid.nchunks} chunks -> {target}")
    year = combine([scan(source) for source in sources], "time")
    combined = write(year, out / "tas_2001.json")
    grid = year["tas"].grid
    doc = emit_chunk_grid(grid)
    (out / "monthly" / "year_chunk_grid.json").write_text(json.dumps(doc, indent=1) + "\n")
    _verify_combined(sources, combined)
    echo(f"\nCombined the year into {combined}: tas {grid.shape}, time chunks "
         f"{grid.lengths(0).tolist()[:8]}... ({grid.chunk_counts[0]} along time), equal to "
         "xarray.open_mfdataset of the 12 files")
    echo(f"its Zarr v3 chunk_grid: {json.dumps(doc)}")
    return [*written, combined]


def _verify_combined(sources: list[Path], refs: Path) -> None:
    import xarray as xr

    ours = xr.open_dataset(refs, engine="refgrid")
    expected = xr.open_mfdataset(sources, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals")
    for name in expected.variables:
        if not np.array_equal(ours[name].values, expected[name].values):
            raise AssertionError(f"{refs}: {name} differs from open_mfdataset of the sources")


def _verify(source: Path, refs: Path) -> None:
    """Every value read through the references equals netCDF4's read of the source."""
    import fsspec
    import netCDF4
    import zarr

    fs = fsspec.filesystem("reference", fo=str(refs), asynchronous=True)
    with warnings.catch_warnings(), netCDF4.Dataset(source) as ds:
        warnings.filterwarnings("ignore", "Numcodecs codecs are not in the Zarr version 3")
        group = zarr.open_group(zarr.storage.FsspecStore(fs, read_only=True), mode="r")
        ds.set_auto_maskandscale(False)
        for name, var in ds.variables.items():
            if not np.array_equal(group[name][...], var[...]):
                raise AssertionError(f"{refs}: {name} differs from {source}")

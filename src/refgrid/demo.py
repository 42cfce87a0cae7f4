"""The job ``make demo`` runs on the bundled fixtures: scan, write references, show the grid.

It scans the monthly archive (12 files of 28-31 daily steps, chunked 10 along time), writes one
kerchunk reference file per source, verifies every value against netCDF4, and prints the
rectilinear chunk grid that represents the whole year - the grid no regular Zarr array can
express - together with how to open the outputs.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from refgrid.grid import RectilinearGrid
from refgrid.model import VirtualArray
from refgrid.scan import scan
from refgrid.write import write


def run(fixtures: Path, out: Path, echo=print) -> list[Path]:
    """Scan ``fixtures/monthly/chunk10``, write references to ``out``; return the files."""
    sources = sorted((fixtures / "monthly" / "chunk10").glob("*.nc"))
    if not sources:
        raise FileNotFoundError(f"no monthly fixtures under {fixtures}; run from the repo root")
    written, grids = [], []
    for source in sources:
        group = scan(source)
        target = write(group, out / "monthly" / f"{source.stem}.json")
        tas = group["tas"]
        assert isinstance(tas, VirtualArray)
        grids.append(tas.grid)
        _verify(source, target)
        written.append(target)
        echo(f"  {source.name}: tas {tas.shape}, {tas.grid.nchunks} chunks -> {target}")
    year = RectilinearGrid.concat(grids, 0)
    doc = year.to_json()
    (out / "monthly" / "year_chunk_grid.json").write_text(json.dumps(doc, indent=1) + "\n")
    echo(f"\nThe year as one array: shape {year.shape}, time chunks "
         f"{year.lengths(0).tolist()[:8]}... ({year.chunk_counts[0]} along time)")
    echo(f"its Zarr v3 chunk_grid: {json.dumps(doc)}")
    return written


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

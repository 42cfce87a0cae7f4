"""refgrid: virtual Zarr datasets over HDF5/NetCDF archives, irregular lengths included.

    g = refgrid.scan("s3://bucket/f.nc", anon=True)      # one file → VirtualGroup
    refgrid.write(g, "out/refs.json")                    # kerchunk JSON v1, Zarr v3 inside
    refs = refgrid.to_kerchunk(g)                        # the same as a dict
    g = refgrid.combine([g1, g2, g3], concat_dim="time") # many files → one, irregular lengths
    ds = xr.open_dataset("out/refs.json", engine="refgrid", chunks={})
    ds = xr.open_dataset(refgrid.get_mapper("out/refs.json"), engine="zarr")  # stock zarr
    refgrid.batch("s3://bucket/era5/*.nc", "era5.parq")  # whole archives on dask, resumable

``import refgrid`` loads only the error classes: each public name below is imported the
first time it is used, so a script, a CLI start or xarray's discovery of the engine does not
pay for h5py, zarr, pyarrow or pandas it may never need. No module is named after a public
function (``refgrid.scan`` is a function; the scanners are :mod:`refgrid.scanners`), so
importing a module never replaces a public name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from refgrid.errors import (
    AccessError,
    ArgumentError,
    BatchError,
    CombineError,
    ConstraintError,
    DirectoryError,
    FormatError,
    GridError,
    GroupError,
    MissingExtraError,
    ModelError,
    NotFoundError,
    ReadError,
    RefgridError,
    ScanError,
    WriteError,
)

if TYPE_CHECKING:
    from refgrid.archive import batch
    from refgrid.combining import combine, merge
    from refgrid.core.bounds import Limits, limits, set_limits
    from refgrid.explore import plot as plot
    from refgrid.explore.advise import ChunkAdvice, advise_chunks
    from refgrid.grid.rectilinear import RectilinearGrid
    from refgrid.materializing import materialize
    from refgrid.model.manifest import ChunkManifest
    from refgrid.model.virtual import VirtualArray, VirtualGroup
    from refgrid.read.mapper import get_mapper
    from refgrid.read.pipeline import zarr_config
    from refgrid.read.store import open_store
    from refgrid.scanners import scan
    from refgrid.writers import to_kerchunk, write

__version__ = "0.1.0"

_LAZY = {"advise_chunks": "refgrid.explore.advise", "ChunkAdvice": "refgrid.explore.advise",
         "batch": "refgrid.archive", "materialize": "refgrid.materializing",
         "Limits": "refgrid.core.bounds", "limits": "refgrid.core.bounds",
         "set_limits": "refgrid.core.bounds", "combine": "refgrid.combining",
         "merge": "refgrid.combining",
         "RectilinearGrid": "refgrid.grid.rectilinear", "ChunkManifest": "refgrid.model.manifest",
         "VirtualArray": "refgrid.model.virtual", "VirtualGroup": "refgrid.model.virtual",
         "get_mapper": "refgrid.read.mapper", "scan": "refgrid.scanners",
         "open_store": "refgrid.read.store", "zarr_config": "refgrid.read.pipeline",
         "to_kerchunk": "refgrid.writers", "write": "refgrid.writers"}
"""Public name → the module defining it."""

_MODULES = {"plot": "refgrid.explore.plot"}
"""Public module names → where the module lives (``from refgrid import plot``)."""


def __getattr__(name: str) -> object:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'refgrid' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_MODULES})


__all__ = [
    "AccessError",
    "ArgumentError",
    "BatchError",
    "ChunkAdvice",
    "ChunkManifest",
    "CombineError",
    "ConstraintError",
    "DirectoryError",
    "FormatError",
    "GridError",
    "GroupError",
    "Limits",
    "MissingExtraError",
    "ModelError",
    "NotFoundError",
    "ReadError",
    "RectilinearGrid",
    "RefgridError",
    "ScanError",
    "VirtualArray",
    "VirtualGroup",
    "WriteError",
    "__version__",
    "advise_chunks",
    "batch",
    "combine",
    "get_mapper",
    "limits",
    "materialize",
    "merge",
    "open_store",
    "scan",
    "set_limits",
    "to_kerchunk",
    "write",
    "zarr_config",
]

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
pay for h5py, zarr, pyarrow or pandas it may never need.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from refgrid.errors import (
    AccessError,
    ArgumentError,
    BatchError,
    CombineError,
    DirectoryError,
    FormatError,
    GridError,
    GroupError,
    MissingExtraError,
    ModelError,
    ReadError,
    RefgridError,
    ScanError,
    WriteError,
)

if TYPE_CHECKING:
    from refgrid.archive import batch
    from refgrid.combine import combine
    from refgrid.core.bounds import Limits, limits, set_limits
    from refgrid.explore import plot as plot
    from refgrid.explore.advise import ChunkAdvice, advise_chunks
    from refgrid.grid.rectilinear import RectilinearGrid
    from refgrid.materialize import materialize
    from refgrid.model.manifest import ChunkManifest
    from refgrid.model.virtual import VirtualArray, VirtualGroup
    from refgrid.read.mapper import get_mapper
    from refgrid.read.pipeline import zarr_config
    from refgrid.read.store import open_store
    from refgrid.scan import scan
    from refgrid.writers import to_kerchunk, write

__version__ = "0.1.0"

_LAZY = {"advise_chunks": "refgrid.explore.advise", "ChunkAdvice": "refgrid.explore.advise",
         "batch": "refgrid.archive", "materialize": "refgrid.materialize",
         "Limits": "refgrid.core.bounds", "limits": "refgrid.core.bounds",
         "set_limits": "refgrid.core.bounds", "combine": "refgrid.combine",
         "RectilinearGrid": "refgrid.grid.rectilinear", "ChunkManifest": "refgrid.model.manifest",
         "VirtualArray": "refgrid.model.virtual", "VirtualGroup": "refgrid.model.virtual",
         "get_mapper": "refgrid.read.mapper", "scan": "refgrid.scan",
         "open_store": "refgrid.read.store", "zarr_config": "refgrid.read.pipeline",
         "to_kerchunk": "refgrid.writers", "write": "refgrid.writers"}
"""Public name → the module defining it."""

_MODULES = {"plot": "refgrid.explore.plot"}
"""Public module names → where the module lives (``from refgrid import plot``)."""


def __getattr__(name: str) -> Any:
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


class _Package(types.ModuleType):
    """The package, keeping its functions over same-named modules: importing
    ``refgrid.scan.hdf5`` (or ``refgrid.combine``) would otherwise rebind ``refgrid.scan``
    to the subpackage (the import system sets each submodule on its parent), and
    ``refgrid.scan(path)`` would then call a module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _LAZY:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "AccessError",
    "ArgumentError",
    "BatchError",
    "ChunkAdvice",
    "ChunkManifest",
    "CombineError",
    "DirectoryError",
    "FormatError",
    "GridError",
    "GroupError",
    "Limits",
    "MissingExtraError",
    "ModelError",
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
    "open_store",
    "scan",
    "set_limits",
    "to_kerchunk",
    "write",
    "zarr_config",
]

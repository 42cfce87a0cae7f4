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
    from refgrid.advise import ChunkAdvice, advise_chunks
    from refgrid.archive import batch
    from refgrid.bounds import Limits, limits, set_limits
    from refgrid.combine import combine
    from refgrid.grid import RectilinearGrid
    from refgrid.manifest import ChunkManifest
    from refgrid.materialize import materialize
    from refgrid.model import VirtualArray, VirtualGroup
    from refgrid.output import write
    from refgrid.read.mapper import get_mapper
    from refgrid.scan import scan
    from refgrid.write import to_kerchunk

__version__ = "0.1.0"

_LAZY = {"advise_chunks": "refgrid.advise", "ChunkAdvice": "refgrid.advise",
         "batch": "refgrid.archive", "materialize": "refgrid.materialize",
         "Limits": "refgrid.bounds", "limits": "refgrid.bounds",
         "set_limits": "refgrid.bounds", "combine": "refgrid.combine",
         "RectilinearGrid": "refgrid.grid", "ChunkManifest": "refgrid.manifest",
         "VirtualArray": "refgrid.model", "VirtualGroup": "refgrid.model",
         "get_mapper": "refgrid.read.mapper", "scan": "refgrid.scan",
         "to_kerchunk": "refgrid.write", "write": "refgrid.output"}
"""Public name → the module defining it."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'refgrid' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(types.ModuleType):
    """The package, keeping its functions over same-named subpackages: importing
    ``refgrid.scan.hdf5`` would otherwise rebind ``refgrid.scan`` to the subpackage (the
    import system sets each submodule on its parent), and ``refgrid.scan(path)`` would
    then call a module (``refgrid.write`` is the function of :mod:`refgrid.output`, not
    the package :mod:`refgrid.write`)."""

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
    "scan",
    "set_limits",
    "to_kerchunk",
    "write",
]

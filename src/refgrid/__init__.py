"""refgrid: virtual Zarr datasets over HDF5/NetCDF archives, irregular lengths included.

    g = refgrid.scan("s3://bucket/f.nc", anon=True)      # one file → VirtualGroup
    refgrid.write(g, "out/refs.json")                    # kerchunk JSON v1, Zarr v3 inside
    refs = refgrid.to_kerchunk(g)                        # the same as a dict
    g = refgrid.combine([g1, g2, g3], concat_dim="time") # many files → one, irregular lengths
    ds = xr.open_dataset("out/refs.json", engine="refgrid", chunks={})
    ds = xr.open_dataset(refgrid.get_mapper("out/refs.json"), engine="zarr")  # stock zarr
    refgrid.batch("s3://bucket/era5/*.nc", "era5.parq")  # whole archives on dask, resumable
"""

from refgrid.archive import batch
from refgrid.bounds import Limits, limits, set_limits
from refgrid.combine import combine
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
from refgrid.grid import RectilinearGrid
from refgrid.manifest import ChunkManifest
from refgrid.model import VirtualArray, VirtualGroup
from refgrid.read.mapper import get_mapper
from refgrid.scan import scan
from refgrid.write import to_kerchunk, write

__version__ = "0.1.0"


__all__ = [
    "AccessError",
    "ArgumentError",
    "BatchError",
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
    "batch",
    "combine",
    "get_mapper",
    "limits",
    "scan",
    "set_limits",
    "to_kerchunk",
    "write",
]

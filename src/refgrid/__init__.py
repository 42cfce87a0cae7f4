"""refgrid: virtual Zarr datasets over HDF5/NetCDF archives, irregular lengths included."""

from refgrid.errors import GridError, ModelError, RefgridError
from refgrid.grid import RectilinearGrid
from refgrid.manifest import ChunkManifest
from refgrid.model import VirtualArray, VirtualGroup

__version__ = "0.1.0"

__all__ = [
    "ChunkManifest",
    "GridError",
    "ModelError",
    "RectilinearGrid",
    "RefgridError",
    "VirtualArray",
    "VirtualGroup",
    "__version__",
]

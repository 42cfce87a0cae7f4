"""A comparable description of a fixture file's content: structure, metadata and values.

Used where bytes may legitimately differ (another HDF5 or netCDF-C version writes other
padding or B-tree layouts) to check that what the file *says* is unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import hdf5plugin  # noqa: F401  (registers the plugin filters with h5py)
import netCDF4
import numpy as np


def _value(v: Any) -> Any:
    if isinstance(v, h5py.Empty):
        return ("empty", str(v.dtype))
    if isinstance(v, h5py.Reference | h5py.RegionReference):
        return "reference"
    arr = np.asarray(v)
    if _holds_references(arr.dtype):
        return "reference"  # addresses, which differ from file to file
    if arr.dtype.kind == "O":
        items = [x if isinstance(x, str | bytes) else _value(x) for x in arr.reshape(-1).tolist()]
        return (str(arr.dtype), arr.shape, repr(items))
    return (arr.dtype.str, arr.shape, arr.tobytes())


def _holds_references(dtype: np.dtype) -> bool:
    if dtype.fields:
        return any(_holds_references(f[0]) for f in dtype.fields.values())
    return h5py.check_dtype(ref=dtype) is not None


def describe_hdf5(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with h5py.File(path, "r") as f:
        def visit(name: str, obj: Any) -> None:
            entry: dict[str, Any] = {"attrs": {k: _value(obj.attrs[k]) for k in obj.attrs}}
            if isinstance(obj, h5py.Dataset):
                dcpl = obj.id.get_create_plist()
                entry.update(
                    dtype=str(obj.dtype), shape=obj.shape, chunks=obj.chunks,
                    layout=dcpl.get_layout(),
                    filters=[dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())],
                    data=_value(obj[()]),
                )
            out[name] = entry
        visit("/", f)
        f.visititems(visit)
    return out


def describe_netcdf3(path: Path) -> dict[str, Any]:
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        ds.set_auto_chartostring(False)
        return {
            "format": ds.data_model,
            "dims": {k: (len(d), d.isunlimited()) for k, d in ds.dimensions.items()},
            "attrs": {k: _value(ds.getncattr(k)) for k in ds.ncattrs()},
            "vars": {k: (v.dimensions, str(v.dtype), _value(v[...]),
                         {a: _value(v.getncattr(a)) for a in v.ncattrs()})
                     for k, v in ds.variables.items()},
        }


def describe(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        magic = f.read(4)
    return describe_netcdf3(path) if magic[:3] == b"CDF" else describe_hdf5(path)

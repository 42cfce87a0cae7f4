"""Ground truth for a source file, and the comparison rules of ../shared/corpus/README.md.

netCDF4-python (no CF decoding) for NetCDF files, h5py (hdf5plugin loaded) for plain HDF5.
Values are equal when shapes and values match: NaN equals NaN, byte order is ignored,
strings are decoded, compound types compare field by field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import hdf5plugin  # noqa: F401
import netCDF4
import numpy as np

from refgrid.core.dtypes import DTYPE_ATTR, VLEN_DTYPE_ATTR, original_dtype


def _netcdf_vars(group: netCDF4.Group, prefix: str, out: dict[str, Any]) -> None:
    for name, var in group.variables.items():
        var.set_auto_maskandscale(False)
        var.set_auto_chartostring(False)
        var.set_always_mask(False)
        try:
            out[prefix + name] = var[...]
        except Exception as e:
            out[prefix + name] = e
    for name, child in group.groups.items():
        _netcdf_vars(child, f"{prefix}{name}/", out)


def ground_truth(path: Path) -> dict[str, Any]:
    """Every variable's values by path, from the C libraries."""
    if path.suffix == ".nc":
        try:
            with netCDF4.Dataset(path) as ds:
                out: dict[str, Any] = {}
                _netcdf_vars(ds, "", out)
                return {k: np.asarray(v) if isinstance(v, np.ma.MaskedArray) else v
                        for k, v in out.items()}
        except OSError:
            pass  # not a NetCDF file after all: plain HDF5
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                try:
                    out[name] = obj[()]
                except Exception as e:
                    out[name] = e
        f.visititems(visit)
    return out


def restore(values: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """Undo refgrid's documented encodings (raw-bytes records, vlen sequences)."""
    if DTYPE_ATTR in attrs and values.dtype.fields is None:  # (the engine restores records)
        dtype = original_dtype(attrs, values.dtype)
        return np.frombuffer(np.ascontiguousarray(values).tobytes(), dtype).reshape(values.shape)
    if VLEN_DTYPE_ATTR in attrs:
        element = np.dtype(attrs[VLEN_DTYPE_ATTR])
        items = [np.frombuffer(v, element) for v in values.reshape(-1)]
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(values.shape)
    return values


def same(ours: Any, truth: Any) -> bool:
    """The corpus README's equality."""
    if isinstance(truth, h5py.Empty):
        return np.asarray(ours).size == 0
    ours, truth = np.asarray(ours), np.asarray(truth)
    if ours.shape != truth.shape:
        return False
    if truth.dtype.fields is not None:
        return ours.dtype.fields is not None and all(
            same(ours[name], truth[name]) for name in truth.dtype.names)
    if truth.dtype.kind in "OSU" or ours.dtype.kind in "OTSU":
        return all(_same_item(a, b) for a, b in zip(ours.reshape(-1).tolist(),
                                                    truth.reshape(-1).tolist(), strict=True))
    if truth.dtype.kind in "fc":
        return bool(np.array_equal(ours.astype(truth.dtype.newbyteorder("=")), truth,
                                   equal_nan=True))
    return bool(np.array_equal(ours, truth))


def _same_item(a: Any, b: Any) -> bool:
    if isinstance(a, bytes) and isinstance(b, str):
        a = a.decode("utf-8")
    if isinstance(b, bytes) and isinstance(a, str):
        b = b.decode("utf-8", errors="surrogateescape")
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return same(a, b)
    return a == b


def assert_like_source(ours: Any, source: Any) -> None:
    """An xarray Dataset read through a zarr view equals ``xr.open_dataset(source)``:
    every variable, its dims, values and (for numbers and times) dtype."""
    assert set(ours.variables) == set(source.variables)
    for key, expected in source.variables.items():
        got = ours[key]
        if DTYPE_ATTR in got.attrs:  # records zarr cannot type: raw bytes (documented)
            values = restore(got.values, dict(got.attrs))
            for field in expected.dtype.names:
                np.testing.assert_array_equal(values[field], expected.values[field], key)
            continue
        assert got.dims == expected.dims, key
        if expected.dtype.kind in "fcmM":
            assert got.dtype == expected.dtype, key
            np.testing.assert_array_equal(got.values, expected.values, err_msg=key)
        else:  # (zarr returns variable-length strings as numpy's StringDType)
            assert (got.values == expected.values).all(), key

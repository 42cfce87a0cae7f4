"""Every fixture and corpus file opens through refgrid exactly as xarray opens the source.

``xr.testing.assert_identical`` (values, dtypes, dimensions, attributes, coordinates), and the
encoding keys xarray's engines report (compression, chunking, source, shape, dtype,
unlimited dimensions) wherever the source has them. The source is opened with the engine
xarray would use for it: netCDF4 for files netCDF-C wrote (NetCDF3, or HDF5 carrying
``_NCProperties``), h5netcdf (xarray's HDF5 engine) for other HDF5 files — netCDF-C crashes
the process on some of those (``free(): invalid pointer`` on compound/opaque types).
"""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr

import refgrid
from helpers import CORPUS, FIXTURES, closed, data_files

NETCDF4_KEYS = ("zlib", "complevel", "shuffle", "fletcher32", "szip", "zstd", "bzip2",
                "blosc", "contiguous", "chunksizes", "original_shape", "source", "dtype")
"""Encoding keys of xarray's netCDF4 engine."""
H5NETCDF_KEYS = ("zlib", "shuffle", "fletcher32", "contiguous", "chunksizes",
                 "original_shape", "source", "dtype")
"""The netCDF4 keys h5netcdf reports alike (it names plugin filters its own way, h5py's)."""

KNOWN_DIFFERENCES = {
    "jhdf__compound_datasets_latest.hdf5":
        "compounds with variable-length members have no Zarr representation: refgrid skips "
        "and reports them (README, 'What refgrid reads differently')",
    "kerchunk__vlen2.h5": "the same: a compound with a variable-length string member",
    "ncc__ref_nc_test_netcdf4_4_0.nc":
        "a global NC_CHAR attribute that is not UTF-8: xarray's netCDF4 engine gives bytes "
        "b'\\x80' there while netCDF4's getncattr (and refgrid) give '\\ufffd'",
}
"""The only files that do not read identically, each with its reason."""


def _files() -> list[Path]:
    corpus = sorted(CORPUS.iterdir()) if CORPUS.is_dir() else []
    return data_files(FIXTURES) + corpus


def _source_engine(path: Path) -> tuple[str, dict]:
    if h5py.is_hdf5(path):
        with h5py.File(path) as f:
            if "_NCProperties" not in f.attrs:
                return "h5netcdf", {"phony_dims": "access"}
    return "netcdf4", {"auto_complex": True}


def _same(a: object, b: object) -> bool:
    try:
        return bool(np.all(a == b)) if not isinstance(a, dict) else a == b
    except (TypeError, ValueError):
        return False


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name)
def test_reads_as_xarray_reads_the_source(path: Path) -> None:
    if path.name in KNOWN_DIFFERENCES:
        pytest.xfail(KNOWN_DIFFERENCES[path.name])
    engine, kwargs = _source_engine(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refused = None
        try:
            source = closed(xr.open_dataset(path, engine=engine, **kwargs))
        except Exception as e:  # the source engine refuses: refgrid must not invent data
            refused = type(e).__name__
        if refused is not None:
            # xarray leaves the file it opened before failing to its garbage collector, which
            # warns ("deallocating CachingFileManager"): collected here, once the exception
            # (whose frames hold it) is gone, not in a later test
            gc.collect()
            try:
                refgrid.scan(path)
            except refgrid.RefgridError:
                return
            pytest.skip(f"{engine} cannot read it ({refused}); compared with h5py "
                        "and netCDF4 directly in test_scan_hdf5_acceptance/test_fixtures")
        ours = xr.open_dataset(path, engine="refgrid").load()
    xr.testing.assert_identical(ours, source)
    keys = NETCDF4_KEYS if engine == "netcdf4" else H5NETCDF_KEYS
    for name, expected in source.variables.items():
        got = ours[name].encoding
        if set(got) == {"dtype"} and got["dtype"].kind == "U":
            continue  # xarray turns vlen strings into <U keeping only dtype (netCDF4's too)
        for key in keys:
            if key in expected.encoding:
                want = expected.encoding[key]
                have = got.get(key, "<missing>")
                if key == "source":
                    want, have = str(want), str(have)
                assert _same(have, want), f"{path.name}: {name}.encoding[{key!r}]: " \
                                          f"{have!r}, source {want!r}"
    if engine == "netcdf4":
        assert ours.encoding["unlimited_dims"] == source.encoding["unlimited_dims"]

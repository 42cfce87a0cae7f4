"""How an HDF5 dataset is stored, in the words of xarray's netCDF4 engine (``encoding``).

Re-writing a dataset opened from references with ``to_netcdf`` should keep the source's
compression, chunking and record dimensions, as it does when the file itself is opened. The
facts are read from the dataset creation property list at scan time (the references alone
cannot tell a contiguous dataset from one split into virtual chunks) and stored in the
``_refgrid_encoding`` attribute (:data:`refgrid.core.dtypes.ENCODING_ATTR`).
"""

from __future__ import annotations

import h5py
import numpy as np

BLOSC_COMPRESSORS = ("blosc_lz", "blosc_lz4", "blosc_lz4hc", "blosc_snappy", "blosc_zlib",
                     "blosc_zstd")
"""netCDF-C's names for the compressor codes of HDF5 filter 32001 (cd_values[6])."""
SZIP_NN = 32
"""The nearest-neighbour bit of an szip options mask (else entropy coding)."""
DEFLATE, SHUFFLE, FLETCHER32, SZIP, BZIP2, BLOSC, ZSTD = 1, 2, 3, 4, 307, 32001, 32015


def filter_encoding(d: h5py.Dataset) -> dict[str, object]:
    """netCDF4's ``Variable.filters()`` for ``d``; filters it has no key for are given the
    h5py way (``compression``/``compression_opts``), as xarray's h5netcdf engine does."""
    out: dict[str, object] = {"zlib": False, "szip": False, "zstd": False, "bzip2": False,
                              "blosc": False, "shuffle": False, "complevel": 0,
                              "fletcher32": False}
    dcpl = d.id.get_create_plist()
    for index in range(dcpl.get_nfilters()):
        code, _, cd, _ = dcpl.get_filter(index)
        if code == DEFLATE:
            out.update(zlib=True, complevel=int(cd[0]) if cd else 0)
        elif code == SHUFFLE:
            out["shuffle"] = True
        elif code == FLETCHER32:
            out["fletcher32"] = True
        elif code == SZIP and len(cd) >= 2:
            out["szip"] = {"coding": "nn" if cd[0] & SZIP_NN else "ec",
                           "pixels_per_block": int(cd[1])}
        elif code in (ZSTD, BZIP2):
            out.update({"zstd" if code == ZSTD else "bzip2": True,
                        "complevel": int(cd[0]) if cd else 0})
        elif code == BLOSC and len(cd) >= 7 and cd[6] < len(BLOSC_COMPRESSORS):
            out["blosc"] = {"compressor": BLOSC_COMPRESSORS[cd[6]], "shuffle": int(cd[5])}
        else:
            out.update(compression=d.compression or str(code),
                       compression_opts=_plain(d.compression_opts))
    return out


def storage_encoding(d: h5py.Dataset, url: str) -> dict[str, object]:
    """Filters, chunking and the source file of ``d``."""
    chunked = d.chunks is not None
    return {**filter_encoding(d), "contiguous": not chunked,
            "chunksizes": list(d.chunks) if chunked else None, "source": url}


def enum_encoding(dtype: np.dtype, name: str | None) -> dict[str, object]:
    """An enum type's members and name, which xarray keeps in ``encoding["dtype"]``."""
    members = h5py.check_enum_dtype(dtype) or {}
    return {"enum": {k: int(v) for k, v in members.items()}, "enum_name": name}


def _plain(value: object) -> object:
    """A compression option as JSON: tuples as lists, numpy scalars as Python numbers."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value

"""Classic kerchunk references: Zarr v2 keys and metadata, for datasets of regular grids.

What existing kerchunk consumers read unchanged — fsspec's ``reference://`` with zarr in v2
mode, ``MultiZarrToZarr``, intake catalogues: ``.zgroup``/``.zarray``/``.zattrs`` documents
with the dimension names in ``_ARRAY_DIMENSIONS`` (xarray's convention) and chunks at
``tas/0.3.1`` (``tas/0`` for a 0-d array). A Zarr v2 array has one chunk shape, so a
rectilinear array is refused, naming it and its irregular dimension.

The v3 codec list maps onto v2's ``filters`` + ``compressor``: array→array filters first,
then a non-``bytes`` array→bytes codec, then every bytes→bytes codec but the last, which is
the compressor; the ``bytes`` codec's byte order moves into ``dtype``. refgrid's own HDF5
codecs keep their names (``refgrid.lzf`` ...), which numcodecs finds through refgrid's
``numcodecs.codecs`` entry points (:mod:`refgrid.codecs.numcodecs_v2`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

from refgrid.codecs.filters import CodecJSON, Pipeline, stored_dtype
from refgrid.codecs.numcodecs_v2 import SIZED
from refgrid.core.dtypes import (
    flat_records,
    original_dtype,
    recast_fill,
    split_bookkeeping,
    zarr_dtype,
)
from refgrid.core.keys import ZARRAY, ZATTRS, ZGROUP
from refgrid.core.typed import JSONObject
from refgrid.errors import WriteError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.virtual import VirtualArray, VirtualGroup


def v2_documents(group: VirtualGroup) -> dict[str, dict[str, object]]:
    """Every node's v2 documents, keyed ``.zgroup``, ``tas/.zarray``, ``tas/.zattrs``..."""
    out: dict[str, dict[str, object]] = {ZGROUP: {"zarr_format": 2}, ZATTRS: _plain(group.attrs)}
    for path, node in group.walk():
        if isinstance(node, VirtualGroup):
            out[f"{path}/{ZGROUP}"] = {"zarr_format": 2}
            out[f"{path}/{ZATTRS}"] = _plain(node.attrs)
        else:
            out[f"{path}/{ZARRAY}"], out[f"{path}/{ZATTRS}"] = _array_documents(path, node)
    return out


def _plain(attrs: Mapping[str, object], also: str | None = None) -> dict[str, object]:
    """Attributes for readers that are not refgrid: without refgrid's bookkeeping (kept in
    the references' own section) and ``also``."""
    return {k: v for k, v in split_bookkeeping(attrs)[0].items() if k != also}


def require_regular(path: str, array: VirtualArray, what: str) -> RectilinearGrid:
    """``array``'s grid if it is regular; else a :class:`WriteError` naming the array and
    its irregular dimension."""
    grid = array.grid
    if grid.is_regular:
        return grid
    dim = next(d for d, a in enumerate(grid.axes) if a.regular_size is None)
    lengths = grid.lengths(dim)[:8].tolist()
    more = " ..." if grid.chunk_counts[dim] > 8 else ""
    raise WriteError(
        f"array {path!r}: {what} needs regular chunk grids, but its chunks along "
        f"{array.dims[dim]!r} have lengths {lengths}{more} (files of irregular length, or "
        "chunks padded inside the array); write format='json' or 'parquet' (Zarr v3, "
        "rectilinear grid) instead")


def _array_documents(path: str, array: VirtualArray
                     ) -> tuple[dict[str, object], dict[str, object]]:
    grid = require_regular(path, array, "kerchunk-v2 output")
    chunks = list(grid.chunk_shape or ())
    filters, compressor = _v2_codecs(path, array, math.prod(chunks))
    dtype, fill, moved = _v2_dtype_and_fill(path, array)
    zarray = {"zarr_format": 2, "shape": list(array.shape), "chunks": chunks, "dtype": dtype,
              "fill_value": fill, "order": _v2_order(path, array), "filters": filters or None,
              "compressor": compressor, "dimension_separator": "."}
    attrs = _plain(array.attrs, "_FillValue" if moved else None)
    attrs["_ARRAY_DIMENSIONS"] = list(array.dims)
    return zarray, attrs


def _v2_dtype_and_fill(path: str, array: VirtualArray) -> tuple[object, object, bool]:
    """The ``dtype`` and ``fill_value`` of ``.zarray``, and whether the CF ``_FillValue``
    became that fill value (xarray reads it from there in v2); without one that fits the
    type, a fill only where some chunk is missing."""
    dtype = stored_dtype(array.dtype, array.codecs)
    records = original_dtype(array.attrs, dtype)  # (raw bytes: Zarr v3 would misread them)
    typed = records != dtype and flat_records(records)  # (v2 keeps each field's order)
    zdtype = zarr_dtype(records if typed else dtype, zarr_format=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        name = zdtype.to_json(zarr_format=2)["name"]
        candidates = [(array.attrs.get("_FillValue"), True)]
        if array.manifest.missing.any():
            candidates.append((recast_fill(array.fill_value, dtype, zdtype.to_native_dtype()),
                               False))
        for value, from_attribute in candidates:
            if value is None:
                continue
            try:
                fill = zdtype.to_json_scalar(zdtype.cast_scalar(value), zarr_format=2)
            except (TypeError, ValueError, OverflowError):
                continue
            return name, list(fill) if isinstance(fill, tuple) else fill, from_attribute
    return name, None, False


def _v2_order(path: str, array: VirtualArray) -> str:
    """Zarr v2's memory order: a ``transpose`` codec that reverses the axes is ``"F"``; any
    other permutation has no v2 form."""
    order = Pipeline.of(list(array.codecs)).order
    if order is None or order == tuple(range(len(order))):
        return "C"
    if order == tuple(reversed(range(len(order)))):
        return "F"
    raise WriteError(f"array {path!r}: a transpose to {list(order)} has no Zarr v2 form; "
                     "write format='json' (Zarr v3) instead")


def _v2_codecs(path: str, array: VirtualArray,
               chunk_elements: int) -> tuple[list[JSONObject], JSONObject | None]:
    pipeline = Pipeline.of(list(array.codecs))
    nbytes = chunk_elements * array.dtype.itemsize
    stages = [_v2_codec(path, c, nbytes) for c in pipeline.filters]
    if pipeline.head["name"] != "bytes":
        stages.append(_v2_codec(path, pipeline.head, nbytes))
    stages += [_v2_codec(path, c, nbytes) for c in pipeline.compressors]
    if pipeline.compressors:
        return stages[:-1], stages[-1]
    return stages, None


def _v2_codec(path: str, codec: CodecJSON, nbytes: int) -> JSONObject:
    name, config = codec["name"], dict(codec.get("configuration", {}))
    if name in ("vlen-utf8", "vlen-bytes"):
        return {"id": name}
    if name.startswith("numcodecs."):
        return {"id": name.removeprefix("numcodecs."), **config}
    if name in SIZED:
        return {"id": name, **config, "nbytes": nbytes}
    if name in ("gzip", "zstd"):  # Zarr v3's own compressors: numcodecs' ids and settings
        return {"id": name, **config}
    raise WriteError(f"array {path!r}: codec {name!r} has no Zarr v2 form; write "
                     "format='json' (Zarr v3) instead")

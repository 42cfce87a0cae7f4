"""Packed variables served unpacked, as xarray unpacks the source files.

A variable stored as int16 with float32 ``scale_factor``/``add_offset`` unpacks to float32
when xarray reads the NetCDF file — but to float64 from a Zarr store, whose JSON attributes
lose the float32 type. Both views can serve such a variable already unpacked (masked and
scaled by xarray itself, in the type the file gives), so a stock reader gets the values a
reader of the file gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from refgrid.codecs.filters import CodecJSON, bytes_codec
from refgrid.core.dtypes import reader_attrs
from refgrid.model.virtual import VirtualArray

if TYPE_CHECKING:
    from xarray import Variable


def packed(array: VirtualArray) -> bool:
    return "scale_factor" in array.attrs or "add_offset" in array.attrs


def unpacked_array(array: VirtualArray) -> VirtualArray:
    """``array`` as served unpacked (for its documents): the type xarray unpacks it to, NaN
    for a fill value, plain little-endian bytes, no packing attributes."""
    template = _masked_and_scaled(array.name, array.dims, array.attrs,
                                  np.zeros((0,) * array.grid.ndim, array.value_dtype))
    attrs = {k: v for k, v in array.attrs.items() if k not in template.encoding}
    return replace(array, dtype=template.dtype, fill_value=np.nan,
                   codecs=(plain_codec(template.dtype),), attrs=attrs, segments=None)


def unpack_values(array: VirtualArray, values: np.ndarray) -> np.ndarray:
    """``values`` of ``array`` as stored, masked and scaled as xarray unpacks them."""
    return decode_values(array.name, array.dims, array.attrs, values)


def decode_values(name: str, dims: tuple[str, ...], attrs: Mapping[str, object],
                  values: np.ndarray) -> np.ndarray:
    """``values`` stored under ``attrs``, masked and scaled as xarray decodes them."""
    return np.asarray(_masked_and_scaled(name, dims, attrs, values).values)


def _masked_and_scaled(name: str, dims: tuple[str, ...], stored: Mapping[str, object],
                       values: np.ndarray) -> Variable:
    """xarray's own mask-and-scale of ``values``, with the attribute types the source file
    had (refgrid's bookkeeping restores float32 factors). xarray is imported here, when a
    view unpacks: the service and the stores need it for nothing else (it doubles the
    service's memory)."""
    from xarray import Variable, conventions

    attrs = reader_attrs(stored)
    return conventions.decode_cf_variable(name, Variable(dims, values, attrs),
                                          mask_and_scale=True, decode_times=False,
                                          decode_timedelta=False, concat_characters=False)


def plain_codec(dtype: np.dtype) -> CodecJSON:
    """The codec of values served uncompressed: little-endian bytes, or vlen text/bytes."""
    if dtype.kind in "OT":
        return {"name": "vlen-utf8" if dtype.kind == "T" else "vlen-bytes"}
    return bytes_codec(dtype.newbyteorder("<") if dtype.itemsize > 1 and dtype.kind != "V"
                       else dtype)

"""Packed variables served unpacked, as xarray unpacks the source files.

A variable stored as int16 with float32 ``scale_factor``/``add_offset`` unpacks to float32
when xarray reads the NetCDF file — but to float64 from a Zarr store, whose JSON attributes
lose the float32 type. Both views can serve such a variable already unpacked (masked and
scaled by xarray itself, in the type the file gives), so a stock reader gets the values a
reader of the file gets.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from refgrid.codecs.filters import plain_codec
from refgrid.core.cf import mask_and_scale
from refgrid.core.dtypes import reader_attrs
from refgrid.model.virtual import VirtualArray


def packed(array: VirtualArray) -> bool:
    return "scale_factor" in array.attrs or "add_offset" in array.attrs


def unpacked_array(array: VirtualArray) -> VirtualArray:
    """``array`` as served unpacked (for its documents): the type xarray unpacks it to, NaN
    for a fill value, plain little-endian bytes, no packing attributes."""
    template = mask_and_scale(array.name, array.dims, reader_attrs(array.attrs),
                              np.zeros((0,) * array.grid.ndim, array.value_dtype))
    attrs = {k: v for k, v in array.attrs.items() if k not in template.encoding}
    return replace(array, dtype=template.dtype, fill_value=np.nan,
                   codecs=(plain_codec(template.dtype),), attrs=attrs, segments=None)


def unpack_values(array: VirtualArray, values: np.ndarray) -> np.ndarray:
    """``values`` of ``array`` as stored, masked and scaled as xarray unpacks them."""
    return np.asarray(mask_and_scale(array.name, array.dims, reader_attrs(array.attrs),
                                     values).values)



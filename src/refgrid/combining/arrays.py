"""What a combine does to one array: its values held inline, a leading axis of length 1 —
used by the shaping of files (:mod:`.shaping`), the concatenation (:mod:`.concat`) and the
stacking (:mod:`.sets`) alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from refgrid.codecs.filters import bytes_codec
from refgrid.core.dtypes import ENCODING_ATTR
from refgrid.grid.rectilinear import AxisChunks, RectilinearGrid
from refgrid.model.virtual import VirtualArray, in_pieces, piece_length
from refgrid.model.zarr_json import DIMENSION_NAMES_ATTR, dimension_names


def inlined(like: VirtualArray, data: np.ndarray, *, pieces: bool) -> VirtualArray:
    """``like`` holding ``data`` inline (uncompressed, little-endian): in pieces along its
    first dimension (:func:`~refgrid.model.virtual.in_pieces`), or as one chunk."""
    stored = data.astype(like.dtype.newbyteorder("<")) if data.dtype.itemsize > 1 else data
    typed = replace(like, dtype=stored.dtype, codecs=(bytes_codec(stored.dtype),),
                    segments=None)
    return in_pieces(typed, stored.tobytes(), data.shape,
                     piece_length(data.shape[0]) if pieces else max(1, data.shape[0]))


def brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def with_leading_axis(array: VirtualArray, dim: str) -> VirtualArray:
    """``array`` with a leading dimension ``dim`` of length 1 (the dimension names its
    source store left out stay left out; the chunk sizes its encoding records gain one)."""
    one = np.ones(1, dtype=np.int64)
    grid = RectilinearGrid((AxisChunks(one, one), *array.grid.axes))
    attrs = dict(array.attrs)
    encoding = attrs.get(ENCODING_ATTR)
    if isinstance(encoding, Mapping) and isinstance(encoding.get("chunksizes"), list | tuple):
        attrs[ENCODING_ATTR] = {**encoding, "chunksizes": [1, *encoding["chunksizes"]]}
    if DIMENSION_NAMES_ATTR in attrs:
        attrs[DIMENSION_NAMES_ATTR] = [dim, *(dimension_names(array) or
                                              [None] * len(array.dims))]
    return replace(array, dims=(dim, *array.dims), grid=grid, attrs=attrs,
                   manifest=array.manifest.reshaped((1, *array.manifest.shape)))

"""Reading an array stored in segments (:mod:`refgrid.model.segments`), as it is shown
(:mod:`refgrid.model.presented`).

A read splits the selection at segment boundaries along the segmented dimension, reads each
*storage group* (segments stored alike: usually all of them) through one reader of stored
chunks — so an archive of 10^4 files differing only in ``add_offset`` is one coalesced read —
and converts each segment's part of it (decoded as xarray decodes that file, where the array
is shown decoded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import numpy as np

from refgrid.core.cf import mask_and_scale
from refgrid.core.dtypes import reader_attrs
from refgrid.core.sources import SourceCheck
from refgrid.core.typed import StorageOptions
from refgrid.grid.selection import normalize_selection
from refgrid.model.segments import Encoding
from refgrid.model.virtual import VirtualArray


class ArrayReader(Protocol):
    """What reads one array: :class:`refgrid.read.array.Reader`, or for an array stored in
    segments :class:`SegmentedReader`."""

    def read(self, selection: object = ...) -> np.ndarray: ...


ReaderOf = Callable[[VirtualArray, str, StorageOptions | None, SourceCheck | None],
                    ArrayReader]
"""How a reader of stored chunks is made (:class:`refgrid.read.array.Reader`)."""


class SegmentedReader:
    """Reads of one array in segments: the :class:`~refgrid.read.array.Reader` interface
    views and the engine use."""

    def __init__(self, array: VirtualArray, name: str, storage_options: StorageOptions | None,
                 check: SourceCheck | None, stored: ReaderOf) -> None:
        segments = array.segments
        assert segments is not None
        self.array, self.segments = array, segments
        self.axis = array.axis(segments.dim)
        bounds = array.grid.axes[self.axis].bounds
        self.first = bounds[np.asarray(segments.starts)]
        """Each segment's first element along the segmented axis."""
        groups: list[Encoding] = []
        self.group = np.empty(len(segments), np.intp)
        for k, e in enumerate(segments.encodings):
            storage = Encoding.of(e.dtype, e.codecs, e.fill_value, {})
            found = next((g for g, kind in enumerate(groups) if kind == storage), None)
            if found is None:
                found = len(groups)
                groups.append(storage)
            self.group[k] = found
        self.attrs: dict[int, dict[str, object]] = {}
        """Each segment's decoding attributes as xarray is given them (made when read)."""
        self.readers = [stored(replace(array, dtype=g.dtype, codecs=g.codecs,
                                       fill_value=g.fill_value, segments=None),
                               name, storage_options, check) for g in groups]

    def read(self, selection: object = ...) -> np.ndarray:
        """``array[selection]`` (orthogonal), each segment decoded by its own encoding."""
        array, axis = self.array, self.axis
        index = list(normalize_selection(selection, array.shape))
        dropped = [isinstance(i, int | np.integer) for i in index]
        index = [np.asarray([i]) if d else i for i, d in zip(index, dropped, strict=True)]
        along = np.arange(array.shape[axis])[index[axis]]
        segment = np.searchsorted(self.first, along, side="right") - 1
        shape = [len(np.arange(n)[i]) for i, n in zip(index, array.shape, strict=True)]
        out = np.empty(shape, array.value_dtype)
        group = self.group[segment]
        for g, reader in enumerate(self.readers):
            where = np.flatnonzero(group == g)
            if not len(where):
                continue
            chosen = list(index)
            chosen[axis] = index[axis] if len(where) == len(along) else along[where]
            raw = reader.read(tuple(chosen))
            for k in np.unique(segment[where]).tolist():
                mine = where[segment[where] == k]
                at = np.searchsorted(where, mine)
                cut = [slice(None)] * len(shape)
                cut[axis] = at
                put = [slice(None)] * len(shape)
                put[axis] = mine
                out[tuple(put)] = self.converted(k, raw[tuple(cut)])
        return out.reshape([n for n, d in zip(shape, dropped, strict=True) if not d])

    def converted(self, k: int, raw: np.ndarray) -> np.ndarray:
        """Segment ``k``'s stored values as they are shown."""
        if not self.segments.decoded:
            return raw
        attrs = self.attrs.get(k)
        if attrs is None:
            attrs = self.attrs[k] = reader_attrs(self.segments.encodings[k].attrs)
        return np.asarray(mask_and_scale(self.array.name, self.array.dims, attrs, raw).values)

"""Arrays stored in segments (:mod:`refgrid.model.segments`): how they are presented, and read.

A combine of files that store a variable in other ways gives it a *presentation* — the one
encoding every reader sees — chosen as xarray's ``open_mfdataset`` would see the files:

* **stored**: the segments differ only in how bytes are stored (byte order, codecs, a storage
  fill that decodes nothing) and every decoding attribute agrees. The values are the stored
  values, in their native type; the attributes (packing included) are the files'.
* **decoded**: packing, fill markers or the type differ. Each segment is masked and scaled
  by xarray's own decoder (:func:`refgrid.read.unpacked.decode_values`), in the type it
  gives for that file, and the values are shown in the type those promote to (float32
  beside float64 is float64, as ``xr.concat`` makes it), without packing attributes — bit
  for bit what xarray reads from each file.

A read splits the selection at segment boundaries along the segmented dimension, reads each
*storage group* (segments stored alike: usually all of them) through one
:class:`~refgrid.read.array.Reader` — so an archive of 10^4 files differing only in
``add_offset`` is one coalesced read — and converts each segment's part of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from refgrid.core.cf import PACKING_ATTRS
from refgrid.core.sources import SourceCheck
from refgrid.core.typed import Attributes, StorageOptions
from refgrid.core.util import same_value
from refgrid.grid.selection import normalize_selection
from refgrid.model.segments import Encoding, Segments
from refgrid.model.virtual import VirtualArray
from refgrid.read.unpacked import decode_values, plain_codec


def presentation(name: str, encodings: Sequence[Encoding], dims: tuple[str, ...],
                 attrs: Attributes) -> tuple[bool, np.dtype, object, Attributes]:
    """Whether segments of array ``name`` stored as ``encodings`` are shown decoded, and the
    type, fill value and attributes they are shown with (``attrs``: the combined array's)."""
    first = encodings[0]
    values = {_value_dtype(e.dtype) for e in encodings}
    if len(values) == 1 and all(same_value(dict(e.attrs), dict(first.attrs))
                                for e in encodings):
        dtype = values.pop()
        return False, dtype, first.fill_value, attrs
    types = [decode_values(name, dims, e.attrs, np.zeros((0,) * len(dims), _value_dtype(
        e.dtype))).dtype for e in encodings]
    dtype = np.result_type(*types)
    fill = np.nan if dtype.kind in "fc" else np.zeros((), dtype)[()]
    shown = {k: v for k, v in attrs.items() if k not in PACKING_ATTRS}
    return True, dtype, fill, shown


def _value_dtype(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=") if dtype.itemsize > 1 else dtype


def joined(parts: Sequence[VirtualArray], dim: str, attrs: Attributes) -> VirtualArray:
    """``parts`` (each uniform or itself in segments) joined along ``dim`` in segments,
    shown as :func:`presentation` decides; one encoding throughout is no segment at all."""
    pieces: list[tuple[VirtualArray, Encoding]] = []
    for part in parts:
        pieces.extend(_pieces(part))
    axis = parts[0].axis(dim)
    starts: list[int] = []
    encodings: list[Encoding] = []
    chunk = 0
    for piece, encoding in pieces:
        if not encodings or encoding != encodings[-1]:
            starts.append(chunk)
            encodings.append(encoding)
        chunk += piece.grid.chunk_counts[axis]
    first = pieces[0][0]
    aligned = [replace(p, dtype=first.dtype, codecs=first.codecs, fill_value=first.fill_value,
                       attrs=first.attrs) for p, _ in pieces]
    whole = VirtualArray.concat(aligned, dim)
    if len(encodings) == 1:
        only = encodings[0]
        return replace(whole, dtype=only.dtype, codecs=only.codecs,
                       fill_value=only.fill_value, attrs=attrs)
    decoded, dtype, fill, shown = presentation(whole.name, encodings, whole.dims, attrs)
    return replace(whole, dtype=dtype, codecs=(plain_codec(dtype),), fill_value=fill,
                   attrs=shown, segments=Segments(dim, tuple(starts), tuple(encodings),
                                                  decoded))


def _pieces(part: VirtualArray) -> list[tuple[VirtualArray, Encoding]]:
    """A part as its runs of one encoding each (itself, if it has no segments)."""
    segments = part.segments
    if segments is None:
        return [(part, Encoding.of(part.dtype, part.codecs, part.fill_value, part.attrs))]
    axis = part.axis(segments.dim)
    bounds = part.grid.axes[axis].bounds
    ranges = segments.chunk_ranges(part.grid.chunk_counts[axis])
    return [(replace(part, segments=None).slice(segments.dim, int(bounds[a]), int(bounds[b])),
             encoding) for (a, b), encoding in zip(ranges, segments.encodings, strict=True)]


class SegmentedReader:
    """Reads of one array in segments: the :class:`~refgrid.read.array.Reader` interface
    views and the engine use."""

    def __init__(self, array: VirtualArray, name: str,
                 storage_options: StorageOptions | None, check: SourceCheck | None) -> None:
        from refgrid.read.array import Reader

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
            stored = Encoding.of(e.dtype, e.codecs, e.fill_value, {})
            found = next((g for g, kind in enumerate(groups) if kind == stored), None)
            if found is None:
                found = len(groups)
                groups.append(stored)
            self.group[k] = found
        self.readers = [Reader(replace(array, dtype=g.dtype, codecs=g.codecs,
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
        encoding = self.segments.encodings[k]
        return decode_values(self.array.name, self.array.dims, encoding.attrs, raw)

"""Segments: runs of an array's chunks along one dimension, each stored in its own way.

An archive written by many tools over many years stores one variable in many ways: a year
re-saved by ``nccopy``, another converted to NETCDF3 (big-endian, uncompressed), compression
switched on later, float64 among float32, packing (``scale_factor``/``add_offset``) that
changes with every file. Each file decodes to values with the same meaning, so they make one
array — but one Zarr array has one encoding. A segmented array keeps each file's encoding
(:class:`Encoding`) for its run of chunks along the concatenated dimension, and declares a
*presented* encoding on the array itself (its ``dtype``, ``codecs``, ``fill_value`` and
``attrs``): what every reader sees, each chunk decoded with its own segment's encoding and
converted (:mod:`refgrid.read.segmented`). No byte is copied.

The model is the data only: which presentation an archive gets is decided by
:mod:`refgrid.model.presented`, and how a segment's values become the presented ones by the
reader (:mod:`refgrid.read.segmented`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from refgrid.codecs.filters import CodecJSON
from refgrid.core.cf import PACKING_ATTRS
from refgrid.core.dtypes import ATTRIBUTE_TYPES_ATTR
from refgrid.core.util import same_value
from refgrid.errors import ModelError


@dataclass(frozen=True, eq=False)
class Encoding:
    """How one segment's chunks are stored and what decodes them."""

    dtype: np.dtype
    codecs: tuple[CodecJSON, ...]
    fill_value: object
    attrs: Mapping[str, object]
    """Only what decodes the values: packing and fill markers, with their recorded numeric
    types (a plain dict: segments are pickled to workers)."""

    @classmethod
    def of(cls, dtype: np.dtype, codecs: Sequence[CodecJSON], fill_value: object,
           attrs: Mapping[str, object]) -> Encoding:
        kept = {k: v for k, v in attrs.items() if k in PACKING_ATTRS}
        types = attrs.get(ATTRIBUTE_TYPES_ATTR)
        if isinstance(types, Mapping) and (mine := {k: t for k, t in types.items()
                                                    if k in kept}):
            kept[ATTRIBUTE_TYPES_ATTR] = mine  # (the types of these only: not every attribute's)
        return cls(np.dtype(dtype), tuple(codecs), fill_value, kept)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Encoding) and self.dtype == other.dtype and same_value(
            [list(self.codecs), self.fill_value, dict(self.attrs)],
            [list(other.codecs), other.fill_value, dict(other.attrs)])

    __hash__ = None  # type: ignore[assignment]

    @property
    def storage(self) -> tuple[str, str, str]:
        """How chunks are stored — type, codecs, fill — as a key (segments stored alike are
        read together)."""
        return (self.dtype.str, json.dumps([dict(c) for c in self.codecs], sort_keys=True,
                                           default=str), repr(self.fill_value))


@dataclass(frozen=True, eq=False)
class Segments:
    """An array's segments along ``dim``: segment ``k`` holds the chunks from
    ``starts[k]`` up to the next start (the last one to the end), stored as
    ``encodings[k]``. Adjacent segments differ (equal ones are one segment)."""

    dim: str
    starts: tuple[int, ...]
    encodings: tuple[Encoding, ...]
    decoded: bool = False
    """How the array is shown (:mod:`refgrid.read.segmented`): each segment's values as
    xarray decodes them (packing, fill markers or types differ), else as stored."""

    def __post_init__(self) -> None:
        starts = np.asarray(self.starts)
        if len(self.starts) != len(self.encodings) or not self.starts or self.starts[0] != 0 \
                or (np.diff(starts) <= 0).any():
            raise ModelError(f"segments along {self.dim!r}: starts {self.starts!r:.80} do not "
                             f"begin at chunk 0 and increase, one per encoding "
                             f"({len(self.encodings)})")

    def __len__(self) -> int:
        return len(self.starts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Segments) and (self.dim, self.starts, self.decoded) == (
            other.dim, other.starts, other.decoded) and list(self.encodings) == list(
            other.encodings)

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def of_runs(cls, dim: str, runs: Sequence[tuple[int, Encoding]], decoded: bool = False
                ) -> Segments:
        """The segments of runs of chunks ``(first chunk, encoding)`` in order, adjacent
        runs of one encoding merged."""
        kept = [run for k, run in enumerate(runs) if k == 0 or run[1] != runs[k - 1][1]]
        return cls(dim, tuple(s for s, _ in kept), tuple(e for _, e in kept), decoded)

    def chunk_ranges(self, nchunks: int) -> list[tuple[int, int]]:
        """Each segment's chunks ``[first, stop)`` along :attr:`dim`, of ``nchunks``."""
        stops = [*self.starts[1:], nchunks]
        return list(zip(self.starts, stops, strict=True))

    def sliced(self, chunks: slice) -> Segments:
        """The segments of chunks ``chunks`` (a step-1 slice along :attr:`dim`) — one
        segment left is still a segment: the array's presentation stays what it was."""
        first, stop = chunks.start or 0, chunks.stop
        kept = [(max(s, first) - first, e) for (s, t), e in zip(
            self.chunk_ranges(stop), self.encodings, strict=True) if t > first and s < stop]
        if not kept:
            kept = [(0, self.encodings[-1])]
        return Segments(self.dim, tuple(s for s, _ in kept), tuple(e for _, e in kept),
                        self.decoded)

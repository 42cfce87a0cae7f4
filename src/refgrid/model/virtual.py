"""The in-memory model of a virtual dataset: arrays and groups over chunk manifests.

Scanners produce it, :mod:`refgrid.combining` joins it, writers serialise it. Attributes are kept
exactly as the source has them (CF attributes included) so that xarray decodes the virtual
dataset as it would decode the file. A scan never drops a variable quietly: what it could not
represent as plain references is a :class:`ReportEntry` in the group's report.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, cast

import numpy as np

from refgrid.codecs.filters import CodecJSON
from refgrid.core.reprs import Displayed
from refgrid.core.sources import PagedSources, SourceIdentity
from refgrid.core.util import FrozenPickle, same_value
from refgrid.errors import GridError, ModelError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import INLINE, ChunkManifest, ManifestBuilder
from refgrid.model.segments import Segments

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

INLINE_PIECE = 4096
"""Elements along its first dimension per chunk of an array refgrid stores inline (a concat
coordinate, re-encoded times; :func:`in_pieces`): an append rewrites the last piece only, not
24 MB of coordinate at 3·10^6 steps, and a followed archive's views serve pieces of this
length."""

Action = Literal["skipped", "inlined", "encoded", "attribute-skipped", "attribute-conflict",
                 "duplicate", "re-encoded", "filled", "from-name", "own-time", "dropped",
                 "segmented"]
"""What was done with something plain references cannot express (``attribute-conflict``:
combine kept the first file's value of an attribute that differs between files;
``re-encoded``: combine wrote times that files encode in other units in the first file's;
``duplicate``: a file named more than once was combined once; ``filled``: a variable absent
from some files reads as its fill value there; ``from-name``: files without a time took the
date their name gives, ``own-time``: files with one kept it, checked against their name —
``time_from``; ``dropped``: a scan left a variable unscanned as ``drop_variables`` asked, a
note :func:`~refgrid.model.choose.choose` takes off; ``segmented``: files store a variable in
other ways, each read by its own encoding — :mod:`refgrid.model.segments`)."""


@dataclass(frozen=True)
class ReportEntry:
    """One variable (or attribute) a scan or combine could not represent as plain references
    — skipped, or served another way (decoded and inlined, stored in a documented encoding) —
    with the reason, so a user can see exactly what the virtual dataset holds."""

    url: str
    variable: str
    action: Action
    reason: str

    def __str__(self) -> str:
        return f"{self.url}: {self.variable}: {self.action}: {self.reason}"


@dataclass(frozen=True, eq=False, repr=False)
class VirtualArray(Displayed, FrozenPickle):
    """One array: its metadata, its chunk grid and where its chunks live."""

    _display = "array"

    name: str
    dims: tuple[str, ...]
    dtype: np.dtype
    """The type as stored: its byte order is the chunks' (the ``bytes`` codec's ``endian``).
    Values are read as :attr:`value_dtype`."""
    grid: RectilinearGrid
    manifest: ChunkManifest
    fill_value: object = None
    codecs: tuple[CodecJSON, ...] = ()
    """Zarr v3 codec pipeline (JSON), array→bytes codec first as Zarr lists it."""
    attrs: Mapping[str, object] = field(default_factory=dict)
    segments: Segments | None = None
    """Where runs of chunks along one dimension are stored in their own ways (files written
    by other tools): then ``dtype``, ``codecs``, ``fill_value`` and ``attrs`` are what
    readers are shown, each chunk decoded by its segment's encoding (:mod:`.segments`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(self.dims))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "codecs", tuple(self.codecs))
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))
        if self.dtype.itemsize == 0:
            raise ModelError(f"array {self.name!r}: data type {self.dtype} has no bytes")
        if not all(isinstance(d, str) for d in self.dims):
            raise ModelError(f"array {self.name!r}: dimension names {self.dims!r:.80} are not "
                             "all strings")
        if len(self.dims) != self.grid.ndim:
            raise ModelError(f"array {self.name!r}: {len(self.dims)} dimension names "
                             f"{self.dims} for a {self.grid.ndim}-dimensional grid")
        if self.fill_value is not None and np.ndim(cast("ArrayLike", self.fill_value)) and \
                self.dtype.fields is None and self.dtype.kind != "V":  # (records: a tuple)
            raise ModelError(f"array {self.name!r}: fill value {self.fill_value!r:.80} is not "
                             f"one value of {self.dtype}")
        if self.manifest.shape != self.grid.chunk_counts:
            raise ModelError(f"array {self.name!r}: manifest of {self.manifest.shape} chunks "
                             f"for a grid of {self.grid.chunk_counts} chunks")
        if self.segments is not None and (
                self.segments.dim not in self.dims or self.segments.starts[-1]
                >= max(1, self.grid.chunk_counts[self.dims.index(self.segments.dim)])):
            raise ModelError(f"array {self.name!r}: segments along {self.segments.dim!r} "
                             f"do not fit its dimensions {self.dims} and chunks "
                             f"{self.grid.chunk_counts}")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.grid.shape

    @property
    def value_dtype(self) -> np.dtype:
        """The type values are read as: native byte order; strings and bytes as objects."""
        if self.dtype.kind in "OT":
            return np.dtype(object)
        if self.dtype.fields is None and self.dtype.itemsize > 1 and self.dtype.kind != "V":
            return self.dtype.newbyteorder("=")
        return self.dtype

    @property
    def inline_bytes(self) -> bool:
        """Whether the array is uncompressed inline chunks on a regular grid, whole but
        along the first dimension — so a piece of it is a slice of its bytes. (Its first
        and last chunks are looked at: a paged manifest loads no more.)"""
        grid = self.grid
        chunks = grid.chunk_shape
        if not grid.ndim or not grid.nchunks or chunks is None or \
                list(chunks[1:]) != [max(1, n) for n in self.shape[1:]] or \
                self.dtype.kind in "OT" or [c.get("name") for c in self.codecs] != ["bytes"]:
            return False
        ids = self.manifest.locate([0, grid.nchunks - 1]).path_id
        return bool((np.asarray(ids) == INLINE).all())

    @property
    def inline_pieces(self) -> bool:
        """Whether the array is stored as :func:`in_pieces` stores what refgrid inlines (a
        concat coordinate, times re-encoded, as :func:`refgrid.combine` stores them): its
        :attr:`inline_bytes` in pieces of :func:`piece_length` elements."""
        return self.inline_bytes and (self.grid.chunk_shape or (0,))[0] == \
            piece_length(self.shape[0])

    def axis(self, dim: str) -> int:
        try:
            return self.dims.index(dim)
        except ValueError:
            raise ModelError(f"array {self.name!r} has no dimension {dim!r} "
                             f"(dimensions: {self.dims})") from None

    def slice(self, dim: str, start: int, stop: int) -> VirtualArray:
        """The elements ``[start, stop)`` along ``dim``; ``start`` on a chunk boundary."""
        axis = self.axis(dim)
        try:
            grid, chunks = self.grid.slice(axis, start, stop)
        except GridError as e:
            raise ModelError(f"array {self.name!r}: {e}") from e
        segments = self.segments
        if segments is not None and segments.dim == dim:
            segments = segments.sliced(chunks)
        return replace(self, grid=grid, manifest=self.manifest.slice(axis, chunks),
                       segments=segments)

    @classmethod
    def concat(cls, arrays: Sequence[VirtualArray], dim: str) -> VirtualArray:
        """Join arrays along ``dim``; attributes are the first array's.

        Everything that would change how a chunk decodes or where it lands must agree, and
        every disagreement is reported, naming the position of the offending array.
        """
        if not arrays:
            raise ModelError("cannot concatenate an empty list of arrays")
        first = arrays[0]
        if any(a.segments is not None for a in arrays):
            raise ModelError(f"cannot concatenate array {first.name!r} along {dim!r}: it is "
                             "stored in segments (refgrid.combine joins those)")
        problems = [f"#{k} {p}" for k, a in enumerate(arrays[1:], start=1)
                    for p in _concat_conflicts(first, a)]
        if problems:
            raise ModelError(f"cannot concatenate array {first.name!r} along {dim!r}: "
                             + "; ".join(problems))
        axis = first.axis(dim)
        try:
            grid = RectilinearGrid.concat([a.grid for a in arrays], axis)
        except GridError as e:
            raise ModelError(
                f"cannot concatenate array {first.name!r} along {dim!r}: {e}") from e
        manifest = ChunkManifest.concat([a.manifest for a in arrays], axis)
        return replace(first, grid=grid, manifest=manifest)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VirtualArray):
            return NotImplemented
        return (self.name == other.name and self.dims == other.dims
                and self.dtype == other.dtype and self.grid == other.grid
                and self.manifest == other.manifest
                and same_value(self.fill_value, other.fill_value)
                and same_value(list(self.codecs), list(other.codecs))
                and same_value(dict(self.attrs), dict(other.attrs))
                and self.segments == other.segments)

    __hash__ = None  # type: ignore[assignment]


def _concat_conflicts(a: VirtualArray, b: VirtualArray) -> list[str]:
    checks = [
        ("dimensions", a.dims, b.dims, a.dims == b.dims),
        ("dtype", a.dtype, b.dtype, a.dtype == b.dtype),
        ("fill value", a.fill_value, b.fill_value, same_value(a.fill_value, b.fill_value)),
        ("codecs", list(a.codecs), list(b.codecs), same_value(list(a.codecs), list(b.codecs))),
    ]
    return [f"has {what} {vb!r}, #0 has {va!r}" for what, va, vb, ok in checks if not ok]


@dataclass(frozen=True, eq=False, repr=False)
class VirtualGroup(Displayed, FrozenPickle):
    """A group: attributes, arrays and child groups (NetCDF4 / HDF5 groups nest)."""

    _display = "group"

    attrs: Mapping[str, object] = field(default_factory=dict)
    arrays: Mapping[str, VirtualArray] = field(default_factory=dict)
    groups: Mapping[str, VirtualGroup] = field(default_factory=dict)
    report: tuple[ReportEntry, ...] = ()
    """What the scan could not express as references (not part of equality)."""
    sources: Mapping[str, SourceIdentity] = field(default_factory=dict)
    """Each source file's identity when it was scanned, by URL (kept on the root group; not
    part of equality)."""

    def __post_init__(self) -> None:
        for name in ("attrs", "arrays", "groups", "sources"):
            value = getattr(self, name)
            if not isinstance(value, PagedSources):  # (read when first asked for)
                object.__setattr__(self, name, MappingProxyType(dict(value)))
        clash = set(self.arrays) & set(self.groups)
        if clash:
            raise ModelError(f"names used for both an array and a group: {sorted(clash)}")

    def __getitem__(self, path: str) -> VirtualArray | VirtualGroup:
        """An array or group by ``/``-separated path relative to this group."""
        node: VirtualArray | VirtualGroup = self
        for part in [p for p in path.split("/") if p]:
            if not isinstance(node, VirtualGroup) or part not in {**node.arrays, **node.groups}:
                raise KeyError(f"no array or group {path!r}")
            node = node.arrays[part] if part in node.arrays else node.groups[part]
        return node

    def walk(self, prefix: str = "") -> Iterator[tuple[str, VirtualGroup | VirtualArray]]:
        """Every node below this group with its path, groups before their contents."""
        for name, array in self.arrays.items():
            yield f"{prefix}{name}", array
        for name, group in self.groups.items():
            yield f"{prefix}{name}", group
            yield from group.walk(f"{prefix}{name}/")

    def with_arrays(self, arrays: Mapping[str, VirtualArray], prefix: str = ""
                    ) -> VirtualGroup:
        """This group with the arrays at the given paths (relative to it) replaced."""
        if not arrays:
            return self
        mine = {name: arrays.get(prefix + name, array) for name, array in self.arrays.items()}
        groups = {name: child.with_arrays(arrays, f"{prefix}{name}/")
                  for name, child in self.groups.items()}
        return replace(self, arrays=mine, groups=groups)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VirtualGroup):
            return NotImplemented
        return (same_value(dict(self.attrs), dict(other.attrs))
                and dict(self.arrays) == dict(other.arrays)
                and dict(self.groups) == dict(other.groups))

    __hash__ = None  # type: ignore[assignment]


def piece_length(length: int) -> int:
    """The length along the first dimension of each piece :func:`in_pieces` stores for an
    array that long: :data:`INLINE_PIECE`, or the whole array where it is shorter."""
    return max(1, min(length, INLINE_PIECE))


def in_pieces(like: VirtualArray, data: bytes, shape: Sequence[int],
              piece: int) -> VirtualArray:
    """``like`` holding ``data`` (its stored bytes, C order, ``shape``: an array along a
    concat dimension, so of one dimension at least) as inline chunks of ``piece`` elements
    along the first dimension (whole along the others) on a regular grid; the last piece
    padded with zeros to full length, as a regular grid's last chunk is stored (no reader
    reads past the end; the appends that fill it rewrite it)."""
    shape = tuple(int(n) for n in shape)
    grid = RectilinearGrid.regular(shape, (piece, *(max(1, n) for n in shape[1:])))
    built = ManifestBuilder(grid.chunk_counts)
    size = piece * math.prod(shape[1:]) * like.dtype.itemsize
    rest = (0,) * (len(shape) - 1)
    for k in range(grid.chunk_counts[0] if math.prod(shape) else 0):
        chunk = data[k * size:(k + 1) * size]
        built.inlined((k, *rest), chunk + bytes(size - len(chunk)))
    return replace(like, grid=grid, manifest=built.build())

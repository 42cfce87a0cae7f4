"""HDF5 and NetCDF4 files → :class:`~refgrid.model.virtual.VirtualGroup`, through h5py.

Chunk positions come from ``DatasetID.chunk_iter`` (one pass over the chunk index, any index
type). What cannot be a byte-range reference is inlined and reported: compact layouts,
chunks that HDF5 stored with a filter skipped (``filter_mask``), variable-length data, and
data behind filters without a Zarr codec (decoded through h5py). Fixed-length strings read
as HDF5 reads them, through string codecs (C strings end at their NUL, space-padded ones
lose the spaces). NetCDF semantics are applied on top: dimension names from dimension scales
(or netCDF-C style phony names), hidden bookkeeping attributes, and variables shorter than
their unlimited dimension padded with fill values.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from operator import itemgetter
from typing import Protocol, cast

import h5py
import hdf5plugin  # noqa: F401  (registers plugin filters with h5py for decoded fallbacks)
import numcodecs
import numpy as np

from refgrid.codecs.filters import (
    CodecJSON,
    StringPad,
    UnsupportedFilter,
    bytes_codec,
    hdf5_pipeline,
    string_codecs,
)
from refgrid.codecs.pipeline import decode_chunk, encode_chunk
from refgrid.core.dtypes import (
    ENCODING_ATTR,
    STRING,
    VLEN_DTYPE_ATTR,
    storable,
)
from refgrid.core.typed import Attributes
from refgrid.core.util import gc_paused
from refgrid.errors import ScanError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import INLINE, MISSING, ChunkManifest, ManifestBuilder
from refgrid.model.virtual import ReportEntry, VirtualArray, VirtualGroup
from refgrid.scanners.attributes import typed_attributes
from refgrid.scanners.contiguous import rows_per_chunk
from refgrid.scanners.hdf5_encoding import enum_encoding, storage_encoding
from refgrid.scanners.options import ScanOptions
from refgrid.scanners.phony import PhonyNames
from refgrid.scanners.source import Source

HIDDEN_ATTRS = frozenset({"DIMENSION_LIST", "REFERENCE_LIST", "_Netcdf4Dimid",
                          "_Netcdf4Coordinates", "_NCProperties", "_nc3_strict",
                          "_SuperblockVersion", "_IsNetcdf4", "CLASS", "NAME"})
"""Attributes netCDF-C and h5netcdf reserve and never show (CLASS and NAME on any object)."""
DIM_WITHOUT_VARIABLE = b"This is a netCDF dimension but not a netCDF variable"
NON_COORD_PREFIX = "_nc4_non_coord_"
"""netCDF-C stores a multi-dimensional variable named like a dimension under this prefix."""
CHUNK_BATCH = 2048
"""Chunk records taken from h5py at a time (h5py makes a Python object per chunk)."""
FALLBACK_CODECS: tuple[CodecJSON, ...] = ({"name": "numcodecs.zlib",
                                           "configuration": {"level": 1}},)


Fill = np.generic | None
"""A dataset's fill value as a scalar of its type (None: HDF5 has none)."""


class _Skip(Exception):
    """A variable that has no Zarr representation: reported, never fatal."""


class _StoreInfo(Protocol):
    """h5py's ``StoreInfo`` (a named tuple), one per chunk from ``DatasetID.chunk_iter``."""

    chunk_offset: tuple[int, ...]
    filter_mask: int
    byte_offset: int
    size: int

    def __getitem__(self, index: int, /) -> object: ...


@dataclass
class _FileScan:
    source: Source
    options: ScanOptions
    report: list[ReportEntry] = field(default_factory=list)
    phony: PhonyNames = field(default_factory=PhonyNames)
    # keyed by h5py object ids, which hash and compare as the HDF5 object they name
    dim_lengths: dict[object, int] = field(default_factory=dict)
    scale_names: dict[object, dict[object, str]] = field(default_factory=dict)
    dimid_names: dict[object, dict[int, str]] = field(default_factory=dict)
    phony_unlimited: set[str] = field(default_factory=set)
    """Phony dimensions of axes with no maximum size (netCDF-C counts them unlimited)."""
    lineage: list[h5py.Group] = field(default_factory=list)

    # -- groups and attributes ------------------------------------------------------------

    def group(self, h5: h5py.Group, path: str) -> VirtualGroup:
        self.lineage.append(h5)
        try:
            return self._group(h5, path)
        finally:
            self.lineage.pop()

    def _group(self, h5: h5py.Group, path: str) -> VirtualGroup:
        arrays: dict[str, VirtualArray] = {}
        groups: dict[str, VirtualGroup] = {}
        unlimited: list[str] = []
        members = []
        for name in h5:
            where = f"{path}/{name}".lstrip("/")
            try:
                obj = h5.get(name)
            except (KeyError, OSError, RuntimeError, ValueError) as e:
                self._problem(where, f"cannot be opened: {e}")
                continue
            if obj is None:  # h5py's get() hides why: dangling link, damaged header, ...
                self._problem(where, f"cannot be opened ({_why_not(h5, name)})")
                continue
            members.append((name, where, obj))
        self.scale_names[h5.id] = {obj.id: name for name, _, obj in members if _is_scale(obj)}
        for name, where, obj in members:
            try:  # damaged metadata fails in h5py with any error: each is this object's
                if isinstance(obj, h5py.Group):
                    groups[name] = self.group(obj, where)
                    continue
                if isinstance(obj, h5py.Dataset) and _is_unlimited_dimension(obj):
                    unlimited.append(name)
                if isinstance(obj, h5py.Dataset) and not _is_hidden_dimension(obj):
                    shown = name.removeprefix(NON_COORD_PREFIX)  # netCDF-C's rename, undone
                    if self.options.drops(f"{path}/{shown}".lstrip("/")):
                        self._dropped(obj, shown, f"{path}/{shown}".lstrip("/"))
                        continue
                    arrays[shown] = self.array(obj, shown, where)
            except _Skip as e:
                self.report.append(ReportEntry(self.source.url, where, "skipped", str(e)))
            except ScanError as e:
                self._problem(e.variable or where, e.reason)
            except Exception as e:
                self._problem(where, f"{type(e).__name__}: {e}")
        attrs = self.attributes(h5, path or "/", hide=HIDDEN_ATTRS)
        unlimited += sorted({dim for a in arrays.values() for dim in a.dims
                             if dim in self.phony_unlimited} - set(unlimited))
        if unlimited:
            attrs[ENCODING_ATTR] = {"unlimited_dims": unlimited}
        return VirtualGroup(attrs, arrays, groups)

    def attributes(self, obj: h5py.HLObject, where: str, hide: Iterable[str]) -> Attributes:
        hidden = set(hide)
        return typed_attributes(((name, partial(obj.attrs.__getitem__, name))
                                 for name in obj.attrs if name not in hidden),
                                self.source.url, where, self.report)

    def _problem(self, where: str, reason: str) -> None:
        if self.options.on_error == "raise":
            raise ScanError(self.source.url, where, reason)
        self.report.append(ReportEntry(self.source.url, where, "skipped", reason))

    def _dropped(self, d: h5py.Dataset, name: str, where: str) -> None:
        """A variable ``drop_variables`` names: noted, not scanned — but its unnamed axes
        still named, so the other variables' phony dimensions are named as netCDF-C names
        them (a dimension list it cannot read names none)."""
        with contextlib.suppress(Exception):  # (damage there is no one's concern: dropped)
            if d.shape is not None:
                self.dimensions(d, name)
        self.report.append(ReportEntry(self.source.url, where, "dropped", "drop_variables"))

    # -- dimensions -----------------------------------------------------------------------

    def dimensions(self, d: h5py.Dataset, name: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Dimension names, and each dimension's length (a variable may be shorter)."""
        names: list[str] = []
        lengths: list[int] = []
        is_scale = h5py.h5ds.is_scale(d.id)
        dimids = _netcdf_dimids(d) if is_scale and len(d.shape) > 1 else None
        scales = [None] * len(d.shape) if is_scale else _first_scales(d)
        for axis, n in enumerate(d.shape):
            scale = scales[axis]
            by_id = self._dimid_name(dimids[axis]) if dimids is not None else None
            if is_scale and axis == 0:  # a coordinate: as long as its (unlimited) dimension
                names.append(name)
                lengths.append(max(n, self._dimension_length(d)))
            elif by_id is not None and by_id not in names:
                names.append(by_id)  # a scale cannot have scales attached: netCDF-C's ids
                lengths.append(n)
            elif scale is not None:
                names.append(self._scale_name(scale))
                lengths.append(max(n, self._dimension_length(scale)))
            else:
                names.append(self.phony.name(n, names))
                lengths.append(n)
                if d.maxshape and d.maxshape[axis] is None:
                    self.phony_unlimited.add(names[-1])
        return tuple(names), tuple(lengths)

    def _scale_name(self, scale: h5py.Dataset) -> str:
        """A dimension scale's name. Not ``scale.name``: for an object reached through a
        reference HDF5 searches the whole file for its path (12 ms per call on a file of
        2000 datasets). NetCDF dimensions live in the variable's group or an ancestor, so
        those groups' scales are listed as each group is entered and looked up by object
        identity."""
        for group in reversed(self.lineage):
            found = self.scale_names.get(group.id, {}).get(scale.id)
            if found is not None:
                return found
        return scale.name.rsplit("/", 1)[-1]

    def _dimid_name(self, dimid: int) -> str | None:
        """The dimension netCDF-C numbered ``dimid`` (its ``_Netcdf4Dimid``), looked up in
        the variable's group and its ancestors."""
        for group in reversed(self.lineage):
            key = group.id
            if key not in self.dimid_names:
                members = ((n, group.get(n)) for n in group)
                self.dimid_names[key] = {
                    int(obj.attrs["_Netcdf4Dimid"]): n for n, obj in members
                    if isinstance(obj, h5py.Dataset) and "_Netcdf4Dimid" in obj.attrs
                    and h5py.h5ds.is_scale(obj.id)}
            if dimid in self.dimid_names[key]:
                return self.dimid_names[key][dimid]
        return None

    def _dimension_length(self, scale: h5py.Dataset) -> int:
        """A dimension's length as netCDF-C computes it: the longest of the scale and every
        variable attached to it (an unlimited dimension grows with its longest variable)."""
        key = scale.id
        if key not in self.dim_lengths:
            length = scale.shape[0] if scale.shape else 0
            try:
                references = scale.attrs.get("REFERENCE_LIST", ())
                f = scale.file  # one File object for every reference
                for ref, axis in references:
                    shape = f[ref].shape
                    if shape is not None and axis < len(shape):
                        length = max(length, shape[axis])
            except (OSError, KeyError, TypeError, ValueError):
                pass  # a damaged reference list: fall back to the scale's own length
            self.dim_lengths[key] = length
        return self.dim_lengths[key]

    # -- arrays ---------------------------------------------------------------------------

    def array(self, d: h5py.Dataset, name: str, where: str) -> VirtualArray:
        dtype = d.dtype
        if h5py.check_ref_dtype(dtype) or _holds(dtype, lambda t: h5py.check_ref_dtype(t)):
            raise _Skip("object/region references have no Zarr representation")
        vlen = h5py.check_vlen_dtype(dtype)
        if dtype.fields is not None and _holds(dtype, h5py.check_vlen_dtype):
            raise _Skip("compound type with variable-length members has no Zarr representation")
        attrs = self.attributes(d, where, HIDDEN_ATTRS)
        encoding = storage_encoding(d, self.source.url)
        if h5py.check_enum_dtype(dtype) is not None and dtype != np.dtype(bool):
            encoding.update(enum_encoding(dtype, _type_name(d)))
            dtype = np.dtype(dtype.str)
        attrs[ENCODING_ATTR] = encoding
        if d.shape is None:  # null dataspace: no elements at all, a zero-size array
            dtype = storable(_bare(dtype))[0] if vlen is None else STRING
            codec = bytes_codec(dtype) if vlen is None else {"name": "vlen-utf8"}
            return VirtualArray(name, (self.phony.name(0, []),), dtype,
                                RectilinearGrid.regular([0], [1]), ChunkManifest.empty((0,)),
                                None, (codec,), attrs)
        dims, dim_lengths = self.dimensions(d, name)
        if vlen is not None:
            return _pad(self._vlen(d, name, where, dims, attrs, vlen), dim_lengths, d)
        if dtype.subdtype is not None:  # H5T_ARRAY: each element an array of its own
            raw = self._fixed(d, name, where, dims, np.dtype(f"V{dtype.itemsize}"), attrs)
            return self._subarray(_pad(raw, dim_lengths, d), *dtype.subdtype)
        stored, extra = storable(_bare(dtype))
        if extra:
            self.report.append(ReportEntry(self.source.url, where, "encoded",
                                           f"compound type {dtype} is stored as raw bytes; the "
                                           "record type is in attribute _refgrid_dtype"))
        array = self._fixed(d, name, where, dims, stored, {**attrs, **extra})
        return _pad(array, dim_lengths, d)

    def _fixed(self, d: h5py.Dataset, name: str, where: str, dims: tuple[str, ...],
               dtype: np.dtype, attrs: Attributes) -> VirtualArray:
        dcpl = d.id.get_create_plist()
        layout = dcpl.get_layout()
        fill = _fill_value(d, dtype)
        shape = d.shape
        strings = string_codecs(dtype.itemsize, _string_places(d.id.get_type()))
        base = (bytes_codec(dtype), *strings)
        if layout == h5py.h5d.VIRTUAL:
            raise _Skip("virtual datasets (VDS) are not supported")
        if dcpl.get_external_count():
            raise _Skip("data in external raw files is not supported")
        if layout == h5py.h5d.COMPACT:
            grid = RectilinearGrid.regular(shape, _one_chunk(shape))
            data = d[()] if d.size else np.zeros(shape, dtype)
            manifest = _inline_manifest(grid, {(0,) * len(shape): _raw(data, dtype)})
            return VirtualArray(name, dims, dtype, grid, manifest, fill, base, attrs)
        if layout == h5py.h5d.CONTIGUOUS:
            return self._contiguous(d, name, dims, dtype, fill, base, attrs)
        try:
            filters = [dcpl.get_filter(i)[::2] for i in range(dcpl.get_nfilters())]
            head, *compressors = hdf5_pipeline([f[:2] for f in filters], dtype)
            codecs = (head, *strings, *compressors)
        except UnsupportedFilter as e:
            return self._decoded_fallback(d, name, where, dims, dtype, fill, attrs, str(e))
        grid = RectilinearGrid.regular(shape, d.chunks)
        manifest = self._chunk_manifest(d, grid, dtype, fill, codecs)
        return VirtualArray(name, dims, dtype, grid, manifest, fill, codecs, attrs)

    def _contiguous(self, d: h5py.Dataset, name: str, dims: tuple[str, ...], dtype: np.dtype,
                    fill: Fill, codecs: tuple[CodecJSON, ...],
                    attrs: Attributes) -> VirtualArray:
        shape = d.shape
        rows = rows_per_chunk(shape, dtype.itemsize, self.options.contiguous_chunk_bytes)
        grid = RectilinearGrid.regular(shape, (rows, *shape[1:]) if shape else ())
        offset = d.id.get_offset()
        if offset is None or d.size == 0:
            return VirtualArray(name, dims, dtype, grid, ChunkManifest.empty(grid.chunk_counts),
                                fill, codecs, attrs)
        chunk_bytes = rows * math.prod(shape[1:]) * dtype.itemsize if shape else dtype.itemsize
        built = ManifestBuilder(grid.chunk_counts)
        flat = np.arange(math.prod(grid.chunk_counts), dtype=np.uint64)
        built.ranges(flat, built.url(self.source.url), offset + chunk_bytes * flat, chunk_bytes)
        return VirtualArray(name, dims, dtype, grid, built.build(), fill, codecs, attrs)

    def _chunk_manifest(self, d: h5py.Dataset, grid: RectilinearGrid, dtype: np.dtype,
                        fill: Fill, codecs: tuple[CodecJSON, ...]) -> ChunkManifest:
        counts = grid.chunk_counts
        built = ManifestBuilder(counts)
        url = built.url(self.source.url)
        flagged: list[np.ndarray] = []  # chunks to inline: filter-masked or small
        chunk = np.asarray(d.chunks, dtype=np.int64)
        batch: list[_StoreInfo] = []

        def flush() -> None:
            """Write a batch of h5py StoreInfo records (chunk_offset, filter_mask,
            byte_offset, size) into the columns; batches bound memory at 10^6 chunks."""
            n = len(batch)
            field = [np.fromiter(map(itemgetter(k), batch), dtype, n)  # C-level loops
                     for k, dtype in ((1, np.int64), (2, np.uint64), (3, np.uint64))]
            flat = np.fromiter(itertools.chain.from_iterable(map(itemgetter(0), batch)),
                               np.int64, n * len(chunk))
            coords = flat.reshape(n, len(chunk)) // chunk
            inside = (coords < np.asarray(counts)).all(axis=1)  # a shrunk dataset keeps chunks
            sizes_in = field[2][inside]
            built.ranges(np.ravel_multi_index(tuple(coords[inside].T), counts), url,
                         field[1][inside], sizes_in)
            masked = field[0][inside] != 0
            small = sizes_in < self.options.inline_threshold
            flagged.append(np.column_stack((coords[inside], masked))[masked | small])
            batch.clear()

        countdown = itertools.cycle(range(CHUNK_BATCH - 1, -1, -1)).__next__  # 0: batch full

        def visit(info: _StoreInfo, append: Callable[[_StoreInfo], None] = batch.append,
                  countdown: Callable[[], int] = countdown) -> None:
            append(info)  # (helpers as locals: this runs once per chunk)
            if not countdown():
                flush()

        with gc_paused():  # (no storage-size check first: it walks the chunk index too)
            d.id.chunk_iter(visit)
            if batch:
                flush()
        if flagged:
            rows = np.concatenate(flagged)
            masked_count = int(rows[:, -1].sum())
            if masked_count:
                self.report.append(ReportEntry(
                    self.source.url, d.name.lstrip("/"), "inlined",
                    f"{masked_count} chunks stored with filters skipped (filter_mask) "
                    "were re-encoded and inlined"))
            for c in rows[:, :-1]:
                key = tuple(int(v) for v in c)
                built.inlined(key, self._chunk_bytes(d, grid, key, dtype, fill, codecs))
        return built.build()

    def _subarray(self, raw: VirtualArray, base: np.dtype,
                  sub: tuple[int, ...]) -> VirtualArray:
        """An array of HDF5 array-typed elements as an array of ``base`` with the element's
        axes last: the bytes are the same, each chunk gains whole trailing axes."""
        if base.subdtype is not None or base.fields is not None or base.kind in "OV":
            raise _Skip(f"array elements of type {base} have no Zarr representation")
        dims = list(raw.dims)
        for n in sub:
            dims.append(self.phony.name(n, dims))
        grid = raw.grid
        lengths = [grid.lengths(k) for k in range(grid.ndim)] + [[n] for n in sub]
        encoded = [grid.encoded_lengths(k) for k in range(grid.ndim)] + [[n] for n in sub]
        manifest = raw.manifest.reshaped(raw.manifest.shape + (1,) * len(sub))
        fill = None
        if raw.fill_value is not None:
            values = np.frombuffer(np.asarray(raw.fill_value).tobytes(), base)
            fill = values[0] if (values == values[0]).all() else None
        return VirtualArray(raw.name, tuple(dims), base,
                            RectilinearGrid.from_lengths(lengths, encoded), manifest, fill,
                            (bytes_codec(base), *raw.codecs[1:]), raw.attrs)

    def _chunk_bytes(self, d: h5py.Dataset, grid: RectilinearGrid, coords: tuple[int, ...],
                     dtype: np.dtype, fill: Fill, codecs: tuple[CodecJSON, ...]) -> bytes:
        """A chunk encoded with the array's codecs, from values h5py decodes (which honours
        the chunk's filter mask)."""
        region = grid.chunk_region(coords)
        block = np.full(grid.encoded_chunk_shape(coords), fill, dtype=dtype)
        values = d[region]
        if dtype.kind == "V" and values.dtype != dtype:  # array-typed elements, as raw bytes
            flat = np.ascontiguousarray(values).reshape((*values.shape[:len(region)], -1))
            values = flat.view(dtype)[..., 0]
        block[tuple(slice(0, r.stop - r.start) for r in region)] = values
        return encode_chunk(block, codecs)

    def _decoded_fallback(self, d: h5py.Dataset, name: str, where: str, dims: tuple[str, ...],
                          dtype: np.dtype, fill: Fill, attrs: Attributes,
                          reason: str) -> VirtualArray:
        nbytes = d.size * dtype.itemsize
        if nbytes > self.options.fallback_inline_limit:
            raise ScanError(self.source.url, where, f"{reason}, and its {nbytes} decoded bytes "
                            f"exceed the inline limit ({self.options.fallback_inline_limit}); "
                            "raise fallback_inline_limit to inline it")
        codecs = (bytes_codec(dtype), *FALLBACK_CODECS)
        grid = RectilinearGrid.regular(d.shape, d.chunks or _one_chunk(d.shape))
        keys: list[tuple[int, ...]] = []
        if d.chunks is not None:
            infos: list[_StoreInfo] = []
            d.id.chunk_iter(infos.append)
            keys = [tuple(int(v) for v in np.asarray(i.chunk_offset) // np.asarray(d.chunks))
                    for i in infos]
        elif d.size:
            keys = [(0,) * len(d.shape)]
        inline = {key: self._chunk_bytes(d, grid, key, dtype, fill, codecs) for key in keys
                  if all(k < n for k, n in zip(key, grid.chunk_counts, strict=True))}
        self.report.append(ReportEntry(self.source.url, where, "inlined",
                                       f"{reason}: {len(inline)} chunks decoded through h5py "
                                       "and inlined"))
        return VirtualArray(name, dims, dtype, grid, _inline_manifest(grid, inline), fill,
                            codecs, attrs)

    def _vlen(self, d: h5py.Dataset, name: str, where: str, dims: tuple[str, ...],
              attrs: Attributes, base: type | np.dtype) -> VirtualArray:
        """Variable-length data is read now and inlined as one chunk (vlen-utf8/vlen-bytes)."""
        shape = d.shape
        grid = RectilinearGrid.regular(shape, _one_chunk(shape))
        values = np.asarray(d[()], dtype=object).reshape(shape)
        dtype: np.dtype
        codec: CodecJSON
        fill: str | bytes
        if base is str or (base is bytes and _all_utf8(values)):
            data = np.array([_text(v) for v in values.reshape(-1)], dtype=object).reshape(shape)
            dtype, codec, fill = STRING, {"name": "vlen-utf8"}, ""
        elif base is bytes:
            data, dtype, codec, fill = values, np.dtype("O"), {"name": "vlen-bytes"}, b""
        else:
            element = np.dtype(base).newbyteorder("<")
            data = np.array([np.asarray(v, dtype=element).tobytes() for v in values.reshape(-1)],
                            dtype=object).reshape(shape)
            dtype, codec, fill = np.dtype("O"), {"name": "vlen-bytes"}, b""
            attrs = {**attrs, VLEN_DTYPE_ATTR: element.str}
            self.report.append(ReportEntry(
                self.source.url, where, "encoded", "variable-length sequences are stored as "
                f"vlen-bytes of {element.str} elements (type in attribute {VLEN_DTYPE_ATTR})"))
        vlen_codec = (numcodecs.VLenUTF8() if codec["name"] == "vlen-utf8"
                      else numcodecs.VLenBytes())
        inline = {(0,) * len(shape): bytes(vlen_codec.encode(data.reshape(-1)))} if d.size else {}
        return VirtualArray(name, dims, dtype, grid, _inline_manifest(grid, inline), fill,
                            (codec,), attrs)


# -- helpers --------------------------------------------------------------------------------

def _why_not(group: h5py.Group, name: str) -> str:
    """Why ``group[name]`` cannot be opened, in HDF5's words."""
    link = group.get(name, getlink=True)
    if isinstance(link, h5py.SoftLink):
        return f"a soft link to {link.path!r}, which does not exist"
    if isinstance(link, h5py.ExternalLink):
        return f"an external link to {link.filename}:{link.path}, which cannot be opened"
    try:
        group[name]
    except (KeyError, OSError, RuntimeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return "h5py returns nothing for it"


def _is_unlimited_dimension(d: h5py.Dataset) -> bool:
    """A netCDF dimension that can grow: a dimension scale with no maximum size."""
    return bool(d.maxshape) and d.maxshape[0] is None and h5py.h5ds.is_scale(d.id)


def _type_name(d: h5py.Dataset) -> str | None:
    """The name of a dataset's committed (named) type, as netCDF-C names an enum type."""
    tid = d.id.get_type()
    if not tid.committed():
        return None
    name = h5py.h5i.get_name(tid)
    return name.decode("utf-8", "replace").rsplit("/", 1)[-1] if name else None


def _is_scale(obj: object) -> bool:
    """Whether ``obj`` is a dimension scale (False for one whose metadata cannot be read:
    its own scan reports that)."""
    try:
        return isinstance(obj, h5py.Dataset) and bool(h5py.h5ds.is_scale(obj.id))
    except (OSError, RuntimeError, ValueError, TypeError):
        return False


def _is_hidden_dimension(d: h5py.Dataset) -> bool:
    """netCDF-C's dimension scale for a dimension that has no coordinate variable."""
    name = d.attrs.get("NAME") if "NAME" in d.attrs else None
    return isinstance(name, bytes | np.bytes_) and bytes(name).startswith(DIM_WITHOUT_VARIABLE)


def _netcdf_dimids(d: h5py.Dataset) -> list[int] | None:
    """netCDF-C's dimension ids of a variable (``_Netcdf4Coordinates``), if it wrote them."""
    try:
        ids = [int(v) for v in np.asarray(d.attrs["_Netcdf4Coordinates"]).reshape(-1)]
    except (KeyError, OSError, TypeError, ValueError):
        return None
    return ids if len(ids) == len(d.shape) else None


def _first_scales(d: h5py.Dataset) -> list[h5py.Dataset | None]:
    """The first dimension scale attached to each axis, read from ``DIMENSION_LIST`` itself
    (once: h5py's ``d.dims`` iterates scales in libhdf5, which can hang on damaged metadata,
    and reads the attribute again for every axis)."""
    out: list[h5py.Dataset | None] = [None] * len(d.shape)
    try:
        entries = d.attrs["DIMENSION_LIST"]
        f = d.file
    except (KeyError, OSError, RuntimeError, TypeError, ValueError):
        return out
    for axis in range(len(out)):
        try:
            refs = entries[axis]
            scale = f[refs[0]] if len(refs) else None
        except (KeyError, IndexError, OSError, RuntimeError, TypeError, ValueError):
            continue
        out[axis] = scale if isinstance(scale, h5py.Dataset) else None
    return out


def _holds(dtype: np.dtype, test: Callable[[np.dtype], object]) -> bool:
    """Whether any (nested) member of a compound type passes ``test``."""
    if dtype.fields is None:
        return dtype.subdtype is not None and bool(test(dtype.subdtype[0]))
    return any(bool(test(f[0])) or _holds(f[0], test) for f in dtype.fields.values())


STRING_PADS: dict[int, StringPad] = {h5py.h5t.STR_NULLTERM: "nullterm",
                                     h5py.h5t.STR_NULLPAD: "nullpad",
                                     h5py.h5t.STR_SPACEPAD: "spacepad"}


def _string_places(tid: h5py.h5t.TypeID, offset: int = 0
                   ) -> dict[StringPad, list[tuple[int, int]]]:
    """Where an HDF5 type's fixed-length strings lie in each element — the type itself, a
    compound's members, an array type's elements, nested — by their padding: the bytes
    after a C string's NUL and a space-padded string's trailing spaces are not what HDF5
    reads (:func:`~refgrid.codecs.filters.string_codecs`)."""
    places: dict[StringPad, list[tuple[int, int]]] = {}
    kind = tid.get_class()
    if kind == h5py.h5t.STRING and not tid.is_variable_str():
        places[STRING_PADS.get(tid.get_strpad(), "unknown")] = [(offset, tid.get_size())]
    elif kind == h5py.h5t.COMPOUND:
        for k in range(tid.get_nmembers()):
            member = _string_places(tid.get_member_type(k), offset + tid.get_member_offset(k))
            for pad, found in member.items():
                places.setdefault(pad, []).extend(found)
    elif kind == h5py.h5t.ARRAY:
        base = tid.get_super()
        element = _string_places(base)
        size = base.get_size()
        for k in range(math.prod(tid.get_array_dims())):
            for pad, found in element.items():
                places.setdefault(pad, []).extend((offset + k * size + o, n) for o, n in found)
    return places


def _bare(dtype: np.dtype) -> np.dtype:
    """``dtype`` without the metadata h5py gives its members (a string's encoding, an
    enum's members), which numpy's record descriptions cannot hold and warn about."""
    if dtype.fields is not None and dtype.names is not None:
        return np.dtype({"names": list(dtype.names),
                         "formats": [_bare(dtype.fields[n][0]) for n in dtype.names],
                         "offsets": [dtype.fields[n][1] for n in dtype.names],
                         "itemsize": dtype.itemsize})
    if dtype.subdtype is not None:
        return np.dtype((_bare(dtype.subdtype[0]), dtype.subdtype[1]))
    return np.dtype(dtype.str) if dtype.metadata else dtype


def _fill_value(d: h5py.Dataset, dtype: np.dtype) -> Fill:
    """The value unallocated chunks read as: HDF5's fill value property, as netCDF-C and h5py
    both return it (netCDF-C sets it to the netCDF default when no _FillValue is given)."""
    try:
        value = d.fillvalue
    except (OSError, RuntimeError, TypeError, ValueError):  # "fill value is undefined"
        return None
    if dtype.kind == "V":
        raw = np.ascontiguousarray(value).tobytes()
        return np.frombuffer(raw, dtype)[0] if len(raw) == dtype.itemsize else None
    if dtype.fields is None:  # (a scalar: numpy's stubs type ``a[()]`` as an array)
        return cast(np.generic, np.asarray(value).astype(dtype)[()])
    return value


def _one_chunk(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The chunk shape of a grid that is one chunk (chunk lengths are at least 1)."""
    return tuple(max(n, 1) for n in shape)


def _raw(data: np.ndarray, dtype: np.dtype) -> bytes:
    return np.ascontiguousarray(np.asarray(data)).view(dtype).tobytes() \
        if dtype.kind == "V" else np.ascontiguousarray(np.asarray(data, dtype=dtype)).tobytes()


def _inline_manifest(grid: RectilinearGrid,
                     inline: dict[tuple[int, ...], bytes]) -> ChunkManifest:
    built = ManifestBuilder(grid.chunk_counts)
    for key, data in inline.items():
        built.inlined(key, data)
    return built.build()


def _pad(array: VirtualArray, lengths: tuple[int, ...], d: h5py.Dataset) -> VirtualArray:
    """Extend a variable shorter than its (unlimited) dimensions to their lengths.

    The part beyond the variable's extent reads as the fill value. Where the stored edge
    chunks already hold the fill value in their padding (netCDF-C writes it there), they are
    simply read further and the grid stays regular; otherwise their padding is cut off and
    the grid becomes rectilinear. Either way, every value is exactly what netCDF-C returns.
    """
    for axis, target in enumerate(lengths):
        have = array.shape[axis]
        if target <= have:
            continue
        grid = array.grid
        if grid.chunk_counts[axis] and _edge_padding_is_fill(array, axis, d):
            last = grid.chunk_counts[axis] - 1
            room = target - int(grid.bounds(axis)[last])
            reach = min(int(grid.encoded_lengths(axis)[last]), room)
            lengths_axis = grid.lengths(axis).copy()
            lengths_axis[last] = reach
            grid = RectilinearGrid.from_lengths(
                [lengths_axis if k == axis else grid.lengths(k) for k in range(grid.ndim)],
                [grid.encoded_lengths(k) for k in range(grid.ndim)])
            array = replace(array, grid=grid)
            have = grid.shape[axis]
            if target == have:
                continue
        chunks = [int(e[0]) if len(e) else 1
                  for e in (grid.encoded_lengths(k) for k in range(grid.ndim))]
        shape = list(array.shape)
        shape[axis] = target - have
        filler_grid = RectilinearGrid.regular(shape, chunks)
        filler = replace(array, grid=filler_grid,
                         manifest=ChunkManifest.empty(filler_grid.chunk_counts))
        array = VirtualArray.concat([array, filler], array.dims[axis])
    return array


def _edge_padding_is_fill(array: VirtualArray, axis: int, d: h5py.Dataset) -> bool:
    """Whether every stored chunk at the end of ``axis`` holds the fill value beyond the
    variable's extent (decoded here: a handful of chunks)."""
    if array.fill_value is None or array.dtype.kind in "OTV" or d.chunks is None:
        return False
    grid, manifest = array.grid, array.manifest
    last = grid.chunk_counts[axis] - 1
    kept = int(grid.lengths(axis)[last])
    if kept == int(grid.encoded_lengths(axis)[last]):
        return True
    slab = np.take(manifest.path_id, [last], axis=axis)
    for rest in np.argwhere(slab != MISSING):
        coords = tuple(int(c) for c in rest)
        coords = (*coords[:axis], last, *coords[axis + 1:])
        if manifest.path_id[coords] == INLINE:
            data = manifest.inline[coords]
        else:
            start = tuple(c * n for c, n in zip(coords, d.chunks, strict=True))
            data = d.id.read_direct_chunk(start)[1]
        block = decode_chunk(data, array.codecs, array.dtype, grid.encoded_chunk_shape(coords))
        padding = np.take(block, np.arange(kept, block.shape[axis]), axis=axis)
        if not np.array_equal(padding, np.full_like(padding, array.fill_value), equal_nan=True):
            return False
    return True


def _all_utf8(values: np.ndarray) -> bool:
    try:
        for v in values.reshape(-1):
            if isinstance(v, bytes):
                v.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def scan_hdf5(source: Source, options: ScanOptions) -> VirtualGroup:
    """Scan one HDF5/NetCDF4 file."""
    identity = source.identity
    with source.open() as handle:
        try:
            f = h5py.File(handle, "r")
        except OSError as e:
            raise ScanError(source.url, None, f"not a readable HDF5 file: {e}") from e
        with f:
            scan = _FileScan(source, options)
            root = scan.group(f, "")
    return replace(root, report=tuple(scan.report),
                   sources={source.url: source.settled(identity)})

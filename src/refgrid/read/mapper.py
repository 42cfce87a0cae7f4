"""A read-only fsspec filesystem serving a *regular-grid* Zarr v3 view of any refgrid dataset.

Stock zarr 3.1 cannot read rectilinear grids, and reads archives of small chunks slowly. Through
this view it reads every refgrid dataset, fast: each view chunk is decoded and assembled by
refgrid's read path from the native chunks it covers and served uncompressed. View chunks are

* by default (``chunks="auto"``) blocks of whole native chunks sized by a cost model
  (:mod:`refgrid.read.view_chunks`), so zarr makes few calls without decoding much it was
  not asked for;
* with ``chunks="native"`` the native chunks themselves (along an irregular dimension the
  most common native length), a missing native chunk a missing view chunk;
* with ``chunks={"time": 30}`` the lengths given, the other dimensions as ``"native"``.

The root ``zarr.json`` carries consolidated metadata, so opening costs one request.

    mapper = refgrid.get_mapper("refs.json")
    ds = xr.open_dataset(mapper, engine="zarr")
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numcodecs
import numpy as np
from fsspec import AbstractFileSystem
from fsspec.mapping import FSMap

from refgrid.codecs.filters import CodecJSON, bytes_codec
from refgrid.core.dtypes import (
    DTYPE_ATTR,
    ENCODING_ATTR,
    original_dtype,
    reader_attrs,
    zarr_records,
)
from refgrid.core.keys import chunk_of_key, document_node
from refgrid.core.sources import SourceCheck
from refgrid.errors import FormatError, RefgridError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import MISSING, ChunkManifest
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import (
    ArrayDocument,
    Document,
    array_document,
    consolidated,
    group_document,
)
from refgrid.read.array import Reader, read_fill
from refgrid.read.view_chunks import ViewChunks, view_chunks
from refgrid.scan import Input, scan


@dataclass(frozen=True)
class _View:
    """How one array is served: in its native chunks or re-chunked to a regular grid,
    optionally CF-unpacked. Chunks are always decoded by refgrid and served uncompressed, so
    a chunk that does not decode is a :class:`refgrid.ReadError` naming it, not an error
    from inside zarr."""

    array: VirtualArray
    chunk_shape: tuple[int, ...]
    native: bool
    """The view's chunks are the native ones (a missing native chunk is a missing file)."""
    unpacked: bool = False
    """Served as xarray unpacks it (masked, scaled) rather than as stored."""
    records: np.dtype | None = None
    """Records stored as raw bytes, served typed (packed, little-endian fields)."""

    def document(self) -> ArrayDocument:
        grid = RectilinearGrid.regular(self.array.shape, self.chunk_shape)
        if self.unpacked:
            return array_document(replace(unpacked_array(self.array), grid=grid,
                                          manifest=_empty_manifest(self.array.shape,
                                                                   self.chunk_shape)))
        if self.records is not None:
            dtype, fill = self.records, None
            attrs = {k: v for k, v in _readable_attrs(self.array).items() if k != DTYPE_ATTR}
        else:
            dtype, fill = self.array.dtype if self.array.dtype.kind in "OT" else \
                self.array.value_dtype, self.array.fill_value
            attrs = _readable_attrs(self.array)
        view = VirtualArray(self.array.name, self.array.dims, dtype, grid,
                            _empty_manifest(self.array.shape, self.chunk_shape),
                            fill, (_plain_codec(dtype),), attrs)
        return array_document(view)


def _readable_attrs(array: VirtualArray) -> dict[str, Any]:
    """The attributes, less a ``_FillValue`` an integer array cannot hold (NaN, say): xarray
    drops it with a warning reading the source file, but fails on it reading zarr."""
    attrs = {k: v for k, v in array.attrs.items() if k != ENCODING_ATTR}  # engine-only facts
    fill = attrs.get("_FillValue")
    if array.dtype.kind in "iu" and isinstance(fill, float) and not fill.is_integer():
        del attrs["_FillValue"]
    return attrs


def packed(array: VirtualArray) -> bool:
    return "scale_factor" in array.attrs or "add_offset" in array.attrs


def unpacked_array(array: VirtualArray) -> VirtualArray:
    """``array`` as served unpacked (its documents' view): the type xarray unpacks it to,
    NaN for a fill value, plain little-endian bytes, no packing attributes."""
    template = _unpack(array, np.zeros((0,) * array.grid.ndim, array.value_dtype))
    attrs = {k: v for k, v in array.attrs.items() if k not in template.encoding}
    return replace(array, dtype=template.dtype, fill_value=np.nan,
                   codecs=(_plain_codec(template.dtype),), attrs=attrs)


def unpack_values(array: VirtualArray, values: np.ndarray) -> np.ndarray:
    """``values`` of ``array`` as stored, masked and scaled as xarray unpacks them."""
    return np.asarray(_unpack(array, values).values)


def _unpack(array: VirtualArray, values: np.ndarray) -> Any:
    """``values`` masked and scaled by xarray itself, with the attribute types the source
    file had (so int16 packed with float32 factors unpacks to float32, as from the file)."""
    from xarray import Variable, conventions

    attrs = reader_attrs(array.attrs)
    return conventions.decode_cf_variable(array.name, Variable(array.dims, values, attrs),
                                          mask_and_scale=True, decode_times=False,
                                          decode_timedelta=False, concat_characters=False)


def _plain_codec(dtype: np.dtype) -> CodecJSON:
    if dtype.kind in "OT":
        return {"name": "vlen-utf8" if dtype.kind == "T" else "vlen-bytes"}
    return bytes_codec(dtype.newbyteorder("<") if dtype.itemsize > 1 and dtype.kind != "V"
                       else dtype)


def _empty_manifest(shape: tuple[int, ...], chunks: tuple[int, ...]) -> ChunkManifest:
    return ChunkManifest.empty(RectilinearGrid.regular(shape, chunks).chunk_counts)


class RegularViewFileSystem(AbstractFileSystem):
    """``zarr.json`` documents and chunks of the regular view, as files (read-only)."""

    protocol = "refgrid-view"
    cachable = False
    async_impl = True
    asynchronous = True
    """zarr 3.1 awaits the coroutines below directly; a plain (sync) filesystem it would wrap
    to run every chunk in a thread of its own, several times slower for small chunks and in
    a convoy for the GIL. Chunks are assembled in the caller's loop, one at a time; a large
    one is decoded on refgrid's own threads."""

    def __init__(self, group: VirtualGroup, chunks: ViewChunks = "auto",
                 storage_options: dict[str, Any] | None = None, unpack: bool = False,
                 verify_sources: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source_options = storage_options or {}  # not storage_options: fsspec overwrites that
        self.check = SourceCheck(group.sources, self.source_options) \
            if verify_sources and group.sources else None
        self.views: dict[str, _View] = {}
        self.readers: dict[str, Reader] = {}
        self.groups: dict[str, VirtualGroup] = {"": group}
        for path, node in group.walk():
            if isinstance(node, VirtualGroup):
                self.groups[path] = node
            else:
                shape, native = view_chunks(node, chunks)
                records = zarr_records(original_dtype(node.attrs, node.value_dtype)) \
                    if DTYPE_ATTR in node.attrs else None
                self.views[path] = _View(node, shape, native, unpack and packed(node), records)
        self.documents: dict[str, Document] = {path: group_document(g)
                                               for path, g in self.groups.items()}
        self.documents.update({path: v.document() for path, v in self.views.items()})
        self.documents[""] = consolidated(group_document(group), self.documents)  # type: ignore[assignment]

    # -- files ------------------------------------------------------------------------------

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        data = self._content(self._strip_protocol(path).strip("/"))
        return data[start:end]

    def _content(self, key: str) -> bytes:
        node = document_node(key)
        if node is not None:
            if node in self.documents:
                return json.dumps(self.documents[node]).encode()
            raise FileNotFoundError(key)
        found = chunk_of_key(key, self.views)
        if found is None:
            raise FileNotFoundError(key)
        array, tail = found
        try:
            coords = tuple(int(c) for c in tail.split("/")) if tail else ()
        except ValueError:
            raise FileNotFoundError(key) from None
        return self._chunk(array, coords)

    def _chunk(self, path: str, coords: tuple[int, ...]) -> bytes:
        view = self.views[path]
        array = view.array
        if len(coords) != array.grid.ndim:
            raise FileNotFoundError(path)
        if view.native:
            try:
                missing = array.manifest.path_id[coords] == MISSING
            except IndexError:
                raise FileNotFoundError(path) from None
            if missing:
                raise FileNotFoundError(path)  # zarr reads the fill value
        region = tuple(slice(c * n, min((c + 1) * n, size))
                       for c, n, size in zip(coords, view.chunk_shape, array.shape, strict=True))
        if any(r.start >= r.stop for r in region) and array.shape:
            raise FileNotFoundError(path)
        reader = self.readers.get(path)
        if reader is None:
            reader = self.readers[path] = Reader(array, path, self.source_options, self.check)
        values = reader.read(region)
        fill = read_fill(array)
        if view.records is not None:
            values = values.view(original_dtype(array.attrs, array.value_dtype))
            values, fill = values.astype(view.records), np.zeros((), view.records)[()]
        if view.unpacked:
            values, fill = unpack_values(array, values), np.nan
        block = np.full(view.chunk_shape, fill, dtype=values.dtype)
        block[tuple(slice(0, r.stop - r.start) for r in region) or ...] = values  # (0-d too)
        if values.dtype.kind == "O":
            codec = numcodecs.VLenUTF8() if array.dtype.kind == "T" else numcodecs.VLenBytes()
            return bytes(codec.encode(block.reshape(-1)))
        return np.ascontiguousarray(block, dtype=block.dtype.newbyteorder("<")
                                    if block.dtype.itemsize > 1 and block.dtype.kind != "V"
                                    else block.dtype).tobytes()

    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None,
                        **kwargs: Any) -> bytes:
        return self.cat_file(path, start, end)

    async def _cat_ranges(self, paths: list[str], starts: list[int | None],
                          ends: list[int | None], on_error: str = "return",
                          **kwargs: Any) -> list[Any]:
        out: list[Any] = []
        for path, start, end in zip(paths, starts, ends, strict=True):
            try:
                out.append(self.cat_file(path, start, end))
            except FileNotFoundError as e:
                if on_error != "return":
                    raise
                out.append(e)
        return out

    async def _exists(self, path: str, **kwargs: Any) -> bool:
        return self.exists(path)

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self.info(path)

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        return self.ls(path, detail)

    async def _find(self, path: str, **kwargs: Any) -> Any:
        return self.find(path, **kwargs)

    # -- listing ----------------------------------------------------------------------------

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        key = self._strip_protocol(path).strip("/")
        if key in self.groups or key in self.views:
            return {"name": key, "size": 0, "type": "directory"}
        try:
            return {"name": key, "size": len(self._content(key)), "type": "file"}
        except FileNotFoundError:
            raise FileNotFoundError(path) from None

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        key = self._strip_protocol(path).strip("/")
        if key not in self.groups and key not in self.views:
            raise FileNotFoundError(path)
        prefix = f"{key}/" if key else ""
        names = [f"{prefix}zarr.json"]
        if key in self.groups:
            group = self.groups[key]
            names += [f"{prefix}{n}" for n in (*group.arrays, *group.groups)]
        entries = [self.info(n) for n in names]
        return entries if detail else [e["name"] for e in entries]


def get_mapper(refs: Input, chunks: ViewChunks = "auto",
               storage_options: dict[str, Any] | None = None, unpack: bool = False,
               allowed_sources: Sequence[str] | None = None,
               verify_sources: bool = True) -> FSMap:
    """An fsspec mapper with a regular-grid Zarr v3 view of a refgrid dataset.

    ``refs``: a reference dict, or a path/URL to JSON or parquet references or a Zarr v3
    store. ``chunks``: the view's chunks — ``"auto"`` (blocks of native chunks sized for
    stock zarr), ``"native"``, or a length per dimension name (see the module docstring).
    ``storage_options`` reach the references and the source files. ``unpack=True`` serves
    packed variables (``scale_factor``/``add_offset``) already unpacked and masked, exactly
    as xarray unpacks the source files: stock xarray cannot do that itself, since JSON
    attributes lose their float32 type and it would unpack in float64. Their raw values are
    then not available through the view.
    ``allowed_sources``: prefixes the files named by references must lie under (see
    :func:`refgrid.scan`). ``verify_sources``: check each source's recorded identity before
    its first read (see the engine).
    """
    group = scan(refs, allowed_sources=allowed_sources, **(storage_options or {}))
    try:
        view = RegularViewFileSystem(group, chunks, storage_options, unpack, verify_sources)
    except RefgridError:
        raise
    except Exception as e:  # metadata the scan accepted but no Zarr document can hold
        where = "<references>" if isinstance(refs, Mapping) else os.fspath(refs)
        raise FormatError(where, None, f"cannot be served as Zarr: {type(e).__name__}: "
                          f"{e}") from e
    return view.get_mapper("")

"""DMR++ (OPeNDAP Hyrax's chunk index) → the model, without opening the granule.

NASA's Earthdata Cloud publishes beside each granule a DMR++ document: the DAP4 metadata
(groups, dimensions, variables, attributes) with, for each variable, its storage — chunk
offsets and sizes in the data file, filters, fill value, byte order — written by Hyrax's
``build_dmrpp`` (HDF5, NetCDF4) and ``build_dmrpp_h4`` (HDF4, HDF-EOS2). One read of the
document gives what a scan of the granule gives; the data file is asked for its identity
only (one ``HEAD``), never read.

What the document describes maps onto what the HDF5 scanner builds:

- DAP4 atomic types (``byteOrder="BE"``: big-endian types, as HDF4 stores everything),
  ``Char`` as one-byte strings, enumerations as their base type, fixed-length strings
  (``dmrpp:FixedLengthStringArray``; in older documents, strings whose chunks show a fixed
  length) as bytes, read as HDF5 reads them (C strings through ``refgrid.nullterm``,
  space-padded ones through ``refgrid.spacepad``, padding unknown through
  ``refgrid.anypad``); variable-length strings held in the document (``dmrpp:compact``,
  ``dmrpp:vlsa``) inlined;
- shared dimensions (``<Dimension>``) by name, anonymous ones (``<Dim size>``) as netCDF-C's
  ``phony_dim_N``;
- layouts: chunked (chunks absent from the index read as the fill value), contiguous (one
  block, cut into virtual chunks; several blocks, one chunk each where they hold whole rows),
  compact and ``dmrpp:missingdata`` (values in the document: inlined);
- filters, in the order the document lists them (the order they were applied): deflate,
  shuffle, fletcher32, by the HDF5 filter table (:func:`~refgrid.codecs.filters.hdf5_pipeline`);
  any other is refused by name for that variable.

Where the data is: ``dmrpp:href`` (and a chunk's own ``href``) kept when it is an absolute URL;
a relative path or Hyrax's placeholder ``OPeNDAP_DMRpp_DATA_ACCESS_URL`` is the data file
beside the document (its name without ``.dmrpp``), or ``data_url`` (a URL, or a template
whose ``{name}`` is that name).

The document is untrusted: parsed by ``defusedxml`` (no DTD, no entities, nothing external
read), at most :data:`DOCUMENT_LIMIT` bytes; text before the XML declaration, chunks off the
grid or past the data file's end and numbers that overflow are a :class:`FormatError` naming
the document, the variable and the reason.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import math
import posixpath
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Literal

import numpy as np

from refgrid.codecs.filters import (
    CodecJSON,
    UnsupportedFilter,
    bytes_codec,
    hdf5_pipeline,
    string_codecs,
)
from refgrid.core.dtypes import STRING, recast_fill, storable
from refgrid.core.formats import input_format, stem
from refgrid.core.sources import SourceIdentity
from refgrid.core.typed import Attributes
from refgrid.core.util import import_extra
from refgrid.errors import AccessError, FormatError, ModelError, NotFoundError, ScanError
from refgrid.grid.rectilinear import AxisChunks, RectilinearGrid
from refgrid.model.manifest import MISSING, ChunkManifest, ManifestBuilder
from refgrid.model.virtual import ReportEntry, VirtualArray, VirtualGroup
from refgrid.scanners.allowed import check_url
from refgrid.scanners.attributes import typed_attributes
from refgrid.scanners.contiguous import rows_per_chunk
from refgrid.scanners.options import ScanOptions
from refgrid.scanners.phony import PhonyNames
from refgrid.scanners.source import HEAD_BLOCK, Source

if TYPE_CHECKING:
    from xml.etree.ElementTree import Element

    from refgrid.codecs.filters import StringPad

DAP4 = ("http://xml.opendap.org/ns/DAP/4.0#", "https://xml.opendap.org/ns/DAP/4.0#")
DMRPP = ("http://xml.opendap.org/dap/dmrpp/1.0.0#", "https://xml.opendap.org/dap/dmrpp/1.0.0#")
"""The namespaces (Hyrax has written both schemes)."""
PLACEHOLDER = "OPeNDAP_DMRpp_DATA_ACCESS_URL"
DOCUMENT_LIMIT = 2**28
"""Bytes of one document read at most (a granule of 10^6 chunks has a document of ~100 MB)."""
INLINE_LIMIT = 2**26
"""Decoded bytes of values one document may hold itself (compact, missing data, strings),
in all."""
ATOMIC = {"Byte": "u1", "UInt8": "u1", "Int8": "i1", "Int16": "i2", "UInt16": "u2",
          "Int32": "i4", "UInt32": "u4", "Int64": "i8", "UInt64": "u8", "Float32": "f4",
          "Float64": "f8", "Char": "S1"}
"""DAP4 atomic types → numpy (byte order from the storage's ``byteOrder``)."""
TEXT = frozenset({"String", "URL"})
STRING_PADS: dict[str, StringPad] = {"null_term": "nullterm", "null_pad": "nullpad",
                                     "space_pad": "spacepad"}
"""``FixedLengthStringArray``'s ``pad`` → HDF5's string paddings (another: unknown)."""
HEAP_REFERENCE_SIZES = frozenset({10, 12, 16, 24})
"""Bytes an element of variable-length strings takes in a chunk (a reference into the file's
heap: its length, 4 bytes, the heap collection's address, 2, 4, 8 or 16 bytes, the object's
index, 4)."""
UNSUPPORTED = {"Sequence": "DAP4 Sequence", "Opaque": "DAP4 Opaque"}
VARIABLES = frozenset({*ATOMIC, *TEXT, "Enum", "Structure", *UNSUPPORTED})
"""The elements that are variables."""
FILTERS = {"deflate": 1, "shuffle": 2, "fletcher32": 3}
"""DMR++ filter names → HDF5 filter ids (:data:`refgrid.codecs.filters.HDF5_FILTERS`)."""
STORAGE = frozenset({"chunks", "chunk", "compact", "missingdata", "vlsa",
                     "FixedLengthStringArray"})
"""The storage elements of a variable (in the DMR++ namespace)."""
DATA_FILES = 16
"""Distinct data files one document's chunks may name (each is asked its identity)."""
HIDDEN = frozenset({"build_dmrpp_metadata", "fullnamepath", "origname", "DIMENSION_LIST",
                    "REFERENCE_LIST", "_Netcdf4Dimid", "_Netcdf4Coordinates", "_NCProperties",
                    "_nc3_strict", "_SuperblockVersion", "_IsNetcdf4", "CLASS", "NAME"})
"""Attributes that are not the granule's: Hyrax's own (its build, the file's names before
it made them DAP4 names), and the ones netCDF-C reserves and never shows, which Hyrax copies
from the HDF5 file (as the HDF5 scanner hides them)."""
HIDDEN_PREFIX = "dmr_"
"""Hyrax's bookkeeping of HDF4 objects (``dmr_sds_ref``, ``dmr_vdata_ref``)."""
_POSITION = re.compile(r"^\[\s*(\d+(?:\s*,\s*\d+)*)?\s*\]$")


class _Skip(Exception):
    """A variable the document describes that refgrid cannot represent (reported)."""


def scan_dmrpp(source: Source, options: ScanOptions) -> VirtualGroup:
    """The model of the granule the DMR++ document at ``source`` describes."""
    text = _document(source)
    root = _parse(text, source.url)
    href = next((root.get(f"{{{ns}}}href") for ns in DMRPP if root.get(f"{{{ns}}}href")),
                None)
    if href is None:
        raise FormatError(source.url, None, "the Dataset has no dmrpp:href: no data file")
    scan = _Scan(source, options, _data_url(href, source, options.data_url), href)
    scan.declare(root, "")
    group = scan.group(root, "")
    try:
        identities = {url: scan.identity(url) for url in scan.urls}
    except NotFoundError as e:
        raise NotFoundError(e.url, None, f"the data file {source.url} describes (its "
                            f"dmrpp:href is {href!r}) is not found: pass data_url= "
                            "(--data-url) where it lies elsewhere") from e
    for url, (end, where) in scan.ends.items():
        size = identities[url]["size"]
        if end > size:
            raise FormatError(source.url, where, f"a chunk ends at byte {end}, past the end of "
                              f"the data file {url} ({size} bytes)")
    return replace(group, report=tuple(scan.report), sources=identities)


def _document(source: Source) -> bytes:
    """The whole document: the block its format was told from, where it is that small (one
    request in all), else the rest read once; refused past the limit."""
    data = source.head(HEAD_BLOCK)
    if len(data) == HEAD_BLOCK:
        data += source.read_at(HEAD_BLOCK, DOCUMENT_LIMIT + 1 - HEAD_BLOCK)
    if len(data) > DOCUMENT_LIMIT:
        raise FormatError(source.url, None, f"a DMR++ document of more than {DOCUMENT_LIMIT} "
                          "bytes (the most read)")
    return data


def _parse(text: bytes, url: str) -> Element:
    defused = import_extra("defusedxml.ElementTree", "dmrpp", "reading DMR++ documents")
    refused = import_extra("defusedxml", "dmrpp", "reading DMR++ documents").DefusedXmlException
    start = text.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not start.startswith(b"<"):
        shown = start[:40].decode("utf-8", "replace")
        raise FormatError(url, None, f"text before the XML declaration ({shown!r}...): not a "
                          "DMR++ document as Hyrax writes one")
    try:
        root = defused.fromstring(start, forbid_dtd=True, forbid_entities=True,
                                  forbid_external=True)
    except refused as e:
        raise FormatError(url, None, f"refused: {e} (a DMR++ document has no DTD or entities)") \
            from e
    except Exception as e:  # (ParseError, and expat's errors on damaged bytes)
        raise FormatError(url, None, f"not well-formed XML ({e})") from e
    if root.tag not in {f"{{{ns}}}Dataset" for ns in DAP4}:
        raise FormatError(url, None, f"not a DAP4 Dataset (its root is {root.tag!r})")
    return root


def _data_url(href: str, source: Source, template: str | None) -> str:
    """Where the data is (see the module docstring)."""
    if "://" in href and href != PLACEHOLDER:
        return href
    name = stem(posixpath.basename(source.url.rstrip("/")), [input_format("dmrpp")])
    if template is not None:
        return template.replace("{name}", name) if "{name}" in template else template
    return _directory(source.url) + name


def _directory(url: str) -> str:
    """The directory part of a URL or path, with its trailing ``/`` (empty: none)."""
    head, slash, _ = url.rstrip("/").rpartition("/")
    return head + slash


@dataclass
class _Scan:
    source: Source
    options: ScanOptions
    data_url: str
    href: str
    """The Dataset's ``dmrpp:href`` as written (chunks naming it are in the granule)."""
    report: list[ReportEntry] = field(default_factory=list)
    dims: dict[str, int] = field(default_factory=dict)
    """Shared dimensions by full path (``/g/time``)."""
    enums: dict[str, str] = field(default_factory=dict)
    """Enumerations by full path → their base type."""
    phony: PhonyNames = field(default_factory=PhonyNames)
    urls: dict[str, None] = field(default_factory=dict)
    identities: dict[str, SourceIdentity] = field(default_factory=dict)
    budget: int = INLINE_LIMIT
    """Bytes of values the document may still hold (decoded and inflated)."""
    ends: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Per data file, the furthest byte a chunk reaches (checked against its size)."""

    # -- groups ------------------------------------------------------------------------

    def declare(self, element: Element, path: str) -> None:
        """Every group's dimensions and enumerations, first: a variable may name one a
        group after it declares (DAP4 names them by path)."""
        for child in element:
            tag = _local(child.tag)
            name = child.get("name", "")
            if tag == "Dimension":
                self.dims[f"{path}/{name}"] = _count(child.get("size"), self.source.url,
                                                     f"{path}/{name}")
            elif tag == "Enumeration":
                self.enums[f"{path}/{name}"] = child.get("basetype", "")
            elif tag == "Group":
                self.declare(child, f"{path}/{name}")

    def group(self, element: Element, path: str) -> VirtualGroup:
        arrays: dict[str, VirtualArray] = {}
        groups: dict[str, VirtualGroup] = {}
        for child in element:
            tag = _local(child.tag)
            name = child.get("name", "")
            where = f"{path}/{name}".lstrip("/")
            if tag == "Group":
                groups[name] = self.group(child, f"{path}/{name}")
            elif tag in VARIABLES and self.options.drops(where):
                with contextlib.suppress(FormatError):  # unscanned, its axes named all the
                    self.dimensions(child, path, where)  # same (see ScanOptions.dropped)
                self.report.append(ReportEntry(self.source.url, where, "dropped",
                                               "drop_variables"))
            elif tag in VARIABLES:
                try:
                    arrays[name] = self.array(child, tag, name, path, where)
                except _Skip as e:
                    self._problem(where, str(e))
                except FormatError as e:  # one damaged variable: the others still read
                    if self.options.on_error == "raise":
                        raise
                    self._problem(where, e.reason)
                except ModelError as e:  # (what the model cannot hold: named, for it alone)
                    if self.options.on_error == "raise":
                        raise FormatError(self.source.url, where, str(e)) from e
                    self._problem(where, str(e))
        return VirtualGroup(self.attributes(element, path or "/"), arrays, groups)

    def _problem(self, where: str, reason: str) -> None:
        if self.options.on_error == "raise":
            raise ScanError(self.source.url, where, reason)
        self.report.append(ReportEntry(self.source.url, where, "skipped", reason))

    # -- attributes --------------------------------------------------------------------

    def attributes(self, element: Element, where: str) -> Attributes:
        """The element's attributes, typed as its type names them (containers, and
        Hyrax's own, left out)."""
        shown = [a for a in element if _local(a.tag) == "Attribute" and not (
            a.get("name", "") in HIDDEN or a.get("name", "").startswith(HIDDEN_PREFIX))]
        return typed_attributes(((a.get("name", ""), partial(_attribute, a)) for a in shown),
                                self.source.url, where, self.report)

    # -- variables ---------------------------------------------------------------------

    def array(self, element: Element, tag: str, name: str, path: str,
              where: str) -> VirtualArray:
        if tag in UNSUPPORTED:
            raise _Skip(f"{UNSUPPORTED[tag]} has no Zarr representation refgrid writes")
        dims, shape = self.dimensions(element, path, where)
        attrs = self.attributes(element, where)
        if attrs.get("orig_datatype") == "VLEN":
            raise _Skip("Hyrax's padded form of a variable-length array (orig_datatype VLEN), "
                        "not the values the file holds")
        storage = {_local(c.tag): c for c in element if _local(c.tag) in STORAGE}
        if "chunks" not in storage and "chunk" in storage:  # (early documents: no wrapper)
            storage["chunks"] = element
        chunks = storage.get("chunks")
        big = chunks is not None and (chunks.get("byteOrder") or chunks.get("byteOrde")) == "BE"
        if tag in TEXT:
            return self.text(storage, name, dims, shape, attrs, where)
        dtype = self.dtype(element, tag, path, big)
        fill, exact = _fill(chunks, attrs, dtype, self.source.url, where)
        if dtype.fields is not None:
            stored, extra = storable(dtype)
            attrs = {**attrs, **extra}
            fill, dtype = recast_fill(fill, dtype, stored), stored  # (raw bytes?)
        if "compact" in storage or "missingdata" in storage:
            data = self.held(storage, dtype, shape, where)
            return _inline(name, dims, dtype, shape, data, fill, attrs)
        if chunks is None:
            raise _Skip("no storage is described (no dmrpp:chunks, compact or missing data)")
        codecs = self.codecs(chunks, dtype)
        return _filled_exactly(self.stored(chunks, name, dims, shape, dtype, fill, codecs,
                                           attrs, where), exact)

    def dtype(self, element: Element, tag: str, path: str, big: bool) -> np.dtype:
        """The numpy type of a variable: an atomic type, an enumeration's base type, or a
        Structure's record (atomic members, arrays of them; ``structOffset`` places them
        as the file does)."""
        order: Literal["<", ">"] = ">" if big else "<"
        if tag == "Structure":
            fields: list[tuple[str, np.dtype, tuple[int, ...]]] = []
            for member in element:
                kind = _local(member.tag)
                if kind not in VARIABLES:
                    continue
                if kind not in ATOMIC or kind == "Char":
                    raise _Skip(f"a Structure with a {kind} member ({member.get('name')!r})")
                counts = tuple(_count(d.get("size"), self.source.url, path)
                               for d in member if _local(d.tag) == "Dim")
                fields.append((member.get("name", ""),
                               np.dtype(ATOMIC[kind]).newbyteorder(order), counts))
            if not fields:
                raise _Skip("a Structure without atomic members")
            chunks = next((c for c in element if _local(c.tag) == "chunks"), None)
            ends = [_count(t, self.source.url, path) for t in
                    ((chunks.get("structOffset") if chunks is not None else None) or "").split()]
            sizes = [np.dtype((kind, counts)).itemsize for _, kind, counts in fields]
            if len(ends) == len(fields):
                offsets, itemsize = [0, *ends[:-1]], ends[-1]
            else:  # no layout given: packed or C-aligned, where the chunks' sizes tell
                offsets = [sum(sizes[:k]) for k in range(len(fields))]
                itemsize = sum(sizes)
                aligned = np.dtype([(n, (k, c) if c else k) for n, k, c in fields], align=True)
                vdata = any(_local(a.tag) == "Attribute" and a.get("name") == "dmr_vdata_ref"
                            for a in element)  # (HDF4 Vdata records are packed)
                if aligned.itemsize != itemsize and not vdata:
                    told = _record_size(chunks, element, (itemsize, aligned.itemsize))
                    if told is None:
                        raise _Skip("a Structure whose members' places in the file are not "
                                    "given (no structOffset), packed or padded")
                    if told == aligned.itemsize:
                        return aligned
            if any(o + n > itemsize for o, n in zip(offsets, sizes, strict=True)):
                raise FormatError(self.source.url, path, f"structOffset {ends} does not hold "
                                  "its members")
            return np.dtype({"names": [f[0] for f in fields],
                             "formats": [(f[1], f[2]) if f[2] else f[1] for f in fields],
                             "offsets": offsets, "itemsize": itemsize})
        base = tag if tag != "Enum" else self.enums.get(
            _absolute(element.get("enum", ""), path), "")
        if base not in ATOMIC:
            raise _Skip(f"an enumeration of unknown base type {base!r}")
        dtype = np.dtype(ATOMIC[base])
        return dtype.newbyteorder(order) if dtype.itemsize > 1 else dtype

    def dimensions(self, element: Element, path: str,
                   where: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
        names: list[str] = []
        shape: list[int] = []
        for dim in element:
            if _local(dim.tag) != "Dim":
                continue
            named = dim.get("name")
            if named is not None:
                full = _absolute(named, path)
                if full not in self.dims:
                    raise FormatError(self.source.url, where, f"dimension {named!r} is not "
                                      "declared")
                names.append(full.rsplit("/", 1)[-1])
                shape.append(self.dims[full])
            else:
                n = _count(dim.get("size"), self.source.url, where)
                names.append(self.phony.name(n, names))
                shape.append(n)
        return tuple(names), tuple(shape)

    def codecs(self, chunks: Element, dtype: np.dtype) -> tuple[CodecJSON, ...]:
        names = (chunks.get("compressionType") or "").split()
        unknown = [n for n in names if n not in FILTERS]
        if unknown:
            raise _Skip(f"filter {unknown[0]!r} has no Zarr codec")
        levels = iter((chunks.get("deflateLevel") or "").split())  # one per deflate
        try:
            return tuple(hdf5_pipeline([(FILTERS[n], [int(next(levels, "6"))]
                                         if n == "deflate" else [dtype.itemsize]
                                         if n == "shuffle" else []) for n in names], dtype))
        except ValueError as e:
            raise _Skip(f"deflate levels {chunks.get('deflateLevel')!r} are not numbers") \
                from e
        except UnsupportedFilter as e:
            raise _Skip(str(e)) from e

    def stored(self, chunks: Element, name: str, dims: tuple[str, ...],
               shape: tuple[int, ...], dtype: np.dtype, fill: object,
               codecs: tuple[CodecJSON, ...], attrs: Attributes, where: str) -> VirtualArray:
        sizes = next((c for c in chunks if _local(c.tag) == "chunkDimensionSizes"), None)
        pieces = [c for c in chunks if _local(c.tag) in ("chunk", "block")]
        if sizes is not None:
            chunk = tuple(_count(t, self.source.url, where) for t in (sizes.text or "").split())
            if len(chunk) != len(shape) or 0 in chunk:
                raise FormatError(self.source.url, where, f"chunk sizes {chunk} do not fit "
                                  f"its shape {shape}")
            grid = RectilinearGrid.regular(shape, chunk)
            built = ManifestBuilder(grid.chunk_counts)
            for piece in pieces:
                key = self._position(piece, chunk, grid.chunk_counts, where)
                self._range(built, piece, key, where)
            return VirtualArray(name, dims, dtype, grid, built.build(), fill, codecs, attrs)
        return self.contiguous(pieces, name, dims, shape, dtype, fill, codecs, attrs, where)

    def contiguous(self, pieces: list[Element], name: str, dims: tuple[str, ...],
                   shape: tuple[int, ...], dtype: np.dtype, fill: object,
                   codecs: tuple[CodecJSON, ...], attrs: Attributes,
                   where: str) -> VirtualArray:
        """Data in one block (cut into virtual chunks where uncompressed) or in several
        (one chunk each, where each holds whole rows)."""
        whole = tuple(max(1, n) for n in shape)
        if not pieces or not math.prod(shape):
            grid = RectilinearGrid.regular(shape, whole)
            return VirtualArray(name, dims, dtype, grid, ChunkManifest.empty(grid.chunk_counts),
                                fill, codecs, attrs)
        if len(pieces) == 1 and len(codecs) == 1 and shape:
            offset, nbytes = self._extent(pieces[0], where)
            row = math.prod(shape[1:]) * dtype.itemsize
            if nbytes != shape[0] * row:
                raise FormatError(self.source.url, where, f"{nbytes} bytes hold no array of "
                                  f"{shape} {dtype}")
            rows = rows_per_chunk(shape, dtype.itemsize, self.options.contiguous_chunk_bytes)
            grid = RectilinearGrid.regular(shape, (rows, *shape[1:]))
            built = ManifestBuilder(grid.chunk_counts)
            flat = np.arange(grid.chunk_counts[0], dtype=np.uint64)
            url = self._url(pieces[0])
            built.ranges(flat, built.url(url), offset + rows * row * flat, rows * row)
            self._reach(url, offset + nbytes, where)
            return VirtualArray(name, dims, dtype, grid, built.build(), fill, codecs, attrs)
        if len(pieces) == 1:
            grid = RectilinearGrid.regular(shape, whole)
            built = ManifestBuilder(grid.chunk_counts)
            self._range(built, pieces[0], (0,) * len(shape), where)
            return VirtualArray(name, dims, dtype, grid, built.build(), fill, codecs, attrs)
        if len(codecs) > 1 or not shape:
            raise _Skip(f"{len(pieces)} compressed blocks of one contiguous array")
        row = math.prod(shape[1:]) * dtype.itemsize
        extents = [self._extent(p, where) for p in pieces]
        if any(n % row for _, n in extents) or sum(n for _, n in extents) != shape[0] * row:
            raise _Skip(f"{len(pieces)} blocks that do not hold whole rows of {shape}")
        lengths = np.array([n // row for _, n in extents], dtype=np.int64)
        grid = RectilinearGrid((AxisChunks(lengths, lengths.copy()),
                                *RectilinearGrid.regular(shape[1:], shape[1:]).axes))
        built = ManifestBuilder(grid.chunk_counts)
        for k, piece in enumerate(pieces):
            self._range(built, piece, (k, *(0,) * (len(shape) - 1)), where)
        return VirtualArray(name, dims, dtype, grid, built.build(), fill, codecs, attrs)

    def text(self, storage: dict[str, Element], name: str, dims: tuple[str, ...],
             shape: tuple[int, ...], attrs: Attributes, where: str) -> VirtualArray:
        """Strings: fixed-length ones as bytes, read as h5py reads them — their length and
        padding as ``dmrpp:FixedLengthStringArray`` gives them, or, where the document does
        not say (Hyrax's older ones), the length the chunks' sizes show and any padding —
        and variable-length ones the document holds inlined as Zarr strings; others refused
        by name."""
        fixed = storage.get("FixedLengthStringArray")
        chunks = storage.get("chunks")
        if fixed is None and ("compact" in storage or "vlsa" in storage):
            values = self.strings(storage, shape, where)
            import numcodecs

            grid = RectilinearGrid.regular(shape, tuple(max(1, n) for n in shape))
            built = ManifestBuilder(grid.chunk_counts)
            built.inlined((0,) * len(shape), bytes(numcodecs.VLenUTF8().encode(
                np.array(values, dtype=object))))
            return VirtualArray(name, dims, STRING, grid, built.build(), "",
                                ({"name": "vlen-utf8"},), attrs)
        if fixed is not None:
            length = _count(fixed.get("string_length"), self.source.url, where)
            pad = STRING_PADS.get(fixed.get("pad", ""), "unknown")
        elif chunks is not None:
            length, pad = self.string_length(chunks, shape, where), "unknown"
        else:
            raise _Skip("no storage is described (no dmrpp:chunks, compact or vlsa values)")
        dtype = np.dtype(f"S{max(1, length)}")
        fill, exact = _fill(chunks, attrs, dtype, self.source.url, where)
        padded = string_codecs(dtype.itemsize, {pad: [(0, dtype.itemsize)]})
        if "compact" in storage:
            held = _inline(name, dims, dtype, shape, self.held(storage, dtype, shape, where),
                           fill, attrs)
            return replace(held, codecs=(*held.codecs, *padded))
        if chunks is None:
            raise _Skip("no storage is described (no dmrpp:chunks or compact values)")
        codecs = self.codecs(chunks, dtype)
        return _filled_exactly(self.stored(chunks, name, dims, shape, dtype, fill,
                                           (codecs[0], *padded, *codecs[1:]), attrs, where),
                               exact)

    def string_length(self, chunks: Element, shape: tuple[int, ...], where: str) -> int:
        """The length of strings a document describes without saying whether they are
        fixed-length (Hyrax's older documents): the bytes an element takes in every stored
        chunk, where those are a whole number and not what a reference into the file's heap
        takes (variable-length strings, which the document does not hold); with no chunk
        stored, the fill value's (every element reads as it)."""
        if chunks.get("compressionType"):
            raise _Skip("strings stored compressed, whose chunk sizes cannot tell "
                        "fixed-length strings from references into the data file's heap "
                        "(variable-length strings, which the document does not hold)")
        sizes = next((c for c in chunks if _local(c.tag) == "chunkDimensionSizes"), None)
        pieces = [self._extent(c, where)[1] for c in chunks
                  if _local(c.tag) in ("chunk", "block")]
        if not pieces:
            text = chunks.get("fillValue")
            if text is None or text == "unsupported-string":
                raise _Skip("strings with no chunk stored and no fill value: nothing tells "
                            "what they read as")
            return len(text.encode())
        if sizes is not None:
            elements = math.prod(_count(t, self.source.url, where)
                                 for t in (sizes.text or "").split())
        else:
            elements, pieces = math.prod(shape), [sum(pieces)]
        if not elements:
            return 1
        if any(n % elements for n in pieces) or len({n // elements for n in pieces}) != 1:
            raise _Skip(f"strings whose chunks ({', '.join(map(str, pieces[:4]))} bytes) hold "
                        f"no one whole number of bytes for each of their {elements} elements")
        length = pieces[0] // elements
        if length in HEAP_REFERENCE_SIZES:
            raise _Skip(f"strings of {length} bytes an element: fixed-length ones, or "
                        "references into the data file's heap to variable-length ones the "
                        f"document does not hold ({length} bytes with {length - 8}-byte "
                        "addresses) — it does not say which")
        return length

    def strings(self, storage: dict[str, Element], shape: tuple[int, ...],
                where: str) -> list[str]:
        count = math.prod(shape)
        if "compact" in storage:
            values = [self.decoded(storage["compact"].text, where).decode("utf-8", "replace")]
        else:
            values = []
            for v in storage["vlsa"]:  # <v>text</v>, or base64 (deflated if shorter than s)
                if v.get("s") is None:
                    text = v.text or ""
                else:
                    data = self.decoded(v.text, where)
                    if len(data) != _count(v.get("s"), self.source.url, where):
                        data = self.inflated(data, where)
                    text = data.decode("utf-8", "replace")
                repeat = _count(v.get("c") or "1", self.source.url, where)
                if len(values) + repeat > count:  # (before the list is made)
                    raise FormatError(self.source.url, where, f"more strings than its {count} "
                                      "elements")
                values += [text] * repeat
        if len(values) != count:
            raise FormatError(self.source.url, where, f"{len(values)} strings for {count} "
                              "elements")
        return values

    def held(self, storage: dict[str, Element], dtype: np.dtype, shape: tuple[int, ...],
             where: str) -> bytes:
        """Values the document holds (compact: raw; missing data: deflated; none: the fill
        value, as Hyrax's placeholders of CF grid mappings hold)."""
        expected = math.prod(shape) * dtype.itemsize
        if "compact" in storage:
            data = self.decoded(storage["compact"].text, where)
        else:  # deflated, or (Hyrax writes both) the values themselves
            held = self.decoded(storage["missingdata"].text, where)
            if not held:
                return held
            try:
                data = self.inflated(held, where)
            except FormatError:
                if len(held) != expected:
                    raise
                data = held
        if len(data) != expected:
            raise FormatError(self.source.url, where, f"holds {len(data)} bytes of values "
                              f"where {shape} {dtype} takes {expected}")
        return data

    # -- values the document holds ----------------------------------------------------

    def decoded(self, text: str | None, where: str) -> bytes:
        """Base64 values, counted against the document's :data:`INLINE_LIMIT`."""
        data = _base64(text, self.source.url, where)
        self._spend(len(data), where)
        return data

    def inflated(self, data: bytes, where: str) -> bytes:
        """Deflated values: a whole zlib stream, decompressed within what is left of the
        document's :data:`INLINE_LIMIT` (no bombs, one document or many elements)."""
        inflater = zlib.decompressobj()
        try:
            out = inflater.decompress(data, self.budget + 1)
        except zlib.error as e:
            raise FormatError(self.source.url, where, f"deflated values in the document are "
                              f"damaged ({e})") from e
        if len(out) > self.budget or inflater.unconsumed_tail:
            raise FormatError(self.source.url, where, f"values the document holds inflate past "
                              f"{INLINE_LIMIT} bytes in all")
        if not inflater.eof:
            raise FormatError(self.source.url, where, "deflated values in the document end "
                              "before their stream does")
        self._spend(len(out), where)
        return out

    def _spend(self, nbytes: int, where: str) -> None:
        if nbytes > self.budget:
            raise FormatError(self.source.url, where, f"values the document holds pass "
                              f"{INLINE_LIMIT} bytes in all")
        self.budget -= nbytes

    # -- chunks ------------------------------------------------------------------------

    def _url(self, piece: Element) -> str:
        """The file a chunk is in: the granule, or a chunk's own ``href`` (a file beside the
        document where relative: Hyrax's sidecars of missing values), which must exist."""
        href = piece.get("href")
        if href is None or href == self.href:
            url = self.data_url
        else:
            url = href if "://" in href else \
                f"{_directory(self.source.url)}{posixpath.basename(href)}"
            if url not in self.identities:
                if len(self.identities) >= DATA_FILES:
                    raise FormatError(self.source.url, None, f"its chunks name more than "
                                      f"{DATA_FILES} data files (Hyrax's name one, and a "
                                      "sidecar)")
                try:
                    self.identity(url)
                except AccessError:
                    raise  # (not a file that cannot be read: one not allowed)
                except ScanError as e:
                    raise _Skip(f"its chunks are in {url}, which cannot be read ({e.reason})") \
                        from e
        self.urls.setdefault(url)
        return url

    def identity(self, url: str) -> SourceIdentity:
        """A data file's identity (one ``stat`` or ``HEAD``), once it is allowed."""
        if url not in self.identities:
            if self.options.allowed is not None:
                check_url(url, self.options.allowed, self.source.url, "")
            self.identities[url] = Source.of(url, self.source.storage_options).identity
        return self.identities[url]

    def _extent(self, piece: Element, where: str) -> tuple[int, int]:
        return (_count(piece.get("offset"), self.source.url, where),
                _count(piece.get("nBytes"), self.source.url, where))

    def _reach(self, url: str, end: int, where: str) -> None:
        if end > self.ends.get(url, (0, ""))[0]:
            self.ends[url] = (end, where)

    def _range(self, built: ManifestBuilder, piece: Element, key: tuple[int, ...],
               where: str) -> None:
        offset, nbytes = self._extent(piece, where)
        url = self._url(piece)
        self._reach(url, offset + nbytes, where)
        built.ranges(np.array([np.ravel_multi_index(key, built.shape)], dtype=np.uint64)
                     if key else np.zeros(1, np.uint64), built.url(url), offset, nbytes)

    def _position(self, piece: Element, chunk: tuple[int, ...], counts: tuple[int, ...],
                  where: str) -> tuple[int, ...]:
        text = piece.get("chunkPositionInArray", "[]" if not chunk else None)
        found = _POSITION.match(text or "")
        if found is None:
            raise FormatError(self.source.url, where, f"chunk position {text!r} is not "
                              "[i, j, ...]")
        position = tuple(int(t) for t in found[1].split(",")) if found[1] else ()
        if len(position) != len(chunk) or any(
                p % c or p // c >= n for p, c, n in zip(position, chunk, counts, strict=True)):
            raise FormatError(self.source.url, where, f"chunk position {list(position)} is "
                              f"off its grid of chunks {list(chunk)}")
        return tuple(p // c for p, c in zip(position, chunk, strict=True))


# -- helpers --------------------------------------------------------------------------------

def _record_size(chunks: Element | None, element: Element,
                 candidates: tuple[int, int]) -> int | None:
    """The record size uncompressed chunks show: one whole chunk's bytes over its
    elements, where exactly one of ``candidates`` (packed, padded) divides them so; with no
    chunk stored, either (every value is the fill value, whatever the layout)."""
    if chunks is not None and not any(_local(c.tag) in ("chunk", "block") for c in chunks):
        return candidates[0]
    if chunks is None or chunks.get("compressionType"):
        return None
    sizes = next((c for c in chunks if _local(c.tag) == "chunkDimensionSizes"), None)
    elements = math.prod(int(t) for t in (sizes.text or "").split()) if sizes is not None \
        else math.prod(int(d.get("size") or 0) for d in element if _local(d.tag) == "Dim")
    pieces = [int(c.get("nBytes") or -1) for c in chunks if _local(c.tag) in ("chunk", "block")]
    fits = {size for size in candidates if pieces and all(n == elements * size for n in pieces)}
    return fits.pop() if len(fits) == 1 else None


def _attribute(element: Element) -> object:
    """One attribute's value: text (one, or a list), or numbers of its DAP4 type."""
    kind = element.get("type", "")
    values = [v.text or "" for v in element if _local(v.tag) == "Value"]
    if kind in TEXT:
        return values[0] if len(values) == 1 else values
    if kind not in ATOMIC or kind == "Char":
        raise ValueError(f"attributes of type {kind or 'none'} are not kept")
    return _numbers(values, np.dtype(ATOMIC[kind]))


def _numbers(texts: list[str], dtype: np.dtype) -> np.ndarray:
    """Numbers the document prints, as ``dtype``; one the type cannot hold (out of its
    range, a fraction or text for an integer) is a ``ValueError``, never another number."""
    try:
        with np.errstate(all="raise"):
            values = np.array([t.strip() for t in texts]).astype(dtype)
    except (FloatingPointError, OverflowError) as e:
        raise ValueError(f"{' '.join(texts)[:60]!r} is out of the range of {dtype}") from e
    if dtype.kind == "f" and any(np.isinf(v) and "inf" not in t.lower()
                                 for v, t in zip(values, texts, strict=True)):
        raise ValueError(f"{' '.join(texts)[:60]!r} is out of the range of {dtype}")
    return values


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _absolute(name: str, path: str) -> str:
    return name if name.startswith("/") else f"{path}/{name}"


def _count(text: str | None, url: str, where: str) -> int:
    """A non-negative integer the document gives (offsets, sizes, counts), bounded."""
    if text is None or not text.strip().isdigit() or len(text.strip()) > 19:
        raise FormatError(url, where, f"{text!r} is not a count or offset")
    value = int(text)
    if value >= 2**63:
        raise FormatError(url, where, f"{value} overflows a 64-bit offset")
    return value


def _filled_exactly(array: VirtualArray, exact: bool) -> VirtualArray:
    """``array``, unless chunks absent from the index would read as a fill value the
    document does not give exactly (refused: they would read as another number)."""
    if not exact and bool(np.any(array.manifest.path_id == MISSING)):
        raise _Skip("chunks the index lacks read as its fill value, which the document gives "
                    "only to 6 digits or not at all (no fillValue, no _FillValue of one value)")
    return array


def _fill(chunks: Element | None, attrs: Attributes, dtype: np.dtype, url: str,
          where: str) -> tuple[object, bool]:
    """The value absent chunks read as, and whether it is exactly the file's: the storage's
    ``fillValue`` (HDF5's fill value, which h5py and netCDF-C read there) — which Hyrax
    prints to 6 significant digits, so a longer float is exact only where it is a value
    such printing names (netCDF's default fills, a type's extremes) or where the variable's
    ``_FillValue``, one value of its type, prints as it (netCDF-C makes them one) —; with no
    ``fillValue``, that ``_FillValue`` (exact); else zero, not known to be the file's (a
    netCDF-4 file's is netCDF's default). A ``_FillValue`` of other shapes (none, or two
    values) is an attribute only, as netCDF4 and h5py show it."""
    text = chunks.get("fillValue") if chunks is not None else None
    try:
        if dtype.kind == "S":
            return _text_fill(text, attrs.get("_FillValue"), dtype)
        if dtype.fields is not None:  # a record: its members' values in turn, flattened
            return _record_fill(text.split(), dtype) if text is not None else \
                (np.zeros((), dtype)[()], False)
        native = dtype.newbyteorder("=")
        declared = _one_value(attrs.get("_FillValue"), native)
        if text is None:
            return (declared, True) if declared is not None else (np.zeros((), native)[()],
                                                                  False)
        printed, exact = _number(text, native)
        if declared is not None and not exact and _printed(declared) == _printed(printed):
            return declared, True
        return printed, exact
    except (ValueError, OverflowError, TypeError) as e:
        raise FormatError(url, where, f"fill value {text!r} is not a {dtype}: {e}") from e


def _text_fill(text: str | None, declared: object, dtype: np.dtype) -> tuple[bytes, bool]:
    """The fill value of fixed-length strings: the printed one, else a ``_FillValue`` that
    is one string; at most the strings' length."""
    if text is not None and text != "unsupported-string":
        value, exact = text.encode(), True
    elif isinstance(declared, str):
        value, exact = declared.encode(), True
    else:
        return b"", False
    if len(value) > dtype.itemsize:
        raise ValueError(f"{len(value)} bytes where the strings hold {dtype.itemsize}")
    return value, exact


def _one_value(value: object, dtype: np.dtype) -> np.number | None:
    """``value`` as a scalar of ``dtype`` where it is one number that type holds exactly,
    else None (no value, several, text, or one the type would change)."""
    array = np.asarray(value) if value is not None else np.zeros(0)
    if array.size != 1 or array.dtype.kind not in "iuf":
        return None
    one = array.reshape(-1)[0]
    with np.errstate(all="ignore"):
        cast = np.array([one]).astype(dtype)[0]
    same = cast == one or (dtype.kind == "f" and np.isnan(cast) and np.isnan(one))
    return cast if same else None


def _printed(value: str | float | np.number) -> str:
    """A number as Hyrax prints a fill value."""
    return f"{float(value):.{PRINTED_DIGITS}g}"


PRINTED_DIGITS = 6
"""Significant digits Hyrax prints a fill value with (C's ``%g``)."""
NETCDF_FILLS = {"i1": -127, "u1": 255, "i2": -32767, "u2": 65535, "i4": -2147483647,
                "u4": 4294967295, "i8": -9223372036854775806, "u8": 18446744073709551614,
                "f4": 9.969209968386869e36, "f8": 9.969209968386869e36}
"""netCDF's default fill values (``NC_FILL_*``)."""


def _number(text: str, dtype: np.dtype) -> tuple[np.number, bool]:
    """A number the document prints, and whether it is exactly the value it was printed
    from (see :func:`_fill`)."""
    value = _numbers([text], dtype)[0]
    digits = len(text.strip().lstrip("+-").split("e")[0].split("E")[0].replace(".", "")
                 .lstrip("0"))
    if digits < PRINTED_DIGITS:
        return value, True
    shown = _printed(text)
    extremes = (np.finfo(dtype).max, -np.finfo(dtype).max) if dtype.kind == "f" else \
        (np.iinfo(dtype).max, np.iinfo(dtype).min)
    for candidate in (NETCDF_FILLS.get(dtype.str[1:]), *extremes):
        if candidate is not None and _printed(candidate) == shown:
            return np.array([candidate]).astype(dtype)[0], True
    return value, dtype.kind in "iu" and "e" not in text.lower()


def _record_fill(numbers: list[str], dtype: np.dtype) -> tuple[object, bool]:
    record = np.zeros((), dtype)
    exact = True
    if numbers != ["0"]:
        for name in dtype.names or ():
            member = record[name]
            count = member.size
            if len(numbers) < count:
                raise ValueError("fewer values than its members")
            values = [_number(t, member.dtype.base.newbyteorder("=")) for t in numbers[:count]]
            record[name] = np.asarray([v for v, _ in values]).reshape(member.shape)
            exact = exact and all(e for _, e in values)
            numbers = numbers[count:]
        if numbers:
            raise ValueError("more values than its members")
    return record[()], exact


def _base64(text: str | None, url: str, where: str) -> bytes:
    try:
        return base64.b64decode((text or "").strip(), validate=True)
    except (binascii.Error, ValueError) as e:
        raise FormatError(url, where, f"values in the document are not base64 ({e})") from e


def _inline(name: str, dims: tuple[str, ...], dtype: np.dtype, shape: tuple[int, ...],
            data: bytes, fill: object, attrs: Attributes) -> VirtualArray:
    grid = RectilinearGrid.regular(shape, tuple(max(1, n) for n in shape))
    built = ManifestBuilder(grid.chunk_counts)
    if math.prod(shape) and data:
        built.inlined((0,) * len(shape), data)
    return VirtualArray(name, dims, dtype, grid, built.build(), fill, (bytes_codec(dtype),),
                        attrs)


def walk_variables(root: Element) -> Iterator[tuple[str, Element]]:
    """Every variable element a document describes, with its path (for reports and tests)."""
    def visit(element: Element, path: str) -> Iterator[tuple[str, Element]]:
        for child in element:
            tag = _local(child.tag)
            name = child.get("name", "")
            if tag == "Group":
                yield from visit(child, f"{path}{name}/")
            elif tag in VARIABLES:
                yield f"{path}{name}", child
    return visit(root, "")


__all__ = ["scan_dmrpp", "walk_variables"]

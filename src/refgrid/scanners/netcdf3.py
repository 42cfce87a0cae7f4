"""NetCDF3 files (classic CDF-1, 64-bit offset CDF-2, 64-bit data CDF-5) → the model.

refgrid's own header parser: it reads only the header bytes, and every count, length and
offset is checked against the bytes and the file size before it is used, so a malformed
header raises :class:`~refgrid.errors.FormatError` naming the file and the field — never an
IndexError, a hang, or an attempt to allocate gigabytes.

Data is uncompressed and big-endian. Non-record variables are contiguous: cut into virtual
chunks of a few MiB along their first axis. Record variables have one chunk per record (the
records of all record variables interleave); a file with a single record variable stores its
records back to back, so several records make one chunk.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import cast

import numpy as np

from refgrid.codecs.filters import bytes_codec
from refgrid.core.dtypes import ATTRIBUTE_TYPES_ATTR, ENCODING_ATTR, attribute_types
from refgrid.core.typed import Attributes
from refgrid.errors import FormatError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ManifestBuilder
from refgrid.model.virtual import ReportEntry, VirtualArray, VirtualGroup
from refgrid.scanners.attributes import attribute_value, decode_text
from refgrid.scanners.contiguous import rows_per_chunk
from refgrid.scanners.options import ScanOptions
from refgrid.scanners.source import Source

TYPES = {1: ">i1", 2: "S1", 3: ">i2", 4: ">i4", 5: ">f4", 6: ">f8", 7: ">u1", 8: ">u2",
         9: ">u4", 10: ">i8", 11: ">u8"}
NETCDF_FILL = {"i1": -127, "S1": b"\x00", "i2": -32767, "i4": -2147483647,
               "f4": 9.969209968386869e36, "f8": 9.969209968386869e36, "u1": 255, "u2": 65535,
               "u4": 4294967295, "i8": -9223372036854775806, "u8": 18446744073709551614}
ABSENT, DIMENSION, VARIABLE, ATTRIBUTE = 0, 10, 11, 12
FIRST_READ = 64 * 2**10


class _NeedMore(Exception):
    """The header continues beyond the bytes read so far."""


@dataclass
class _Reader:
    """Bounded big-endian reads over the header bytes read so far."""

    data: bytes
    url: str
    file_size: int
    version: int
    pos: int = 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.file_size:
            raise FormatError(self.url, what, f"needs {n} bytes at offset {self.pos}, beyond "
                              f"the end of the file ({self.file_size} bytes)")
        if self.pos + n > len(self.data):
            raise _NeedMore
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int32(self, what: str) -> int:
        return struct.unpack(">i", self.take(4, what))[0]

    def size(self, what: str) -> int:
        """A non-negative count or length: 4 bytes, 8 in CDF-5."""
        value = struct.unpack(">q" if self.version == 5 else ">i",
                              self.take(8 if self.version == 5 else 4, what))[0]
        if value < 0:
            raise FormatError(self.url, what, f"negative value {value}")
        return value

    def offset(self, what: str) -> int:
        wide = self.version in (2, 5)
        return struct.unpack(">q" if wide else ">i", self.take(8 if wide else 4, what))[0]

    def count(self, what: str, min_item_bytes: int) -> int:
        """A list length that the rest of the file could hold (absurd counts stop here)."""
        n = self.size(what)
        if n * min_item_bytes > self.file_size - self.pos:
            raise FormatError(self.url, what, f"claims {n} entries, more than the "
                              f"{self.file_size - self.pos} bytes left in the file can hold")
        return n

    def name(self, what: str) -> str:
        n = self.count(f"{what} name length", 1)
        raw = self.take(n, f"{what} name")
        self.take(-n % 4, f"{what} name padding")
        return decode_text(raw.split(b"\x00", 1)[0])  # netCDF-C names end at a NUL

    def tag(self, expected: int, what: str) -> int:
        """A list header: its element count, 0 for ABSENT."""
        tag = self.int32(f"{what} tag")
        if tag == ABSENT:
            n = self.size(f"{what} count")
            if n:
                raise FormatError(self.url, f"{what} count", f"absent list with count {n}")
            return 0
        if tag != expected:
            raise FormatError(self.url, f"{what} tag", f"expected {expected} or 0, got {tag}")
        return self.count(f"{what} count", 8)


@dataclass
class _Var:
    name: str
    dimids: list[int]
    attrs: Attributes
    dtype: np.dtype
    vsize: int
    begin: int


@dataclass
class _Header:
    numrecs: int
    dims: list[tuple[str, int]]
    attrs: Attributes
    variables: list[_Var]
    record_dim: int | None
    end: int = 0
    """Where the header ends: no variable may begin before it."""


def _attributes(r: _Reader, where: str) -> Attributes:
    out: Attributes = {}
    raw: dict[str, np.ndarray] = {}
    for _ in range(r.tag(ATTRIBUTE, f"{where} attribute list")):
        name = r.name(f"{where} attribute")
        code = r.int32(f"{where} attribute {name!r} type")
        if code not in TYPES:
            raise FormatError(r.url, f"{where} attribute {name!r} type", f"unknown type {code}")
        dtype = np.dtype(TYPES[code])
        n = r.count(f"{where} attribute {name!r} length", dtype.itemsize)
        payload = r.take(n * dtype.itemsize, f"{where} attribute {name!r} values")
        r.take(-(n * dtype.itemsize) % 4, f"{where} attribute {name!r} padding")
        if dtype.kind == "S":
            out[name] = decode_text(payload.rstrip(b"\x00"))
            continue
        raw[name] = np.frombuffer(payload, dtype)
        out[name] = attribute_value(raw[name])
    types = attribute_types(raw)
    if types:
        out[ATTRIBUTE_TYPES_ATTR] = types
    return out


def parse_header(r: _Reader) -> _Header:
    numrecs = r.size("numrecs") if r.version == 5 else struct.unpack(">I", r.take(4,
                                                                                 "numrecs"))[0]
    dims = []
    for k in range(r.tag(DIMENSION, "dimension list")):
        dims.append((r.name(f"dimension {k}"), r.size(f"dimension {k} length")))
    record = [k for k, (_, n) in enumerate(dims) if n == 0]
    if len(record) > 1:
        raise FormatError(r.url, "dimension list", "more than one unlimited dimension")
    attrs = _attributes(r, "global")
    variables = []
    for k in range(r.tag(VARIABLE, "variable list")):
        name = r.name(f"variable {k}")
        ndims = r.count(f"variable {name!r} dimension count", 4)
        dimids = [r.size(f"variable {name!r} dimension id") for _ in range(ndims)]
        bad = [d for d in dimids if d >= len(dims)]
        if bad:
            raise FormatError(r.url, f"variable {name!r} dimension id",
                              f"{bad[0]} but the file has {len(dims)} dimensions")
        if record and record[0] in dimids[1:]:
            raise FormatError(r.url, f"variable {name!r} dimensions",
                              "the unlimited dimension is not the first")
        vattrs = _attributes(r, f"variable {name!r}")
        code = r.int32(f"variable {name!r} type")
        if code not in TYPES:
            raise FormatError(r.url, f"variable {name!r} type", f"unknown type {code}")
        r.take(8 if r.version == 5 else 4, f"variable {name!r} vsize")  # recomputed: _vsize
        begin = r.offset(f"variable {name!r} begin")
        dtype = np.dtype(TYPES[code])
        variables.append(_Var(name, dimids, vattrs, dtype, _vsize(dims, dimids, dtype, record),
                              begin))
    header = _Header(numrecs, dims, attrs, variables, record[0] if record else None, r.pos)
    _check_layout(header, r.url)
    return header


def _vsize(dims: list[tuple[str, int]], dimids: list[int], dtype: np.dtype,
           record: list[int]) -> int:
    """A variable's size as netCDF-C computes it (one record of a record variable), rounded
    up to 4 bytes. The header's own vsize is not trusted: netCDF-C ignores it too (it
    overflows for variables beyond 4 GiB)."""
    n = math.prod(dims[d][1] for d in dimids if not (record and d == record[0]))
    size = n * dtype.itemsize
    return size + (-size % 4)


def _check_layout(header: _Header, url: str) -> None:
    """netCDF-C's checks of the data layout: fixed-size variables in definition order, none
    overlapping the header or each other; record variables after them, likewise."""
    is_record = [header.record_dim is not None and v.dimids[:1] == [header.record_dim]
                 for v in header.variables]
    previous = ("the header", header.end)
    for record in (False, True):
        for v, rec in zip(header.variables, is_record, strict=True):
            if v.begin < 0:
                raise FormatError(url, f"variable {v.name!r} begin", f"negative offset {v.begin}")
            if rec != record or (v.vsize == 0 and not rec):
                continue
            if v.begin < previous[1]:
                raise FormatError(url, f"variable {v.name!r} begin",
                                  f"offset {v.begin} overlaps {previous[0]} (which ends at "
                                  f"{previous[1]})")
            previous = (f"variable {v.name!r}", v.begin + v.vsize)


def read_header(source: Source, size: int | None = None) -> tuple[_Header, int]:
    """Parse the header, fetching more bytes only when it is longer than the first read
    (``size``: the file's, when already known)."""
    size = source.identity["size"] if size is None else size
    n = FIRST_READ
    while True:
        data = source.head(min(n, size))
        if data[:3] != b"CDF" or data[3:4] not in (b"\x01", b"\x02", b"\x05"):
            raise FormatError(source.url, "magic", f"not a NetCDF3 file (starts {data[:4]!r})")
        r = _Reader(data, source.url, size, data[3], 4)
        try:
            return parse_header(r), size
        except _NeedMore:
            if n >= size:
                raise FormatError(source.url, "header", "truncated header") from None
            n *= 4




def scan_netcdf3(source: Source, options: ScanOptions) -> VirtualGroup:
    """Scan one NetCDF3 file (classic, 64-bit offset or 64-bit data)."""
    contiguous_chunk_bytes = options.contiguous_chunk_bytes
    identity = source.identity
    header, size = read_header(source, identity["size"])
    record_vars = [v for v in header.variables if header.record_dim is not None
                   and v.dimids[:1] == [header.record_dim]]
    single = len(record_vars) == 1
    recsize = sum(v.vsize for v in record_vars) if not single else 0
    arrays = {}
    report = []
    for v in header.variables:
        dims = tuple(header.dims[d][0] for d in v.dimids)
        shape = tuple(header.numrecs if d == header.record_dim else header.dims[d][1]
                      for d in v.dimids)
        is_record = v in record_vars
        if single and is_record:
            recsize = math.prod(shape[1:]) * v.dtype.itemsize  # adjacent, no padding
        _check_extent(v, shape, is_record, recsize, size, source.url)
        fill, note = _fill_value(v)
        if note:
            report.append(ReportEntry(source.url, v.name, "attribute-skipped", note))
        array = _array(v, dims, shape, is_record, single, recsize, fill, size, source,
                       contiguous_chunk_bytes)
        arrays[v.name] = array
    attrs = dict(header.attrs)
    if header.record_dim is not None:
        attrs[ENCODING_ATTR] = {"unlimited_dims": [header.dims[header.record_dim][0]]}
    return VirtualGroup(attrs, arrays, {}, tuple(report), {source.url: source.settled(identity)})


def _check_extent(v: _Var, shape: tuple[int, ...], is_record: bool, recsize: int, size: int,
                  url: str) -> None:
    """The variable's bytes lie inside the file (checked with Python integers, before any
    array is sized from the header's numbers)."""
    row = math.prod(shape[1:]) * v.dtype.itemsize if shape else v.dtype.itemsize
    if math.prod(shape) == 0 and shape:
        return  # (negative offsets are refused with the layout, at parse time)
    if is_record:
        end = v.begin + (shape[0] - 1) * max(recsize, row) + row
    else:
        end = v.begin + (math.prod(shape) * v.dtype.itemsize if shape else v.dtype.itemsize)
    if end > size:
        raise FormatError(url, f"variable {v.name!r} begin",
                          f"its data ends at byte {end}, beyond the end of the file "
                          f"({size} bytes)")


def _fill_value(v: _Var) -> tuple[np.generic, str | None]:
    default = NETCDF_FILL[v.dtype.str[1:]]
    if "_FillValue" not in v.attrs:
        return _scalar(default, v.dtype), None
    value = v.attrs["_FillValue"]
    try:
        given = np.asarray(value)
        if v.dtype.kind in "iu" and given.dtype.kind == "f" and not np.isfinite(given).all():
            raise ValueError  # NaN or infinity: no integer holds it
        fitted = given.astype(v.dtype)
        if v.dtype.kind in "iu" and not np.array_equal(fitted, given):
            raise ValueError
        return fitted.reshape(-1)[0], None
    except (ValueError, TypeError, OverflowError, IndexError):  # IndexError: no value at all
        return _scalar(default, v.dtype), (
            f"_FillValue {value!r} does not fit type {v.dtype}; the netCDF default "
            f"{default!r} is the fill value (the attribute is kept as it is)")


def _scalar(value: object, dtype: np.dtype) -> np.generic:
    """``value`` as a numpy scalar of ``dtype`` (numpy's stubs type ``a[()]`` as an array)."""
    return cast(np.generic, np.asarray(value, dtype=dtype)[()])


def _array(v: _Var, dims: tuple[str, ...], shape: tuple[int, ...], is_record: bool,
           single: bool, recsize: int, fill: np.generic, size: int, source: Source,
           target: int) -> VirtualArray:
    item = v.dtype.itemsize
    row = math.prod(shape[1:]) * item if shape else item
    if is_record:
        records = rows_per_chunk(shape, item, target) if single else 1
        grid = RectilinearGrid.regular(shape, (records, *shape[1:]))
        n = grid.chunk_counts
        starts = v.begin + (np.arange(n[0], dtype=np.uint64) * records * (recsize or row))
        chunk_bytes = records * row
    else:
        rows = rows_per_chunk(shape, item, target)
        grid = RectilinearGrid.regular(shape, (rows, *shape[1:]) if shape else ())
        n = grid.chunk_counts
        chunk_bytes = rows * row if shape else item
        starts = v.begin + np.arange(math.prod(n), dtype=np.uint64) * chunk_bytes
    built = ManifestBuilder(n)
    built.ranges(np.arange(starts.size), built.url(source.url), starts, chunk_bytes)
    manifest = built.build()
    return VirtualArray(v.name, dims, v.dtype, grid, manifest, fill, (bytes_codec(v.dtype),),
                        {**v.attrs, ENCODING_ATTR: {"source": source.url,  # netCDF-C: native
                                                    "dtype": v.dtype.newbyteorder("=").str}})

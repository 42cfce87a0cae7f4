"""A served dataset as OPeNDAP sees it: groups, variables, their DAP types and attributes.

Both protocols describe the same tree, made once per dataset from its model: the arrays as
stored (packed ones packed, with ``scale_factor``/``add_offset``/``_FillValue``, so clients
unpack them as they would the file) and the attributes netCDF4 shows (:func:`reader_attrs`).
What a protocol cannot carry exactly is said here, in two tables, not decided in the
encoders: DAP2 has no signed byte and no 64-bit integers, and netCDF-C reads its integers
as signed, so ``int8`` goes as ``Byte`` and the unsigned integers as they are, each with
the ``_Unsigned`` attribute clients read that from; ``int64``/``uint64`` go as ``Float64``
— exact up to 2**53, and a value beyond it fails the response (:func:`exact_in_float64`)
rather than being rounded. DAP4 has every netCDF-4 atomic type. Arrays of records, opaque
bytes and variable-length sequences have no place in either and are left out, named in the
dataset's ``refgrid_dap_omitted`` attribute.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from refgrid.core.dtypes import reader_attrs, vlen_element
from refgrid.errors import ReadError
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import root_array

EXACT_FLOAT64 = 2**53
"""Integers up to this magnitude are exact in a Float64 (DAP2's stand-in for 64-bit ints)."""


class DapType(NamedTuple):
    """How values of one numpy type travel in one protocol."""

    name: str
    """The protocol's type name (``Int16``, ``Float64``, ``String``, ...)."""
    wire: np.dtype
    """The values' type on the wire (DAP2: XDR, big-endian and at least 4 bytes a number
    but for bytes; DAP4: little-endian, as wide as the type)."""


TYPES: dict[str, tuple[str, str, str, str]] = {
    # kind+size  DAP2 name, wire    DAP4 name, wire
    "b1": ("Byte", "u1", "UInt8", "u1"), "u1": ("Byte", "u1", "UInt8", "u1"),
    "i1": ("Byte", "i1", "Int8", "i1"),
    "i2": ("Int16", ">i4", "Int16", "<i2"), "u2": ("UInt16", ">u4", "UInt16", "<u2"),
    "i4": ("Int32", ">i4", "Int32", "<i4"), "u4": ("UInt32", ">u4", "UInt32", "<u4"),
    "i8": ("Float64", ">f8", "Int64", "<i8"), "u8": ("Float64", ">f8", "UInt64", "<u8"),
    "f2": ("Float32", ">f4", "Float32", "<f4"), "f4": ("Float32", ">f4", "Float32", "<f4"),
    "f8": ("Float64", ">f8", "Float64", "<f8"),
    "S": ("String", "O", "String", "O"), "S1": ("String", "O", "Char", "S1"),
    "T": ("String", "O", "String", "O"), "O": ("String", "O", "String", "O")}
"""numpy kind and size → how each protocol carries it. DAP2: XDR, big-endian, at least 4
bytes a number but for bytes; signed bytes as ``Byte`` with ``_Unsigned = "false"``,
unsigned integers with ``_Unsigned = "true"`` (netCDF-C reads every DAP2 integer as
signed); 64-bit ints as Float64, checked. DAP4: every type as it is, little-endian;
netCDF's characters as ``Char``."""
DAP2_TYPES = {kind: DapType(name, np.dtype(wire)) for kind, (name, wire, _, _) in TYPES.items()}
DAP4_TYPES = {kind: DapType(name, np.dtype(wire)) for kind, (_, _, name, wire) in TYPES.items()}
UNSIGNED = {"i1": "false", "b1": "true", "u1": "true", "u2": "true", "u4": "true"}
"""The ``_Unsigned`` attribute DAP2 adds, by numpy type: how netCDF-C, netCDF4-python and
xarray tell a signed byte and the unsigned integers apart in DAP2's types."""
TABLES = {2: DAP2_TYPES, 4: DAP4_TYPES}


def type_key(dtype: np.dtype) -> str:
    """The key of ``dtype`` in the type tables (strings by kind alone)."""
    if dtype.kind in "OTU" or (dtype.kind == "S" and dtype.itemsize != 1):
        return dtype.kind
    return f"{dtype.kind}{dtype.itemsize}"


def dap_type(dtype: np.dtype, protocol: int) -> DapType | None:
    """How values of ``dtype`` travel in DAP ``protocol`` (2 or 4); None where they cannot."""
    return TABLES[protocol].get(type_key(dtype))


def inexact_in_float64(values: np.ndarray) -> np.ndarray:
    """Where 64-bit integers ``values`` have no exact Float64 (compared as integers)."""
    if values.dtype.kind == "u":
        return values > EXACT_FLOAT64
    return (values > EXACT_FLOAT64) | (values < -EXACT_FLOAT64)


def wire_view(values: np.ndarray, wire: np.dtype) -> memoryview:
    """``values`` in the wire's type, as bytes to send (no copy where the types agree)."""
    return np.ascontiguousarray(values, dtype=wire).reshape(-1).view(np.uint8).data


def exact_in_float64(values: np.ndarray, variable: str) -> None:
    """Refuse 64-bit integers a DAP2 Float64 cannot hold exactly (a :class:`ReadError`
    naming the variable and the first such value): rounding them would be silent wrong
    data."""
    if values.dtype.kind in "iu" and values.dtype.itemsize == 8 and values.size:
        wide = inexact_in_float64(values)
        if wide.any():
            raise ReadError(f"variable {variable!r}: value {values.flat[int(np.argmax(wide))]} "
                            "has no exact DAP2 Float64 (DAP2 has no 64-bit integers): read it "
                            "through DAP4 or the Zarr endpoints")


@dataclass(frozen=True)
class DapVariable:
    """One served array: where it is, its dimensions and its attributes as netCDF4 shows
    them."""

    path: str
    """``/``-separated from the root (``surface/t2m``)."""
    array: VirtualArray
    dims: tuple[str, ...]
    attrs: Mapping[str, object]

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        """The values' type as read (native byte order; objects for strings)."""
        return self.array.value_dtype

    @property
    def stored(self) -> np.dtype:
        return self.array.dtype

    def type(self, protocol: int) -> DapType:
        found = dap_type(self.stored, protocol)
        assert found is not None  # (variables without a type are left out on construction)
        return found


@dataclass(frozen=True)
class DapGroup:
    """A group: its attributes, variables and subgroups (DAP4 groups; DAP2 structures)."""

    path: str
    attrs: Mapping[str, object]
    variables: tuple[DapVariable, ...]
    groups: tuple[DapGroup, ...]
    dimensions: Mapping[str, int] = field(default_factory=dict)
    """The dimensions first met in this group (a subgroup uses its ancestors' too)."""

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]

    def walk(self) -> Iterator[DapVariable]:
        """Every variable, a group's before its subgroups' (the order of responses)."""
        yield from self.variables
        for group in self.groups:
            yield from group.walk()


@dataclass(frozen=True)
class DapDataset:
    """A served dataset in OPeNDAP's terms, made once and kept with the dataset."""

    name: str
    root: DapGroup
    variables: Mapping[str, DapVariable]
    """By path, in response order."""
    omitted: Mapping[str, str]
    """Arrays left out, with why."""
    single: bool = False
    """Whether the dataset is one array (a Zarr store whose root is an array), which its
    views key as ``""``."""

    def key(self, variable: DapVariable) -> str:
        """``variable``'s path in the dataset's views."""
        return "" if self.single else variable.path

    @classmethod
    def of(cls, name: str, group: VirtualGroup) -> DapDataset:
        omitted: dict[str, str] = {}
        single = root_array(group)
        root = _group("", group if single is None else
                      VirtualGroup(group.attrs, {single.name: single}), {}, omitted)
        if omitted:
            root = DapGroup(root.path, {**root.attrs, "refgrid_dap_omitted": "; ".join(
                f"{p}: {why}" for p, why in omitted.items())}, root.variables, root.groups,
                root.dimensions)
        return cls(name, root, {v.path: v for v in root.walk()}, omitted, single is not None)


def _group(path: str, group: VirtualGroup, known: Mapping[str, int],
           omitted: dict[str, str]) -> DapGroup:
    """``group`` at ``path``; ``known``: the dimensions its ancestors declare."""
    prefix = f"{path}/" if path else ""
    variables = []
    dimensions: dict[str, int] = {}
    for name, array in group.arrays.items():
        why = _unserved(array) or (UNWRITABLE if any(XML_UNSAFE.search(text) for text in
                                                      (name, *array.dims)) else None)
        if why is not None:
            omitted[prefix + name] = why
            continue
        for dim, size in zip(array.dims, array.shape, strict=True):
            if known.get(dim, size) != size or dimensions.get(dim, size) != size:
                omitted[prefix + name] = f"dimension {dim!r} of length {size} is another " \
                    f"length elsewhere in the group"
                break
        else:
            dimensions.update({d: s for d, s in zip(array.dims, array.shape, strict=True)
                               if d not in known})
            attrs = _writable(attributes(array.attrs), prefix + name, omitted)
            fill = attrs.get("_FillValue")
            if fill is not None and not _holds(array.value_dtype, fill):
                omitted[f"{prefix}{name}._FillValue"] = f"{fill} is no {array.dtype.name} value " \
                    "(netCDF-C refuses the variable with it)"
                del attrs["_FillValue"]
            variables.append(DapVariable(prefix + name, array, array.dims, attrs))
    inner = {**known, **dimensions}
    for name in group.groups:
        if XML_UNSAFE.search(name):
            omitted[prefix + name] = UNWRITABLE
    groups = tuple(_group(prefix + name, child, inner, omitted)
                   for name, child in group.groups.items() if not XML_UNSAFE.search(name))
    return DapGroup(path, _writable(attributes(group.attrs), path or "/", omitted),
                    tuple(variables), groups, dimensions)


XML_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
"""Characters XML 1.0 cannot hold, even as references (the DMR is XML)."""
UNWRITABLE = "its name, a dimension's name or its text holds control characters XML " \
    "cannot carry"


def _writable(attrs: dict[str, object], where: str,
              omitted: dict[str, str]) -> dict[str, object]:
    """``attrs`` without those whose name or text XML cannot carry (named in ``omitted``)."""
    out = {}
    for key, value in attrs.items():
        texts = [key, *([value] if isinstance(value, str) else
                        value if isinstance(value, list) else [])]
        if any(XML_UNSAFE.search(str(t)) for t in texts):
            omitted[f"{where}.{key}"] = UNWRITABLE
        else:
            out[key] = value
    return out


def _holds(dtype: np.dtype, value: object) -> bool:
    """Whether ``value`` is exactly a value of ``dtype`` (a fill value clients cast to the
    variable's type: a NaN fill of integers has none)."""
    if dtype.kind not in "iuf" or isinstance(value, str | list):
        return True
    number = np.asarray(value)
    if number.size != 1 or number.dtype.kind not in "iufb":
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        cast = number.astype(dtype)
    return bool(np.array_equal(cast.astype(np.float64), number.astype(np.float64),
                               equal_nan=True))


def _unserved(array: VirtualArray) -> str | None:
    """Why ``array`` has no place in DAP, or None."""
    if array.dtype.fields is not None:
        return "records (compound types) are not served over DAP"
    if vlen_element(array.attrs) is not None or array.dtype.kind == "V":
        return "opaque bytes and variable-length sequences are not served over DAP"
    if dap_type(array.dtype, 4) is None:
        return f"type {array.dtype.name} is not served over DAP"
    return None


HIDDEN = frozenset({
    "CLASS", "DIMENSION_LIST", "NAME", "REFERENCE_LIST", "_ARRAY_DIMENSIONS", "_Codecs",
    "_Format", "_IsNetcdf4", "_Netcdf4Coordinates", "_Netcdf4Dimid", "_SuperblockVersion",
    "_nc3_strict", "_NCProperties", "_DAP4_Checksum_CRC32", "_DAP4_Little_Endian",
    "_dap4.ce"})
"""Storage attributes of HDF5, netCDF-C and Zarr, and DAP's own, that are no attributes of
the data (netCDF-C's DAP4 client refuses a dataset that has the first ones)."""


def attributes(stored: Mapping[str, object]) -> dict[str, object]:
    """The attributes netCDF4 shows, as DAP carries them: numbers as numpy values or 1-d
    arrays, text as ``str`` (several texts as a list), anything else (JSON objects a Zarr
    input may hold) as its JSON text."""
    out: dict[str, object] = {}
    for name, value in reader_attrs(stored, records_typed=True).items():
        if name in HIDDEN or name.startswith("_edu.ucar."):
            continue
        if isinstance(value, str | np.ndarray | np.generic):
            out[name] = value
        elif isinstance(value, bytes):
            out[name] = value.decode("utf-8", "replace")
        elif isinstance(value, bool):
            out[name] = np.int8(value)
        elif isinstance(value, int | float):
            out[name] = np.asarray(value)[()]
        elif isinstance(value, list | tuple) and value and \
                all(isinstance(v, str) for v in value):
            out[name] = list(value)
        elif isinstance(value, list | tuple) and value and \
                all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            out[name] = np.asarray(value)
        else:
            out[name] = json.dumps(value, default=str)
    return out

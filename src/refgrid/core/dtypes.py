"""numpy dtypes ↔ Zarr v3 data types (through zarr's own dtype machinery).

Zarr v3 has no data type for nested compounds, compound array members, compounds that mix
byte orders or leave gaps between fields. Such data stays referenced byte for byte as
``raw_bytes`` of the record size, and the attribute ``_refgrid_dtype`` records the numpy type
so refgrid (or a user, with ``np.frombuffer``) views the bytes as records again.

Attributes named ``_refgrid_*`` are refgrid's bookkeeping beside the source's attributes:
``_refgrid_attribute_types`` (numeric attribute types JSON would widen), ``_refgrid_dtype``
(the record type of raw bytes), ``_refgrid_vlen_dtype`` (the element type of
variable-length sequences stored as bytes) and ``_refgrid_encoding`` (how the source stored
a variable or group — filters, chunking, enum type, unlimited dimensions — which xarray's
engines report as ``encoding``). They are refgrid's alone: stock readers would show them as
attributes (a dict xarray cannot write to NetCDF, the first source's absolute path), so the
Zarr documents a writer or a view gives out carry none of them; writers keep them beside
the documents (:func:`split_bookkeeping`, :mod:`refgrid.model.zarr_json`), where refgrid's
scanners find them again. :func:`reader_attrs` is the one place refgrid's own readers turn
stored attributes into the attributes they show.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

import numpy as np
import numpy.typing as npt
from zarr.core.dtype import TBaseDType, TBaseScalar
from zarr.dtype import VariableLengthBytes, VariableLengthUTF8, ZDType, parse_dtype

from refgrid.core.typed import JSON, Attributes

if TYPE_CHECKING:
    from zarr.core.common import JSON as ZarrJSON
    from zarr.core.dtype.common import DTypeSpec_V3

BOOKKEEPING_PREFIX = "_refgrid_"
"""The prefix of refgrid's bookkeeping attributes."""
DTYPE_ATTR = "_refgrid_dtype"
VLEN_DTYPE_ATTR = "_refgrid_vlen_dtype"

STRING = np.dtypes.StringDType()
"""Variable-length UTF-8 strings (Zarr ``string``); object dtype means variable-length bytes."""


def flat_records(dtype: np.dtype) -> bool:
    """Records of scalar fields, packed (no gaps), in any byte orders: what a Zarr v2
    record type (a numpy descr, each field with its order) holds and every zarr reads."""
    if dtype.fields is None or dtype.names is None:
        return False
    fields = [(dtype.fields[name][0], dtype.fields[name][1]) for name in dtype.names]
    if any(f.fields is not None or f.subdtype is not None for f, _ in fields):
        return False
    sizes = [f.itemsize for f, _ in fields]
    packed = [offset for _, offset in fields] == [sum(sizes[:k]) for k in range(len(sizes))]
    return packed and sum(sizes) == dtype.itemsize


def _flat_compound(dtype: np.dtype) -> bool:
    """A compound every zarr reads right as a Zarr v3 ``struct``: flat records stored
    little-endian. zarr < 3.3 views a struct's chunks in the native order whatever the
    ``bytes`` codec's ``endian`` says (3.1 and 3.2 read ``(1, 1.5)`` stored big-endian as
    ``(16777216, 3.1e-319)``), so big-endian records are raw bytes: exact for every reader."""
    assert dtype.fields is not None
    native = "<" if np.little_endian else ">"
    orders = {native if f[0].byteorder == "=" else f[0].byteorder
              for f in dtype.fields.values() if f[0].itemsize > 1}
    return flat_records(dtype) and orders <= {"<", "|"}


def storable(dtype: np.dtype) -> tuple[np.dtype, Attributes]:
    """The dtype to store ``dtype`` as in Zarr v3, and attributes that describe the original."""
    if dtype.fields is None or _flat_compound(dtype):
        return dtype, {}
    descr = json.loads(json.dumps(np.lib.format.dtype_to_descr(dtype)))
    return np.dtype(f"V{dtype.itemsize}"), {DTYPE_ATTR: descr}


def recast_fill(fill: object, dtype: np.dtype, to: np.dtype) -> object:
    """A fill value of ``dtype`` as type ``to`` holds the same bytes: records as the raw
    bytes :func:`storable` stores them as, and back."""
    if fill is None or to == dtype:
        return fill
    return np.frombuffer(np.asarray(fill, dtype).tobytes(), to)[0]


def zarr_records(records: np.dtype) -> np.dtype | None:
    """The record type stock zarr 3.1 can serve for ``records``: the same fields, packed
    (no padding) and little-endian; nested records allowed. None where zarr has no type for
    it: fields that are arrays (zarr 3.1's ``structured`` type cannot hold them)."""
    if records.fields is None or records.names is None:
        return None
    fields = []
    for name in records.names:
        kind = records.fields[name][0]
        if kind.subdtype is not None:
            return None
        if kind.fields is not None:
            inner = zarr_records(kind)
            if inner is None:
                return None
            fields.append((name, inner))
        else:
            fields.append((name, kind.newbyteorder("<") if kind.itemsize > 1 else kind))
    return np.dtype(fields)


def original_dtype(attrs: Mapping[str, object], stored: np.dtype) -> np.dtype:
    """Undo :func:`storable`: the record dtype recorded in ``attrs``, else ``stored``."""
    descr = cast("list[list[JSON]] | None", attrs.get(DTYPE_ATTR))  # as storable wrote it
    if descr is None:
        return stored
    fields = [_descr_field(entry) for entry in descr]
    # (numpy's stubs know flat descrs only; a nested record's type is a list of fields)
    return np.lib.format.descr_to_dtype(cast("list[tuple[str, str]]", fields))


def _descr_field(entry: Sequence[object]) -> tuple[object, ...]:
    """One ``[name, type(, shape)]`` entry of a JSON round-tripped numpy descr, as a tuple."""
    name, kind, *shape = entry
    if isinstance(kind, list):
        kind = [_descr_field(e) for e in kind]
    return (name, kind, tuple(cast("list[int]", shape[0]))) if shape else (name, kind)


ZarrDType = ZDType[TBaseDType, TBaseScalar] | VariableLengthUTF8 | VariableLengthBytes
"""What :func:`zarr_dtype` gives (zarr's variable-length types are not its generic type)."""


def zarr_dtype(dtype: np.dtype, zarr_format: Literal[2, 3] = 3) -> ZarrDType:
    """zarr's data type object for ``dtype``: Zarr v3 types carry no byte order (the
    ``bytes`` codec does), Zarr v2 types keep it."""
    if dtype == STRING or dtype.kind == "T":
        return VariableLengthUTF8()
    if dtype.kind == "O":
        return VariableLengthBytes()
    native = zarr_format == 3 and dtype.fields is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_dtype(dtype.newbyteorder("=") if native else dtype,
                           zarr_format=zarr_format)


def zarr_data_type(dtype: np.dtype) -> DTypeSpec_V3:
    """The ``data_type`` JSON of a Zarr v3 array holding ``dtype``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return zarr_dtype(dtype).to_json(zarr_format=3)


def zarr_fill_value(dtype: np.dtype, value: object) -> ZarrJSON:
    """The ``fill_value`` JSON for ``value`` (the type's default when ``None``). A value
    ``dtype`` does not hold as it is — not one value, text for a number, a fraction or a
    number out of range for an integer, a finite number a float type overflows, more bytes
    than its strings hold — is a ``ValueError`` saying so, never another fill value."""
    zdtype = zarr_dtype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if value is None:
            value = zdtype.default_scalar()
        elif dtype.kind in "V" and not isinstance(value, bytes | np.void):
            value = np.zeros((), dtype)[()]
        elif dtype.kind in "fc" and isinstance(value, float) and math.isnan(value):
            value = dtype.type(value)
        if dtype.kind in "OTV":
            out = zdtype.to_json_scalar(value, zarr_format=3)
        else:
            out = zdtype.to_json_scalar(_held(dtype, zdtype, value), zarr_format=3)
    return list(out) if isinstance(out, tuple) else out


def _held(dtype: np.dtype, zdtype: ZarrDType, value: object) -> object:
    """``value`` as zarr's scalar of ``dtype``, where that is the same value (see
    :func:`zarr_fill_value`)."""
    try:
        if np.ndim(cast("npt.ArrayLike", value)):  # (zarr would take the first of several)
            raise ValueError("not one value")
        scalar = zdtype.cast_scalar(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"fill value {value!r:.80} is not a {dtype}: {e}") from e
    number = isinstance(value, int | float | np.number) and not isinstance(value, bool)
    changed = (dtype.kind in "iu" and number and scalar != value) or \
        (dtype.kind == "b" and number and value not in (0, 1)) or \
        (dtype.kind == "f" and number and bool(np.isinf(scalar)) and
         not np.isinf(cast(float, value))) or \
        (dtype.kind == "S" and isinstance(value, bytes | str) and
         len(value.encode() if isinstance(value, str) else value.rstrip(b"\0")) >
         dtype.itemsize)
    if changed:
        raise ValueError(f"fill value {value!r:.80} is not a {dtype}: it would read as "
                         f"{scalar!r:.80}")
    return scalar


ATTRIBUTE_TYPES_ATTR = "_refgrid_attribute_types"
"""Numpy types of numeric attributes JSON would widen (float32 ``scale_factor`` decides
that xarray unpacks to float32, as it does for the source file)."""


def attribute_types(values: Mapping[str, object]) -> dict[str, str]:
    """``{name: dtype}`` of the numeric attributes that are not int64/float64/bool."""
    types = {}
    for name, value in values.items():
        if isinstance(value, np.generic | np.ndarray) and value.dtype.kind in "iufc" and \
                value.dtype not in (np.dtype("int64"), np.dtype("float64")):
            types[name] = value.dtype.newbyteorder("=").str
    return types


def restore_attribute_types(attrs: Mapping[str, object]) -> Attributes:
    """A copy of ``attrs`` with the numpy types recorded by :func:`attribute_types` restored
    (and their record removed)."""
    out = dict(attrs)
    types = cast("dict[str, str]", out.pop(ATTRIBUTE_TYPES_ATTR, None) or {})
    for name, kind in types.items():
        if name in out:
            value = np.asarray(out[name])
            if np.dtype(kind).kind == "c":  # stored as [real, imag] pairs
                value = value.astype(np.float64).reshape(-1, 2).view(np.complex128)[:, 0]
                value = value.reshape(np.asarray(out[name]).shape[:-1])
            value = value.astype(kind)
            out[name] = value[()] if value.ndim == 0 else value
    return out


ENCODING_ATTR = "_refgrid_encoding"
"""The source's storage facts, as netCDF4's xarray engine reports them in ``encoding``:
per variable ``zlib``, ``complevel``, ``shuffle``, ``fletcher32``, ``szip``, ``zstd``,
``bzip2``, ``blosc`` (or h5py's ``compression``/``compression_opts``), ``contiguous``,
``chunksizes``, ``source``, ``enum``/``enum_name`` for enum types and ``dtype`` where the
source reports another type than the stored one; per group ``unlimited_dims``."""


class StoredEncoding(TypedDict, total=False):
    """The entries of ``_refgrid_encoding`` refgrid reads back (the others pass through)."""

    dtype: str
    enum: dict[str, int]
    enum_name: str
    chunksizes: Sequence[int] | None
    unlimited_dims: list[str]


def variable_encoding(attrs: Mapping[str, object], dtype: np.dtype | type,
                      shape: tuple[int, ...]) -> dict[str, object]:
    """A variable's xarray ``encoding`` from its stored ``_refgrid_encoding`` (``dtype``:
    the type the reader gives the values)."""
    found = cast("Mapping[str, object]", attrs.get(ENCODING_ATTR) or {})
    stored = cast("StoredEncoding", dict(found))
    if "dtype" in stored:  # the source reports a type other than the stored one
        dtype = np.dtype(stored.pop("dtype"))
    enum, enum_name = stored.pop("enum", None), stored.pop("enum_name", None)
    if enum is not None:
        dtype = np.dtype(dtype, metadata={"enum": dict(enum), "enum_name": enum_name})
    chunksizes = stored.get("chunksizes")
    if chunksizes is not None:
        stored["chunksizes"] = tuple(chunksizes)
    return {"dtype": dtype, **stored, "original_shape": shape}


def dataset_encoding(attrs: Mapping[str, object]) -> dict[str, object]:
    """A group's xarray ``encoding``: its unlimited dimensions, as a set."""
    stored = cast("StoredEncoding", attrs.get(ENCODING_ATTR) or {})
    return {"unlimited_dims": set(stored.get("unlimited_dims", ()))}


def zarr_attributes(attrs: Mapping[str, object], dtype: np.dtype) -> Attributes:
    """``attrs`` as written into a ``zarr.json``: a float, complex or bytes ``_FillValue``
    encoded as xarray encodes it for Zarr v3 (base64 of little-endian float64), which is how
    xarray's zarr engine decodes it — a plain float there fails to open."""
    out = dict(attrs)
    value = out.get("_FillValue")
    kind = np.dtype(dtype).kind
    if isinstance(value, bool) or not isinstance(value, int | float | complex | str):
        return out
    if kind == "f" and isinstance(value, int | float):
        out["_FillValue"] = _b64_float(value)
    elif kind == "c" and isinstance(value, int | float | complex):
        out["_FillValue"] = [_b64_float(complex(value).real), _b64_float(complex(value).imag)]
    elif kind == "S" and isinstance(value, str):
        out["_FillValue"] = base64.standard_b64encode(value.encode("utf-8")).decode()
    return out


def model_attributes(attrs: Mapping[str, object], dtype: np.dtype) -> Attributes:
    """The inverse of :func:`zarr_attributes` (plain values, as other writers leave them,
    pass through)."""
    out = dict(attrs)
    value = out.get("_FillValue")
    kind = np.dtype(dtype).kind
    try:
        if kind == "f" and isinstance(value, str):
            out["_FillValue"] = struct.unpack("<d", base64.standard_b64decode(value))[0]
        elif kind == "c" and isinstance(value, list) and len(value) == 2 and all(
                isinstance(v, str) for v in value):
            re, im = (struct.unpack("<d", base64.standard_b64decode(v))[0] for v in value)
            out["_FillValue"] = [re, im]
        elif kind == "S" and isinstance(value, str):
            out["_FillValue"] = base64.standard_b64decode(value).decode("utf-8", "replace")
    except (ValueError, struct.error, binascii.Error):
        pass  # not xarray's encoding: keep the value as written
    return out


def _b64_float(value: float) -> str:
    return base64.standard_b64encode(struct.pack("<d", float(value))).decode()


def vlen_element(attrs: Mapping[str, object]) -> np.dtype | None:
    """The element type of variable-length sequences stored as bytes, if they are."""
    kind = attrs.get(VLEN_DTYPE_ATTR)
    return None if kind is None else np.dtype(cast("npt.DTypeLike", kind))


def reader_attrs(attrs: Mapping[str, object], *, records_typed: bool = False
                 ) -> dict[str, Any]:
    """The attributes a refgrid reader shows for stored ``attrs``: numeric types restored;
    refgrid's bookkeeping dropped (``_refgrid_encoding`` readers report as encoding, the
    store layout a Zarr input had), but for ``_refgrid_dtype`` and ``_refgrid_vlen_dtype``
    where the reader cannot give the values their types (not ``records_typed``: records, and
    sequences as arrays), which say how to."""
    kept = () if records_typed else (DTYPE_ATTR, VLEN_DTYPE_ATTR)
    return {name: value for name, value in restore_attribute_types(attrs).items()
            if not name.startswith(BOOKKEEPING_PREFIX) or name in kept}


def split_bookkeeping(attrs: Mapping[str, object]) -> tuple[Attributes, Attributes]:
    """``attrs`` as stock readers should see them, and refgrid's bookkeeping apart."""
    plain: Attributes = {}
    kept: Attributes = {}
    for name, value in attrs.items():
        (kept if name.startswith(BOOKKEEPING_PREFIX) else plain)[name] = value
    return plain, kept

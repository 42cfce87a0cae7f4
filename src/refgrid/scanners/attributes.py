"""Attribute values → JSON-compatible Python values, the way netCDF4-python presents them.

One odd attribute must never fail a file: values that cannot be represented are reported by
the caller and left out. Text that is not UTF-8 is decoded with replacement characters, as
netCDF4 decodes it; one-element numeric arrays become scalars, as netCDF4 returns
them; NaN and infinities stay floats (JSON writers emit them as ``NaN``/``Infinity``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import h5py
import numpy as np

from refgrid.core.dtypes import ATTRIBUTE_TYPES_ATTR, attribute_types
from refgrid.core.typed import JSON, Attributes
from refgrid.model.virtual import ReportEntry


class UnrepresentableAttribute(ValueError):
    """An attribute value with no JSON form (object references, opaque blobs...)."""


def typed_attributes(values: Iterable[tuple[str, Callable[[], object]]], url: str, where: str,
                     report: list[ReportEntry]) -> Attributes:
    """Attributes from ``(name, read its value)`` pairs: each value's JSON form, and the
    numeric types netCDF4 gives them (:data:`ATTRIBUTE_TYPES_ATTR`); one whose value cannot
    be read or represented is left out and reported (``attribute-skipped``)."""
    out: Attributes = {}
    raw: dict[str, object] = {}
    for name, value in values:
        try:
            raw[name] = value()
            out[name] = attribute_value(raw[name])
        except (OSError, TypeError, ValueError, OverflowError) as e:
            raw.pop(name, None)
            report.append(ReportEntry(url, f"{where}@{name}", "attribute-skipped", str(e)))
    types = attribute_types(raw)
    if types:
        out[ATTRIBUTE_TYPES_ATTR] = types
    return out


def decode_text(value: bytes) -> str:
    return value.decode("utf-8", errors="replace")


def attribute_value(value: object) -> JSON:
    """The JSON-compatible form of one attribute value."""
    if isinstance(value, h5py.Empty):  # a null dataspace: netCDF4 reads "" or no values
        return "" if value.dtype.kind in "SUO" else []
    if isinstance(value, bytes | np.bytes_):
        return decode_text(bytes(value))
    if isinstance(value, str | bool | int | float) or value is None:
        return value
    if isinstance(value, np.generic):
        return attribute_value(np.asarray(value))
    if isinstance(value, np.ndarray):
        return _array_value(value)
    if isinstance(value, list | tuple):
        return [attribute_value(v) for v in value]
    raise UnrepresentableAttribute(f"values of type {type(value).__name__} have no JSON form")


def _array_value(value: np.ndarray) -> JSON:
    kind = value.dtype.kind
    items: list[JSON]
    if value.dtype.fields is not None or kind == "V":
        raise UnrepresentableAttribute(f"compound/opaque value of type {value.dtype}")
    if kind == "O":
        items = [attribute_value(v) for v in value.reshape(-1)]
    elif kind in "SU":
        items = [decode_text(v) if isinstance(v, bytes) else str(v) for v in value.reshape(-1)]
    elif kind == "c":
        items = [[float(v.real), float(v.imag)] for v in value.reshape(-1)]
    elif kind in "biuf":
        items = value.reshape(-1).tolist()
    else:
        raise UnrepresentableAttribute(f"values of type {value.dtype} have no JSON form")
    return items[0] if len(items) == 1 else items  # netCDF4 returns 1-element arrays as scalars

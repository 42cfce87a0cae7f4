"""DAP2's responses: the DDS and DAS texts, the ``.dods`` data (XDR) and ``.ascii`` text.

A group is a DAP2 ``Structure`` holding its variables and subgroups (netCDF-C names them
``group.name``); the dimensions keep their names in each declaration (``[time = 365]``), so
netCDF-C makes one netCDF dimension of each. Values are encoded per block
(:mod:`.blocks`): an array is its element count twice (XDR's and DAP's), then its values
big-endian — numbers of fewer than four bytes widened to four, bytes packed and padded to a
multiple of four at the end, strings each a count and padded bytes; a scalar is its value
alone. Encoding is table-driven (:data:`~refgrid.serve.dap.model.DAP2_TYPES`); nothing here
reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import numpy as np

from refgrid.serve.dap.constraint import Projection
from refgrid.serve.dap.model import (
    UNSIGNED,
    DapDataset,
    DapGroup,
    DapVariable,
    dap_type,
    exact_in_float64,
    inexact_in_float64,
    type_key,
    wire_view,
)

INDENT = "    "
SAFE = re.compile(r"[^A-Za-z0-9_!~*'\-\"./]")  # DAP2's identifier characters (and the path)
DATA_MARK = b"\nData:\n"


def name(text: str) -> str:
    """A DAP2 identifier: other characters %-escaped, as the DAP2 specification says."""
    return SAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m[0].encode()), text)


def dds(dataset: DapDataset, projections: Iterable[Projection]) -> str:
    """The DDS of ``projections`` (each with its hyperslab's shape), groups as structures."""
    chosen = {p.variable.path: p for p in projections}
    lines = ["Dataset {"]
    _declare(dataset.root, chosen, 1, lines)
    lines.append(f"}} {name(dataset.name.replace('/', '_'))};")
    return "\n".join(lines) + "\n"


def _declare(group: DapGroup, chosen: Mapping[str, Projection], depth: int,
             lines: list[str]) -> None:
    pad = INDENT * depth
    for variable in group.variables:
        projection = chosen.get(variable.path)
        if projection is None:
            continue
        dims = "".join(f"[{name(d)} = {n}]" for d, n in
                       zip(variable.dims, projection.shape, strict=True))
        lines.append(f"{pad}{variable.type(2).name} {name(variable.name)}{dims};")
    for child in group.groups:
        if any(v.path in chosen for v in child.walk()):
            lines.append(f"{pad}Structure {{")
            _declare(child, chosen, depth + 1, lines)
            lines.append(f"{pad}}} {name(child.name)};")


def das(dataset: DapDataset) -> str:
    """The DAS: each variable's attributes in a container of its name, a group's in its
    structure's, the root group's in ``NC_GLOBAL`` (where netCDF-C looks for them)."""
    lines = ["Attributes {"]
    _attribute_containers(dataset.root, 1, lines)
    lines.append(f"{INDENT}NC_GLOBAL {{")
    lines += _attribute_lines(dataset.root.attrs, 2)
    lines.append(f"{INDENT}}}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _attribute_containers(group: DapGroup, depth: int, lines: list[str]) -> None:
    pad = INDENT * depth
    for variable in group.variables:
        lines.append(f"{pad}{name(variable.name)} {{")
        lines += _attribute_lines(_dap2_attributes(variable), depth + 1)
        lines.append(f"{pad}}}")
    for child in group.groups:
        lines.append(f"{pad}{name(child.name)} {{")
        lines += _attribute_lines(child.attrs, depth + 1)
        _attribute_containers(child, depth + 1, lines)
        lines.append(f"{pad}}}")


def _dap2_attributes(variable: DapVariable) -> dict[str, object]:
    """A variable's attributes as DAP2 carries them: with ``_Unsigned`` where its type needs
    it, and without a 64-bit ``_FillValue`` no Float64 holds exactly (named instead in
    ``refgrid_dap2_omitted``: read it through DAP4)."""
    attrs = dict(variable.attrs)
    signed = UNSIGNED.get(type_key(variable.stored))
    if signed and "_Unsigned" not in attrs:
        attrs["_Unsigned"] = signed
    fill = attrs.get("_FillValue")
    number = np.asarray(fill) if isinstance(fill, np.generic | np.ndarray) else None
    if number is not None and number.dtype.kind in "iu" and number.dtype.itemsize == 8 and \
            inexact_in_float64(number).any():
        del attrs["_FillValue"]
        shown = number.ravel()[0] if number.size == 1 else fill
        attrs["refgrid_dap2_omitted"] = f"_FillValue {shown}: no exact DAP2 Float64"
    return attrs


def _attribute_lines(attrs: Mapping[str, object], depth: int) -> list[str]:
    pad = INDENT * depth
    out = []
    for key, value in attrs.items():
        kind, texts = attribute_values(value)
        if texts:
            out.append(f"{pad}{kind} {name(key)} {', '.join(texts)};")
    return out


def attribute_values(value: object) -> tuple[str, list[str]]:
    """An attribute's DAP2 type and its values as DAS text (64-bit integers beyond what a
    Float64 holds exactly go as their decimal text: DAP2 has no 64-bit type)."""
    if isinstance(value, str):
        return "String", [quoted(value)]
    if isinstance(value, list):
        return "String", [quoted(str(v)) for v in value]
    values = np.atleast_1d(np.asarray(value))
    kind = dap_type(values.dtype, 2)
    if kind is None or kind.name == "String":
        return "String", [quoted(str(v)) for v in values.tolist()]
    if values.dtype.kind in "iu" and values.dtype.itemsize == 8 and \
            inexact_in_float64(values).any():
        return "String", [quoted(str(v)) for v in values.tolist()]
    return kind.name, [number(v, kind.name) for v in values]


def number(value: float | int | np.number, kind: str) -> str:
    """A number as DAS/ASCII text that reads back to the same value of type ``kind``."""
    if kind == "Float32":  # the float32's exact value, in the shortest text of a float64
        return repr(float(np.float32(value)))  # (a client may parse it as either)
    if kind == "Float64":
        return repr(float(value))
    return str(int(value))


def quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- data --------------------------------------------------------------------------------------

def header(projection: Projection) -> bytes:
    """What precedes an array's values: its element count, twice (XDR's and DAP's), once
    for strings; none for a scalar."""
    if not projection.slices:
        return b""
    times = 1 if projection.variable.type(2).name == "String" else 2
    return np.array([projection.count] * times, ">u4").tobytes()


def encode(projection: Projection, values: np.ndarray) -> bytes | memoryview:
    """A block of ``projection``'s values in XDR. A scalar byte takes four bytes, the byte
    four times: netCDF-C reads the last of them (an XDR integer), pydap the first."""
    kind = projection.variable.type(2)
    if kind.name == "String":
        return b"".join(_xdr_string(v) for v in values.ravel().tolist())
    checked(projection, values)
    if not projection.slices and kind.wire.itemsize == 1:
        return bytes(wire_view(values, kind.wire)) * 4
    return wire_view(values, kind.wire)


def checked(projection: Projection, values: np.ndarray) -> None:
    """Refuse values DAP2 cannot carry exactly (64-bit integers beyond 2**53)."""
    if projection.variable.type(2).wire.kind == "f" and values.dtype.kind in "iu":
        exact_in_float64(values, projection.variable.path)


def trailer(projection: Projection) -> bytes:
    """What follows an array of bytes: padding to a multiple of four."""
    if projection.variable.type(2).wire.itemsize == 1 and projection.slices:
        return b"\x00" * (-projection.count % 4)
    return b""


def _xdr_string(value: object) -> bytes:
    raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
    return len(raw).to_bytes(4, "big") + raw + b"\x00" * (-len(raw) % 4)


def wire_bytes(projection: Projection) -> int | None:
    """The bytes of ``projection``'s values on the wire where known before reading them
    (not for strings)."""
    kind = projection.variable.type(2)
    if kind.name == "String":
        return None
    n = projection.count * kind.wire.itemsize if projection.slices else \
        max(4, kind.wire.itemsize)
    return n + len(header(projection)) + len(trailer(projection))


# -- ascii -------------------------------------------------------------------------------------

def ascii_lines(projection: Projection, values: np.ndarray, start: int) -> str:
    """A block's values as text: a line a row (the last axis), each headed by its index in
    the hyperslab; ``start``, the block's first element's C-order position in it, says where
    in a row the block begins (a block may hold part of a row)."""
    checked(projection, values)
    kind = projection.variable.type(2).name
    shape = projection.shape
    row = shape[-1] if shape else 1
    flat = values.ravel().tolist()
    name = projection.variable.path.replace("/", ".")
    out = []
    at = 0
    while at < len(flat):
        position = start + at
        end = min(len(flat), at + row - position % row)
        texts = ", ".join(_text(v, kind) for v in flat[at:end])
        if position % row == 0:
            index = "".join(f"[{k}]" for k in np.unravel_index(position, shape)[:-1]) \
                if len(shape) > 1 else ""
            out.append(f"{name}{index}, {texts}")
        else:
            out.append(f", {texts}")
        if (start + end) % row == 0:
            out.append("\n")
        at = end
    return "".join(out)


def _text(value: object, kind: str) -> str:
    if kind == "String":
        return quoted(value.decode("utf-8", "replace") if isinstance(value, bytes)
                      else str(value))
    if kind == "Float32":
        return str(np.float32(value))  # type: ignore[arg-type]  # (a number)
    return number(value, kind)  # type: ignore[arg-type]  # (a number)

"""DAP4's responses: the DMR (XML) and the ``.dap`` data, in DAP4's chunked framing.

The DMR declares each dimension once, in the group where it is first met, with the length
the request's hyperslabs give it (so the DMR of a data response describes exactly the
values that follow), and every variable names its dimensions by fully qualified name. The
data follow the DMR in its order: fixed-size values raw and little-endian, strings each an
8-byte little-endian count and their UTF-8 bytes, and after each variable the CRC-32 of
its bytes (zlib's) when the request asks for checksums (``dap4.checksum=true``, as pydap
does). The DMR carries no ``_DAP4_Checksum_CRC32`` values: they would have to be known
before the first value is sent, which rules out streaming (netCDF-C asks for one variable a
request and needs none). The whole response is a sequence of chunks, each headed by four
bytes: flags (last, error, little-endian) and a 24-bit length; the DMR is the first.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Collection, Iterable, Mapping
from xml.etree import ElementTree as ET

import numpy as np

from refgrid.serve.dap.constraint import ConstraintError, Projection
from refgrid.serve.dap.dap2 import number
from refgrid.serve.dap.model import DapDataset, DapGroup, dap_type, wire_view

NAMESPACE = "http://xml.opendap.org/ns/DAP/4.0#"
LAST, ERROR, LITTLE_ENDIAN, NO_CHECKSUMS = 0x01, 0x02, 0x04, 0x08
"""The chunk flags (``NO_CHECKSUMS`` on the DMR's chunk: netCDF-C 4.9 expects checksums
unless it is set; 4.10 and pydap ignore it)."""
CHUNK_LIMIT = 2**24 - 1
"""A chunk's largest length (24 bits)."""


def dmr(dataset: DapDataset, projections: Iterable[Projection]) -> bytes:
    """The DMR of ``projections`` (each with its hyperslab's shape), ending in CRLF as
    netCDF-C needs (it overwrites a data response's DMR's last byte). A carriage return in
    a text is written as a reference: XML parsers read a raw one, and CRLF, as a line
    feed."""
    chosen = {p.variable.path: p for p in projections}
    root = ET.Element("Dataset", {"xmlns": NAMESPACE, "dapVersion": "4.0",
                                  "dmrVersion": "1.0", "name": dataset.name})
    _group(root, dataset.root, chosen, {})
    ET.indent(root)
    text = ET.tostring(root, "unicode").replace("\r", "&#13;")  # (XML reads a raw CR as LF)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + text.encode() + b"\r\n"


def _lengths(group: DapGroup, chosen: Mapping[str, Projection]) -> dict[str, int]:
    """This group's dimensions at the lengths the chosen hyperslabs give them."""
    out: dict[str, int] = {}
    for variable in group.walk():
        projection = chosen.get(variable.path)
        if projection is None:
            continue
        for dim, length in zip(variable.dims, projection.shape, strict=True):
            if dim in group.dimensions and out.setdefault(dim, length) != length:
                raise ConstraintError(
                    f"dimension {dim!r} is cut to {out[dim]} and to {length} elements in one "
                    f"request ({variable.path} among them): DAP4 gives a dimension one length, "
                    "so ask for these variables apart")
    return out


def _group(element: ET.Element, group: DapGroup, chosen: Mapping[str, Projection],
           declared: dict[str, str]) -> None:
    """``group``'s dimensions, variables, attributes and subgroups into ``element``;
    ``declared``: fully qualified names of the dimensions declared above it."""
    scope = dict(declared)
    prefix = f"/{group.path}/" if group.path else "/"
    for dim, length in _lengths(group, chosen).items():
        ET.SubElement(element, "Dimension", {"name": dim, "size": str(length)})
        scope[dim] = prefix + dim
    for variable in group.variables:
        if variable.path not in chosen:
            continue
        node = ET.SubElement(element, variable.type(4).name, {"name": variable.name})
        for dim in variable.dims:
            ET.SubElement(node, "Dim", {"name": scope[dim]})
        for key, value in variable.attrs.items():
            _attribute(node, key, value)
    for key, value in group.attrs.items():
        _attribute(element, key, value)
    for child in group.groups:
        if any(v.path in chosen for v in child.walk()):
            _group(ET.SubElement(element, "Group", {"name": child.name}), child, chosen,
                   scope)


def netcdf_c_misreads(dataset: DapDataset, paths: Collection[str]) -> list[str]:
    """The attributes of the DMR of the variables at ``paths`` netCDF-C's DAP4 client would
    read other than they are, each as ``variable.name (why)`` (a group's as ``/group.name``;
    the root group's are in every DMR): Float32 values its double narrowing changes
    (:func:`netcdf_c_float32`) and texts holding characters it garbles
    (:data:`NETCDF_C_GARBLES`)."""
    out = []
    groups = [dataset.root]
    while groups:
        group = groups.pop(0)
        if group is dataset.root or any(v.path in paths for v in group.walk()):
            out += [f"/{group.path}.{k} ({why})" for k, v in group.attrs.items()
                    if (why := _misread(v)) is not None]
        out += [f"{v.path}.{k} ({why})" for v in group.variables if v.path in paths
                for k, value in v.attrs.items() if (why := _misread(value)) is not None]
        groups += group.groups
    return out


NETCDF_C_GARBLES = re.compile("[&<>\"'\\\\]")
"""Characters netCDF-C's DAP4 client changes in an attribute's text, whatever the DMR says
(``libdap4/d4parser.c``, ``getValueStrings``): it XML-escapes the text it has parsed (``&``
arrives as ``&amp;``, ``<`` as ``&lt;``; the five XML specials) and then drops every
backslash, keeping the character after it. No spelling survives both."""


def netcdf_c_float32(values: np.ndarray) -> np.ndarray:
    """The Float32 values netCDF-C's DAP4 client reads from the DMR's text of ``values``
    (``libdap4/d4meta.c``): ``convertString`` parses the text to a double and narrows it to
    a float written over the low half of the double's bytes (a union), and its caller,
    ``compileAttrValues``, narrows that half-overwritten double again. The text is the
    float's exact value (:func:`~refgrid.serve.dap.dap2.number`: the double it parses to
    is the float's), and the host little-endian, as netCDF-C's are. About one float in
    eight survives: 0.01 and 0 do; -9999, 273.15, 1 and 1e20 do not."""
    with np.errstate(over="ignore", invalid="ignore"):  # (signalling NaNs, overflows)
        exact = np.asarray(values, np.float32).astype(np.float64)
        first = exact.astype(np.float32)
        half = exact.view(np.uint64) & np.uint64(0xFFFFFFFF00000000) | \
            first.view(np.uint32).astype(np.uint64)
        return half.view(np.float64).astype(np.float32)


def _misread(value: object) -> str | None:
    """How netCDF-C's DAP4 client would read ``value`` wrongly (the first value that
    changes, or the character it garbles), or None where it reads it as it is."""
    kind, texts = _texts(value)
    if kind == "Float32":
        values = np.atleast_1d(np.asarray(value)).ravel()
        read = netcdf_c_float32(values)
        with np.errstate(invalid="ignore"):  # (signalling NaNs)
            exact = values.astype(np.float32)
        changed = (read != exact) & ~(np.isnan(read) & np.isnan(exact))
        if changed.any():
            k = int(np.argmax(changed))
            return f"{exact[k]!s} would read as {read[k]!s}"
    elif kind == "String":
        for text in texts:
            found = NETCDF_C_GARBLES.search(text)
            if found is not None:
                return f"text with {found[0]!r}"
    return None


def _texts(value: object) -> tuple[str, list[str]]:
    """An attribute's DAP4 type and its values as the DMR's text."""
    if isinstance(value, str | list):
        return "String", [value] if isinstance(value, str) else [str(v) for v in value]
    values = np.atleast_1d(np.asarray(value))
    found = dap_type(values.dtype, 4)
    kind = found.name if found is not None else "String"
    return kind, [str(v) if kind == "String" else number(v, kind) for v in values.tolist()]


def _attribute(element: ET.Element, key: str, value: object) -> None:
    kind, texts = _texts(value)
    node = ET.SubElement(element, "Attribute", {"name": key, "type": kind})
    for text in texts:
        ET.SubElement(node, "Value").text = text


def encode(projection: Projection, values: np.ndarray) -> bytes | memoryview:
    """A block of ``projection``'s values as DAP4 sends them (little-endian)."""
    kind = projection.variable.type(4)
    if kind.name == "String":
        parts = []
        for v in values.ravel().tolist():
            raw = v if isinstance(v, bytes) else str(v).encode("utf-8")
            parts.append(struct.pack("<Q", len(raw)) + raw)
        return b"".join(parts)
    return wire_view(values, kind.wire)


def chunk(data: bytes, flags: int = 0) -> bytes:
    """One chunk of the framing (at most :data:`CHUNK_LIMIT` bytes of ``data``)."""
    return struct.pack(">I", (flags | LITTLE_ENDIAN) << 24 | len(data)) + data


def chunks(data: bytes | memoryview) -> Iterable[bytes | memoryview]:
    """``data`` framed as chunks (none of them the last): each chunk's header, then its
    bytes (a view of ``data``, not a copy)."""
    view = memoryview(data)
    for start in range(0, len(view), CHUNK_LIMIT):
        piece = view[start: start + CHUNK_LIMIT]
        yield struct.pack(">I", LITTLE_ENDIAN << 24 | len(piece))
        yield piece


def crc32(data: bytes | memoryview, running: int = 0) -> int:
    return zlib.crc32(data, running)


def error_document(status: int, message: str, context: str | None = None) -> bytes:
    """A DAP4 error response's body (as netCDF-C prints it: ``DAP4 Error: http-code=...
    message="..." context="..."``)."""
    root = ET.Element("Error", {"httpcode": str(status)})
    ET.SubElement(root, "Message").text = message
    ET.SubElement(root, "Context").text = context
    ET.SubElement(root, "OtherInformation")
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "utf-8") + b"\n"

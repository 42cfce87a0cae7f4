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

import struct
import zlib
from collections.abc import Iterable, Mapping
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
    netCDF-C needs (it overwrites a data response's DMR's last byte)."""
    chosen = {p.variable.path: p for p in projections}
    root = ET.Element("Dataset", {"xmlns": NAMESPACE, "dapVersion": "4.0",
                                  "dmrVersion": "1.0", "name": dataset.name})
    _group(root, dataset.root, chosen, {})
    ET.indent(root)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode").encode() \
        + b"\r\n"


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


def float32_attributes(dataset: DapDataset, projections: Iterable[Projection]) -> list[str]:
    """The Float32 attributes a DMR of ``projections`` holds (``variable.name``; a
    group's as ``/group.name``; the root group's are in every DMR)."""
    chosen = {p.variable.path for p in projections}
    out = []
    groups = [dataset.root]
    while groups:
        group = groups.pop(0)
        if group is dataset.root or any(v.path in chosen for v in group.walk()):
            out += [f"/{group.path}.{k}" for k, v in group.attrs.items() if _float32(v)]
        out += [f"{v.path}.{k}" for v in group.variables if v.path in chosen
                for k, value in v.attrs.items() if _float32(value)]
        groups += group.groups
    return out


def _float32(value: object) -> bool:
    return isinstance(value, np.floating | np.ndarray) and value.dtype.kind == "f" and \
        value.dtype.itemsize <= 4  # (float16 travels as Float32 too)


def _attribute(element: ET.Element, key: str, value: object) -> None:
    if isinstance(value, str | list):
        texts = [value] if isinstance(value, str) else [str(v) for v in value]
        kind = "String"
    else:
        values = np.atleast_1d(np.asarray(value))
        found = dap_type(values.dtype, 4)
        kind = found.name if found is not None else "String"
        texts = [str(v) if kind == "String" else number(v, kind) for v in values.tolist()]
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


def error_document(status: int, message: str) -> bytes:
    """A DAP4 error response's body (as netCDF-C prints it)."""
    root = ET.Element("Error", {"httpcode": str(status)})
    ET.SubElement(root, "Message").text = message
    ET.SubElement(root, "Context")
    ET.SubElement(root, "OtherInformation")
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "utf-8") + b"\n"

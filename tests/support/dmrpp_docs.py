"""DMR++ documents for test files, written as Hyrax's ``build_dmrpp`` writes them, and the
DMR++ corpus of real documents (``../shared/corpus/dmrpp``) with its ground truth.

The writer covers what the tests' NetCDF4 files hold (shared dimensions, chunked data with
deflate/shuffle, attributes, a relative ``dmrpp:href``): its documents are the input of the
combine, batch and service tests, where an archive of many granules is needed; fidelity to
Hyrax's own documents is the corpus's part.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import numpy as np

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "dmrpp" / "files"
TYPES = {"i1": "Int8", "u1": "UInt8", "i2": "Int16", "u2": "UInt16", "i4": "Int32",
         "u4": "UInt32", "i8": "Int64", "u8": "UInt64", "f4": "Float32", "f8": "Float64"}


PADS = {0: "null_term", 1: "null_pad", 2: "space_pad"}
"""HDF5's string paddings as ``dmrpp:FixedLengthStringArray`` names them."""


def write_dmrpp(data: Path, href: str | None = None, string_lengths: bool = True) -> Path:
    """``data``'s DMR++ beside it (``NAME.dmrpp``), its href relative as Hyrax's are:
    numbers, and fixed-length strings with their length and padding — not given where
    ``string_lengths`` is false, as Hyrax's older documents leave them out."""
    import h5py

    lines = ['<?xml version="1.0" encoding="ISO-8859-1"?>',
             '<Dataset xmlns="http://xml.opendap.org/ns/DAP/4.0#" '
             'xmlns:dmrpp="http://xml.opendap.org/dap/dmrpp/1.0.0#" dapVersion="4.0" '
             f'dmrVersion="1.0" name={quoteattr(data.name)} '
             f'dmrpp:href={quoteattr(href or "data/" + data.name)}>']
    with h5py.File(data, "r") as f:
        dims = {name: d.shape[0] for name, d in f.items()
                if isinstance(d, h5py.Dataset) and d.attrs.get("CLASS") == b"DIMENSION_SCALE"}
        lines += [f'  <Dimension name={quoteattr(n)} size="{n_}"/>' for n, n_ in dims.items()]
        for name, d in f.items():
            if not isinstance(d, h5py.Dataset) or d.dtype.kind not in "iufS" or \
                    d.attrs.get("NAME", b"").startswith(b"This is a netCDF dimension"):
                continue
            kind = "String" if d.dtype.kind == "S" else TYPES[d.dtype.str[1:]]
            lines.append(f"  <{kind} name={quoteattr(name)}>")
            for scale in _scales(d, name, dims):
                lines.append(f'    <Dim name="/{scale}"/>' if isinstance(scale, str) else
                             f'    <Dim size="{scale}"/>')
            lines += list(_attributes(d))
            lines += list(_storage(d))
            if d.dtype.kind == "S" and string_lengths:
                pad = PADS[d.id.get_type().get_strpad()]
                lines.append(f'    <dmrpp:FixedLengthStringArray string_length='
                             f'"{d.dtype.itemsize}" pad="{pad}"/>')
            lines.append(f"  </{kind}>")
        lines += list(_attributes(f, "  "))
    lines.append("</Dataset>")
    out = data.with_name(data.name + ".dmrpp")
    out.write_text("\n".join(lines) + "\n", encoding="latin-1")
    return out


def _scales(d, name: str, dims: dict[str, int]) -> list[str | int]:
    """Each axis's dimension: its scale's name, or (none attached) its length."""
    if name in dims:
        return [name]
    return [d.dims[k][0].name.rsplit("/", 1)[-1] if len(d.dims[k]) else d.shape[k]
            for k in range(d.ndim)]


def _attributes(obj, indent: str = "    ") -> Iterator[str]:
    for key, value in obj.attrs.items():
        if key in ("CLASS", "NAME", "REFERENCE_LIST", "DIMENSION_LIST", "_Netcdf4Dimid",
                   "_Netcdf4Coordinates", "_NCProperties"):
            continue
        array = np.atleast_1d(value)
        if array.dtype.kind in "SUO":
            text = [v.decode() if isinstance(v, bytes) else str(v) for v in array]
            kind = "String"
        else:
            text, kind = [repr(v.item()) for v in array], TYPES[array.dtype.str[1:]]
        yield f"{indent}<Attribute name={quoteattr(key)} type=\"{kind}\">"
        yield from (f"{indent}  <Value>{escape(t)}</Value>" for t in text)
        yield f"{indent}</Attribute>"


def _storage(d) -> Iterator[str]:
    plist = d.id.get_create_plist()
    names = {1: "deflate", 2: "shuffle", 3: "fletcher32"}
    filters = [plist.get_filter(k) for k in range(plist.get_nfilters())]
    kinds = " ".join(names[f[0]] for f in filters)
    levels = " ".join(str(f[2][0]) for f in filters if f[0] == 1)
    head = '    <dmrpp:chunks'
    if kinds:
        head += f' compressionType="{kinds}"' + (f' deflateLevel="{levels}"' if levels else "")
    fill = d.fillvalue.decode() if isinstance(d.fillvalue, bytes) else repr(d.fillvalue.item())
    head += f' fillValue={quoteattr(fill)} byteOrder="LE">'
    yield head
    if d.chunks is None:
        offset, size = d.id.get_offset(), d.id.get_storage_size()
        yield f'      <dmrpp:chunk offset="{offset}" nBytes="{size}"/>'
    else:
        sizes = " ".join(map(str, d.chunks))
        yield f"      <dmrpp:chunkDimensionSizes>{sizes}</dmrpp:chunkDimensionSizes>"
        for k in range(d.id.get_num_chunks()):
            info = d.id.get_chunk_info(k)
            position = ",".join(map(str, info.chunk_offset))
            yield (f'      <dmrpp:chunk offset="{info.byte_offset}" nBytes="{info.size}" '
                   f'chunkPositionInArray="[{position}]"/>')
    yield "    </dmrpp:chunks>"


def corpus_pairs() -> list[tuple[Path, Path]]:
    """Every (document, data file) pair of the corpus."""
    return [(doc, doc.with_name(doc.name.removesuffix(".dmrpp")))
            for doc in sorted(CORPUS.glob("*.dmrpp"))]


def folder(doc: Path) -> str:
    return doc.name.split("__", 1)[0]


def hyrax_attributes(doc: Path) -> dict[str, dict[str, list[str]]]:
    """Each variable's attributes as the document writes them (Hyrax's own among them:
    ``fullnamepath``, ``dmr_sds_ref``, ``dmr_vdata_ref``), by path."""
    import defusedxml.ElementTree as ET

    from refgrid.scanners.dmrpp import walk_variables

    text = doc.read_bytes()
    root = ET.fromstring(text[text.index(b"<"):])
    return {path: {a.get("name"): [v.text or "" for v in a] for a in element
                   if a.tag.endswith("Attribute")}
            for path, element in walk_variables(root)}


def truth(data: Path, path: str, attrs: dict[str, list[str]]) -> np.ndarray:
    """What the data file holds for a variable: h5py's read (HDF5, NetCDF4; by Hyrax's
    ``fullnamepath`` where the document renamed it), pyhdf's (HDF4: the SDS or Vdata the
    document's ``dmr_sds_ref``/``dmr_vdata_ref`` names). KeyError: not in the file."""
    if data.suffix == ".hdf":
        return _hdf4(data, path, attrs)
    if data.suffix == ".bin":  # raw bytes: the file is the values
        return np.frombuffer(data.read_bytes(), np.uint8)
    import h5py

    full = attrs.get("fullnamepath", [None])[0]
    parent, _, name = path.rpartition("/")
    hidden = f"{parent}/_nc4_non_coord_{name}".lstrip("/")
    with h5py.File(data, "r") as f:
        for candidate in ([full] if full else []) + [hidden, path]:
            if candidate in f:
                d = f[candidate]
                return np.asarray(d[()]) if d.shape is not None else np.array([])
    raise KeyError(path)


def _hdf4(data: Path, path: str, attrs: dict[str, list[str]]) -> np.ndarray:
    if "dmr_sds_ref" in attrs:
        from pyhdf.SD import SD, SDC

        sd = SD(str(data), SDC.READ)
        try:
            return np.asarray(sd.select(sd.reftoindex(int(attrs["dmr_sds_ref"][0]))).get())
        finally:
            sd.end()
    if "dmr_vdata_ref" in attrs:
        import pyhdf.VS  # noqa: F401 - vstart needs it imported
        from pyhdf.HDF import HDF

        h = HDF(str(data))
        vs = h.vstart()
        try:
            vd = vs.attach(int(attrs["dmr_vdata_ref"][0]))
            records = vd.read(vd.inquire()[0])
            vd.detach()
        finally:
            vs.end()
            h.close()
        if all(len(r) == 1 for r in records):
            return np.array([r[0] for r in records])
        try:  # records: each row its fields' numbers in turn
            return np.array([np.hstack(r).astype(float) for r in records])
        except ValueError:  # (text fields)
            raise KeyError(path) from None
    raise KeyError(path)


def same_values(ours: np.ndarray, expected: np.ndarray) -> bool:
    """Whether refgrid's read holds the data file's values, whatever each reader's form:
    records as bytes, pyhdf's Vdata rows and ``char8`` text, strings decoded."""
    if ours.dtype.fields is not None and expected.dtype.fields is None:  # Vdata rows
        rows = np.asarray(expected, dtype=float).reshape(len(ours), -1)
        column = 0
        for name in ours.dtype.names or ():
            values = ours[name].reshape(len(ours), -1).astype(float)
            width = values.shape[1]
            if not np.array_equal(values, rows[:, column:column + width]):
                return False
            column += width
        return column == rows.shape[1]
    if expected.dtype.fields is not None:  # records: their members' values (not padding)
        names = expected.dtype.names or ()
        return ours.dtype.names == names and ours.shape == expected.shape and all(
            np.array_equal(ours[n], expected[n], equal_nan=expected[n].dtype.kind in "fc")
            for n in names)
    flat = expected.reshape(-1)
    if ours.dtype.kind in "iu" and flat.dtype.kind in "OU" and flat.size and \
            isinstance(flat[0], str):  # pyhdf's char8 as text
        text = "".join(flat).encode("latin-1")
        return np.frombuffer(text, ours.dtype).tolist() == \
            np.trim_zeros(ours.reshape(-1), "b").tolist()
    if expected.dtype.kind in "OSU" or ours.dtype.kind in "OT":
        def text(v: object) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)
        return [text(v) for v in flat] == [text(v) for v in ours.reshape(-1)]
    return ours.shape == expected.shape and np.array_equal(
        ours, expected, equal_nan=expected.dtype.kind in "fc")


SIDECAR = re.compile(r"its chunks are in .*_mvs\.h5, which cannot be read")
"""Variables whose chunks Hyrax put in a sidecar of missing values the corpus lacks."""

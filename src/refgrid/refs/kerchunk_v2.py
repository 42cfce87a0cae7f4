"""Classic kerchunk references — Zarr v2 keys and documents — in both directions, for JSON
and parquet reference sets alike (the containers are :mod:`refgrid.refs.json_refs` and
:mod:`refgrid.refs.parquet`).

Written (:func:`v2_documents`): what existing kerchunk consumers read unchanged — fsspec's
``reference://`` with zarr in v2 mode, ``MultiZarrToZarr``, intake catalogues:
``.zgroup``/``.zarray``/``.zattrs`` documents with the dimension names in
``_ARRAY_DIMENSIONS`` (xarray's convention) and chunks at ``tas/0.3.1`` (``tas/0`` for a 0-d
array). A Zarr v2 array has one chunk shape, so a rectilinear array is refused, naming it and
its irregular dimension. The v3 codec list maps onto v2's ``filters`` + ``compressor``:
array→array filters first, then a non-``bytes`` array→bytes codec, then every bytes→bytes codec
but the last, which is the compressor; the ``bytes`` codec's byte order moves into ``dtype``.
refgrid's own HDF5 codecs keep their names (``refgrid.lzf`` ...), which numcodecs finds through
refgrid's ``numcodecs.codecs`` entry points (:mod:`refgrid.codecs.numcodecs_v2`).

Read (:func:`v2_group`, :func:`v2_keys_group`): existing kerchunk reference sets (kerchunk's
output for HDF5, GRIB, TIFF, FITS...): Zarr v2 metadata (``.zarray``, ``.zattrs`` with
``_ARRAY_DIMENSIONS``, compressor and filters) translated to the v3 form, chunk keys of either
separator, whole-file references (``[url]``) sized.
"""

from __future__ import annotations

import base64
import json
import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import NotRequired, TypeAlias, TypedDict, cast

import numpy as np
import numpy.typing as npt

from refgrid.codecs.filters import ARRAY_TO_ARRAY, CodecJSON, Pipeline, bytes_codec, stored_dtype
from refgrid.codecs.pipeline import REFGRID_CODECS, numcodec
from refgrid.core.dtypes import (
    STRING,
    flat_records,
    original_dtype,
    recast_fill,
    split_bookkeeping,
    storable,
    zarr_dtype,
)
from refgrid.core.keys import ZARRAY, ZATTRS, ZGROUP, KeyEncoding
from refgrid.core.sources import file_sizes
from refgrid.core.typed import JSON, JSONObject, StorageOptions
from refgrid.errors import FormatError, WriteError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ChunkManifest, ManifestBuilder, flat_index
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import refuse_segments

BYTES_TO_BYTES = frozenset({"zlib", "gzip", "bz2", "lzma", "zstd", "lz4", "blosc", "shuffle",
                            "fletcher32", "crc32", "crc32c", "adler32", "jenkins_lookup3"})
"""numcodecs ids that work on bytes; others (delta, fixedscaleoffset, ...) act on arrays."""
V2ManifestFor = Callable[[str, RectilinearGrid, str], ChunkManifest]
"""(array path, its grid, chunk-key separator) → its manifest"""
VLEN: dict[str, tuple[np.dtype, str]] = {"vlen-utf8": (STRING, "vlen-utf8"),
                                          "vlen-bytes": (np.dtype("O"), "vlen-bytes")}
"""Zarr v2 object-codec filters → (dtype, Zarr v3 codec)."""
KerchunkValue: TypeAlias = str | bytes | list[object]
"""A value of fsspec's normalised reference mapping: inline data (text, ``base64:`` text or
bytes) or a reference ``[url]`` / ``[url, offset, length]``."""


class CodecV2(TypedDict):
    """A Zarr v2 filter or compressor: its numcodecs ``id`` beside its configuration."""

    id: str


class ZArray(TypedDict):
    """The fields of a Zarr v2 ``.zarray`` read here (as parsed: unchecked until used)."""

    shape: list[int]
    chunks: list[int]
    dtype: JSON
    compressor: CodecV2 | None
    filters: NotRequired[list[CodecV2] | None]
    fill_value: JSON
    order: NotRequired[str]
    dimension_separator: NotRequired[str]


# -- read ------------------------------------------------------------------------------

def v2_keys_group(refs: Mapping[str, KerchunkValue], url: str,
                  storage_options: StorageOptions) -> VirtualGroup:
    """The model of a kerchunk key → value mapping with Zarr v2 keys (fsspec's normalised
    form of any kerchunk JSON: :func:`refgrid.refs.json_refs.load_kerchunk`)."""
    keys = list(refs)
    documents = {k: _document(refs, k, url) for k in keys
                 if k.rpartition("/")[2] in (ZARRAY, ZATTRS, ZGROUP)}
    arrays = {k[: -len(ZARRAY)].rstrip("/") for k in documents if k.endswith(ZARRAY)}
    chunks: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        if key.rpartition("/")[2].startswith(".z"):
            continue
        head, _, tail = key.rpartition("/")
        while head not in arrays and head:  # chunk keys written with "/" separators
            head, _, first = head.rpartition("/")
            tail = f"{first}/{tail}"
        if head in arrays:
            chunks[head].append(tail)
    return v2_group(documents, lambda path, grid, separator: _manifest_from_keys(
        path, refs, chunks.get(path, []), grid, separator, url, storage_options), url)


def as_base64(value: str | bytes) -> str:
    """Inline data as ``base64:`` text. Inline text is UTF-8, the rule fsspec's reference
    filesystem reads it by: kerchunk inlines a chunk as plain text whenever its bytes decode
    as UTF-8 (station names with accents or other scripts included), as base64 otherwise."""
    data = value if isinstance(value, bytes) else (
        base64.b64decode(value[7:]) if value.startswith("base64:") else value.encode("utf-8"))
    return "base64:" + base64.b64encode(data).decode("ascii")


def _document(refs: Mapping[str, KerchunkValue], key: str, url: str) -> JSONObject:
    raw = refs[key]
    data = base64.b64decode(raw[7:]) if isinstance(raw, str) and raw.startswith("base64:") \
        else raw
    try:
        return json.loads(cast(str | bytes, data))  # (a list: TypeError, below)
    except (json.JSONDecodeError, TypeError) as e:
        raise FormatError(url, key, f"metadata is not JSON: {e}") from e


def v2_group(documents: Mapping[str, JSONObject], manifest_for: V2ManifestFor,
             url: str) -> VirtualGroup:
    """The model of Zarr v2 metadata documents (``.zgroup``/``.zarray``/``.zattrs`` keys)."""
    nodes = sorted({k.rpartition(".z")[0].rstrip("/") for k in documents
                    if k.endswith((ZARRAY, ZGROUP))})
    if not nodes:
        raise FormatError(url, None, "no .zgroup/.zarray/zarr.json: not Zarr references")
    arrays = {p: _array_v2(p, documents, manifest_for, url) for p in nodes
              if f"{p}/{ZARRAY}".lstrip("/") in documents}
    return _group_v2("", nodes, arrays, documents)


def _attrs(documents: Mapping[str, JSONObject], path: str) -> JSONObject:
    return dict(documents.get(f"{path}/{ZATTRS}".lstrip("/"), {}))


def _group_v2(path: str, nodes: list[str], arrays: dict[str, VirtualArray],
              documents: Mapping[str, JSONObject]) -> VirtualGroup:
    prefix = f"{path}/" if path else ""
    children = [p for p in nodes if p.startswith(prefix) and p != path and p
                and "/" not in p[len(prefix):]]
    return VirtualGroup(
        _attrs(documents, path),
        {p[len(prefix):]: arrays[p] for p in children if p in arrays},
        {p[len(prefix):]: _group_v2(p, nodes, arrays, documents) for p in children
         if p not in arrays},
    )


def _array_v2(path: str, documents: Mapping[str, JSONObject], manifest_for: V2ManifestFor,
              url: str) -> VirtualArray:
    meta = cast(ZArray, documents[f"{path}/{ZARRAY}".lstrip("/")])
    attrs = _attrs(documents, path)
    dims = attrs.pop("_ARRAY_DIMENSIONS", None)
    # kerchunk writes a chunk length of 0 along zero-length dimensions
    shape, chunk_shape = tuple(meta["shape"]), tuple(max(1, c) for c in meta["chunks"])
    if meta.get("order", "C") != "C":
        raise FormatError(url, path, "Fortran-ordered (order 'F') arrays are not supported")
    compressor = meta.get("compressor")
    chain = [*(meta.get("filters") or []), *([compressor] if compressor else [])]
    dtype: np.dtype = np.dtype(_v2_dtype(meta["dtype"]))
    vlen = [f for f in chain if f.get("id") in VLEN]
    if vlen:
        dtype = VLEN[vlen[0]["id"]][0]
    stored, records = storable(dtype)  # (records stock zarr misreads: raw bytes)
    fill = recast_fill(_fill_v2(meta.get("fill_value"), dtype), dtype, stored)
    codecs = _v3_codecs(chain, stored, url, path)
    grid = RectilinearGrid.regular(shape, chunk_shape if shape else ())
    separator = meta.get("dimension_separator", ".")
    manifest = manifest_for(path, grid, separator)
    return VirtualArray(path.rsplit("/", 1)[-1] or "data",
                        tuple(cast(list[str], dims)) if dims  # (names: VirtualArray checks)
                        else tuple(f"dim_{k}" for k in range(len(shape))),
                        stored, grid, manifest, fill, codecs, {**attrs, **records})


def _v3_codecs(chain: list[CodecV2], dtype: np.dtype, url: str,
               path: str) -> tuple[CodecJSON, ...]:
    """A Zarr v2 filter + compressor chain (in encoding order) as a Zarr v3 codec list:
    array→array filters, then one array→bytes codec, then bytes→bytes codecs. A codec that is
    neither (kerchunk's ``grib``, imagecodecs' image codecs) is the array→bytes codec."""
    codecs: list[CodecJSON] = []
    head: CodecJSON | None = None
    for f in chain:
        name = f"numcodecs.{f['id']}"
        entry: CodecJSON = {"name": name,
                            "configuration": {k: v for k, v in f.items() if k != "id"}}
        if head is None and f["id"] in VLEN:
            head = {"name": VLEN[f["id"]][1]}
            codecs.append(head)
        elif head is None and name in ARRAY_TO_ARRAY:
            codecs.append(entry)
        elif head is None and f["id"] in BYTES_TO_BYTES:
            head = bytes_codec(dtype)
            codecs += [head, entry]
        elif head is None:
            try:
                numcodec(entry)
            except Exception as e:  # unknown id or bad configuration
                raise FormatError(url, path, f"codec {f['id']!r} is not available: {e}") from e
            head = entry
            codecs.append(entry)
        elif f["id"] in BYTES_TO_BYTES:
            codecs.append(entry)
        else:
            raise FormatError(url, path, f"codec {f['id']!r} follows the array→bytes codec "
                              f"{head['name']!r}: not expressible as Zarr v3 codecs")
    if head is None:
        codecs.append(bytes_codec(dtype))
    return tuple(codecs)


def _v2_dtype(spec: object) -> npt.DTypeLike:
    if isinstance(spec, list):
        return [tuple(_v2_dtype(x) if isinstance(x, list) else x for x in f) for f in spec]
    return cast(npt.DTypeLike, spec)  # a type string: np.dtype judges it


def _fill_v2(value: JSON, dtype: np.dtype) -> object:
    if value is None or dtype.kind in "OT":
        return None
    if isinstance(value, str) and dtype.kind in "fc":
        return dtype.type({"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}[value])
    if isinstance(value, str):  # bytes-like types: base64
        return np.frombuffer(base64.b64decode(value), dtype)[0]
    fitted = np.asarray(value).astype(dtype)
    if fitted.ndim:
        raise ValueError(f"fill_value {value!r:.40} is not one value")
    return fitted[()]


def _manifest_from_keys(path: str, refs: Mapping[str, KerchunkValue], chunk_keys: list[str],
                        grid: RectilinearGrid, separator: str, url: str,
                        storage_options: StorageOptions) -> ChunkManifest:
    counts = grid.chunk_counts
    try:
        encoding = KeyEncoding.from_json({"name": "v2", "configuration": {
            "separator": separator}})
    except ValueError as e:
        raise FormatError(url, path, f"dimension_separator {separator!r:.20}: {e}") from e
    built = ManifestBuilder(counts)
    whole: list[tuple[int, ...]] = []  # [url] references: the whole file is the chunk
    for tail in chunk_keys:
        # a 0-d array: "0" (or the empty key some writers produce)
        coords = encoding.decode(tail, len(counts)) if counts else ()
        if coords is None or any(not c < n for c, n in zip(coords, counts, strict=True)):
            continue
        key = f"{path}/{tail}".lstrip("/")
        value = refs[key]
        if isinstance(value, list):
            if len(value) not in (1, 3) or not isinstance(value[0], str) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2**62
                    for v in value[1:]):
                raise FormatError(url, key, f"reference {value!r:.80} is not [url] or "
                                  "[url, offset, length] with offsets in [0, 2**62]")
            if len(value) == 1:
                whole.append(coords)
                built.range(coords, value[0], 0, 0)
            else:
                built.range(coords, value[0], cast(int, value[1]), cast(int, value[2]))
        else:
            built.inlined(coords, base64.b64decode(as_base64(value)[7:]))
    if whole:
        flat = [flat_index(c, counts) for c in whole]
        table = list(built.urls)
        named = [table[built.path_id[k]] for k in flat]
        sizes = file_sizes(sorted(set(named)), storage_options, url)
        built.set_lengths(flat, [sizes[u] for u in named])
    return built.build()


# -- written ---------------------------------------------------------------------------

def v2_documents(group: VirtualGroup) -> dict[str, dict[str, object]]:
    """Every node's v2 documents, keyed ``.zgroup``, ``tas/.zarray``, ``tas/.zattrs``..."""
    refuse_segments(group, "Zarr v2 output (kerchunk, parquet zarr_format=2)")
    out: dict[str, dict[str, object]] = {ZGROUP: {"zarr_format": 2}, ZATTRS: _plain(group.attrs)}
    for path, node in group.walk():
        if isinstance(node, VirtualGroup):
            out[f"{path}/{ZGROUP}"] = {"zarr_format": 2}
            out[f"{path}/{ZATTRS}"] = _plain(node.attrs)
        else:
            out[f"{path}/{ZARRAY}"], out[f"{path}/{ZATTRS}"] = _array_documents(path, node)
    return out


def _plain(attrs: Mapping[str, object], also: str | None = None) -> dict[str, object]:
    """Attributes for readers that are not refgrid: without refgrid's bookkeeping (kept in
    the references' own section) and ``also``."""
    return {k: v for k, v in split_bookkeeping(attrs)[0].items() if k != also}


def require_regular(path: str, array: VirtualArray, what: str) -> RectilinearGrid:
    """``array``'s grid if it is regular; else a :class:`WriteError` naming the array and
    its irregular dimension."""
    grid = array.grid
    if grid.is_regular:
        return grid
    dim = next(d for d, a in enumerate(grid.axes) if a.regular_size is None)
    lengths = grid.lengths(dim)[:8].tolist()
    more = " ..." if grid.chunk_counts[dim] > 8 else ""
    raise WriteError(
        f"array {path!r}: {what} needs regular chunk grids, but its chunks along "
        f"{array.dims[dim]!r} have lengths {lengths}{more} (files of irregular length, or "
        "chunks padded inside the array); write format='json' or 'parquet' (Zarr v3, "
        "rectilinear grid) instead")


def _array_documents(path: str, array: VirtualArray
                     ) -> tuple[dict[str, object], dict[str, object]]:
    grid = require_regular(path, array, "kerchunk-v2 output")
    chunks = list(grid.chunk_shape or ())
    filters, compressor = _v2_codecs(path, array, math.prod(chunks))
    dtype, fill, moved = _v2_dtype_and_fill(path, array)
    zarray = {"zarr_format": 2, "shape": list(array.shape), "chunks": chunks, "dtype": dtype,
              "fill_value": fill, "order": _v2_order(path, array), "filters": filters or None,
              "compressor": compressor, "dimension_separator": "."}
    attrs = _plain(array.attrs, "_FillValue" if moved else None)
    attrs["_ARRAY_DIMENSIONS"] = list(array.dims)
    return zarray, attrs


def _v2_dtype_and_fill(path: str, array: VirtualArray) -> tuple[object, object, bool]:
    """The ``dtype`` and ``fill_value`` of ``.zarray``, and whether the CF ``_FillValue``
    became that fill value (xarray reads it from there in v2); without one that fits the
    type, a fill only where some chunk is missing."""
    dtype = stored_dtype(array.dtype, array.codecs)
    records = original_dtype(array.attrs, dtype)  # (raw bytes: Zarr v3 would misread them)
    typed = records != dtype and flat_records(records)  # (v2 keeps each field's order)
    zdtype = zarr_dtype(records if typed else dtype, zarr_format=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        name = zdtype.to_json(zarr_format=2)["name"]
        candidates = [(array.attrs.get("_FillValue"), True)]
        if array.manifest.missing.any():
            candidates.append((recast_fill(array.fill_value, dtype, zdtype.to_native_dtype()),
                               False))
        for value, from_attribute in candidates:
            if value is None:
                continue
            try:
                fill = zdtype.to_json_scalar(zdtype.cast_scalar(value), zarr_format=2)
            except (TypeError, ValueError, OverflowError):
                continue
            return name, list(fill) if isinstance(fill, tuple) else fill, from_attribute
    return name, None, False


def _v2_order(path: str, array: VirtualArray) -> str:
    """Zarr v2's memory order: a ``transpose`` codec that reverses the axes is ``"F"``; any
    other permutation has no v2 form."""
    order = Pipeline.of(list(array.codecs)).order
    if order is None or order == tuple(range(len(order))):
        return "C"
    if order == tuple(reversed(range(len(order)))):
        return "F"
    raise WriteError(f"array {path!r}: a transpose to {list(order)} has no Zarr v2 form; "
                     "write format='json' (Zarr v3) instead")


def _v2_codecs(path: str, array: VirtualArray,
               chunk_elements: int) -> tuple[list[JSONObject], JSONObject | None]:
    pipeline = Pipeline.of(list(array.codecs))
    nbytes = chunk_elements * array.dtype.itemsize
    stages = [_v2_codec(path, c, nbytes) for c in pipeline.filters]
    if pipeline.head["name"] != "bytes":
        stages.append(_v2_codec(path, pipeline.head, nbytes))
    stages += [_v2_codec(path, c, nbytes) for c in pipeline.compressors]
    if pipeline.compressors:
        return stages[:-1], stages[-1]
    return stages, None


def _v2_codec(path: str, codec: CodecJSON, nbytes: int) -> JSONObject:
    name, config = codec["name"], dict(codec.get("configuration", {}))
    if name in ("vlen-utf8", "vlen-bytes"):
        return {"id": name}
    if name.startswith("numcodecs."):
        return {"id": name.removeprefix("numcodecs."), **config}
    if name in REFGRID_CODECS:  # their v2 configuration adds the decoded size, ``nbytes``
        return {"id": name, **config, "nbytes": nbytes}
    if name in ("gzip", "zstd"):  # Zarr v3's own compressors: numcodecs' ids and settings
        return {"id": name, **config}
    raise WriteError(f"array {path!r}: codec {name!r} has no Zarr v2 form; write "
                     "format='json' (Zarr v3) instead")

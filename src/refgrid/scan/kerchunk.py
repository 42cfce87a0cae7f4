"""Existing kerchunk reference sets → the model (e.g. kerchunk's output for GRIB, TIFF, FITS).

fsspec's reference filesystem normalises the JSON forms — v0 and v1 (templates, generators) —
into one key → value mapping. Zarr v3 keys go through :mod:`refgrid.scan.v3_refs`; Zarr v2
metadata (``.zarray``, ``.zattrs`` with ``_ARRAY_DIMENSIONS``, compressor and filters) is
translated to the v3 form here, for JSON and parquet reference sets alike.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import fsspec
import numpy as np

from refgrid.codecs.filters import ARRAY_TO_ARRAY, CodecJSON, bytes_codec
from refgrid.codecs.pipeline import numcodec
from refgrid.core.dtypes import STRING
from refgrid.core.keys import METADATA, ZARRAY, ZATTRS, ZGROUP
from refgrid.errors import FormatError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import INLINE, MISSING, ChunkManifest
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.scan.source import file_sizes
from refgrid.scan.v3_refs import references_to_group

BYTES_TO_BYTES = frozenset({"zlib", "gzip", "bz2", "lzma", "zstd", "lz4", "blosc", "shuffle",
                            "fletcher32", "crc32", "crc32c", "adler32", "jenkins_lookup3"})
"""numcodecs ids that work on bytes; others (delta, fixedscaleoffset, ...) act on arrays."""
V2ManifestFor = Callable[[str, RectilinearGrid, str], ChunkManifest]
"""(array path, its grid, chunk-key separator) → its manifest"""
VLEN = {"vlen-utf8": (STRING, "vlen-utf8"), "vlen-bytes": (np.dtype("O"), "vlen-bytes")}
"""Zarr v2 object-codec filters → (dtype, Zarr v3 codec)."""


def load_kerchunk(refs: str | Mapping[str, Any], url: str,
                  storage_options: Mapping[str, Any]) -> Mapping[str, Any]:
    """The key → value mapping of a kerchunk reference set (a URL, or a loaded dict)."""
    try:
        fs = fsspec.filesystem("reference", fo=refs, target_options=dict(storage_options),
                               remote_options=dict(storage_options), simple_templates=False,
                               skip_instance_cache=True)
    except FileNotFoundError:
        raise FormatError(url, None, "reference set not found") from None
    except (ValueError, KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
        raise FormatError(url, None, f"not a kerchunk reference set: {e}") from None
    return fs.references


def kerchunk_to_group(refs: Mapping[str, Any], url: str,
                      storage_options: Mapping[str, Any]) -> VirtualGroup:
    """The model of a kerchunk key → value mapping: Zarr v3 keys as they are, Zarr v2
    metadata translated."""
    keys = list(refs)
    if METADATA in refs:
        return references_to_group({"refs": {k: _value(refs[k]) for k in keys}}, url)
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


def _value(value: Any) -> Any:
    """A reference value as refgrid's JSON form: lists as they are, data as base64. Inline
    text is UTF-8, the rule fsspec's reference filesystem reads it by: kerchunk inlines a
    chunk as plain text whenever its bytes decode as UTF-8 (station names with accents or
    other scripts included), as base64 otherwise."""
    if isinstance(value, list):
        return value
    data = value if isinstance(value, bytes) else (
        base64.b64decode(value[7:]) if value.startswith("base64:") else value.encode("utf-8"))
    return "base64:" + base64.b64encode(data).decode("ascii")


def _document(refs: Mapping[str, Any], key: str, url: str) -> dict[str, Any]:
    raw = refs[key]
    data = base64.b64decode(raw[7:]) if isinstance(raw, str) and raw.startswith("base64:") \
        else raw
    try:
        return json.loads(data)
    except (json.JSONDecodeError, TypeError) as e:
        raise FormatError(url, key, f"metadata is not JSON: {e}") from None


def v2_group(documents: Mapping[str, Any], manifest_for: V2ManifestFor, url: str) -> VirtualGroup:
    """The model of Zarr v2 metadata documents (``.zgroup``/``.zarray``/``.zattrs`` keys)."""
    nodes = sorted({k.rpartition(".z")[0].rstrip("/") for k in documents
                    if k.endswith((ZARRAY, ZGROUP))})
    if not nodes:
        raise FormatError(url, None, "no .zgroup/.zarray/zarr.json: not Zarr references")
    arrays = {p: _array_v2(p, documents, manifest_for, url) for p in nodes
              if f"{p}/{ZARRAY}".lstrip("/") in documents}
    return _group_v2("", nodes, arrays, documents)


def _attrs(documents: Mapping[str, Any], path: str) -> dict[str, Any]:
    return dict(documents.get(f"{path}/{ZATTRS}".lstrip("/"), {}))


def _group_v2(path: str, nodes: list[str], arrays: dict[str, VirtualArray],
              documents: Mapping[str, Any]) -> VirtualGroup:
    prefix = f"{path}/" if path else ""
    children = [p for p in nodes if p.startswith(prefix) and p != path and p
                and "/" not in p[len(prefix):]]
    return VirtualGroup(
        _attrs(documents, path),
        {p[len(prefix):]: arrays[p] for p in children if p in arrays},
        {p[len(prefix):]: _group_v2(p, nodes, arrays, documents) for p in children
         if p not in arrays},
    )


def _array_v2(path: str, documents: Mapping[str, Any], manifest_for: V2ManifestFor,
              url: str) -> VirtualArray:
    meta = documents[f"{path}/{ZARRAY}".lstrip("/")]
    attrs = _attrs(documents, path)
    dims = attrs.pop("_ARRAY_DIMENSIONS", None)
    # kerchunk writes a chunk length of 0 along zero-length dimensions
    shape, chunk_shape = tuple(meta["shape"]), tuple(max(1, c) for c in meta["chunks"])
    if meta.get("order", "C") != "C":
        raise FormatError(url, path, "Fortran-ordered (order 'F') arrays are not supported")
    chain = [*(meta.get("filters") or []), *([meta["compressor"]] if meta.get("compressor")
                                            else [])]
    dtype = np.dtype(_v2_dtype(meta["dtype"]))
    vlen = [f for f in chain if f.get("id") in VLEN]
    if vlen:
        dtype = VLEN[vlen[0]["id"]][0]
    codecs = _v3_codecs(chain, dtype, url, path)
    grid = RectilinearGrid.regular(shape, chunk_shape if shape else ())
    separator = meta.get("dimension_separator", ".")
    manifest = manifest_for(path, grid, separator)
    return VirtualArray(path.rsplit("/", 1)[-1] or "data",
                        tuple(dims) if dims else tuple(f"dim_{k}" for k in range(len(shape))),
                        dtype, grid, manifest, _fill_v2(meta.get("fill_value"), dtype),
                        codecs, attrs)


def _v3_codecs(chain: list[dict[str, Any]], dtype: np.dtype, url: str,
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
                raise FormatError(url, path, f"codec {f['id']!r} is not available: {e}") from None
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


def _v2_dtype(spec: Any) -> Any:
    if isinstance(spec, list):
        return [tuple(_v2_dtype(x) if isinstance(x, list) else x for x in f) for f in spec]
    return spec


def _fill_v2(value: Any, dtype: np.dtype) -> Any:
    if value is None or dtype.kind in "OT":
        return None
    if isinstance(value, str) and dtype.kind in "fc":
        return dtype.type({"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}[value])
    if isinstance(value, str):  # bytes-like types: base64
        return np.frombuffer(base64.b64decode(value), dtype)[0]
    cast = np.asarray(value).astype(dtype)
    if cast.ndim:
        raise ValueError(f"fill_value {value!r:.40} is not one value")
    return cast[()]


def _manifest_from_keys(path: str, refs: Mapping[str, Any], chunk_keys: list[str],
                        grid: RectilinearGrid, separator: str, url: str,
                        storage_options: Mapping[str, Any]) -> ChunkManifest:
    counts = grid.chunk_counts
    path_id = np.full(counts, MISSING, np.int32)
    offset = np.zeros(counts, np.uint64)
    length = np.zeros(counts, np.uint64)
    inline: dict[tuple[int, ...], bytes] = {}
    urls: dict[str, int] = {}
    whole: list[tuple[int, ...]] = []  # [url] references: the whole file is the chunk
    for tail in chunk_keys:
        if not counts:  # a 0-d array: "0" (or the empty key some writers produce)
            coords: tuple[int, ...] = ()
        else:
            try:
                coords = tuple(int(c) for c in tail.split(separator))
            except ValueError:
                continue
        if len(coords) != len(counts) or any(not 0 <= c < n for c, n in zip(coords, counts,
                                                                           strict=True)):
            continue
        key = f"{path}/{tail}".lstrip("/")
        value = refs[key]
        if isinstance(value, list):
            if len(value) not in (1, 3) or not isinstance(value[0], str) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2**62
                    for v in value[1:]):
                raise FormatError(url, key, f"reference {value!r:.80} is not [url] or "
                                  "[url, offset, length] with offsets in [0, 2**62]")
            path_id[coords] = urls.setdefault(value[0], len(urls))
            if len(value) == 1:
                whole.append(coords)
            else:
                offset[coords], length[coords] = value[1], value[2]
        else:
            inline[coords] = base64.b64decode(_value(value)[7:])
            path_id[coords] = INLINE
    if whole:
        table = tuple(urls)
        sizes = file_sizes(sorted({table[path_id[c]] for c in whole}), storage_options, url)
        for coords in whole:
            length[coords] = sizes[table[path_id[coords]]]
    return ChunkManifest(tuple(urls), path_id, offset, length, inline)

"""Existing kerchunk reference sets → the model (e.g. kerchunk's output for GRIB, TIFF, FITS).

fsspec's reference filesystem normalises the JSON forms — v0 and v1 (templates, generators) —
into one key → value mapping. Zarr v3 keys go through :mod:`refgrid.scanners.v3_refs`; Zarr v2
metadata (``.zarray``, ``.zattrs`` with ``_ARRAY_DIMENSIONS``, compressor and filters) is
translated to the v3 form here, for JSON and parquet reference sets alike.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import NotRequired, TypeAlias, TypedDict, cast

import fsspec
import numpy as np
import numpy.typing as npt

from refgrid.codecs.filters import ARRAY_TO_ARRAY, CodecJSON, bytes_codec
from refgrid.codecs.pipeline import numcodec
from refgrid.core.dtypes import STRING, recast_fill, storable
from refgrid.core.keys import METADATA, ZARRAY, ZATTRS, ZGROUP, KeyEncoding
from refgrid.core.typed import JSON, JSONObject, StorageOptions
from refgrid.errors import NO_SUCH_FILE, FormatError, NotFoundError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ChunkManifest, ManifestBuilder, flat_index
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.scanners.source import file_sizes
from refgrid.scanners.v3_refs import references_to_group

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


def load_kerchunk(refs: str | Mapping[str, object], url: str,
                  storage_options: StorageOptions) -> Mapping[str, KerchunkValue]:
    """The key → value mapping of a kerchunk reference set (a URL, or a loaded dict)."""
    try:
        fs = fsspec.filesystem("reference", fo=refs, target_options=dict(storage_options),
                               remote_options=dict(storage_options), simple_templates=False,
                               skip_instance_cache=True)
    except FileNotFoundError as e:
        raise NotFoundError(url, None, NO_SUCH_FILE) from e
    except (ValueError, KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
        raise FormatError(url, None, f"not a kerchunk reference set: {e}") from e
    return fs.references


def kerchunk_to_group(refs: Mapping[str, KerchunkValue], url: str,
                      storage_options: StorageOptions) -> VirtualGroup:
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


def _value(value: KerchunkValue) -> str | list[object]:
    """A reference value as refgrid's JSON form: lists as they are, data as base64."""
    return value if isinstance(value, list) else _inline(value)


def _inline(value: str | bytes) -> str:
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
            built.inlined(coords, base64.b64decode(_inline(value)[7:]))
    if whole:
        flat = [flat_index(c, counts) for c in whole]
        table = list(built.urls)
        named = [table[built.path_id[k]] for k in flat]
        sizes = file_sizes(sorted(set(named)), storage_options, url)
        built.set_lengths(flat, [sizes[u] for u in named])
    return built.build()

"""Reference sets → the in-memory model: how refgrid reads back what it wrote.

Every ``zarr.json`` becomes a group or an array (grids in any form: regular, rectilinear with
encoded extents, rectangular) and the chunk references become manifest columns — from a JSON
reference dict (walked once) or from parquet records (read column by column, no Python object
per chunk). Other kerchunk reference sets go through :mod:`refgrid.scan.kerchunk`.
"""

from __future__ import annotations

import base64
import json
import math
import os
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np
import orjson
import pandas as pd
from fsspec.core import url_to_fs

from refgrid.codecs import stored_dtype
from refgrid.errors import FormatError
from refgrid.gc_pause import gc_paused
from refgrid.grid import RectilinearGrid
from refgrid.manifest import INLINE, MISSING, ChunkManifest, chunk_coords
from refgrid.model import VirtualArray, VirtualGroup
from refgrid.write.zarr_v3 import document_keys

if TYPE_CHECKING:
    from refgrid.scan.kerchunk_parquet import ParquetReferences

References = dict[str, Any]


def load_references(refs: References | str | os.PathLike[str],
                    storage_options: dict[str, Any] | None = None) -> References:
    """A kerchunk reference dict from a dict, or a path/URL to a JSON reference file."""
    if isinstance(refs, dict):
        return refs
    url = os.fspath(refs)
    try:
        with fsspec.open(url, "rb", **(storage_options or {})) as f:
            data = f.read()
        with gc_paused():
            return orjson.loads(data)  # (several times faster than json on 10^5 keys)
    except FileNotFoundError:
        raise FormatError(url, None, "reference file not found") from None
    except json.JSONDecodeError as e:
        raise FormatError(url, None, f"not a JSON reference file: {e}") from None


def open_references(refs: References | str | os.PathLike[str],
                    storage_options: dict[str, Any] | None = None) -> VirtualGroup:
    """The model of a reference set: a dict, a JSON file or a parquet directory (path or URL),
    refgrid's own (Zarr v3 documents) or any kerchunk reference set (translated from v2); or
    a Zarr v3 store, a tree of ``zarr.json`` documents and chunk files."""
    from refgrid.scan.kerchunk_parquet import is_parquet_references, load_parquet_references

    options = storage_options or {}
    if isinstance(refs, dict):
        return references_to_group(refs)
    url = os.fspath(refs)
    if not url.endswith((".json", ".parq", ".parquet")) and _is_zarr_store(url, options):
        return zarr_store_to_group(url, options)
    if url.endswith((".parq", ".parquet")) or os.path.isdir(url) or (
            "://" in url and not url.endswith(".json") and is_parquet_references(url, options)):
        parquet = load_parquet_references(url, options)
        if "zarr.json" not in parquet.documents:
            return _kerchunk(url, options, parquet=True)
        return parquet_to_group(parquet)
    loaded = load_references(url, options)
    if "zarr.json" not in loaded.get("refs", loaded):
        return _kerchunk(url, options)
    return references_to_group(loaded, url)


def parquet_to_group(parquet: ParquetReferences) -> VirtualGroup:
    """The model of parquet references holding Zarr v3 documents (refgrid's own)."""
    return group_from_documents(
        {node: parquet.documents[k] for node, k in document_keys(parquet.documents).items()},
        lambda path, grid: parquet.manifest(path, grid.chunk_counts), parquet.url)


def _is_zarr_store(url: str, options: dict[str, Any]) -> bool:
    fs, root = url_to_fs(url, **options)
    return bool(fs.isfile(f"{root.rstrip('/')}/zarr.json"))


def zarr_store_to_group(url: str, storage_options: dict[str, Any] | None = None) -> VirtualGroup:
    """The model of a Zarr v3 store: its ``zarr.json`` documents, and each chunk file a
    reference to the whole file — so the engine reads stores with rectilinear grids (written
    by zarr >= 3.2, say) where zarr 3.1 cannot. One listing of the tree, one request for all
    documents."""
    fs, root = url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    files = {path[len(root) + 1:]: info for path, info in fs.find(root, detail=True).items()}
    names = document_keys(files)
    texts = fs.cat([f"{root}/{k}" for k in names.values()])
    documents = {node: _document(texts[f"{root}/{k}"], url, k) for node, k in names.items()}
    chunks: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    with gc_paused():
        for key, info in files.items():
            array, tail = _chunk_of_file(key, documents)
            if array is not None:
                chunks[array].append((tail, [fs.unstrip_protocol(f"{root}/{key}") if "://" in url
                                             else f"{root}/{key}", 0, int(info["size"])]))
    return group_from_documents(documents, lambda path, grid: _manifest(
        grid, chunks.get(path, []), {}, f"{url}:{path}"), url)


def _chunk_of_file(key: str, documents: dict[str, dict[str, Any]]) -> tuple[str | None, str]:
    """(array, chunk coordinates as ``"0/3/1"``) of a file of a Zarr v3 store (default chunk
    key encoding, ``/`` or ``.`` separated), or (None, "") for other files."""
    head, _, name = key.rpartition("/")
    if name == "c" and documents.get(head, {}).get("node_type") == "array":
        return head, ""  # the chunk of a 0-d array
    if name.startswith("c.") and documents.get(head, {}).get("node_type") == "array":
        return head, name[2:].replace(".", "/")
    array, sep, tail = key.rpartition("/c/")
    if sep and documents.get(array, {}).get("node_type") == "array":
        return array, tail
    return None, ""


def _kerchunk(url: str, options: dict[str, Any], parquet: bool = False) -> VirtualGroup:
    from refgrid.scan.kerchunk import scan_kerchunk

    return scan_kerchunk(url, options, parquet=parquet)


def references_to_group(refs: References, source: str = "<references>") -> VirtualGroup:
    """Build the model of a reference set written with Zarr v3 keys."""
    entries = refs.get("refs", refs)
    templates = refs.get("templates", {})
    documents = {node: _document(entries[k], source, k)
                 for node, k in document_keys(entries).items()}
    chunks: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    with gc_paused():
        for key, value in entries.items():
            head, sep, tail = key.rpartition("/c/")
            if sep and head in documents:
                chunks[head].append((tail, value))
            elif key.endswith("/c") and key[:-2] in documents:
                chunks[key[:-2]].append(("", value))
        return group_from_documents(documents, lambda path, grid: _manifest(
            grid, chunks.get(path, []), templates, f"{source}:{path}"), source)


ManifestFor = Callable[[str, RectilinearGrid], ChunkManifest]
"""(array path, its grid) → its manifest"""


def group_from_documents(documents: dict[str, dict[str, Any]], manifest_for: ManifestFor,
                         source: str) -> VirtualGroup:
    """The model of a tree of ``zarr.json`` documents (keyed by node path, ``""`` the root);
    ``manifest_for`` supplies each array's chunk references."""
    if "" not in documents:
        raise FormatError(source, None, "no root zarr.json: not Zarr v3 references")
    arrays = {path: _array(path, doc, manifest_for)
              for path, doc in documents.items() if doc.get("node_type") == "array"}
    return _build_group("", documents, arrays)


def _document(value: Any, source: str, key: str) -> dict[str, Any]:
    if isinstance(value, str) and value.startswith("base64:"):
        value = base64.b64decode(value[7:]).decode("utf-8")
    try:
        return json.loads(value) if isinstance(value, str | bytes) else dict(value)
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise FormatError(source, key, f"metadata is not a JSON document: {e}") from None


def _build_group(path: str, documents: dict[str, dict[str, Any]],
                 arrays: dict[str, VirtualArray]) -> VirtualGroup:
    prefix = f"{path}/" if path else ""
    children = [p for p in documents if p.startswith(prefix) and p != path
                and "/" not in p[len(prefix):]]
    return VirtualGroup(
        attrs=documents[path].get("attributes", {}),
        arrays={p[len(prefix):]: arrays[p] for p in children if p in arrays},
        groups={p[len(prefix):]: _build_group(p, documents, arrays) for p in children
                if documents[p].get("node_type") == "group"},
    )


def _array(path: str, doc: dict[str, Any], manifest_for: ManifestFor) -> VirtualArray:
    from zarr.core.dtype import get_data_type_from_json

    shape = doc["shape"]
    grid = RectilinearGrid.from_json(doc["chunk_grid"], shape)
    codecs = tuple(doc.get("codecs", ()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zdtype = get_data_type_from_json(doc["data_type"], zarr_format=3)
        dtype = zdtype.to_native_dtype()
        fill = zdtype.from_json_scalar(doc.get("fill_value"), zarr_format=3)
    if codecs:
        dtype = stored_dtype(dtype, codecs)
    return VirtualArray(path.rsplit("/", 1)[-1], tuple(doc.get("dimension_names") or
                                                       (f"dim_{k}" for k in range(len(shape)))),
                        dtype, grid, manifest_for(path, grid), fill, codecs,
                        doc.get("attributes", {}))


def _manifest(grid: RectilinearGrid, chunks: list[tuple[str, Any]],
              templates: dict[str, str], where: str) -> ChunkManifest:
    """Chunk references → manifest columns, key parsing and value columns done in numpy."""
    counts = grid.chunk_counts
    path_id = np.full(math.prod(counts), MISSING, np.int32)
    offset = np.zeros(path_id.size, np.uint64)
    length = np.zeros(path_id.size, np.uint64)
    inline: dict[tuple[int, ...], bytes] = {}
    urls: dict[str, int] = {}
    flat = _flat_indices([tail for tail, _ in chunks], counts)
    values = [value for _, value in chunks]
    ranged = np.fromiter((type(v) is list for v in values), bool, len(values))
    keep = flat >= 0  # a key outside the grid holds no data of this array
    refs = np.flatnonzero(ranged & keep)
    if len(refs):
        table = np.empty((len(refs), 3), dtype=object)
        try:
            table[...] = [values[k] for k in refs.tolist()]
        except ValueError:
            bad = next(k for k in refs.tolist() if len(values[k]) != 3)
            raise FormatError(where, chunks[bad][0], "whole-file references are not supported "
                              "for chunks") from None
        codes, names = pd.factorize(table[:, 0])
        remap = np.array([urls.setdefault(_render(n, templates), len(urls)) for n in names],
                         np.int32)
        path_id[flat[refs]] = remap[codes]
        offset[flat[refs]] = table[:, 1].astype(np.uint64)
        length[flat[refs]] = table[:, 2].astype(np.uint64)
    for k in np.flatnonzero(~ranged & keep).tolist():
        value = values[k]
        inline[chunk_coords(int(flat[k]), counts)] = \
            base64.b64decode(value[7:]) if value.startswith("base64:") else value.encode("utf-8")
        path_id[flat[k]] = INLINE
    return ChunkManifest(tuple(urls), path_id.reshape(counts), offset.reshape(counts),
                         length.reshape(counts), inline)


def _flat_indices(tails: list[str], counts: tuple[int, ...]) -> np.ndarray:
    """C-order chunk index of each key tail (``"0/3/1"``), -1 where it is not in the grid."""
    if not counts:
        return np.where(np.array([t == "" for t in tails], bool), 0, -1)
    parts = "/".join(tails).split("/") if tails else []
    try:
        if len(parts) != len(tails) * len(counts):
            raise ValueError("keys of another rank")
        coords = np.array(parts, dtype=np.int64).reshape(len(tails), len(counts))
    except ValueError:  # some keys of another rank or not numeric: parse one by one
        coords = np.array([[int(c) for c in t.split("/")] if _is_key(t, len(counts)) else
                           [-1] * len(counts) for t in tails], np.int64).reshape(-1, len(counts))
    inside = ((coords >= 0) & (coords < np.array(counts))).all(axis=1)
    flat = np.full(len(tails), -1, np.int64)
    flat[inside] = np.ravel_multi_index(tuple(coords[inside].T), counts)
    return flat


def _is_key(tail: str, ndim: int) -> bool:
    parts = tail.split("/")
    return len(parts) == ndim and all(p.isdigit() for p in parts)


def _render(url: str, templates: dict[str, str]) -> str:
    for name, value in templates.items():
        url = url.replace("{{" + name + "}}", value)
    return url

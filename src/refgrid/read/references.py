"""kerchunk references (JSON v1 with Zarr v3 documents) → the in-memory model.

This is how refgrid reads back what it wrote: every ``zarr.json`` becomes a group or an array
(grids in any form: regular, rectilinear with encoded extents, rectangular), and chunk keys
become manifest columns. The reference dict is walked once; no object is kept per chunk.
"""

from __future__ import annotations

import base64
import json
import os
import warnings
from collections import defaultdict
from typing import Any

import fsspec
import numpy as np

from refgrid.codecs import stored_dtype
from refgrid.errors import FormatError
from refgrid.grid import RectilinearGrid
from refgrid.manifest import INLINE, MISSING, ChunkManifest
from refgrid.model import VirtualArray, VirtualGroup

References = dict[str, Any]


def load_references(refs: References | str | os.PathLike[str],
                    storage_options: dict[str, Any] | None = None) -> References:
    """A kerchunk reference dict from a dict, or a path/URL to a JSON reference file."""
    if isinstance(refs, dict):
        return refs
    url = os.fspath(refs)
    try:
        with fsspec.open(url, "rt", **(storage_options or {})) as f:
            return json.load(f)
    except FileNotFoundError:
        raise FormatError(url, None, "reference file not found") from None
    except json.JSONDecodeError as e:
        raise FormatError(url, None, f"not a JSON reference file: {e}") from None


def references_to_group(refs: References, source: str = "<references>") -> VirtualGroup:
    """Build the model of a reference set written with Zarr v3 keys."""
    entries = refs.get("refs", refs)
    templates = refs.get("templates", {})
    documents = {k[: -len("zarr.json")].rstrip("/"): _document(entries[k], source, k)
                 for k in entries if k == "zarr.json" or k.endswith("/zarr.json")}
    if "" not in documents:
        raise FormatError(source, None, "no root zarr.json: not Zarr v3 references")
    chunks: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for key, value in entries.items():
        head, sep, tail = key.rpartition("/c/")
        if sep and head in documents:
            chunks[head].append((tail, value))
        elif key.endswith("/c") and key[:-2] in documents:
            chunks[key[:-2]].append(("", value))
    arrays = {path: _array(path, doc, chunks.get(path, []), templates, source)
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


def _array(path: str, doc: dict[str, Any], chunks: list[tuple[str, Any]],
           templates: dict[str, str], source: str) -> VirtualArray:
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
    manifest = _manifest(grid, chunks, templates, f"{source}:{path}")
    return VirtualArray(path.rsplit("/", 1)[-1], tuple(doc.get("dimension_names") or
                                                       (f"dim_{k}" for k in range(len(shape)))),
                        dtype, grid, manifest, fill, codecs, doc.get("attributes", {}))


def _manifest(grid: RectilinearGrid, chunks: list[tuple[str, Any]],
              templates: dict[str, str], where: str) -> ChunkManifest:
    counts = grid.chunk_counts
    path_id = np.full(counts, MISSING, np.int32)
    offset = np.zeros(counts, np.uint64)
    length = np.zeros(counts, np.uint64)
    inline: dict[tuple[int, ...], bytes] = {}
    urls: dict[str, int] = {}
    for tail, value in chunks:
        coords = tuple(int(c) for c in tail.split("/")) if tail else ()
        if len(coords) != grid.ndim or any(c >= n for c, n in zip(coords, counts, strict=True)):
            continue  # a key outside the grid holds no data of this array
        if isinstance(value, list):
            url = _render(value[0], templates)
            path_id[coords] = urls.setdefault(url, len(urls))
            if len(value) == 3:
                offset[coords], length[coords] = value[1], value[2]
            else:
                raise FormatError(where, "/".join(map(str, coords)),
                                  "whole-file references are not supported for chunks")
        else:
            data = base64.b64decode(value[7:]) if value.startswith("base64:") else \
                value.encode("utf-8")
            inline[coords] = data
            path_id[coords] = INLINE
    return ChunkManifest(tuple(urls), path_id, offset, length, inline)


def _render(url: str, templates: dict[str, str]) -> str:
    for name, value in templates.items():
        url = url.replace("{{" + name + "}}", value)
    return url

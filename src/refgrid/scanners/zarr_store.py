"""Zarr v3 stores → the model: ``zarr.json`` documents, and each chunk file a reference to
the whole file — so the engine reads stores with rectilinear grids (written by zarr >= 3.2,
say) where zarr 3.1 cannot. Sharded arrays become references to their inner chunks.

Where listing is cheap (a local directory, an object store's paged listing) the tree is
listed once: chunks present and their sizes are known. Over HTTP a listing is a page per
directory and a ``HEAD`` per chunk file, thousands of requests for a modest store, so there
the documents are read (consolidated metadata: one request) and every chunk key the grid
has is named without asking: a whole file of unknown size, which the reader fetches when
asked for and reads as the fill value when the server has none (as zarr does). refgrid's
bookkeeping beside a served store (``refgrid.json``) is read back when present.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping

import fsspec
import numpy as np

from refgrid.core.keys import (
    BOOKKEEPING,
    METADATA,
    KeyEncoding,
    chunk_entries,
    document_key,
    document_keys,
)
from refgrid.core.typed import JSON, JSONObject
from refgrid.core.util import gc_paused
from refgrid.errors import FormatError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import UNSIZED, ChunkManifest, ManifestBuilder
from refgrid.model.virtual import VirtualGroup
from refgrid.model.zarr_json import group_from_documents, with_bookkeeping
from refgrid.refs.json_refs import ChunkRefs, chunk_manifest, document
from refgrid.refs.section import ATTRIBUTES_KEY
from refgrid.scanners.options import ScanOptions
from refgrid.scanners.source import Source
from refgrid.scanners.zarr_shards import is_sharded, unshard

UNLISTED_PROTOCOLS = ("http", "https")
"""Stores whose chunks are named from the metadata rather than listed."""


def scan_zarr_store(source: Source, options: ScanOptions) -> VirtualGroup:
    """The model of the Zarr v3 store at ``source``."""
    fs, root = source.filesystem()
    root = root.rstrip("/")
    protocol = source.url.split("://", 1)[0] if "://" in source.url else "file"
    group = None
    if protocol in UNLISTED_PROTOCOLS:
        group = _unlisted(fs, root, source)
    if group is None:
        group = _listed(fs, root, source)
    return with_bookkeeping(group, _bookkeeping(fs, root))


def _listed(fs: fsspec.AbstractFileSystem, root: str, source: Source) -> VirtualGroup:
    """The store from one listing of its tree (chunks present, with their sizes)."""
    files = {path[len(root) + 1:]: info for path, info in fs.find(root, detail=True).items()}
    _add_sizes(fs, root, files)
    names = document_keys(files)
    texts = fs.cat([f"{root}/{k}" for k in names.values()])
    documents: dict[str, Mapping[str, object]] = {
        node: document(texts[f"{root}/{k}"], source.url, k) for node, k in names.items()}
    chunks: dict[str, ChunkRefs] = {}
    paths: dict[str, str] = {}
    with gc_paused():
        keyed = ((key, (key, info)) for key, info in files.items())
        for array, found in chunk_entries(keyed, documents).items():
            refs = chunks[array] = []
            for tail, (key, info) in found:
                url = f"{root}/{key}" if source.is_local else fs.unstrip_protocol(f"{root}/{key}")
                paths[url] = f"{root}/{key}"
                refs.append((tail, [url, 0, int(info["size"])]))
    for path, doc in list(documents.items()):
        if doc.get("node_type") == "array" and is_sharded(doc):
            documents[path], chunks[path] = unshard(doc, chunks.get(path, []), fs, paths,
                                                    f"{source.url}:{path}")
    return group_from_documents(documents, lambda path, grid: chunk_manifest(
        grid, chunks.get(path, []), {}, f"{source.url}:{path}"), source.url)


def _unlisted(fs: fsspec.AbstractFileSystem, root: str, source: Source) -> VirtualGroup | None:
    """The store from its documents alone, every chunk a whole file named by its key
    (None: a sharded array, whose shard indexes need the files listed)."""
    documents = _documents(fs, root, source.url)
    if any(doc.get("node_type") == "array" and is_sharded(doc) for doc in documents.values()):
        return None
    base = fs.unstrip_protocol(root)

    def manifest(path: str, grid: RectilinearGrid) -> ChunkManifest:
        doc = documents[path]
        prefix = f"{base}/{path}/" if path else f"{base}/"
        try:
            encoding = KeyEncoding.from_json(doc.get("chunk_key_encoding"))
            urls = tuple(prefix + encoding.encode(coords) for coords in
                         itertools.product(*map(range, grid.chunk_counts)))
        except (TypeError, ValueError) as e:
            raise FormatError(source.url, path, f"unusable chunk_key_encoding: {e}") from e
        built = ManifestBuilder(grid.chunk_counts)
        built.ranges(np.arange(len(urls)), [built.url(u) for u in urls], 0, UNSIZED)
        return built.build()

    return group_from_documents(documents, manifest, source.url)


def _documents(fs: fsspec.AbstractFileSystem, root: str, url: str) -> dict[str, JSONObject]:
    """Every node's document by path: from the root's consolidated metadata when it has
    them, else read node by node, each group's directory listed (its chunks never are)."""
    text = _cat(fs, f"{root}/{METADATA}")
    if text is None:
        raise FormatError(url, METADATA, "no root zarr.json: not a Zarr v3 store")
    top = document(text, url, METADATA)
    consolidated = top.get("consolidated_metadata")
    inner = consolidated.get("metadata") if isinstance(consolidated, Mapping) else None
    if isinstance(inner, Mapping):
        return {"": top, **{str(p): dict(d) for p, d in inner.items() if isinstance(d, Mapping)}}
    out = {"": top}
    todo = [""] if top.get("node_type") == "group" else []
    while todo:
        node = todo.pop()
        where = f"{root}/{node}" if node else root
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(where, detail=False)]
        except FileNotFoundError:
            continue
        children = [f"{node}/{n}" if node else n for n in names if n and n != METADATA]
        if not children:
            continue
        texts = fs.cat([f"{root}/{document_key(c)}" for c in children], on_error="return")
        for child in children:
            found = texts.get(f"{root}/{document_key(child)}")
            if isinstance(found, bytes):
                out[child] = document(found, url, document_key(child))
                if out[child].get("node_type") == "group":
                    todo.append(child)
    return out


def _bookkeeping(fs: fsspec.AbstractFileSystem, root: str) -> JSON:
    """refgrid's bookkeeping beside a served store (None where there is none)."""
    text = _cat(fs, f"{root}/{BOOKKEEPING}")
    if text is None:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None  # only refines how refgrid shows the data
    return found.get(ATTRIBUTES_KEY) if isinstance(found, dict) else None


def _cat(fs: fsspec.AbstractFileSystem, path: str) -> bytes | None:
    try:
        return bytes(fs.cat_file(path))
    except FileNotFoundError:
        return None


def _add_sizes(fs: fsspec.AbstractFileSystem, root: str,
               files: dict[str, dict[str, object]]) -> None:
    """Sizes for a listing without them: an HTTP server's directory pages (a static server's,
    or ``refgrid serve``'s) list names only, so the sizes are asked for, concurrently."""
    unsized = [key for key, info in files.items() if info.get("size") is None]
    if unsized:
        for key, size in zip(unsized, fs.sizes([f"{root}/{k}" for k in unsized]), strict=True):
            files[key] = {**files[key], "size": size}

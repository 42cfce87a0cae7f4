"""Zarr v3 stores → the model: ``zarr.json`` documents, and each chunk file a reference to
the whole file — so the engine reads stores with rectilinear grids (written by zarr >= 3.2,
say) where zarr 3.1 cannot. Sharded arrays become references to their inner chunks. One
listing of the tree, one request for all documents, one batch for all shard indexes."""

from __future__ import annotations

from typing import Any

from refgrid.core.keys import chunk_entries, document_keys
from refgrid.core.util import gc_paused
from refgrid.model.virtual import VirtualGroup
from refgrid.model.zarr_json import group_from_documents
from refgrid.scan.options import ScanOptions
from refgrid.scan.source import Source
from refgrid.scan.v3_refs import ChunkRefs, chunk_manifest, document
from refgrid.scan.zarr_shards import is_sharded, unshard


def scan_zarr_store(source: Source, options: ScanOptions) -> VirtualGroup:
    """The model of the Zarr v3 store at ``source``."""
    fs, root = source.filesystem()
    root = root.rstrip("/")
    files = {path[len(root) + 1:]: info for path, info in fs.find(root, detail=True).items()}
    _add_sizes(fs, root, files)
    names = document_keys(files)
    texts = fs.cat([f"{root}/{k}" for k in names.values()])
    documents = {node: document(texts[f"{root}/{k}"], source.url, k) for node, k in names.items()}
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


def _add_sizes(fs: Any, root: str, files: dict[str, dict[str, Any]]) -> None:
    """Sizes for a listing without them: an HTTP server's directory pages (a static server's,
    or ``refgrid serve``'s) list names only, so the sizes are asked for, concurrently."""
    unsized = [key for key, info in files.items() if info.get("size") is None]
    if unsized:
        for key, size in zip(unsized, fs.sizes([f"{root}/{k}" for k in unsized]), strict=True):
            files[key] = {**files[key], "size": size}

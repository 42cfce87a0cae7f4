"""kerchunk references (JSON v1) for a :class:`~refgrid.model.virtual.VirtualGroup`.

Keys are Zarr v3 (``zarr.json``, ``tas/c/0/3/1``), or classic kerchunk's Zarr v2
(``tas/.zarray``, ``tas/0.3.1``: :mod:`refgrid.writers.kerchunk_v2`); values are
``[url, offset, length]``, or ``base64:`` inline bytes stored verbatim. URLs go through
``templates`` (``{{u0}}``) where several files are referenced — a combined archive names each
file for many chunks; the references of a single file name it plainly, the form readers that
do not expand templates (VirtualiZarr's kerchunk parser) open.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from refgrid.core.keys import METADATA, chunk_key, chunk_key_v2
from refgrid.core.sources import SOURCES_KEY
from refgrid.core.typed import JSON, JSONObject
from refgrid.core.util import gc_paused
from refgrid.grid.rectilinear import GridForm
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import consolidated, documents, key_encoding
from refgrid.writers.kerchunk_v2 import v2_documents
from refgrid.writers.section import Portable, section

KeyOf = Callable[[str, tuple[int, ...], VirtualArray], str]
"""(array path, chunk coordinates, the array) → the chunk's key."""


def to_kerchunk(group: VirtualGroup, *, grid_form: GridForm = "auto",
                sidecar: Path | None = None) -> JSONObject:
    """The kerchunk v1 reference dict of ``group`` (metadata documents included). Where
    every array's grid is regular, the root's document carries every node's as consolidated
    metadata, so stock zarr and xarray open it in one read, without a warning; a rectilinear
    grid there would make zarr 3.1 (or zarr >= 3.2 without its flag) refuse the whole group
    rather than that one array, so such references are opened with ``consolidated=False``.
    ``sidecar``: the directory of rewritten chunks beside the references, whose files are
    named relative to it."""
    docs = documents(group, grid_form)
    if all(array.grid.is_regular for _, array in group.walk()
           if isinstance(array, VirtualArray)) and grid_form == "auto":
        nodes = {key[:-len(METADATA)].rstrip("/"): doc for key, doc in docs.items()}
        docs[METADATA] = consolidated(nodes[""], nodes)  # type: ignore[assignment]
    return _references(group, {k: dumps(d) for k, d in docs.items()},
                       lambda path, coords, array: chunk_key(path, coords, key_encoding(array)),
                       Portable(sidecar))


def to_kerchunk_v2(group: VirtualGroup) -> JSONObject:
    """Classic kerchunk references of ``group``: Zarr v2 keys and documents (regular grids
    only; a rectilinear array is a :class:`~refgrid.errors.WriteError` naming it)."""
    return _references(group, {k: dumps(d) for k, d in v2_documents(group).items()},
                       lambda path, coords, array: chunk_key_v2(path, coords), Portable(None))


def _references(group: VirtualGroup, metadata: dict[str, str],
                key_of: KeyOf,
                portable: Portable) -> JSONObject:
    arrays = [(path, node) for path, node in group.walk() if isinstance(node, VirtualArray)]
    names = {portable(url) for _, array in arrays for url in array.manifest.paths}
    templates: dict[str, str] | None = {} if len(names) > 1 else None
    refs: dict[str, JSON] = dict(metadata)
    with gc_paused():  # 10^5 small lists: the collector would walk them again and again
        for path, array in arrays:
            _chunk_refs(path, array, templates, refs, key_of, portable)
    # refgrid's section first (readers check the sources against it; fsspec ignores it):
    # its first bytes tell xarray the file is refgrid's (read/backend.owned_output)
    out: JSONObject = {SOURCES_KEY: section(group, portable), "version": 1}
    if templates or portable.template:
        out["templates"] = {**{v: k for k, v in (templates or {}).items()},
                            **portable.template}
    out["refs"] = refs
    return out


def _chunk_refs(path: str, array: VirtualArray, templates: dict[str, str] | None,
                refs: dict[str, JSON], key_of: KeyOf,
                portable: Portable) -> None:
    """``templates`` is None where URLs are written plainly (a sidecar's files are always
    written through its own template)."""
    manifest = array.manifest
    urls = [portable(url) for url in manifest.paths]
    names = urls if templates is None else [
        url if url.startswith("{{") else
        "{{" + templates.setdefault(url, f"u{len(templates)}") + "}}" for url in urls]
    flat, ids, offsets, lengths = manifest.stored()
    axes = np.unravel_index(flat, manifest.shape) if manifest.shape else ()
    for k, (pid, off, n) in enumerate(zip(ids, offsets, lengths, strict=True)):
        key = key_of(path, tuple(int(c[k]) for c in axes), array)
        refs[key] = [names[pid], off, n]
    for coords, data in manifest.inline.items():  # ChunkManifest checks they are marked INLINE
        refs[key_of(path, coords, array)] = "base64:" + base64.b64encode(data).decode("ascii")


def dumps(document: Mapping[str, object]) -> str:
    return json.dumps(document, separators=(",", ":"))

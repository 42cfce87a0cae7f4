"""kerchunk references (JSON v1) for a :class:`~refgrid.model.VirtualGroup`.

Keys are Zarr v3 (``zarr.json``, ``tas/c/0/3/1``); values are ``[url, offset, length]`` with
URLs through ``templates``, or ``base64:`` inline bytes stored verbatim.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from refgrid.gc_pause import gc_paused
from refgrid.grid import GridForm
from refgrid.keys import chunk_key
from refgrid.model import VirtualArray, VirtualGroup
from refgrid.sources import SOURCES_KEY
from refgrid.zarr_json import Document, documents


def to_kerchunk(group: VirtualGroup, *, grid_form: GridForm = "auto") -> dict[str, Any]:
    """The kerchunk v1 reference dict of ``group`` (metadata documents included)."""
    templates: dict[str, str] = {}
    refs: dict[str, Any] = {k: _dumps(d) for k, d in documents(group, grid_form).items()}
    with gc_paused():  # 10^5 small lists: the collector would walk them again and again
        for path, node in group.walk():
            if isinstance(node, VirtualArray):
                _chunk_refs(path, node, templates, refs)
    out = {"version": 1, "templates": {v: k for k, v in templates.items()}, "refs": refs}
    if group.sources:  # readers check the sources against it (fsspec ignores the key)
        out[SOURCES_KEY] = {"sources": dict(group.sources)}
    return out


def _chunk_refs(path: str, array: VirtualArray, templates: dict[str, str],
                refs: dict[str, Any]) -> None:
    manifest = array.manifest
    names = [templates.setdefault(url, f"u{len(templates)}") for url in manifest.paths]
    flat = np.flatnonzero(manifest.path_id.reshape(-1) >= 0)
    axes = np.unravel_index(flat, manifest.shape) if manifest.shape else ()
    columns = [manifest.path_id, manifest.offset, manifest.length]
    ids, offsets, lengths = (c.reshape(-1)[flat].tolist() for c in columns)
    for k, (pid, off, n) in enumerate(zip(ids, offsets, lengths, strict=True)):
        key = chunk_key(path, tuple(int(c[k]) for c in axes))
        refs[key] = ["{{" + names[pid] + "}}", off, n]
    for coords, data in manifest.inline.items():  # ChunkManifest checks they are marked INLINE
        refs[chunk_key(path, coords)] = "base64:" + base64.b64encode(data).decode("ascii")


def _dumps(document: Document) -> str:
    return json.dumps(document, separators=(",", ":"))

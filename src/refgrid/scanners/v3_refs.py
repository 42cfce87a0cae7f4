"""Reference sets with Zarr v3 keys (refgrid's own JSON) → the model.

Every ``zarr.json`` becomes a group or an array (:mod:`refgrid.model.zarr_json`); the chunk
references become manifest columns, key parsing and value columns done in numpy — a JSON
reference dict of 10^5 keys is walked once, with no Python object kept per chunk.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from refgrid.core.keys import chunk_entries, document_keys, flat_indices
from refgrid.core.sources import ATTRIBUTES_KEY, SIDECAR_TEMPLATE, section
from refgrid.core.typed import JSON, JSONObject
from refgrid.core.util import gc_paused
from refgrid.errors import FormatError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ChunkManifest, ManifestBuilder, chunk_coords
from refgrid.model.virtual import VirtualGroup
from refgrid.model.zarr_json import group_from_documents, with_bookkeeping

ChunkRefs = list[tuple[str, Any]]
"""One array's chunk references: (key tail such as ``"0/3/1"``, reference value). A value is
``[url, offset, length]`` or inline text as the reference set holds it, unchecked: it is
used duck-typed, and whatever is not one of those is refused as it is read."""


def references_to_group(refs: Mapping[str, object], source: str = "<references>",
                        sidecar: str | None = None) -> VirtualGroup:
    """Build the model of a reference set written with Zarr v3 keys (a kerchunk dict, with
    or without the ``{"version": 1, "refs": ...}`` wrapper); ``sidecar``: where its sidecar
    directory lies now (its template resolved there)."""
    # (as the callers checked them: entries an object, templates name → URL or absent)
    entries = cast(Mapping[str, object], refs.get("refs", refs))
    templates = dict(cast(Mapping[str, str], refs.get("templates", {})))
    if sidecar is not None:
        templates[SIDECAR_TEMPLATE.strip("{}")] = sidecar
    documents = {node: document(entries[k], source, k)
                 for node, k in document_keys(entries).items()}
    with gc_paused():
        chunks = chunk_entries(entries.items(), documents)
        group = group_from_documents(documents, lambda path, grid: chunk_manifest(
            grid, chunks.get(path, []), templates, f"{source}:{path}"), source)
    return with_bookkeeping(group, section(refs).get(ATTRIBUTES_KEY))



def document(value: object, source: str, key: str) -> JSONObject:
    """A ``zarr.json`` reference value (JSON text, ``base64:`` text or an object) parsed."""
    try:
        if isinstance(value, str) and value.startswith("base64:"):
            value = base64.b64decode(value[7:], validate=True).decode("utf-8")
        parsed = json.loads(value) if isinstance(value, str | bytes) else dict(
            cast(Mapping[str, JSON], value))  # an inline object
    except (json.JSONDecodeError, TypeError, ValueError, binascii.Error) as e:
        raise FormatError(source, key, f"metadata is not a JSON document: {e}") from e
    if not isinstance(parsed, dict):
        raise FormatError(source, key, f"metadata is a JSON {type(parsed).__name__}, not an "
                          "object")
    return parsed


def chunk_manifest(grid: RectilinearGrid, chunks: ChunkRefs, templates: Mapping[str, str],
                   where: str) -> ChunkManifest:
    """Chunk references → manifest columns, key parsing and value columns done in numpy."""
    counts = grid.chunk_counts
    built = ManifestBuilder(counts)
    flat = flat_indices([tail for tail, _ in chunks], counts)
    values = [value for _, value in chunks]
    ranged = np.array([type(v) is list for v in values], bool)
    keep = flat >= 0  # a key outside the grid holds no data of this array
    refs = np.flatnonzero(ranged & keep)
    if len(refs):
        rows = [values[k] for k in refs.tolist()] if len(refs) < len(values) else values
        if set(map(len, rows)) != {3}:
            bad = next(k for k in refs.tolist() if len(values[k]) != 3)
            raise FormatError(where, chunks[bad][0], "whole-file references are not supported "
                              "for chunks") from None
        targets, offsets, lengths = zip(*rows, strict=True)
        try:
            names = dict.fromkeys(targets)
        except TypeError:  # an unhashable target (a list, an object) is no URL
            names = {None: None}
        if not all(isinstance(n, str) for n in names):
            bad = next(k for k in refs.tolist() if not isinstance(values[k][0], str))
            raise FormatError(where, chunks[bad][0], f"reference {values[bad]!r:.80} names "
                              "no URL")
        remap = np.array([built.url(_render(n, templates)) for n in names], np.int32)
        if len(names) == 1:
            ids = remap[0]
        else:
            code = {n: k for k, n in enumerate(names)}
            ids = remap[np.fromiter(map(code.__getitem__, targets), np.int32, len(targets))]
        built.ranges(flat[refs], ids, _byte_counts(offsets, "offset", chunks, refs, where),
                     _byte_counts(lengths, "length", chunks, refs, where))
    for k in np.flatnonzero(~ranged & keep).tolist():
        value = values[k]
        try:
            data = base64.b64decode(value[7:], validate=True) if value.startswith("base64:") \
                else value.encode("utf-8")
        except (AttributeError, binascii.Error, UnicodeEncodeError) as e:
            raise FormatError(where, chunks[k][0], f"inline chunk {value!r:.40} is neither "
                              f"text nor base64 ({e})") from e
        built.inlined(chunk_coords(int(flat[k]), counts), data)
    return built.build()


MAX_BYTES = 2**62
"""The largest offset or length accepted (sums of them stay within int64)."""


def _byte_counts(column: Sequence[object], what: str, chunks: ChunkRefs, rows: np.ndarray,
                 where: str) -> np.ndarray:
    """An offset or length column as uint64, every entry an integer in [0, 2**62]."""
    if set(map(type, column)) <= {int}:  # the JSON case: checked in bulk
        values = np.array(column)  # int64, or object beyond it
        if values.dtype.kind == "i" and values.min() >= 0 and values.max() <= MAX_BYTES:
            return values.astype(np.uint64)
    ok = [isinstance(v, int | np.integer) and not isinstance(v, bool) and 0 <= v <= MAX_BYTES
          for v in column]
    if not all(ok):
        k = ok.index(False)
        raise FormatError(where, chunks[int(rows[k])][0], f"chunk {what} {column[k]!r:.40} is "
                          "not an integer in [0, 2**62]")
    integers = cast(Sequence[int | np.integer], column)  # (each checked above)
    return np.array([int(v) for v in integers], dtype=np.uint64)


def _render(url: str, templates: Mapping[str, str]) -> str:
    for name, value in templates.items():
        url = url.replace("{{" + name + "}}", value)
    return url

"""Reference sets with Zarr v3 keys (refgrid's own JSON) → the model.

Every ``zarr.json`` becomes a group or an array (:mod:`refgrid.model.zarr_json`); the chunk
references become manifest columns, key parsing and value columns done in numpy — a JSON
reference dict of 10^5 keys is walked once, with no Python object kept per chunk.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from refgrid.core.keys import chunk_entries, document_keys
from refgrid.core.sources import ATTRIBUTES_KEY, SIDECAR_TEMPLATE, section
from refgrid.core.util import gc_paused
from refgrid.errors import FormatError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import INLINE, MISSING, ChunkManifest, chunk_coords
from refgrid.model.virtual import VirtualGroup
from refgrid.model.zarr_json import group_from_documents, with_bookkeeping

ChunkRefs = list[tuple[str, Any]]
"""One array's chunk references: (key tail such as ``"0/3/1"``, reference value)."""


def references_to_group(refs: Mapping[str, Any], source: str = "<references>",
                        sidecar: str | None = None) -> VirtualGroup:
    """Build the model of a reference set written with Zarr v3 keys (a kerchunk dict, with
    or without the ``{"version": 1, "refs": ...}`` wrapper); ``sidecar``: where its sidecar
    directory lies now (its template resolved there)."""
    entries = refs.get("refs", refs)
    templates = dict(refs.get("templates", {}))
    if sidecar is not None:
        templates[SIDECAR_TEMPLATE.strip("{}")] = sidecar
    documents = {node: document(entries[k], source, k)
                 for node, k in document_keys(entries).items()}
    with gc_paused():
        chunks = chunk_entries(entries.items(), documents)
        group = group_from_documents(documents, lambda path, grid: chunk_manifest(
            grid, chunks.get(path, []), templates, f"{source}:{path}"), source)
    return with_bookkeeping(group, section(refs).get(ATTRIBUTES_KEY))



def document(value: Any, source: str, key: str) -> dict[str, Any]:
    """A ``zarr.json`` reference value (JSON text, ``base64:`` text or an object) parsed."""
    try:
        if isinstance(value, str) and value.startswith("base64:"):
            value = base64.b64decode(value[7:], validate=True).decode("utf-8")
        parsed = json.loads(value) if isinstance(value, str | bytes) else dict(value)
    except (json.JSONDecodeError, TypeError, ValueError, binascii.Error) as e:
        raise FormatError(source, key, f"metadata is not a JSON document: {e}") from None
    if not isinstance(parsed, dict):
        raise FormatError(source, key, f"metadata is a JSON {type(parsed).__name__}, not an "
                          "object")
    return parsed


def chunk_manifest(grid: RectilinearGrid, chunks: ChunkRefs, templates: Mapping[str, str],
                   where: str) -> ChunkManifest:
    """Chunk references → manifest columns, key parsing and value columns done in numpy."""
    counts = grid.chunk_counts
    path_id = np.full(math.prod(counts), MISSING, np.int32)
    offset = np.zeros(path_id.size, np.uint64)
    length = np.zeros(path_id.size, np.uint64)
    inline: dict[tuple[int, ...], bytes] = {}
    urls: dict[str, int] = {}
    flat = _flat_indices([tail for tail, _ in chunks], counts)
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
        remap = np.array([urls.setdefault(_render(n, templates), len(urls)) for n in names],
                         np.int32)
        if len(names) == 1:
            path_id[flat[refs]] = remap[0]
        else:
            code = {n: k for k, n in enumerate(names)}
            path_id[flat[refs]] = remap[np.fromiter(map(code.__getitem__, targets), np.int32,
                                                    len(targets))]
        offset[flat[refs]] = _byte_counts(offsets, "offset", chunks, refs, where)
        length[flat[refs]] = _byte_counts(lengths, "length", chunks, refs, where)
    for k in np.flatnonzero(~ranged & keep).tolist():
        value = values[k]
        try:
            inline[chunk_coords(int(flat[k]), counts)] = \
                base64.b64decode(value[7:], validate=True) if value.startswith("base64:") \
                else value.encode("utf-8")
        except (AttributeError, binascii.Error, UnicodeEncodeError) as e:
            raise FormatError(where, chunks[k][0], f"inline chunk {value!r:.40} is neither "
                              f"text nor base64 ({e})") from None
        path_id[flat[k]] = INLINE
    return ChunkManifest(tuple(urls), path_id.reshape(counts), offset.reshape(counts),
                         length.reshape(counts), inline)


MAX_BYTES = 2**62
"""The largest offset or length accepted (sums of them stay within int64)."""


def _byte_counts(column: Sequence[Any], what: str, chunks: ChunkRefs, rows: np.ndarray,
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
    return np.array([int(v) for v in column], dtype=np.uint64)


def _flat_indices(tails: list[str], counts: tuple[int, ...]) -> np.ndarray:
    """C-order chunk index of each key tail (``"0/3/1"``), -1 where it is not in the grid."""
    if not counts:
        return np.where(np.array([t == "" for t in tails], bool), 0, -1)
    text = "/".join(tails)
    digits = text.replace("/", "")
    try:
        if not (digits.isascii() and digits.isdigit()) or set(
                map(operator.methodcaller("count", "/"), tails)) != {len(counts) - 1}:
            raise ValueError("keys of another rank, or not numeric")
        numbers = np.fromstring(text.replace("/", " "), dtype=np.int64, sep=" ")
        if len(numbers) != len(tails) * len(counts):  # an empty part ("1//2")
            raise ValueError("empty coordinates")
        coords = numbers.reshape(len(tails), len(counts))
    except ValueError:  # some keys of another rank or not numeric: parse one by one
        coords = np.array([[int(c) for c in t.split("/")] if _is_key(t, len(counts)) else
                           [-1] * len(counts) for t in tails], np.int64).reshape(-1, len(counts))
    inside = ((coords >= 0) & (coords < np.array(counts))).all(axis=1)
    flat = np.full(len(tails), -1, np.int64)
    flat[inside] = np.ravel_multi_index(tuple(coords[inside].T), counts)
    return flat


def _is_key(tail: str, ndim: int) -> bool:
    parts = tail.split("/")
    return len(parts) == ndim and all(p.isascii() and p.isdigit() for p in parts)


def _render(url: str, templates: Mapping[str, str]) -> str:
    for name, value in templates.items():
        url = url.replace("{{" + name + "}}", value)
    return url

"""What an append changes in an archive's Zarr v3 documents — parquet references'
``.zmetadata`` and an Icechunk repository alike — and the check that keeps it equal to a
from-scratch write.

An append (:mod:`refgrid.archive.extend`) combines the archive's first file, its last and the
new files, and hands over the tail: each array along the concat dimension from the last
file's first step on. Here the tail meets the archive's documents: each array's ``shape``
and chunk grid grow (the archive's chunks up to where its last file begins, then the
tail's: :func:`grown`, which says from which chunk on the output writes), an array stored
inline in pieces grows from its last stored piece (:func:`grown_pieces`), and the result
equals a from-scratch batch of the same files, or the append is not taken
(:class:`NotAppendable`): every document of the combined first/last/new files, but for its
shape and chunk grid, must equal the archive's, and so must refgrid's bookkeeping.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from refgrid.core.dtypes import ENCODING_ATTR
from refgrid.core.keys import KeyEncoding, chunk_key, document_key
from refgrid.errors import RefgridError
from refgrid.grid.json_forms import (
    ChunkGridJSON,
    emit_chunk_grid,
    grown_chunk_grid,
    parse_chunk_grid,
)
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ChunkManifest
from refgrid.model.presented import presentation, shown_as
from refgrid.model.segments import Encoding, Segments
from refgrid.model.virtual import VirtualArray, VirtualGroup, in_pieces, piece_length
from refgrid.model.zarr_json import (
    SEGMENTS_CODEC,
    bookkeeping,
    documents,
    parse_segments,
    segments_codec,
)
from refgrid.refs.icechunk_state import IcechunkState
from refgrid.refs.parquet import ZMetadata

GRID_KEYS = ("shape", "chunk_grid")
"""What an append changes in an array's document."""

Earlier = ZMetadata | IcechunkState
"""The archive as its output read it: its documents (``metadata``) and refgrid's section."""

Placed = tuple[int, int, ChunkManifest]
"""Where an array's chunks of the tail go: the C-order row of its first chunk written, that
chunk's index along the concat dimension, and the chunks from there on."""


class NotAppendable(Exception):
    """The new files combine, but the result would differ from the archive's documents
    beyond its extent: the output is rebuilt instead (the message says why)."""


def grown(earlier: Earlier, tail: VirtualGroup, last_length: int, arrays: Sequence[str],
          pieces: Mapping[str, tuple[int, int]]
          ) -> tuple[dict[str, Mapping[str, Any]], dict[str, Placed]]:
    """The archive's documents grown by ``tail`` (on the grids the output declares), and
    where each grown array's chunks go: ``pieces``, the arrays stored inline in pieces, with
    their new length and first piece written (:func:`grown_pieces`), then ``arrays``, the
    others along the concat dimension, whose tail begins where the archive's last file
    (``last_length`` long) does."""
    grown_grids: dict[str, tuple[Mapping[str, Any], ChunkGridJSON, int]] = {}
    for path in arrays:
        array = _array(tail, path)
        old = earlier.metadata.get(document_key(path))
        if not isinstance(old, Mapping) or old["shape"][1:] != list(array.shape[1:]):
            raise NotAppendable(f"the archive's {path!r} is not shaped as the new files'")
        grown_grids[path] = (old, *(grown_chunk_grid(old["chunk_grid"], old["shape"],
                                                     last_length, array.grid)
                                    or _grown_whole(old, last_length, array.grid, path)))
    segmented = {path: found for path, (old, _, kept) in grown_grids.items()
                 if (found := _continued(old, _array(tail, path), kept, path)) is not None}
    tail = tail.with_arrays({path: shown for path, (shown, _) in segmented.items()})
    docs: dict[str, Mapping[str, Any]] = dict(documents(tail))
    placed: dict[str, Placed] = {}
    for path, (length, piece) in pieces.items():
        array = _array(tail, path)
        key = document_key(path)
        docs[key] = {**docs[key], "shape": [length, *array.shape[1:]]}
        placed[path] = (piece, piece, array.manifest)
    for path, (old, grid_doc, kept) in grown_grids.items():
        array = _array(tail, path)
        key = document_key(path)
        grid = array.grid
        docs[key] = {**docs[key], "shape": [int(old["shape"][0]) - last_length + grid.shape[0],
                                            *old["shape"][1:]], "chunk_grid": grid_doc}
        if path in segmented:
            docs[key] = {**docs[key], "codecs": [segments_codec(segmented[path][1])]}
        placed[path] = (kept * math.prod(grid.chunk_counts[1:]), kept, array.manifest)
    _check_same(earlier.metadata, docs, earlier.section.attributes or {}, bookkeeping(tail),
                {document_key(path) for path in segmented})
    return docs, placed


def _continued(old: Mapping[str, Any], tail: VirtualArray, kept: int, path: str
               ) -> tuple[VirtualArray, Segments] | None:
    """Where the archive or the tail is in segments (files stored in other ways): the tail
    shown as the grown archive shows it, and the grown archive's segments — the archive's
    up to chunk ``kept`` along the concat dimension (its last file's start), then the
    tail's. None where both are stored one way (the tail's document is the archive's)."""
    codecs = old.get("codecs")
    try:
        before = parse_segments(codecs[0]) if isinstance(codecs, list) and codecs and \
            isinstance(codecs[0], Mapping) and codecs[0].get("name") == SEGMENTS_CODEC \
            else None
    except (RefgridError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise NotAppendable(f"the archive's {path!r} has segments that do not read: "
                            f"{type(e).__name__}: {e}") from e
    if before is None and tail.segments is None:
        return None
    dim = tail.dims[0]
    own = tail.segments or Segments(dim, (0,), (Encoding.of(
        tail.dtype, tail.codecs, tail.fill_value, tail.attrs),))
    if before is None:  # one way until now: as the archive's last file, the tail's first
        head = [(0, own.encodings[0])] if kept else []
    else:
        cut = before.sliced(slice(0, kept)) if kept else None
        head = [] if cut is None else list(zip(cut.starts, cut.encodings, strict=True))
    if before is not None and before.dim != dim:
        raise NotAppendable(f"the archive's {path!r} is in segments along {before.dim!r}")
    grown = Segments.of_runs(dim, head + [(kept + s, e) for s, e in zip(
        own.starts, own.encodings, strict=True)])
    encodings = grown.encodings
    decoded, dtype, fill, attrs = presentation(tail.name, encodings, tail.dims, tail.attrs)
    return (shown_as(tail, replace(own, decoded=decoded), dtype, fill, attrs),
            replace(grown, decoded=decoded))


def grown_documents(docs: Mapping[str, Mapping[str, Any]], placed: Mapping[str, Placed]
                    ) -> dict[str, Mapping[str, Any]]:
    """The documents of the arrays :func:`grown` placed: what a commit of the append
    writes again (the others stay as the archive holds them)."""
    return {document_key(path): docs[document_key(path)] for path in placed}


def _array(group: VirtualGroup, path: str) -> VirtualArray:
    array = group[path]
    assert isinstance(array, VirtualArray)
    return array


def _grown_whole(old: Mapping[str, Any], last_length: int, grid: RectilinearGrid,
                 path: str) -> tuple[ChunkGridJSON, int]:
    """The grown grid's document and the chunks kept along the concat dimension, from the
    archive's whole grid (where :func:`grown_chunk_grid` does not apply)."""
    before = parse_chunk_grid(old["chunk_grid"], old["shape"])
    cut = int(before.shape[0]) - last_length
    keep, kept = before.slice(0, 0, cut)
    if cut < 0 or int(before.bounds(0)[kept.stop]) != cut:
        raise NotAppendable(f"the archive's chunks of {path!r} do not end where its last "
                            "file begins")
    return emit_chunk_grid(RectilinearGrid.concat([keep, grid], 0)), kept.stop


def grown_pieces(earlier: Earlier, path: str, array: VirtualArray, start: int,
                 stored: Callable[[int], bytes]) -> tuple[VirtualArray, int, int]:
    """The archive's inline array ``path`` (:func:`~refgrid.model.virtual.in_pieces`) with
    ``array``'s elements from ``start`` on after it (the concat coordinate, re-encoded to
    the first file's units): its pieces from the last stored one on (read — ``stored``: the
    stored bytes of a piece — and written again with the new elements after it: a piece of
    4,096 steps at most, whatever the archive's length), its new length and the index of its
    first piece written. An archive whose array is one chunk of another length (a short
    archive, or one written before arrays were pieced) is written again whole."""
    old = earlier.metadata[document_key(path)]
    if old["shape"][1:] != list(array.shape[1:]):
        raise NotAppendable(f"the archive's {path!r} is not shaped as the new files'")
    before = parse_chunk_grid(old["chunk_grid"], old["shape"])
    length = int(before.shape[0])
    step = math.prod(array.shape[1:]) * array.dtype.itemsize
    added = b"".join(array.manifest.inline_chunk(k) for k in range(array.grid.nchunks))[
        start * step:array.shape[0] * step]
    total = length + len(added) // step
    piece = piece_length(total)
    kept = int(before.axes[0].logical[0]) if before.nchunks else 0
    if before.nchunks > 1 and (kept != piece or (before.chunk_shape or (0,))[0] != kept):
        raise NotAppendable(f"the archive's {path!r} is not stored in pieces of {piece} (its "
                            "files' own chunks, say)")
    first = before.chunk_counts[0] - 1 if kept == piece else 0
    data = stored(first) if before.nchunks else b""
    if before.nchunks and len(data) != kept * step:
        raise NotAppendable(f"the archive's piece {first} of {path!r} holds {len(data)} "
                            f"bytes, not {kept * step}")
    data = data[:(length - first * kept) * step]
    return (in_pieces(array, data + added, (total - first * piece, *array.shape[1:]),
                      piece), total, first)


def piece_key(earlier: Earlier, path: str, piece: int) -> str:
    """The store key of piece ``piece`` of the archive's inline array ``path`` (a chunk of
    its own in an Icechunk repository)."""
    doc = earlier.metadata[document_key(path)]
    return chunk_key(path, (piece,) + (0,) * (len(doc["shape"]) - 1),
                     KeyEncoding.from_json(doc.get("chunk_key_encoding")))


def _check_same(old: Mapping[str, object], new: Mapping[str, object],
                old_kept: object, new_kept: object, segmented: set[str]) -> None:
    """The documents equal but for the grids (and the codecs of arrays in ``segmented``,
    whose segments :func:`_continued` grew from the archive's)."""
    if list(old) != list(new):
        raise NotAppendable(f"the new files' nodes {sorted(set(new) ^ set(old))} differ from "
                            "the archive's")
    for key, doc in new.items():
        was = old[key]
        skip = ("codecs",) if key in segmented else ()
        if not isinstance(was, Mapping) or not isinstance(doc, Mapping) or \
                _without_grid(was, skip) != _without_grid(doc, skip):
            raise NotAppendable(f"{key} of the new files differs from the archive's beyond "
                                "its extent (attributes, codecs or fill values)")
    if _without_source(json.loads(json.dumps(new_kept))) != _without_source(old_kept):
        raise NotAppendable("refgrid's bookkeeping of the new files differs from the "
                            "archive's")


def _without_source(kept: object) -> object:
    """Bookkeeping but the file each array's encoding came from (a variable some files lack
    takes it from the first file holding it among those combined): the archive keeps its
    own."""
    if not isinstance(kept, Mapping):
        return kept
    return {name: {k: ({e: v for e, v in value.items() if e != "source"}
                       if k == ENCODING_ATTR and isinstance(value, Mapping) else value)
                   for k, value in attrs.items()} if isinstance(attrs, Mapping) else attrs
            for name, attrs in kept.items()}


def _without_grid(doc: Mapping[str, object], skip: tuple[str, ...] = ()) -> dict[str, object]:
    return json.loads(json.dumps({k: v for k, v in doc.items()
                                  if k not in GRID_KEYS and k not in skip}))

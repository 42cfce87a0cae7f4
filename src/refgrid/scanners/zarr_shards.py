"""Sharded Zarr v3 arrays (``sharding_indexed``) → references to their inner chunks.

A shard is one file holding many inner chunks and an index of their byte ranges. Reading
each shard's index once, at scan time, turns a sharded array into an ordinary array whose
chunks are the inner chunks — byte ranges inside the shard files — so the engine, the
mapper and every writer handle it with no read path of their own. Shard grids may be
regular or rectilinear (as zarr >= 3.2 writes them); each shard splits into inner chunks of
the codec's ``chunk_shape``, and inner chunks past the array's end are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import cast

import fsspec
import numpy as np

from refgrid.codecs.filters import CodecJSON
from refgrid.core.keys import coordinates
from refgrid.errors import FormatError
from refgrid.grid.json_forms import emit_chunk_grid, parse_chunk_grid
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.zarr_json import ArrayDocument
from refgrid.refs.json_refs import ChunkRefs

SHARDING = "sharding_indexed"
EMPTY = 2**64 - 1
"""Offset and length of an inner chunk that was never written."""
CHECKSUM_BYTES = {"crc32c": 4}


def is_sharded(doc: Mapping[str, object]) -> bool:
    """Whether an array's ``zarr.json`` (as read: unchecked) starts with sharding."""
    codecs = cast(ArrayDocument, doc).get("codecs") or []
    return bool(codecs) and isinstance(codecs[0], Mapping) and codecs[0].get("name") == SHARDING


def unshard(doc: Mapping[str, object], shards: ChunkRefs, fs: fsspec.AbstractFileSystem,
            paths: Mapping[str, str], where: str) -> tuple[dict[str, object], ChunkRefs]:
    """The document and chunk references of a sharded array as an array of its inner chunks.

    ``shards``: (shard coordinates ``"0/1"``, ``[url, 0, size]``) per shard file; ``paths``:
    url → the path ``fs`` reads it by. One batched request reads every shard's index.
    ``doc``: a sharded array's document as read, fields unchecked until used."""
    array = cast(ArrayDocument, doc)
    config = array["codecs"][0].get("configuration") or {}
    try:
        inner = [int(n) for n in config["chunk_shape"]]
        codecs = list(config.get("codecs") or [])
        index_codecs = list(config.get("index_codecs") or [{"name": "bytes"}])
        location = config.get("index_location", "end")
        shape = [int(n) for n in array["shape"]]
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(where, None, f"unusable sharding_indexed codec: {e}") from e
    if any(isinstance(c, Mapping) and c.get("name") == SHARDING for c in codecs):
        raise FormatError(where, None, "nested sharding is not supported")
    if location not in ("start", "end") or len(inner) != len(shape) or min(inner, default=1) < 1:
        raise FormatError(where, None, f"unusable sharding_indexed codec: chunk_shape {inner}, "
                          f"index_location {location!r} for shape {shape}")
    outer = parse_chunk_grid(array["chunk_grid"], shape)
    per_shard = [outer.encoded_lengths(d) // inner[d] for d in range(len(shape))]
    for d in range(len(shape)):
        if (outer.encoded_lengths(d) % inner[d]).any():
            raise FormatError(where, None, f"shards along dimension {d} are not a multiple of "
                              f"the inner chunk length {inner[d]}")
    grid, first = _inner_grid(outer, per_shard, inner)
    index = _read_indexes(shards, per_shard, index_codecs, location, fs, paths, where)
    refs: ChunkRefs = []
    for tail, value in shards:
        coords = coordinates(tail)
        entries = index.get(tail)
        if entries is None:
            continue
        for local in np.argwhere(entries[..., 0] != EMPTY):
            at = tuple(first[d][coords[d]] + int(local[d]) for d in range(len(coords)))
            if any(c >= n for c, n in zip(at, grid.chunk_counts, strict=True)):
                continue  # an inner chunk wholly past the array's end
            offset, length = (int(v) for v in entries[tuple(local)])
            refs.append(("/".join(map(str, at)), [value[0], offset, length]))
    out = {**doc, "chunk_grid": emit_chunk_grid(grid), "codecs": codecs}
    return out, refs


def _inner_grid(outer: RectilinearGrid, per_shard: Sequence[np.ndarray],
                inner: Sequence[int]) -> tuple[RectilinearGrid, list[np.ndarray]]:
    """The grid of inner chunks, and per dimension the index of each shard's first one."""
    logical, encoded, first = [], [], []
    for d, counts in enumerate(per_shard):
        starts = np.repeat(outer.bounds(d)[:-1], counts) + np.concatenate(
            [np.arange(n) for n in counts] or [np.zeros(0, int)]) * inner[d]
        length = outer.shape[d]
        kept = starts < length
        logical.append(np.minimum(inner[d], length - starts[kept]))
        encoded.append(np.full(int(kept.sum()), inner[d]))
        first.append(np.concatenate(([0], np.cumsum(counts)[:-1])).astype(int))
    return RectilinearGrid.from_lengths(logical, encoded), first


def _read_indexes(shards: ChunkRefs, per_shard: Sequence[np.ndarray],
                  index_codecs: list[object], location: str, fs: fsspec.AbstractFileSystem,
                  paths: Mapping[str, str],
                  where: str) -> dict[str, np.ndarray]:
    """Each shard's index as an array (inner chunks..., 2) of (offset, length)."""
    endian, checksum = _index_format(index_codecs, where)
    plans = []
    for tail, value in shards:
        coords = coordinates(tail)
        counts = tuple(int(per_shard[d][c]) for d, c in enumerate(coords))
        nbytes = 16 * math.prod(counts) + checksum
        size = int(value[2])
        if size < nbytes:
            raise FormatError(where, tail, f"shard of {size} bytes is shorter than its index "
                              f"({nbytes} bytes)")
        start = size - nbytes if location == "end" else 0
        plans.append((tail, value[0], counts, start, start + nbytes))
    if not plans:
        return {}
    blobs = fs.cat_ranges([paths[p[1]] for p in plans], [p[3] for p in plans],
                          [p[4] for p in plans])
    out = {}
    for (tail, url, counts, _, _), blob in zip(plans, blobs, strict=True):
        if isinstance(blob, Exception):
            raise FormatError(url, None, f"cannot read the shard index: {blob}")
        if checksum:
            blob = _verified(blob, url)
        out[tail] = np.frombuffer(blob, endian + "u8").reshape((*counts, 2))
    return out


def _index_format(codecs: list[object], where: str) -> tuple[str, int]:
    """(byte order, checksum length) of a shard index: ``bytes`` then optionally ``crc32c``."""
    names = [str(c.get("name")) if isinstance(c, Mapping) else "?" for c in codecs]
    if not names or names[0] != "bytes" or any(n not in CHECKSUM_BYTES for n in names[1:]):
        raise FormatError(where, None, f"shard index codecs {names} are not supported "
                          "(bytes, optionally crc32c)")
    first = cast(CodecJSON, codecs[0])  # a mapping: its name is "bytes"
    endian = ((first.get("configuration") or {}).get("endian", "little"))
    checksum = sum(CHECKSUM_BYTES[n] for n in names[1:])
    return ("<" if endian == "little" else ">"), checksum


def _verified(blob: bytes, url: str) -> bytes:
    from numcodecs import CRC32C

    try:
        return bytes(CRC32C().decode(blob))
    except (RuntimeError, ValueError) as e:
        raise FormatError(url, None, f"shard index fails its checksum: {e}") from e

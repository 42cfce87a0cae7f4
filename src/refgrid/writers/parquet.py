"""Parquet references for large archives: kerchunk's columnar layout with Zarr v3 documents.

The layout is fsspec's ``LazyReferenceMapper``'s: ``.zmetadata`` holds every metadata
document (here the ``zarr.json`` of each node) and the ``record_size``; the references of each
array are in ``<array>/refs.<n>.parq``, row ``i`` of file ``n`` being chunk
``n * record_size + i`` of the chunk grid in C order, with columns ``path`` (dictionary
encoded: an archive names few files many times), ``offset``, ``size`` and ``raw`` (inline
bytes) — an array stored inline in pieces (the concat coordinate) in record files of
:data:`~refgrid.scanners.parquet.PIECE_ROWS` rows, ``<array>/pieces.<n>.parq``. Missing chunks
are rows without a path. A reader takes each column whole, so opening an
archive of 10^6 chunks costs milliseconds and no Python object per chunk; the JSON form of the
same archive costs a parse of every key. Pages carry CRC checksums and ``.zmetadata`` a digest
of each record file (the checksums leave page headers and the footer uncovered), so a damaged
record file reads as an error rather than as other references. (fsspec's own reader of this
layout knows only Zarr v2 documents: refgrid's engine and mapper read the v3 form, and the
classic kerchunk form, ``zarr_format=2``, is fsspec's own.)
"""

from __future__ import annotations

import json
import math
import shutil
from bisect import bisect_right
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from refgrid.core.keys import ZMETADATA
from refgrid.core.sources import (
    ATTRIBUTES_KEY,
    PIECES_KEY,
    RECORDS_KEY,
    SIDECAR_KEY,
    SOURCE_TABLE_KEY,
    SOURCES_KEY,
    SourceIdentity,
    record_digest,
    stored_identities,
)
from refgrid.errors import FormatError
from refgrid.grid.rectilinear import GridForm
from refgrid.model.manifest import ChunkManifest, flat_index
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import documents
from refgrid.scanners.parquet import (
    PIECE_ROWS,
    SOURCE_PAGE_ROWS,
    SOURCES_DIRECTORY,
    IdentityColumns,
    SourceTable,
    identity_table,
    piece_rows,
    read_table,
    record_name,
    record_rows,
    source_table,
)
from refgrid.writers.atomic import replace_directory, temporary_for, write_file
from refgrid.writers.kerchunk_v2 import v2_documents
from refgrid.writers.section import Portable, section

RECORD_SIZE = 100_000
"""Chunks per record file: large enough for few files, small enough to read one quickly."""
DELTA_ENCODED = {"offset": "DELTA_BINARY_PACKED", "size": "DELTA_BINARY_PACKED"}
"""Successive chunks lie one after another: offsets differ by about a chunk's size, which
delta encoding stores in a few bits (plain + zstd leaves ~5 B per offset)."""


def write_parquet(group: VirtualGroup, target: Path, *, grid_form: GridForm = "auto",
                  record_size: int = RECORD_SIZE, zarr_format: Literal[2, 3] = 3,
                  sidecar: Path | None = None) -> Path:
    """Write ``group`` as a parquet reference directory at ``target``, atomically: it is
    built under a temporary name and renamed (an existing directory is replaced).
    ``zarr_format=2`` writes classic kerchunk's v2 documents (regular grids only);
    ``sidecar``: the directory of rewritten chunks beside it, whose files are named relative
    to it."""
    portable = Portable(sidecar)
    metadata = v2_documents(group) if zarr_format == 2 else documents(group, grid_form)
    temporary = temporary_for(target)
    try:
        temporary.mkdir(parents=True)
        digests: dict[str, str] = {}
        pieces = {path: PIECE_ROWS for path, node in group.walk() if zarr_format == 3 and
                  isinstance(node, VirtualArray) and node.inline_pieces}
        for path, node in group.walk():
            if isinstance(node, VirtualArray):
                _write_records(Rows.of(node.manifest, portable), temporary, path, 0,
                               pieces.get(path, record_size), digests, path in pieces)
        sources = [(portable(url), identity) for url, identity in group.sources.items()]
        page_rows = min(record_size, SOURCE_PAGE_ROWS)
        pages = _write_identities(sorted(sources, key=itemgetter(0)), temporary, 0,
                                  page_rows, digests)
        table = {SOURCE_TABLE_KEY: SourceTable(len(sources), page_rows, pages,
                                               _first(sources), _first(sources[::-1])
                                               ).to_json()} if sources else {}
        (temporary / ZMETADATA).write_bytes(zmetadata(
            section(group, portable, sources=False, **{RECORDS_KEY: digests, **table},
                    **({PIECES_KEY: pieces} if pieces else {})),
            metadata, record_size))
        replace_directory(temporary, target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return target


def append_parquet(target: Path, meta: Mapping[str, Any],
                   tail: Mapping[str, tuple[int, ChunkManifest]],
                   metadata: Mapping[str, object], sources: Mapping[str, SourceIdentity],
                   sidecar: Path | None = None, known: Container[str] = (),
                   pieced: Iterable[str] = ()) -> int:
    """Extend the parquet references at ``target`` (whose ``.zmetadata`` is ``meta``, as
    read) in place, writing what changed only:
    ``tail`` maps an array to ``(row, manifest)`` — its chunks from C-order row ``row`` on
    are now ``manifest``'s (the rows before stay; the record file holding ``row`` is
    rewritten, later ones written); ``metadata`` replaces the documents; ``sources`` are
    added to the sources, one identity a URL (``known``: those it holds, named as it names
    them, which are not added again); ``pieced``: the arrays stored inline in pieces, whose
    record files hold :data:`~refgrid.scanners.parquet.PIECE_ROWS` rows. An array whose
    record files change form — the coordinate of an archive written before there were
    record files of pieces, or a one-file archive's time bounds (one chunk, as a piece
    would be) now in its files' chunks — is written again whole from row 0 (such arrays
    are small: inlined times), its earlier record files removed once ``.zmetadata`` names
    the new ones. Each record file is swapped in whole, then
    ``.zmetadata`` (the documents, the digests and the sources' table of the new extent)
    last: until then the directory reads as before (a reader that had loaded the old
    ``.zmetadata`` may meet a rewritten record file, whose digest then differs: an error,
    never other references). The files written are those a from-scratch write of the whole
    would write, byte for byte. Returns the number of record files written."""
    record_size = int(meta["record_size"])
    kept = dict(meta[SOURCES_KEY])
    digests: dict[str, str] = dict(kept.get(RECORDS_KEY, {}))
    pieces = piece_rows(meta)
    stored = {path: record_rows(path, pieces, record_size) for path in tail}
    wanted = {path: (PIECE_ROWS, True) if path in pieced else (record_size, False)
              for path in tail}
    moved = [path for path in tail if stored[path] != wanted[path]]
    order = list(dict.fromkeys(name.rsplit("/", 1)[0] for name in digests))  # (as written)
    portable = Portable(sidecar)
    written = 0
    kept_rows: dict[str, Rows] = {}  # (everything read, and checked, before any write)
    for path, (row, _) in tail.items():
        size, named = stored[path]
        first = row // size if path not in moved else 0
        kept_rows[path] = Rows.empty()
        for n in range(first, -(-row // size)):  # (moved: every record file, read whole)
            name = record_name(path, n, named)
            kept_rows[path] = Rows.concat(kept_rows[path], read_record(
                target / name, digests.get(name))[:row - n * size])
    stale = [name for name in digests if name.rsplit("/", 1)[0] in moved]
    for name in stale:
        del digests[name]
    pieces = {path: rows for path, rows in pieces.items() if path not in moved}
    pieces.update({path: wanted[path][0] for path in moved if wanted[path][1]})
    pieces = {path: pieces[path] for path in sorted(pieces, key=lambda p: (
        order.index(p) if p in order else len(order)))}  # (as a whole write lists them)
    added = [(url, identity) for url, identity in
             ((portable(url), identity) for url, identity in sources.items()) if url not in known]
    table = source_table(meta, str(target))
    if table is None:  # an archive of before: its table leaves .zmetadata
        added = [*stored_identities(meta).items(), *added]
        table = SourceTable(0, min(record_size, SOURCE_PAGE_ROWS), [], _first(added), None)
    since = max(bisect_right(table.pages, min(url for url, _ in added)) - 1, 0) \
        if added else 0
    kept_identities = [row for n in range(since, len(table.pages)) if added
                       for row in _read_identities(
                           target / record_name(SOURCES_DIRECTORY, n),
                           digests.get(record_name(SOURCES_DIRECTORY, n)))]
    for path, (row, manifest) in tail.items():
        size, named = wanted[path]
        written += _write_records(Rows.concat(kept_rows[path], Rows.of(manifest, portable)),
                                  target, path, 0 if path in moved else row // size, size,
                                  digests, named)
    if added:
        merged = sorted({**dict(kept_identities), **dict(added)}.items(), key=itemgetter(0))
        pages = _write_identities(merged, target, since, table.page_rows, digests)
        table = SourceTable(since * table.page_rows + len(merged), table.page_rows,
                            [*table.pages[:since], *pages], table.first or _first(added),
                            _first(added[::-1]) or table.last)
        written += len(pages)
    order = list(dict.fromkeys([*order, *(name.rsplit("/", 1)[0] for name in digests)]))
    records = {name: digests[name] for array in order for name in sorted(
        (k for k in digests if k.rsplit("/", 1)[0] == array),
        key=lambda k: int(k.rsplit(".", 2)[1]))}
    sidecar_name = sidecar.name if sidecar is not None else kept.get(SIDECAR_KEY)
    kept = {**({ATTRIBUTES_KEY: kept[ATTRIBUTES_KEY]} if ATTRIBUTES_KEY in kept else {}),
            **({SIDECAR_KEY: sidecar_name} if sidecar_name else {}), RECORDS_KEY: records,
            **({SOURCE_TABLE_KEY: table.to_json()} if table.rows else {}),
            **({PIECES_KEY: pieces} if pieces else {})}
    write_file(target / ZMETADATA, zmetadata(kept, metadata, record_size))
    for name in stale:
        (target / name).unlink(missing_ok=True)
    return written


def zmetadata(kept: Mapping[str, Any], metadata: Mapping[str, object],
              record_size: int) -> bytes:
    """``.zmetadata``: refgrid's section ``kept``, the documents and the record size (a
    from-scratch write and an append write the same bytes)."""
    return json.dumps({SOURCES_KEY: kept, "metadata": metadata,
                       "record_size": int(record_size)}).encode()


def _write_identities(items: list[tuple[str, SourceIdentity]], root: Path, first: int,
                      page_rows: int, digests: dict[str, str]) -> list[str]:
    """Source identities (sorted by URL) as record files ``first``, ``first + 1``... of the
    sources (:data:`~refgrid.scanners.parquet.SOURCES_DIRECTORY`); each one's first URL."""
    table = identity_table(items, str(root))
    pages = []
    for n in range(math.ceil(len(items) / page_rows)):
        _write_table(table.slice(n * page_rows, page_rows), root,
                     record_name(SOURCES_DIRECTORY, first + n), digests)
        pages.append(items[n * page_rows][0])
    return pages


def _first(items: list[tuple[str, SourceIdentity]]) -> str | None:
    """The first source file among ``items`` (refgrid's rewritten chunk files, sources too,
    are none)."""
    return next((url for url, identity in items if not identity.get("rewritten")), None)


def _read_identities(path: Path, digest: str | None) -> list[tuple[str, SourceIdentity]]:
    """The identities of a source record file refgrid wrote, checked against its digest."""
    return list(IdentityColumns([read_table(_checked(path, digest), str(path), path.name)],
                                str(path)).items())


@dataclass(frozen=True)
class Rows:
    """The references of consecutive chunks (C order), the columns of record files: URL
    ids into ``paths`` (negative: none), offsets, sizes and inline bytes (None: none)."""

    ids: np.ndarray
    paths: list[str]
    offset: np.ndarray
    size: np.ndarray
    raw: np.ndarray | None

    @classmethod
    def of(cls, manifest: ChunkManifest, portable: Portable) -> Rows:
        return cls(manifest.path_id.reshape(-1), [portable(url) for url in manifest.paths],
                   manifest.offset.reshape(-1).astype(np.int64),
                   manifest.length.reshape(-1).astype(np.int64),
                   _inline_column(manifest.inline, manifest.shape, manifest.path_id.size))

    @classmethod
    def empty(cls) -> Rows:
        return cls(np.zeros(0, np.int32), [], np.zeros(0, np.int64), np.zeros(0, np.int64),
                   None)

    @classmethod
    def concat(cls, a: Rows, b: Rows) -> Rows:
        raw = None if a.raw is None and b.raw is None else np.concatenate(
            [r if r is not None else np.full(len(x), None, object)
             for r, x in ((a.raw, a), (b.raw, b))])
        return cls(np.concatenate([a.ids, np.where(b.ids >= 0, b.ids + len(a.paths), b.ids)]),
                   a.paths + b.paths, np.concatenate([a.offset, b.offset]),
                   np.concatenate([a.size, b.size]), raw)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, rows: slice) -> Rows:
        return Rows(self.ids[rows], self.paths, self.offset[rows], self.size[rows],
                    None if self.raw is None else self.raw[rows])

    def table(self) -> pa.Table:
        """The rows as a record file's table. Its ``path`` dictionary holds the URLs these
        rows name, in order of first use: a record file depends on its own rows only (so an
        append rewrites the last one alone), and reading one decodes only its own URLs."""
        stored = self.ids >= 0
        used, first = np.unique(self.ids[stored], return_index=True)
        used = used[np.argsort(first, kind="stable")]
        code = np.zeros(max(len(self.paths), 1), np.int32)
        code[used] = np.arange(len(used), dtype=np.int32)
        return pa.table({
            "path": pa.DictionaryArray.from_arrays(
                pa.array(np.where(stored, code[np.maximum(self.ids, 0)], 0), pa.int32(),
                         mask=~stored),
                pa.array([self.paths[i] for i in used.tolist()], pa.string())),
            "offset": self.offset, "size": self.size,
            "raw": pa.nulls(len(self), pa.binary()) if self.raw is None else
            pa.array(self.raw, pa.binary())}, schema=SCHEMA)


def _write_records(rows: Rows, root: Path, path: str, first: int, record_size: int,
                   digests: dict[str, str], pieced: bool = False) -> int:
    """``rows`` as record files ``first``, ``first + 1``... of ``path`` under ``root``, each
    swapped in whole, their digests into ``digests``; how many were written (``pieced``:
    record files of pieces, :func:`~refgrid.scanners.parquet.record_name`)."""
    count = math.ceil(len(rows) / record_size)
    for n in range(count):
        _write_table(rows[n * record_size:(n + 1) * record_size].table(), root,
                     record_name(path, first + n, pieced), digests, use_dictionary=["path"],
                     column_encoding=DELTA_ENCODED)
    return count


def _write_table(table: pa.Table, root: Path, name: str, digests: dict[str, str],
                 **options: Any) -> None:
    """One record file, swapped in whole, its digest into ``digests``."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", write_statistics=False,
                   write_page_checksum=True, **options)
    data = sink.getvalue().to_pybytes()
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    write_file(root / name, data)
    digests[name] = record_digest(data)


def read_record(path: Path, digest: str | None) -> Rows:
    """The rows of a record file refgrid wrote (one of its local reference directories),
    checked against the ``digest`` ``.zmetadata`` holds for it."""
    table = read_table(_checked(path, digest), str(path), path.name)
    paths = table.column("path").combine_chunks()
    raw = table.column("raw").to_numpy(zero_copy_only=False)
    return Rows(pc.fill_null(paths.indices, -1).to_numpy().astype(np.int64),
                paths.dictionary.to_pylist(), table.column("offset").to_numpy(),
                table.column("size").to_numpy(),
                raw if any(r is not None for r in raw) else None)


def _checked(path: Path, digest: str | None) -> bytes:
    data = path.read_bytes()
    if digest is None or record_digest(data) != digest:
        raise FormatError(str(path), None, "does not match its digest in .zmetadata: it is "
                          "damaged or was changed")
    return data


_PANDAS_COLUMNS = [("path", "unicode", "object"), ("offset", "int64", "int64"),
                   ("size", "int64", "int64"), ("raw", "bytes", "object")]
SCHEMA = pa.schema(
    [pa.field("path", pa.dictionary(pa.int32(), pa.string())),
     pa.field("offset", pa.int64()),
     pa.field("size", pa.int64()),
     pa.field("raw", pa.binary())],
    metadata={"pandas": json.dumps({
        "index_columns": [], "column_indexes": [], "columns": [
            {"name": n, "field_name": n, "pandas_type": p, "numpy_type": t, "metadata": None}
            for n, p, t in _PANDAS_COLUMNS]})})
"""The pandas description tells fastparquet (fsspec's default reader of the layout) that
offsets and sizes are plain int64: without it, it reads them as floats. (The columns stay
optional: a required column has no definition levels, and damaged bytes in its pages then
decode to other numbers more often instead of failing.)"""


def _inline_column(inline: Mapping[tuple[int, ...], bytes], shape: tuple[int, ...],
                   size: int) -> np.ndarray | None:
    """The ``raw`` column: inline chunk bytes at their flat positions, None elsewhere (and
    no column where there are none)."""
    if not inline:
        return None
    raw = np.full(size, None, dtype=object)
    for coords, data in inline.items():
        raw[flat_index(coords, shape)] = data
    return raw

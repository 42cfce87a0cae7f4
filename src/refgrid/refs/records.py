"""A parquet record file of references, in both directions: :class:`Rows` (the references of
consecutive chunks, in C order) become a record file's bytes (:meth:`Rows.record_file`), and a
record file's table is read into a manifest (:func:`into_manifest`) or back into rows
(:func:`read_record`, for an append).

The columns are fsspec's ``LazyReferenceMapper``'s: ``path`` (dictionary encoded: an archive
names few files many times), ``offset``, ``size`` and ``raw`` (inline bytes); a missing chunk
is a row without a path. A reader takes each column whole, so a record file of 10^5 chunks
costs milliseconds and no Python object per chunk. Pages carry CRC checksums and the
directory's ``.zmetadata`` a digest of each record file (:func:`record_digest`: the checksums
leave page headers and the footer uncovered), so a damaged record file reads as an error
rather than as other references. Where the record files lie, and how many rows each holds, is
the directory's (:mod:`refgrid.refs.parquet`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from refgrid.errors import FormatError
from refgrid.model.manifest import MISSING, ChunkManifest, ManifestBuilder, flat_index
from refgrid.refs.section import Portable, in_sidecar

DELTA_ENCODED = {"offset": "DELTA_BINARY_PACKED", "size": "DELTA_BINARY_PACKED"}
"""Successive chunks lie one after another: offsets differ by about a chunk's size, which
delta encoding stores in a few bits (plain + zstd leaves ~5 B per offset)."""


def record_name(array: str, n: int, pieced: bool = False) -> str:
    """Record file ``n`` of ``array``, relative to the reference directory; ``pieced``: of an
    array whose record files hold :data:`~refgrid.refs.parquet.PIECE_ROWS` rows, named apart
    (a reader that knows only ``record_size`` finds no record file — an error — rather than
    reading 64 rows as the first of 10^5, the rest as missing)."""
    return f"{array}/{'pieces' if pieced else 'refs'}.{n}.parq"


def record_digest(data: bytes) -> str:
    """The digest of a parquet record file's bytes, written beside it and checked by the
    reader: parquet's page checksums leave page headers and the footer uncovered, where
    damaged bytes can decode to other references."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def table_file(table: pa.Table, **options: Any) -> bytes:
    """A record file's bytes (zstd, page checksums: read back by :func:`read_table`)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", write_statistics=False,
                   write_page_checksum=True, **options)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def read_table(data: bytes, url: str, name: str) -> pa.Table:
    """One record file. pyarrow bounds-checks what it parses: a damaged file is an error, never
    a crash (fastparquet's thrift reader trusts the footer's lengths). Read on the calling
    thread: a record file is small, and pyarrow's parquet threads can abort the process as
    it exits (apache/arrow#34314: ``terminate called without an active exception``)."""
    try:
        table = pq.read_table(pa.BufferReader(data), page_checksum_verification=True,
                              use_threads=False)
        table.column_names  # noqa: B018 (names are decoded here: a damaged one fails now)
        return table
    except (pa.ArrowException, OSError, ValueError) as e:
        raise FormatError(url, None, f"{name}: not a parquet reference file: {e}") from e


def checked(path: Path, digest: str | None) -> bytes:
    """The bytes of the local record file ``path``, which must match its ``digest`` in
    ``.zmetadata``."""
    data = path.read_bytes()
    if digest is None or record_digest(data) != digest:
        raise FormatError(str(path), None, "does not match its digest in .zmetadata: it is "
                          "damaged or was changed")
    return data


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

    def record_file(self) -> bytes:
        """The rows as one record file's bytes."""
        return table_file(self.table(), use_dictionary=["path"],
                          column_encoding=DELTA_ENCODED)

    def record_files(self, record_size: int) -> Iterator[bytes]:
        """The rows as record files of ``record_size`` rows each (the last may hold fewer),
        each made as it is asked for."""
        return (self[n:n + record_size].record_file() for n in range(0, len(self), record_size))


def read_record(path: Path, digest: str | None) -> Rows:
    """The rows of a record file refgrid wrote (one of its local reference directories),
    checked against the ``digest`` ``.zmetadata`` holds for it."""
    table = read_table(checked(path, digest), str(path), path.name)
    paths = table.column("path").combine_chunks()
    raw = table.column("raw").to_numpy(zero_copy_only=False)
    return Rows(pc.fill_null(paths.indices, -1).to_numpy().astype(np.int64),
                paths.dictionary.to_pylist(), table.column("offset").to_numpy(),
                table.column("size").to_numpy(),
                raw if any(r is not None for r in raw) else None)


def into_manifest(table: pa.Table, start: int, built: ManifestBuilder,
                  sidecar: str | None = None) -> None:
    """One record file's references into the manifest (rows from ``start``): refgrid's or
    another writer's (plain string paths, dictionaries of narrower indices); ``sidecar``:
    where the sidecar lies now."""
    table = table.slice(0, max(built.path_id.size - start, 0))
    if "path" in table.column_names:
        paths = table.column("path").combine_chunks()
        if not pa.types.is_dictionary(paths.type):  # kerchunk's plain strings
            paths = paths.dictionary_encode()
        names = paths.dictionary.to_pylist()
        if not all(isinstance(u, str) or u is None for u in names):
            raise ValueError(f"the path column holds {paths.dictionary.type}, not URLs")
        remap = np.array([built.url(in_sidecar(u, sidecar)) if u else MISSING for u in names]
                         + [MISSING], np.int32)  # the last entry: a null path
        codes = pc.fill_null(paths.indices.cast(pa.int64()), len(names)).to_numpy()
        ids = remap[codes]
        present = np.flatnonzero(ids >= 0)
        built.ranges(start + present, ids[present], _integers(table, "offset")[present],
                     _integers(table, "size")[present])
    if "raw" in table.column_names and not pa.types.is_null(table.schema.field("raw").type):
        raw = table.column("raw")
        rows = np.flatnonzero(pc.fill_null(pc.binary_length(raw), 0).to_numpy())
        built.inlined_many(start + rows, raw.take(rows).to_pylist())


def _integers(table: pa.Table, column: str) -> np.ndarray:
    return pc.fill_null(table.column(column), 0).to_numpy().astype(np.uint64)


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

"""Parquet reference sets (kerchunk's layout; refgrid's own or kerchunk's), read as columns.

The layout (fsspec's ``LazyReferenceMapper``): ``.zmetadata`` holds every Zarr v2 metadata
document and the ``record_size``; each array's references are in ``<array>/refs.<n>.parq``,
row ``i`` of file ``n`` being chunk ``n * record_size + i`` of the chunk grid in C order, with
columns ``path``/``offset``/``size`` and ``raw`` (inline bytes). Reading the columns whole
keeps an archive of millions of chunks free of per-chunk Python objects, and a record file
that kerchunk never wrote (an array without any chunk) simply means missing chunks.
refgrid writes the same layout with Zarr v3 documents (``zarr.json`` keys) in ``.zmetadata``;
kerchunk's Zarr v2 documents are translated by :mod:`refgrid.scanners.kerchunk`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from refgrid.core.jsonio import loads
from refgrid.core.keys import METADATA, ZMETADATA, document_keys
from refgrid.core.sources import (
    ATTRIBUTES_KEY,
    RECORDS_KEY,
    SourceIdentity,
    filesystem,
    in_sidecar,
    record_digest,
    section,
    sidecar_directory,
    stored_identities,
)
from refgrid.core.typed import JSONObject, StorageOptions
from refgrid.errors import FormatError, NotFoundError
from refgrid.model.manifest import MISSING, ChunkManifest, ManifestBuilder
from refgrid.model.virtual import VirtualGroup
from refgrid.model.zarr_json import group_from_documents, with_bookkeeping
from refgrid.scanners.kerchunk import v2_group
from refgrid.scanners.options import ScanOptions
from refgrid.scanners.source import Source, file_sizes


@dataclass(frozen=True)
class ParquetReferences:
    url: str
    documents: dict[str, JSONObject]
    """``.zarray``/``.zattrs``/``.zgroup`` keys → their JSON documents"""
    record_size: int
    sources: dict[str, SourceIdentity]
    sidecar: str | None
    """Where the sidecar of rewritten chunks lies now (its files are named relative to it)."""
    bookkeeping: object
    """The ``_refgrid_*`` attributes by node (:func:`refgrid.model.zarr_json.bookkeeping`)."""
    fs: fsspec.AbstractFileSystem
    root: str
    storage_options: StorageOptions
    digests: dict[str, str]
    """Record file (relative name) → the digest refgrid's writer recorded (none for
    kerchunk's parquet)."""

    def manifest(self, array: str, counts: tuple[int, ...]) -> ChunkManifest:
        """The chunk manifest of ``array`` whose chunk grid has ``counts`` chunks per axis."""
        total = math.prod(counts)
        records = math.ceil(total / self.record_size) if total else 0
        paths = [f"{self.root}/{array}/refs.{n}.parq" for n in range(records)]
        found = self.fs.cat(paths, on_error="return") if paths else {}
        built = ManifestBuilder(counts)
        for n, name in enumerate(paths):
            data = found.get(name)
            if isinstance(data, FileNotFoundError):
                if METADATA in self.documents:  # refgrid writes every record file
                    raise FormatError(self.url, array, f"record file {name} is missing: "
                                      "its chunks' references are lost")
                continue  # kerchunk writes no record file for an array without chunks
            if isinstance(data, Exception):
                raise FormatError(self.url, array, f"cannot read {name}: {data}") from data
            if data is None:
                raise FormatError(self.url, array, f"cannot read {name}: no answer")
            relative = f"{array}/refs.{n}.parq"
            if relative in self.digests and record_digest(data) != self.digests[relative]:
                raise FormatError(self.url, array, f"record file {relative} does not match "
                                  "its digest in .zmetadata: it is damaged or was changed")
            table = _read_table(data, self.url, name)
            try:
                _fill(table, n * self.record_size, built, self.sidecar)
            except (pa.ArrowException, KeyError, TypeError, ValueError) as e:
                raise FormatError(self.url, array, f"{name}: unusable reference columns "
                                  f"{table.column_names}: {e}") from e
        whole = np.flatnonzero((built.path_id >= 0) & (built.length == 0))  # [url]: a file
        if whole.size:
            table = list(built.urls)
            sizes = file_sizes(sorted({table[i] for i in built.path_id[whole]}),
                               self.storage_options, self.url)
            built.set_lengths(whole, [sizes[table[i]] for i in built.path_id[whole]])
        return built.build()


def scan_parquet(source: Source, options: ScanOptions) -> VirtualGroup:
    """The model of a parquet reference set: refgrid's own (Zarr v3 documents) or kerchunk's
    (Zarr v2 documents, translated)."""
    parquet = load_parquet_references(source.url, source.storage_options)
    if METADATA in parquet.documents:
        group = group_from_documents(
            {node: parquet.documents[k] for node, k in document_keys(parquet.documents).items()},
            lambda path, grid: parquet.manifest(path, grid.chunk_counts), parquet.url)
    else:
        group = v2_group(parquet.documents, lambda path, grid, _: parquet.manifest(
            path, grid.chunk_counts), parquet.url)
    return replace(with_bookkeeping(group, parquet.bookkeeping), sources=parquet.sources)


def load_parquet_references(url: str, storage_options: StorageOptions) -> ParquetReferences:
    fs, root = filesystem(url, storage_options)
    root = root.rstrip("/")
    try:
        meta = loads(fs.cat_file(f"{root}/{ZMETADATA}"))
        documents = {k: json.loads(v) if isinstance(v, str) else v
                     for k, v in meta["metadata"].items()}
        record_size = int(meta["record_size"])
        if record_size < 1:
            raise ValueError(f"record_size {record_size} is not a positive integer")
    except FileNotFoundError:
        if not fs.exists(root):
            raise NotFoundError(url, None, "file not found") from None
        raise FormatError(url, None, "no .zmetadata: not kerchunk parquet references (nor "
                          "an HDF5/NetCDF file)") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise FormatError(url, ZMETADATA, f"not kerchunk parquet metadata: {e}") from e
    sidecar = sidecar_directory(meta, url)
    return ParquetReferences(url, documents, record_size, stored_identities(meta, sidecar),
                             sidecar, section(meta).get(ATTRIBUTES_KEY), fs, root,
                             storage_options, _stored_digests(meta))


def _stored_digests(meta: object) -> dict[str, str]:
    value = section(meta).get(RECORDS_KEY)
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _read_table(data: bytes, url: str, name: str) -> pa.Table:
    """One record file. pyarrow bounds-checks what it parses: a damaged file is an error, never
    a crash (fastparquet's thrift reader trusts the footer's lengths)."""
    try:
        table = pq.read_table(pa.BufferReader(data), page_checksum_verification=True)
        table.column_names  # noqa: B018 (names are decoded here: a damaged one fails now)
        return table
    except (pa.ArrowException, OSError, ValueError) as e:
        raise FormatError(url, None, f"{name}: not a parquet reference file: {e}") from e


def _fill(table: pa.Table, start: int, built: ManifestBuilder,
          sidecar: str | None = None) -> None:
    """One record file's references into the manifest (rows from ``start``)."""
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

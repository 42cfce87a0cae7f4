"""Parquet reference sets (kerchunk's layout; refgrid's own or kerchunk's), read as columns.

The layout (fsspec's ``LazyReferenceMapper``): ``.zmetadata`` holds every Zarr v2 metadata
document and the ``record_size``; each array's references are in ``<array>/refs.<n>.parq``,
row ``i`` of file ``n`` being chunk ``n * record_size + i`` of the chunk grid in C order, with
columns ``path``/``offset``/``size`` and ``raw`` (inline bytes). Reading the columns whole
keeps an archive of millions of chunks free of per-chunk Python objects, and a record file
that kerchunk never wrote (an array without any chunk) simply means missing chunks.
refgrid writes the same layout with Zarr v3 documents (``zarr.json`` keys) in ``.zmetadata``;
kerchunk's Zarr v2 documents are translated by :mod:`refgrid.scanners.kerchunk`; its section
may name arrays stored inline in pieces, whose record files hold fewer rows
(:func:`record_name`, :func:`piece_rows`).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import ItemsView, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, cast

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from refgrid.core.jsonio import loads
from refgrid.core.keys import METADATA, ZMETADATA, document_keys
from refgrid.core.sources import (
    ATTRIBUTES_KEY,
    IDENTITY_FIELDS,
    PIECES_KEY,
    RECORDS_KEY,
    SOURCE_TABLE_KEY,
    SourceIdentity,
    StoredSources,
    filesystem,
    in_sidecar,
    record_digest,
    section,
    sidecar_directory,
    stored_identities,
    valid_identity,
)
from refgrid.core.typed import JSONObject, StorageOptions
from refgrid.core.util import gc_paused
from refgrid.errors import NO_SUCH_FILE, FormatError, NotFoundError, RefgridError
from refgrid.model.manifest import (
    MISSING,
    ChunkManifest,
    ManifestBuilder,
    Page,
    PagedManifest,
)
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
    sources: Mapping[str, SourceIdentity]
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
    pieces: Mapping[str, int]
    """Arrays whose record files hold pieces → their rows a file (:func:`piece_rows`)."""

    def manifest(self, array: str, counts: tuple[int, ...]) -> ChunkManifest:
        """The chunk manifest of ``array`` whose chunk grid has ``counts`` chunks per axis:
        read whole at once up to :data:`EAGER_RECORDS` record files (a damaged one is an
        error as the archive opens), page by page beyond (:class:`RecordPages`)."""
        total = math.prod(counts)
        size, pieced = record_rows(array, self.pieces, self.record_size)
        pages = RecordPages(self.url, self.fs, self.root, array, size,
                            {k: v for k, v in self.digests.items()
                             if k.rsplit("/", 1)[0] == array},
                            self.sidecar, self.storage_options, METADATA in self.documents,
                            pieced)
        records = -(-total // size)  # (integers: a size of 10**400 is one record file)
        if records > EAGER_RECORDS:
            paged = PagedManifest(counts, pages)
            # what an append rewrites — the record files holding the last step along the
            # first axis (the last file's padded chunk, its partial record file) — read now
            # and kept: a reader of this version reads it while the next one lands
            slab = math.prod(counts[1:])
            paged.pin(range(max(total - slab, 0) // size * size, total, size))
            return paged
        names = [pages.name(n) for n in range(records)]
        found = self.fs.cat(names, on_error="return") if names else {}  # (concurrently)
        built = ManifestBuilder(counts)
        for n, name in enumerate(names):
            start = n * size
            built.page(start, pages.parse(n, min(size, total - start), found.get(name)))
        return built.build()


PIECE_ROWS = 64
"""Rows of each record file of an array stored inline in pieces
(:attr:`~refgrid.model.virtual.VirtualArray.inline_pieces`: the concat coordinate, 2 MB of
float64 a file), where ``record_size`` rows of 32 kB pieces would make the one record file
an append rewrites hold the whole coordinate."""


def record_name(array: str, n: int, pieced: bool = False) -> str:
    """Record file ``n`` of ``array``, relative to the reference directory; ``pieced``: of an
    array whose record files hold :data:`PIECE_ROWS` rows, named apart (a reader that knows
    only ``record_size`` finds no record file — an error — rather than reading 64 rows as
    the first of 10^5, the rest as missing)."""
    return f"{array}/{'pieces' if pieced else 'refs'}.{n}.parq"


def record_rows(array: str, pieces: Mapping[str, int], record_size: int) -> tuple[int, bool]:
    """The rows of each record file of ``array`` and whether they are record files of
    pieces (:func:`record_name`), given :func:`piece_rows` and the ``record_size``."""
    return pieces.get(array, record_size), array in pieces


def piece_rows(meta: Mapping[str, Any]) -> dict[str, int]:
    """The arrays of parquet references ``meta`` (``.zmetadata``, parsed) whose record files
    hold pieces, with their rows a file (:data:`~refgrid.core.sources.PIECES_KEY`)."""
    found = section(meta).get(PIECES_KEY, {})
    if not isinstance(found, Mapping) or not all(
            isinstance(k, str) and type(v) is int and v > 0 for k, v in found.items()):
        raise ValueError(f"{PIECES_KEY} is not arrays and their rows per record file: "
                         f"{found!r:.80}")
    return dict(found)


EAGER_RECORDS = 8
"""Record files an array's manifest may span and still be read whole as the archive opens
(8 x 10^5 chunks, 16 MB of columns); beyond, a reader loads the record files it needs, and
those holding the last step along the first dimension as it opens (an append rewrites them:
:meth:`~refgrid.model.manifest.PagedManifest.pin`)."""


@dataclass(frozen=True)
class RecordPages:
    """An array's record files as the pages of a :class:`PagedManifest`: each read when
    asked for, checked against its digest, its ``[url]`` references (whole files) sized."""

    url: str
    fs: fsspec.AbstractFileSystem
    root: str
    array: str
    size: int
    digests: Mapping[str, str]
    """This array's record files' digests (none for kerchunk's parquet)."""
    sidecar: str | None
    storage_options: StorageOptions
    refgrid: bool
    """Written by refgrid (which writes every record file)."""
    pieced: bool = False
    """Record files of pieces (:func:`record_name`)."""

    def name(self, n: int) -> str:
        return f"{self.root}/{record_name(self.array, n, self.pieced)}"

    def load(self, n: int, rows: int) -> Page:
        try:
            data: bytes | Exception = self.fs.cat_file(self.name(n))
        except Exception as e:  # fsspec's filesystems raise their own: named by parse()
            data = e
        return self.parse(n, rows, data)

    def parse(self, n: int, rows: int, data: bytes | Exception | None) -> Page:
        """Page ``n`` of ``rows`` chunks from its record file's bytes (or the error its
        read raised)."""
        name = self.name(n)
        built = ManifestBuilder((rows,))
        if isinstance(data, FileNotFoundError):
            if self.refgrid:
                raise FormatError(self.url, self.array, f"record file {name} is missing: "
                                  "its chunks' references are lost")
            return _page(built)  # kerchunk writes no record file for an array without chunks
        if isinstance(data, Exception):
            raise FormatError(self.url, self.array, f"cannot read {name}: {data}") from data
        if data is None:
            raise FormatError(self.url, self.array, f"cannot read {name}: no answer")
        relative = record_name(self.array, n, self.pieced)
        if relative in self.digests and record_digest(data) != self.digests[relative]:
            raise FormatError(self.url, self.array, f"record file {relative} does not match "
                              "its digest in .zmetadata: it is damaged or was changed")
        table = read_table(data, self.url, name)
        if relative in self.digests and table.num_rows != rows:  # (refgrid's: all rows)
            raise FormatError(self.url, self.array, f"record file {relative} holds "
                              f"{table.num_rows} rows, not {rows}: the row count .zmetadata "
                              "gives its array is wrong")
        try:
            _fill(table, 0, built, self.sidecar)
        except (pa.ArrowException, KeyError, TypeError, ValueError) as e:
            raise FormatError(self.url, self.array, f"{name}: unusable reference columns "
                              f"{table.column_names}: {e}") from e
        whole = np.flatnonzero((built.path_id >= 0) & (built.length == 0))  # [url]: a file
        if whole.size:
            urls = list(built.urls)
            try:
                sizes = file_sizes(sorted({urls[i] for i in built.path_id[whole]}),
                                   self.storage_options, self.url)
            except RefgridError:
                raise
            except Exception as e:  # (read as a page loads: no scan names it)
                raise FormatError(self.url, self.array, f"cannot size the files {name} "
                                  f"names: {type(e).__name__}: {e}") from e
            built.set_lengths(whole, [sizes[urls[i]] for i in built.path_id[whole]])
        return _page(built)


def _page(built: ManifestBuilder) -> Page:
    return Page(list(built.urls), built.path_id, built.offset, built.length,
                {int(c[0]): data for c, data in built.inline.items()})


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
        pieces = piece_rows(meta)
        if pieces and METADATA not in documents:
            raise ValueError(f"{PIECES_KEY} in kerchunk's Zarr v2 references, which have none")
    except FileNotFoundError:
        if not fs.exists(root):
            raise NotFoundError(url, None, NO_SUCH_FILE) from None
        raise FormatError(url, None, "no .zmetadata: not kerchunk parquet references (nor "
                          "an HDF5/NetCDF file)") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise FormatError(url, ZMETADATA, f"not kerchunk parquet metadata: {e}") from e
    sidecar = sidecar_directory(meta, url)
    digests = _stored_digests(meta)
    return ParquetReferences(url, documents, record_size,
                             stored_sources(meta, url, fs, root, sidecar, digests), sidecar,
                             section(meta).get(ATTRIBUTES_KEY), fs, root, storage_options,
                             digests, pieces)


# -- the sources' identities: record files of their own ----------------------------------

SOURCES_DIRECTORY = ".sources"
"""Where a parquet archive refgrid wrote keeps its sources' identities: record files named
as an array's (``.sources/refs.<n>.parq``, :data:`SOURCE_PAGE_ROWS` rows each, their digests among
the others), one row a file. In ``.zmetadata`` they were parsed (10^6 identities: 120 MB)
every time the archive opened and rewritten whole by every append."""
IDENTITY_SCHEMA = pa.schema([pa.field("url", pa.string()), pa.field("size", pa.int64()),
                             pa.field("mtime", pa.float64()), pa.field("etag", pa.string()),
                             pa.field("version", pa.string()),
                             pa.field("rewritten", pa.bool_())])
"""One column a field of :class:`~refgrid.core.sources.SourceIdentity` (null: absent)."""


def identity_table(items: Sequence[tuple[str, SourceIdentity]], where: str) -> pa.Table:
    """Identities as the rows of source record files (read back by :class:`IdentityColumns`)."""
    for url, identity in items:
        if valid_identity(identity) != identity:
            raise FormatError(where, url, f"the identity {identity!r:.80} has fields of other "
                              "types than a file's")
    return pa.table({"url": [url for url, _ in items],
                     **{name: [identity.get(name) for _, identity in items]
                        for name in IDENTITY_FIELDS}}, schema=IDENTITY_SCHEMA)


class IdentityColumns(Mapping[str, SourceIdentity]):
    """The identities of source record files, kept as their columns: a URL's identity is
    made when asked for (10^5 made at once cost a tenth of a second; a read checks the few
    it touches). The inverse of :func:`identity_table`."""

    def __init__(self, tables: Sequence[pa.Table], where: str) -> None:
        for table in tables:
            if not table.schema.equals(IDENTITY_SCHEMA, check_metadata=False):
                raise FormatError(where, None, f"not a table of source identities: "
                                  f"{table.schema}")
            if table.column("url").null_count or table.column("size").null_count:
                raise FormatError(where, None, "a source identity without a URL or size")
        whole = pa.concat_tables(tables) if len(tables) != 1 else tables[0]
        self.column = whole.column("url").combine_chunks()
        self.urls: list[str] = self.column.to_pylist()
        self._fields = [(name, whole.column(name).combine_chunks())
                        for name in IDENTITY_FIELDS if whole.column(name).null_count < len(whole)]
        self._rows = {url: k for k, url in enumerate(self.urls)}

    def __getitem__(self, url: str) -> SourceIdentity:
        k = self._rows[url]
        return cast(SourceIdentity, {name: value for name, value in (
            (name, column[k].as_py()) for name, column in self._fields) if value is not None})

    def __contains__(self, url: object) -> bool:
        return url in self._rows

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def items(self) -> ItemsView[str, SourceIdentity]:
        """Every identity, made column by column (an append reads the table whole)."""
        names = [name for name, _ in self._fields]
        columns = [column.to_pylist() for _, column in self._fields]
        with gc_paused():  # 10^5 small dicts: the collector would walk them again and again
            made = {url: cast(SourceIdentity, {name: value for name, value in zip(
                names, values, strict=True) if value is not None})
                for url, *values in zip(self.urls, *columns, strict=True)}
        return made.items()

    def sorted(self) -> bool:
        """Whether the URLs are in order (compared as their UTF-8 bytes, as Python does)."""
        if len(self.urls) < 2:
            return True
        return bool(pc.all(pc.less(self.column[:-1].cast(pa.binary()),
                                   self.column[1:].cast(pa.binary()))).as_py())


def stored_sources(meta: object, url: str, fs: fsspec.AbstractFileSystem, root: str,
                   sidecar: str | None, digests: Mapping[str, str]
                   ) -> Mapping[str, SourceIdentity]:
    """The sources of the archive whose ``.zmetadata`` is ``meta``: from its source record
    files, each read when a URL it holds is first asked for — or, written before those,
    from ``.zmetadata``."""
    table = source_table(meta, url)
    if table is None:
        return stored_identities(meta, sidecar)
    rows, firsts, page_rows = table.rows, table.pages, table.page_rows
    names = [f"{SOURCES_DIRECTORY}/refs.{n}.parq" for n in range(len(firsts))]
    if set(names) != {k for k in digests if k.startswith(f"{SOURCES_DIRECTORY}/")}:
        raise FormatError(url, ZMETADATA, f"the digests name other source record files "
                          f"than the {len(names)} that {rows} sources fill")

    def load(n: int) -> IdentityColumns:
        name = names[n]
        try:
            data = fs.cat_file(f"{root}/{name}")
        except Exception as e:  # fsspec's filesystems raise their own
            raise FormatError(url, name, f"the sources' record file cannot be read: "
                              f"{type(e).__name__}: {e}") from e
        if record_digest(data) != digests.get(name):
            raise FormatError(url, name, "the sources' record file does not match its "
                              "digest in .zmetadata: it is damaged or was changed")
        page = IdentityColumns([read_table(data, url, name)], url)
        bound = firsts[n + 1] if n + 1 < len(firsts) else None
        expected = min(page_rows, rows - n * page_rows)
        if len(page.urls) != expected or len(page) != expected or not page.sorted() or \
                page.urls[0] != firsts[n] or (bound is not None and page.urls[-1] >= bound):
            raise FormatError(url, name, f"the sources' record file holds other URLs than "
                              f".zmetadata says ({expected} from {firsts[n]!r}, sorted)")
        return page

    sources = StoredSources(rows, firsts, load, sidecar)
    # read now, as manifests are: the whole table if small, else the pages an append of
    # later files rewrites — from the one where the archive's last file sorts (new files
    # sort after it when names sort in time) to the end (rewritten chunk files sort last) —
    # so a reader of this version keeps them while the next one lands
    last = bisect_right(firsts, table.last) - 1 if table.last else len(firsts) - 1
    sources.load(range(len(firsts)) if len(firsts) <= EAGER_RECORDS else
                 range(max(last, 0), len(firsts)))
    return sources


SOURCE_PAGE_ROWS = 10_000
"""Identities a source record file holds (fewer if ``record_size`` is smaller): a file's
identity costs reading one (~5 ms), an append rewriting one or two."""


class SourceTable(NamedTuple):
    """What ``.zmetadata`` says of the sources' record files (:data:`SOURCE_TABLE_KEY`)."""

    rows: int
    page_rows: int
    """Identities a record file holds (the last may hold fewer)."""
    pages: list[str]
    """Each record file's first URL (the rows are sorted by URL)."""
    first: str | None
    """The archive's first source file along its concat dimension (sorted by URL, the rows
    do not say which)."""
    last: str | None
    """Its last."""

    def to_json(self) -> dict[str, object]:
        return {"rows": self.rows, "page_rows": self.page_rows, "pages": self.pages,
                "first": self.first, "last": self.last}


def source_table(meta: object, url: str) -> SourceTable | None:
    """The source table ``.zmetadata`` (``meta``) describes; None if it describes none (an
    archive written before its sources had record files keeps them in its section)."""
    table = section(meta).get(SOURCE_TABLE_KEY)
    if table is None:
        return None
    page_rows = table.get("page_rows") if isinstance(table, Mapping) else None
    rows = table.get("rows") if isinstance(table, Mapping) else None
    firsts = table.get("pages") if isinstance(table, Mapping) else None
    first = table.get("first") if isinstance(table, Mapping) else None
    last = table.get("last") if isinstance(table, Mapping) else None
    if type(rows) is not int or rows < 0 or type(page_rows) is not int or page_rows < 1 or \
            not isinstance(firsts, list) or not all(isinstance(u, str) for u in firsts) or \
            firsts != sorted(firsts) or len(firsts) != -(-rows // page_rows) or \
            not isinstance(first, str | None) or not isinstance(last, str | None):
        raise FormatError(url, ZMETADATA, f"the source table {table!r:.60} is not "
                          '{"rows": n, "page_rows": n, "pages": [URL, ...], "first": URL, '
                          '"last": URL}')
    return SourceTable(rows, page_rows, firsts, first, last)


def _stored_digests(meta: object) -> dict[str, str]:
    value = section(meta).get(RECORDS_KEY)
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


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

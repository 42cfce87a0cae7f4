"""Parquet reference directories for large archives, in both directions: kerchunk's columnar
layout (fsspec's ``LazyReferenceMapper``'s) with Zarr v3 documents — or kerchunk's own, Zarr v2.

``.zmetadata`` (:class:`ZMetadata`) holds every metadata document (here the ``zarr.json`` of
each node), the ``record_size`` and refgrid's section (:class:`ParquetSection`: the record
files' digests, the sources' table, the arrays stored in pieces); the references of each array
are in ``<array>/refs.<n>.parq``, row ``i`` of file ``n`` being chunk ``n * record_size + i``
of the chunk grid in C order (:mod:`refgrid.refs.records`) — an array stored inline in pieces
(the concat coordinate) in record files of :data:`PIECE_ROWS` rows, ``<array>/pieces.<n>.parq``
— and the sources' identities in record files of their own (:mod:`refgrid.refs.source_pages`).
A record file that kerchunk never wrote (an array without any chunk) means missing chunks; one
refgrid wrote must be there, whole. (fsspec's own reader of this layout knows only Zarr v2
documents: refgrid's engine and mapper read the v3 form, and the classic kerchunk form,
``zarr_format=2``, is fsspec's own.)

Written whole (:func:`parquet_files`) or extended by an append (:func:`appended_files`: the
record files from where the new chunks begin, the source pages from where the new URLs sort,
``.zmetadata`` last), as files — name → bytes — that the writers swap in
(:mod:`refgrid.writers.parquet`); read as an archive opens (:func:`parquet_group`), record
files loaded as reads need them beyond :data:`EAGER_RECORDS`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal, cast

import fsspec
import numpy as np
import pyarrow as pa

from refgrid.core.jsonio import loads
from refgrid.core.keys import METADATA, ZMETADATA, document_keys
from refgrid.core.sources import SourceIdentity, file_sizes, filesystem
from refgrid.core.typed import JSONObject, StorageOptions
from refgrid.errors import NO_SUCH_FILE, FormatError, NotFoundError, RefgridError
from refgrid.grid.rectilinear import GridForm
from refgrid.model.manifest import ChunkManifest, ManifestBuilder, Page, PagedManifest
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import documents, group_from_documents, with_bookkeeping
from refgrid.refs.kerchunk_v2 import v2_documents, v2_group
from refgrid.refs.records import (
    Rows,
    into_manifest,
    read_record,
    read_table,
    record_digest,
    record_name,
)
from refgrid.refs.section import SECTION_KEY, Portable, Section, raw_section
from refgrid.refs.source_pages import (
    SOURCE_PAGE_ROWS,
    SOURCES_DIRECTORY,
    SourceTable,
    StoredSources,
    first_source,
    local_page,
    page_files,
    page_name,
    read_page,
)

RECORD_SIZE = 100_000
"""Chunks per record file: large enough for few files, small enough to read one quickly."""
PIECE_ROWS = 64
"""Rows of each record file of an array stored inline in pieces
(:attr:`~refgrid.model.virtual.VirtualArray.inline_pieces`: the concat coordinate, 2 MB of
float64 a file), where ``record_size`` rows of 32 kB pieces would make the one record file
an append rewrites hold the whole coordinate."""
EAGER_RECORDS = 8
"""Record files an array's manifest may span and still be read whole as the archive opens
(8 x 10^5 chunks, 16 MB of columns); beyond, a reader loads the record files it needs, and
those holding the last step along the first dimension as it opens (an append rewrites them:
:meth:`~refgrid.model.manifest.PagedManifest.pin`). Source pages likewise."""
RECORDS_KEY = "records"
SOURCE_TABLE_KEY = "source_table"
PIECES_KEY = "pieces"


@dataclass(frozen=True)
class ParquetSection(Section):
    """refgrid's section of parquet references: the section's own fields (the sources only
    in an archive written before they had record files of their own) and the record
    files'."""

    records: Mapping[str, str] = field(default_factory=dict)
    """Each record file (relative name) → its digest (:func:`~refgrid.refs.records.
    record_digest`; none in kerchunk's parquet)."""
    source_table: SourceTable | None = None
    """The sources' record files (None: none — kerchunk's, or an archive of before)."""
    pieces: Mapping[str, int] = field(default_factory=dict)
    """The arrays stored inline in pieces (the concat coordinate) → the rows of each of
    their record files."""

    @classmethod
    def from_dict(cls, data: Mapping[str, object], url: str = "<references>"
                  ) -> ParquetSection:
        """The section of ``.zmetadata`` of the references at ``url``: what a reader can use,
        its record files' keys checked (a ``ValueError`` for the arrays in pieces, a
        :class:`~refgrid.errors.FormatError` for the source table)."""
        found = data.get(PIECES_KEY, {})
        if not isinstance(found, Mapping) or not all(
                isinstance(k, str) and type(v) is int and v > 0 for k, v in found.items()):
            raise ValueError(f"{PIECES_KEY} is not arrays and their rows per record file: "
                             f"{found!r:.80}")
        digests = data.get(RECORDS_KEY)
        table = data.get(SOURCE_TABLE_KEY)
        return cls(**vars(Section.from_dict(data)),
                   records={k: v for k, v in digests.items() if isinstance(k, str) and
                            isinstance(v, str)} if isinstance(digests, dict) else {},
                   source_table=SourceTable.from_dict(table, url) if table is not None else None,
                   pieces=dict(found))

    def to_dict(self) -> JSONObject:
        """The section as written: the section's own fields, then the digests (always),
        the source table and the arrays in pieces (where there are any)."""
        out: dict[str, object] = {**super().to_dict(), RECORDS_KEY: dict(self.records)}
        if self.source_table is not None and self.source_table.rows:
            out[SOURCE_TABLE_KEY] = self.source_table.to_dict()
        if self.pieces:
            out[PIECES_KEY] = dict(self.pieces)
        return cast(JSONObject, out)


@dataclass(frozen=True)
class ZMetadata:
    """``.zmetadata``: refgrid's section, every node's metadata document by key, and the
    rows of a record file."""

    section: ParquetSection
    metadata: Mapping[str, Mapping[str, Any]]
    """Document key (``tas/zarr.json``, or kerchunk's ``tas/.zarray``) → the document."""
    record_size: int

    @classmethod
    def from_bytes(cls, data: bytes, url: str) -> ZMetadata:
        """``.zmetadata`` of the references at ``url`` (parsed by orjson where json would
        read the same: :func:`refgrid.core.jsonio.loads`), checked."""
        try:
            return cls.from_dict(loads(data), url)
        except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as e:
            raise FormatError(url, ZMETADATA, f"not kerchunk parquet metadata: {e}") from e

    @classmethod
    def from_dict(cls, meta: Any, url: str) -> ZMetadata:
        """``.zmetadata`` as parsed (``AttributeError``, ``KeyError``, ``TypeError``,
        ``ValueError`` for what is not: :meth:`from_bytes` names them)."""
        docs = {k: json.loads(v) if isinstance(v, str) else v
                for k, v in meta["metadata"].items()}
        record_size = int(meta["record_size"])
        if record_size < 1:
            raise ValueError(f"record_size {record_size} is not a positive integer")
        section = ParquetSection.from_dict(raw_section(meta), url)
        if section.pieces and METADATA not in docs:
            raise ValueError(f"{PIECES_KEY} in kerchunk's Zarr v2 references, which have none")
        return cls(section, docs, record_size)

    def to_dict(self) -> JSONObject:
        return cast(JSONObject, {SECTION_KEY: self.section.to_dict(),
                                 "metadata": dict(self.metadata),
                                 "record_size": int(self.record_size)})

    def to_bytes(self) -> bytes:
        """As written (a from-scratch write and an append write the same bytes)."""
        return json.dumps(self.to_dict()).encode()

    def rows(self, array: str) -> tuple[int, bool]:
        """The rows of each record file of ``array`` and whether they are record files of
        pieces (:func:`~refgrid.refs.records.record_name`)."""
        return self.section.pieces.get(array, self.record_size), array in self.section.pieces

    def ends(self) -> tuple[str, str] | None:
        """The archive's first and last source files along its concat dimension, where its
        source table says (sorted by URL, its sources do not)."""
        table = self.section.source_table
        return (table.first, table.last) if table is not None and table.first and \
            table.last else None


# -- written ---------------------------------------------------------------------------

def parquet_files(group: VirtualGroup, where: str, *, grid_form: GridForm = "auto",
                  record_size: int = RECORD_SIZE, zarr_format: Literal[2, 3] = 3,
                  sidecar: Path | None = None) -> Iterator[tuple[str, bytes]]:
    """Every file of the parquet references of ``group`` (to be written at ``where``), name
    → bytes, ``.zmetadata`` last. ``zarr_format=2`` writes classic kerchunk's v2 documents
    (regular grids only); ``sidecar``: the directory of rewritten chunks beside it, whose
    files are named relative to it."""
    portable = Portable(sidecar)
    metadata = v2_documents(group) if zarr_format == 2 else documents(group, grid_form)
    digests: dict[str, str] = {}
    pieces = {path: PIECE_ROWS for path, node in group.walk() if zarr_format == 3 and
              isinstance(node, VirtualArray) and node.inline_pieces}
    for path, node in group.walk():
        if isinstance(node, VirtualArray):
            yield from _digested(_record_files(Rows.of(node.manifest, portable), path, 0,
                                               pieces.get(path, record_size), path in pieces),
                                 digests)
    sources = [(portable(url), identity) for url, identity in group.sources.items()]
    page_rows = min(record_size, SOURCE_PAGE_ROWS)
    pages, firsts = page_files(sorted(sources, key=itemgetter(0)), 0, page_rows, where)
    yield from _digested(pages, digests)
    table = SourceTable(len(sources), page_rows, tuple(firsts), first_source(sources),
                        first_source(sources[::-1])) if sources else None
    section = Section.of_group(group, portable, sources=False)
    yield ZMETADATA, ZMetadata(ParquetSection(**vars(section), records=digests,
                                              source_table=table, pieces=pieces),
                               metadata, record_size).to_bytes()


def _record_files(rows: Rows, path: str, first: int, record_size: int,
                  pieced: bool = False) -> Iterator[tuple[str, bytes]]:
    """``rows`` as record files ``first``, ``first + 1``... of ``path`` (``pieced``: record
    files of pieces, :func:`~refgrid.refs.records.record_name`)."""
    for n, data in enumerate(rows.record_files(record_size), first):
        yield record_name(path, n, pieced), data


def _digested(files: Iterable[tuple[str, bytes]], digests: dict[str, str]
              ) -> Iterator[tuple[str, bytes]]:
    """``files``, their digests into ``digests`` as they pass."""
    for name, data in files:
        digests[name] = record_digest(data)
        yield name, data


def appended_files(target: Path, meta: ZMetadata, tail: Mapping[str, tuple[int, ChunkManifest]],
                   metadata: Mapping[str, Mapping[str, Any]],
                   sources: Mapping[str, SourceIdentity], sidecar: Path | None = None,
                   known: Container[str] = (), pieced: Iterable[str] = ()
                   ) -> tuple[Iterator[tuple[str, bytes]], list[str]]:
    """What an append to the parquet references at ``target`` (whose ``.zmetadata`` is
    ``meta``) writes, and what it removes once they are written: ``tail`` maps an array to
    ``(row, manifest)`` — its chunks from C-order row ``row`` on are now ``manifest``'s (the
    rows before stay; the record file holding ``row`` is rewritten, later ones written);
    ``metadata`` replaces the documents; ``sources`` are added to the sources, one identity
    a URL (``known``: those it holds, named as it names them, which are not added again);
    ``pieced``: the arrays stored inline in pieces, whose record files hold
    :data:`PIECE_ROWS` rows. An array whose record files change form — the coordinate of an
    archive written before there were record files of pieces, or a one-file archive's time
    bounds (one chunk, as a piece would be) now in its files' chunks — is written again
    whole from row 0 (such arrays are small: inlined times), its earlier record files
    removed once ``.zmetadata`` names the new ones.

    Everything kept is read, and checked against its digest, before this returns; the
    files then come in the order they are to be swapped in, each whole, ``.zmetadata``
    last: until then the directory reads as before (a reader that had loaded the old
    ``.zmetadata`` may meet a rewritten record file, whose digest then differs: an error,
    never other references). They are those a from-scratch write of the whole would
    write, byte for byte."""
    section = meta.section
    digests = dict(section.records)
    stored = {path: meta.rows(path) for path in tail}
    wanted = {path: (PIECE_ROWS, True) if path in pieced else (meta.record_size, False)
              for path in tail}
    moved = [path for path in tail if stored[path] != wanted[path]]
    order = list(dict.fromkeys(name.rsplit("/", 1)[0] for name in digests))  # (as written)
    portable = Portable(sidecar)
    kept_rows: dict[str, Rows] = {}
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
    pieces = {path: rows for path, rows in section.pieces.items() if path not in moved}
    pieces.update({path: wanted[path][0] for path in moved if wanted[path][1]})
    pieces = {path: pieces[path] for path in sorted(pieces, key=lambda p: (
        order.index(p) if p in order else len(order)))}  # (as a whole write lists them)
    added = [(url, identity) for url, identity in
             ((portable(url), identity) for url, identity in sources.items()) if url not in known]
    if section.source_table is None:  # an archive of before: its table leaves .zmetadata
        added = [*section.identities().items(), *added]
    table = section.source_table or SourceTable(0, min(meta.record_size, SOURCE_PAGE_ROWS),
                                                (), first_source(added), None)
    since = max(table.page_of(min(url for url, _ in added)), 0) if added else 0
    kept_identities = [row for n in range(since, len(table.pages)) if added
                       for row in local_page(target / page_name(n), digests.get(page_name(n)))]

    def files() -> Iterator[tuple[str, bytes]]:
        for path, (row, manifest) in tail.items():
            size, named = wanted[path]
            yield from _digested(_record_files(
                Rows.concat(kept_rows[path], Rows.of(manifest, portable)), path,
                0 if path in moved else row // size, size, named), digests)
        grown = table
        if added:
            merged = sorted({**dict(kept_identities), **dict(added)}.items(), key=itemgetter(0))
            pages, firsts = page_files(merged, since, table.page_rows, str(target))
            yield from _digested(pages, digests)
            grown = SourceTable(since * table.page_rows + len(merged), table.page_rows,
                                (*table.pages[:since], *firsts), table.first or first_source(added),
                                first_source(added[::-1]) or table.last)
        arrays = list(dict.fromkeys([*order, *(name.rsplit("/", 1)[0] for name in digests)]))
        records = {name: digests[name] for array in arrays for name in sorted(
            (k for k in digests if k.rsplit("/", 1)[0] == array),
            key=lambda k: int(k.rsplit(".", 2)[1]))}
        yield ZMETADATA, ZMetadata(ParquetSection(
            attributes=section.attributes,
            sidecar=sidecar.name if sidecar is not None else section.sidecar,
            records=records, source_table=grown, pieces=pieces), metadata,
            meta.record_size).to_bytes()

    return files(), stale


# -- read --------------------------------------------------------------------------------

def read_zmetadata(target: Path) -> ZMetadata:
    """``.zmetadata`` of the local parquet references at ``target`` (an ``OSError`` where it
    cannot be read, a :class:`~refgrid.errors.FormatError` where it is not)."""
    return ZMetadata.from_bytes((target / ZMETADATA).read_bytes(), str(target))


def local_sources(target: Path, meta: ZMetadata) -> Mapping[str, SourceIdentity]:
    """The sources of the local parquet references at ``target``, as they name them."""
    fs, root = filesystem(str(target))
    return stored_sources(meta, str(target), fs, root, None)


def stored_piece(target: Path, meta: ZMetadata, array: str, piece: int) -> bytes | None:
    """The stored bytes of piece ``piece`` of ``array``, stored inline in pieces in the
    local parquet references at ``target`` (None: that row is no inline chunk)."""
    size, pieced = meta.rows(array)
    name = record_name(array, piece // size, pieced)
    stored = read_record(target / name, meta.section.records.get(name))
    row = piece % size
    if len(stored) <= row or stored.raw is None or stored.raw[row] is None:
        return None
    return bytes(stored.raw[row])


@dataclass(frozen=True)
class ParquetReferences:
    """Parquet references as they open: ``.zmetadata`` read, the sources' pages read as
    they are asked for, the record files as manifests are (:meth:`manifest`)."""

    url: str
    meta: ZMetadata
    sources: Mapping[str, SourceIdentity]
    sidecar: str | None
    """Where the sidecar of rewritten chunks lies now (its files are named relative to it)."""
    fs: fsspec.AbstractFileSystem
    root: str
    storage_options: StorageOptions

    def manifest(self, array: str, counts: tuple[int, ...]) -> ChunkManifest:
        """The chunk manifest of ``array`` whose chunk grid has ``counts`` chunks per axis:
        read whole at once up to :data:`EAGER_RECORDS` record files (a damaged one is an
        error as the archive opens), page by page beyond (:class:`RecordPages`)."""
        total = math.prod(counts)
        size, pieced = self.meta.rows(array)
        pages = RecordPages(self.url, self.fs, self.root, array, size,
                            {k: v for k, v in self.meta.section.records.items()
                             if k.rsplit("/", 1)[0] == array},
                            self.sidecar, self.storage_options, METADATA in self.meta.metadata,
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
    """Record files of pieces (:func:`~refgrid.refs.records.record_name`)."""

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
            into_manifest(table, 0, built, self.sidecar)
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


def parquet_group(url: str, storage_options: StorageOptions) -> VirtualGroup:
    """The model of a parquet reference set: refgrid's own (Zarr v3 documents) or kerchunk's
    (Zarr v2 documents, translated)."""
    parquet = load_parquet_references(url, storage_options)
    docs = parquet.meta.metadata
    if METADATA in docs:
        group = group_from_documents(
            {node: docs[k] for node, k in document_keys(docs).items()},
            lambda path, grid: parquet.manifest(path, grid.chunk_counts), parquet.url)
    else:
        group = v2_group(cast(Mapping[str, JSONObject], docs), lambda path, grid, _:
                         parquet.manifest(path, grid.chunk_counts), parquet.url)
    return replace(with_bookkeeping(group, parquet.meta.section.attributes),
                   sources=parquet.sources)


def load_parquet_references(url: str, storage_options: StorageOptions) -> ParquetReferences:
    fs, root = filesystem(url, storage_options)
    root = root.rstrip("/")
    try:
        meta = ZMetadata.from_bytes(fs.cat_file(f"{root}/{ZMETADATA}"), url)
    except FileNotFoundError:
        if not fs.exists(root):
            raise NotFoundError(url, None, NO_SUCH_FILE) from None
        raise FormatError(url, None, "no .zmetadata: not kerchunk parquet references (nor "
                          "an HDF5/NetCDF file)") from None
    sidecar = meta.section.sidecar_directory(url)
    return ParquetReferences(url, meta, stored_sources(meta, url, fs, root, sidecar), sidecar,
                             fs, root, storage_options)


def stored_sources(meta: ZMetadata, url: str, fs: fsspec.AbstractFileSystem, root: str,
                   sidecar: str | None) -> Mapping[str, SourceIdentity]:
    """The sources of the archive whose ``.zmetadata`` is ``meta``: from its source record
    files, each read when a URL it holds is first asked for — or, written before those,
    from ``.zmetadata``."""
    table = meta.section.source_table
    if table is None:
        return meta.section.identities(sidecar)
    digests = meta.section.records
    names = [page_name(n) for n in range(len(table.pages))]
    if set(names) != {k for k in digests if k.startswith(f"{SOURCES_DIRECTORY}/")}:
        raise FormatError(url, ZMETADATA, f"the digests name other source record files "
                          f"than the {len(names)} that {table.rows} sources fill")

    def load(n: int) -> Mapping[str, SourceIdentity]:
        name = names[n]
        try:
            data = fs.cat_file(f"{root}/{name}")
        except Exception as e:  # fsspec's filesystems raise their own
            raise FormatError(url, name, f"the sources' record file cannot be read: "
                              f"{type(e).__name__}: {e}") from e
        return read_page(data, table, n, digests.get(name), url)

    sources = StoredSources(table.rows, table.pages, load, sidecar)
    # read now, as manifests are: the whole table if small, else the pages an append of
    # later files rewrites — from the one where the archive's last file sorts (new files
    # sort after it when names sort in time) to the end (rewritten chunk files sort last) —
    # so a reader of this version keeps them while the next one lands
    last = table.page_of(table.last) if table.last else len(table.pages) - 1
    sources.load(range(len(table.pages)) if len(table.pages) <= EAGER_RECORDS else
                 range(max(last, 0), len(table.pages)))
    return sources

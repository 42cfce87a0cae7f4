"""The sources' identities of a parquet archive, in both directions: record files of their own
(``.sources/refs.<n>.parq``, :data:`SOURCE_PAGE_ROWS` rows each, one row a file, their
digests among the others'), sorted by URL, and :class:`SourceTable` in ``.zmetadata`` saying
how many there are and which URL each page begins with — so a read checking a file loads the
one page that holds it (:class:`StoredSources`), and an append rewrites the pages from where
its first new URL sorts. In ``.zmetadata`` they were parsed (10^6 identities: 120 MB) every
time the archive opened and rewritten whole by every append.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from refgrid.core.keys import ZMETADATA
from refgrid.core.sources import IDENTITY_FIELDS, PagedSources, SourceIdentity, valid_identity
from refgrid.core.util import gc_paused
from refgrid.errors import FormatError
from refgrid.refs.records import checked, read_table, record_digest, record_name, table_file
from refgrid.refs.section import SIDECAR_TEMPLATE, in_sidecar

SOURCES_DIRECTORY = ".sources"
"""Where a parquet archive refgrid wrote keeps its sources' identities: record files named
as an array's (``.sources/refs.<n>.parq``)."""
SOURCE_PAGE_ROWS = 10_000
"""Identities a source record file holds (fewer if ``record_size`` is smaller): a file's
identity costs reading one (~5 ms), an append rewriting one or two."""
IDENTITY_SCHEMA = pa.schema([pa.field("url", pa.string()), pa.field("size", pa.int64()),
                             pa.field("mtime", pa.float64()), pa.field("etag", pa.string()),
                             pa.field("version", pa.string()),
                             pa.field("rewritten", pa.bool_())])
"""One column a field of :class:`~refgrid.core.sources.SourceIdentity` (null: absent)."""


def page_name(n: int) -> str:
    """Source record file ``n``, relative to the reference directory."""
    return record_name(SOURCES_DIRECTORY, n)


@dataclass(frozen=True)
class SourceTable:
    """What ``.zmetadata`` says of the sources' record files (its section's
    ``source_table``)."""

    rows: int
    page_rows: int
    """Identities a record file holds (the last may hold fewer)."""
    pages: tuple[str, ...]
    """Each record file's first URL (the rows are sorted by URL)."""
    first: str | None
    """The archive's first source file along its concat dimension (sorted by URL, the rows
    do not say which)."""
    last: str | None
    """Its last."""

    @classmethod
    def from_dict(cls, table: object, url: str) -> SourceTable:
        """The table as ``.zmetadata`` of the references at ``url`` holds it, checked."""
        fields = table if isinstance(table, Mapping) else {}
        rows, page_rows, firsts = (fields.get(k) for k in ("rows", "page_rows", "pages"))
        first, last = fields.get("first"), fields.get("last")
        if type(rows) is not int or rows < 0 or type(page_rows) is not int or page_rows < 1 or \
                not isinstance(firsts, list) or not all(isinstance(u, str) for u in firsts) or \
                firsts != sorted(firsts) or len(firsts) != -(-rows // page_rows) or \
                not isinstance(first, str | None) or not isinstance(last, str | None):
            raise FormatError(url, ZMETADATA, f"the source table {table!r:.60} is not "
                              '{"rows": n, "page_rows": n, "pages": [URL, ...], "first": '
                              'URL, "last": URL}')
        return cls(rows, page_rows, tuple(firsts), first, last)

    def to_dict(self) -> dict[str, object]:
        return {"rows": self.rows, "page_rows": self.page_rows, "pages": list(self.pages),
                "first": self.first, "last": self.last}

    def page_of(self, url: str) -> int:
        """The page holding ``url``, or that would hold it (-1: before the first)."""
        return bisect_right(self.pages, url) - 1


def identity_table(items: Sequence[tuple[str, SourceIdentity]], where: str) -> pa.Table:
    """Identities as the rows of source record files (read back by :class:`IdentityColumns`)."""
    for url, identity in items:
        if valid_identity(identity) != identity:
            raise FormatError(where, url, f"the identity {identity!r:.80} has fields of other "
                              "types than a file's")
    return pa.table({"url": [url for url, _ in items],
                     **{name: [identity.get(name) for _, identity in items]
                        for name in IDENTITY_FIELDS}}, schema=IDENTITY_SCHEMA)


def page_files(items: Sequence[tuple[str, SourceIdentity]], first: int, page_rows: int,
               where: str) -> tuple[Iterator[tuple[str, bytes]], list[str]]:
    """Identities (sorted by URL) as source record files ``first``, ``first + 1``... (name →
    bytes, each made as it is asked for), and each one's first URL."""
    table = identity_table(items, where)
    starts = range(0, len(items), page_rows)
    return ((page_name(first + n), table_file(table.slice(start, page_rows)))
            for n, start in enumerate(starts)), [items[start][0] for start in starts]


def first_source(items: Sequence[tuple[str, SourceIdentity]]) -> str | None:
    """The first source file among ``items`` (refgrid's rewritten chunk files, sources too,
    are none)."""
    return next((url for url, identity in items if not identity.get("rewritten")), None)


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


def read_page(data: bytes, table: SourceTable, n: int, digest: str | None,
              url: str) -> IdentityColumns:
    """Source record file ``n`` of the references at ``url`` from its bytes, checked against
    its ``digest`` and against what ``table`` says it holds."""
    name = page_name(n)
    if record_digest(data) != digest:
        raise FormatError(url, name, "the sources' record file does not match its digest in "
                          ".zmetadata: it is damaged or was changed")
    page = IdentityColumns([read_table(data, url, name)], url)
    bound = table.pages[n + 1] if n + 1 < len(table.pages) else None
    expected = min(table.page_rows, table.rows - n * table.page_rows)
    if len(page.urls) != expected or len(page) != expected or not page.sorted() or \
            page.urls[0] != table.pages[n] or (bound is not None and page.urls[-1] >= bound):
        raise FormatError(url, name, f"the sources' record file holds other URLs than "
                          f".zmetadata says ({expected} from {table.pages[n]!r}, sorted)")
    return page


def local_page(path: Path, digest: str | None) -> list[tuple[str, SourceIdentity]]:
    """The identities of a local source record file refgrid wrote, checked against its
    digest (an append reads the pages it rewrites)."""
    return list(IdentityColumns([read_table(checked(path, digest), str(path), path.name)],
                                str(path)).items())


class StoredSources(PagedSources):
    """A parquet archive's sources, sorted by URL into pages read as they are asked for:
    ``firsts`` holds each page's first URL, so a file's identity is one page away (a read
    of an archive of 10^6 files checks the files it touches by reading one or two pages of
    10^5), and how many there are is known beforehand. Iterated in URL order. Pickled as
    the dict they are."""

    def __init__(self, rows: int, firsts: Sequence[str],
                 load: Callable[[int], Mapping[str, SourceIdentity]],
                 sidecar: str | None = None) -> None:
        self.rows = rows
        self.firsts = list(firsts)
        self._load = load
        self.sidecar = sidecar
        """Where the sidecar lies now: the pages name its files by the template."""
        self._pages: dict[int, Mapping[str, SourceIdentity]] = {}
        self._lock = threading.Lock()

    def load(self, pages: Iterable[int]) -> None:
        """Read ``pages`` now."""
        for n in pages:
            self._page(n)

    def _page(self, n: int) -> Mapping[str, SourceIdentity]:
        found = self._pages.get(n)
        if found is None:
            with self._lock:
                found = self._pages.get(n)
                if found is None:
                    found = self._pages[n] = self._load(n)
        return found

    def _stored(self, url: object) -> tuple[str, Mapping[str, SourceIdentity]]:
        """``url`` as the pages name it, and the page that would hold it."""
        if not isinstance(url, str):
            return "", {}
        if self.sidecar is not None and url.startswith(self.sidecar + "/"):
            url = SIDECAR_TEMPLATE + url[len(self.sidecar):]
        n = bisect_right(self.firsts, url) - 1
        return url, self._page(n) if n >= 0 else {}

    def __getitem__(self, url: str) -> SourceIdentity:
        stored, page = self._stored(url)
        return page[stored]

    def __contains__(self, url: object) -> bool:
        stored, page = self._stored(url)
        return stored in page

    def __iter__(self) -> Iterator[str]:
        for n in range(len(self.firsts)):
            for url in self._page(n):
                yield in_sidecar(url, self.sidecar)

    def __len__(self) -> int:
        return self.rows

    def items(self) -> ItemsView[str, SourceIdentity]:
        """Every identity, page by page (an append's plan compares them all)."""
        pages = [self._page(n) for n in range(len(self.firsts))]
        with gc_paused():
            return {in_sidecar(url, self.sidecar): identity for page in pages
                    for url, identity in page.items()}.items()

    def __reduce__(self) -> tuple[type[dict[str, SourceIdentity]],
                                  tuple[dict[str, SourceIdentity]]]:
        return dict, (dict(self.items()),)

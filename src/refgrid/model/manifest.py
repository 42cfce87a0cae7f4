"""Chunk manifests: where every chunk of one array lives, as numpy columns.

Archives reach 10^7 chunks, so a manifest is never a Python object per chunk: ``path_id``
(an index into a table of URLs, or a sentinel), ``offset`` and ``length`` are arrays shaped like
the chunk grid (20 bytes a chunk). The few chunks that have no byte range (compact layouts,
decoded fallbacks) are kept as bytes in ``inline``, keyed by chunk coordinates.

Readers ask where chunks are through :meth:`ChunkManifest.locate` (ids into
:attr:`ChunkManifest.table`) and :meth:`ChunkManifest.inline_chunk`, never through the whole
columns: a :class:`PagedManifest` (an archive of 10^8 chunks, 2 GB of columns) answers them by
loading only the pages, record files of 10^5 chunks, that hold the chunks asked for. Whatever
needs every chunk (writers, combine, summaries) reads the columns, and a paged manifest loads
all its pages for that, once.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from refgrid.core.reprs import Displayed
from refgrid.core.util import FrozenPickle
from refgrid.errors import ModelError
from refgrid.grid.rectilinear import check_chunk_count

MISSING = -1
"""``path_id`` of a chunk that was never written: it reads as the fill value."""
INLINE = -2
"""``path_id`` of a chunk whose bytes are in :attr:`ChunkManifest.inline`."""
UNSIZED = 2**63
"""``length`` of a chunk that is a whole file of unknown size, which may be absent (then it
reads as the fill value): each chunk file of a remote Zarr store, named from the store's
metadata without listing or asking for every file (a request per chunk key)."""


def chunk_coords(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    """The grid coordinates of the chunk at C-order index ``flat`` (``()`` for a 0-d grid):
    the key of :attr:`ChunkManifest.inline` and of chunk names."""
    return tuple(int(c) for c in np.unravel_index(flat, tuple(shape)))


def flat_index(coords: tuple[int, ...], shape: Sequence[int]) -> int:
    """The C-order index of the chunk at ``coords`` (the inverse of :func:`chunk_coords`)."""
    return int(np.ravel_multi_index(coords, tuple(shape))) if coords else 0


def flat_indices(coords: Sequence[tuple[int, ...]] | Mapping[tuple[int, ...], object],
                 shape: Sequence[int]) -> np.ndarray:
    """The C-order indices of many chunks at once (10^5 inline chunks of a grown archive),
    all -1 when any of ``coords`` is not a chunk of ``shape``."""
    keys = list(coords)
    if not keys:
        return np.zeros(0, np.int64)
    bad = np.full(len(keys), -1, np.int64)
    if not shape:
        return np.zeros(len(keys), np.int64) if all(k == () for k in keys) else bad
    try:
        table = np.array(keys)
    except ValueError:  # keys of several lengths
        return bad
    if table.dtype.kind not in "iu" or table.ndim != 2 or table.shape[1] != len(shape) or \
            (table < 0).any() or (table >= np.asarray(shape)).any():
        return bad
    return np.asarray(np.ravel_multi_index(tuple(table.T), tuple(shape)), dtype=np.int64)


class Located(NamedTuple):
    """Where some chunks are (:meth:`ChunkManifest.locate`)."""

    path_id: np.ndarray
    offset: np.ndarray
    length: np.ndarray


class PresentChunks:
    """Which chunks of a paged manifest were written, answered a chunk at a time; the whole
    mask (a listing of the chunks) loads every page."""

    def __init__(self, manifest: PagedManifest) -> None:
        self.manifest = manifest

    def __getitem__(self, flat: int) -> bool:
        return bool(self.manifest.locate([flat]).path_id[0] != MISSING)

    def whole(self) -> np.ndarray:
        return self.manifest.path_id.reshape(-1) != MISSING


@dataclass(frozen=True, eq=False, repr=False)
class ChunkManifest(Displayed, FrozenPickle):
    """Byte locations of every chunk of one array."""

    _display = "manifest"

    paths: tuple[str, ...]
    path_id: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    inline: Mapping[tuple[int, ...], bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path_id", np.asarray(self.path_id, dtype=np.int32))
        object.__setattr__(self, "offset", np.asarray(self.offset, dtype=np.uint64))
        object.__setattr__(self, "length", np.asarray(self.length, dtype=np.uint64))
        object.__setattr__(self, "paths", tuple(self.paths))
        object.__setattr__(self, "inline", MappingProxyType(dict(self.inline)))
        shapes = {self.path_id.shape, self.offset.shape, self.length.shape}
        if len(shapes) != 1:
            raise ModelError(f"manifest columns have different shapes: {sorted(shapes)}")
        if self.path_id.size and (self.path_id.min() < INLINE
                                  or self.path_id.max() >= len(self.paths)):
            raise ModelError(f"manifest path ids must lie in [{INLINE}, {len(self.paths)}); got "
                             f"[{self.path_id.min()}, {self.path_id.max()}]")
        marked = np.flatnonzero(self.path_id.reshape(-1) == INLINE)
        if len(marked) != len(self.inline) or not np.array_equal(
                marked, np.sort(flat_indices(self.inline, self.shape))):
            found = {tuple(int(i) for i in c) for c in np.argwhere(self.path_id == INLINE)}
            raise ModelError("manifest inline chunks disagree with the chunks marked inline: "
                             f"{sorted(found ^ set(self.inline), key=repr)[:5]}")

    @classmethod
    def empty(cls, shape: Sequence[int]) -> ChunkManifest:
        """A manifest in which every chunk is missing (reads as the fill value)."""
        check_chunk_count(shape)
        return cls((), np.full(shape, MISSING, np.int32), np.zeros(shape, np.uint64),
                   np.zeros(shape, np.uint64))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.path_id.shape

    @property
    def missing(self) -> np.ndarray:
        """Boolean array: chunks that were never written."""
        return self.path_id == MISSING

    @property
    def unsized(self) -> np.ndarray:
        """Boolean array: chunks that are whole files of unknown size (:data:`UNSIZED`)."""
        return self.length == UNSIZED

    @property
    def nbytes(self) -> int:
        """Memory held by the columns and inline bytes."""
        return (self.path_id.nbytes + self.offset.nbytes + self.length.nbytes
                + sum(len(b) for b in self.inline.values()))

    def stored(self) -> tuple[np.ndarray, list[int], list[int], list[int]]:
        """The chunks with a byte range: their C-order indices, and as lists (writers emit one
        entry each) their path ids, offsets and lengths."""
        flat = np.flatnonzero(self.path_id.reshape(-1) >= 0)
        ids, offsets, lengths = (c.reshape(-1)[flat].tolist() for c in
                                 (self.path_id, self.offset, self.length))
        return flat, ids, offsets, lengths

    def urls(self) -> np.ndarray:
        """Object array of each chunk's URL (``None`` where missing or inline)."""
        table = np.array([*self.paths, None, None], dtype=object)
        return table[self.path_id]  # the sentinels -1 and -2 index the two trailing Nones

    @property
    def table(self) -> Sequence[str]:
        """The URLs the ids :meth:`locate` gives index (for a paged manifest: those of the
        pages loaded so far)."""
        return self.paths

    def locate(self, flat: npt.ArrayLike) -> Located:
        """Where chunks ``flat`` (C-order indices) are: ids into :attr:`table` (or
        :data:`MISSING`, :data:`INLINE`), offsets and lengths."""
        flat = np.asarray(flat, dtype=np.int64)
        return Located(self.path_id.reshape(-1)[flat], self.offset.reshape(-1)[flat],
                       self.length.reshape(-1)[flat])

    def inline_chunk(self, flat: int) -> bytes:
        """The bytes of inline chunk ``flat``."""
        return self.inline[chunk_coords(flat, self.shape)]

    def written(self) -> np.ndarray | PresentChunks:
        """Which chunks were written (a boolean per chunk, C order; paged: asked per chunk,
        the whole mask made only for a listing)."""
        return self.path_id.reshape(-1) != MISSING

    def slice(self, axis: int, chunks: slice) -> ChunkManifest:
        """The manifest of the chunks ``chunks`` along ``axis`` (a step of 1)."""
        index = (slice(None),) * axis + (chunks,)
        first = chunks.indices(self.shape[axis])[0]
        inline = {}
        for coords, data in self.inline.items():
            if coords[axis] in range(*chunks.indices(self.shape[axis])):
                inline[(*coords[:axis], coords[axis] - first, *coords[axis + 1:])] = data
        return ChunkManifest(self.paths, self.path_id[index], self.offset[index],
                             self.length[index], inline)

    def reshaped(self, shape: Sequence[int]) -> ChunkManifest:
        """The same chunks in C order on a grid of ``shape`` (as many chunks: axes of one
        chunk added or removed), inline chunks renamed to match."""
        shape = tuple(int(n) for n in shape)
        inline = {chunk_coords(flat_index(c, self.shape), shape): data
                  for c, data in self.inline.items()}
        return ChunkManifest(self.paths, self.path_id.reshape(shape),
                             self.offset.reshape(shape), self.length.reshape(shape), inline)

    @classmethod
    def concat(cls, manifests: Sequence[ChunkManifest], axis: int) -> ChunkManifest:
        """Join manifests along ``axis``, merging their URL tables."""
        if not manifests:
            raise ModelError("cannot concatenate an empty list of manifests")
        table: dict[str, int] = {}
        path_ids, inline, shift = [], {}, 0
        for m in manifests:
            remap = np.array([table.setdefault(p, len(table)) for p in m.paths] + [INLINE, MISSING],
                             dtype=np.int32)
            path_ids.append(remap[m.path_id])  # -1 → MISSING and -2 → INLINE via the tail
            for coords, data in m.inline.items():
                inline[(*coords[:axis], coords[axis] + shift, *coords[axis + 1:])] = data
            shift += m.shape[axis]
        try:
            return cls(tuple(table), np.concatenate(path_ids, axis=axis),
                       np.concatenate([m.offset for m in manifests], axis=axis),
                       np.concatenate([m.length for m in manifests], axis=axis), inline)
        except ValueError as e:
            shapes = [m.shape for m in manifests]
            raise ModelError(f"cannot join manifests of chunk shapes {shapes} along axis "
                             f"{axis}: {e}") from e

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChunkManifest):
            return NotImplemented
        return (self.shape == other.shape
                and np.array_equal(self.offset, other.offset)
                and np.array_equal(self.length, other.length)
                and np.array_equal(self.urls(), other.urls())
                and dict(self.inline) == dict(other.inline))

    __hash__ = None  # type: ignore[assignment]


class ManifestBuilder:
    """The one way manifest columns are made — by every scanner, by combine and by the
    writers' rewrites: chunks start missing and are given a byte range, inline bytes, or
    nothing; URLs are numbered as they come. Whole columns at once where a scanner has them
    (:meth:`ranges`), a chunk at a time where it has not."""

    def __init__(self, shape: Sequence[int]) -> None:
        self.shape = tuple(int(n) for n in shape)
        check_chunk_count(self.shape)  # (20 bytes a chunk)
        size = int(np.prod(self.shape)) if self.shape else 1
        self.path_id = np.full(size, MISSING, np.int32)
        self.offset = np.zeros(size, np.uint64)
        self.length = np.zeros(size, np.uint64)
        self.urls: dict[str, int] = {}
        self.inline: dict[tuple[int, ...], bytes] = {}

    @classmethod
    def of(cls, manifest: ChunkManifest) -> ManifestBuilder:
        """A builder holding a copy of ``manifest``, to change some of its chunks."""
        out = cls(manifest.shape)
        out.path_id[:] = manifest.path_id.reshape(-1)
        out.offset[:] = manifest.offset.reshape(-1)
        out.length[:] = manifest.length.reshape(-1)
        out.urls = {url: k for k, url in enumerate(manifest.paths)}
        out.inline = dict(manifest.inline)
        return out

    def url(self, url: str) -> int:
        """The number of ``url`` in the table (added when new)."""
        return self.urls.setdefault(url, len(self.urls))

    def ranges(self, flat: npt.ArrayLike, path_id: npt.ArrayLike, offset: npt.ArrayLike,
               length: npt.ArrayLike) -> None:
        """Chunks ``flat`` (C-order indices) at byte ranges of the URLs ``path_id`` numbers."""
        flat = np.asarray(flat, dtype=np.int64)
        if self.inline and (self.path_id[flat] == INLINE).any():  # inlined before, now not
            chosen = set(flat.tolist())
            for coords in [c for c in self.inline if flat_index(c, self.shape) in chosen]:
                del self.inline[coords]
        self.path_id[flat] = path_id
        self.offset[flat] = offset
        self.length[flat] = length

    def range(self, coords: tuple[int, ...], url: str, offset: int, length: int) -> None:
        """One chunk at ``length`` bytes of ``url`` from ``offset``."""
        flat = flat_index(coords, self.shape)
        self.path_id[flat], self.offset[flat], self.length[flat] = self.url(url), offset, length
        self.inline.pop(coords, None)

    def inlined(self, coords: tuple[int, ...], data: bytes) -> None:
        """One chunk whose bytes are at hand (inlined): a chunk at a time, five times cheaper
        than :meth:`inlined_many` of one (scanners inline chunks one by one)."""
        flat = flat_index(coords, self.shape)
        self.path_id[flat], self.offset[flat], self.length[flat] = INLINE, 0, 0
        self.inline[coords] = bytes(data)

    def inlined_many(self, flat: np.ndarray, data: Sequence[bytes]) -> None:
        """Chunks ``flat`` (C-order indices, each once) whose bytes are at hand: a parquet
        record file of 10^5 inline chunks, made in bulk."""
        flat = np.asarray(flat, dtype=np.int64)
        self.missing(flat)  # (drops earlier inline bytes of these chunks)
        self.path_id[flat] = INLINE
        coords = np.unravel_index(flat, self.shape) if self.shape else ()
        keys = zip(*(c.tolist() for c in coords), strict=True) if self.shape else \
            iter([()] * len(flat))
        self.inline.update(zip(keys, map(bytes, data), strict=True))

    def page(self, start: int, page: Page) -> None:
        """The chunks of ``page`` (a paged manifest's), from C-order index ``start`` on, its
        URLs numbered in the order its rows first use them."""
        present = np.flatnonzero(page.ids >= 0)
        used, first = np.unique(page.ids[present], return_index=True)
        order = np.argsort(first, kind="stable")
        numbers = np.empty(len(used), np.int32)
        numbers[order] = [self.url(page.urls[u]) for u in used[order].tolist()]
        self.ranges(start + present, numbers[np.searchsorted(used, page.ids[present])],
                    page.offset[present], page.length[present])
        if page.inline:
            self.inlined_many(start + np.fromiter(page.inline, np.int64, len(page.inline)),
                              list(page.inline.values()))

    def set_lengths(self, flat: npt.ArrayLike, length: npt.ArrayLike) -> None:
        """The lengths of chunks ``flat``, referenced already (whole files, sized later)."""
        self.length[np.asarray(flat, dtype=np.int64)] = length

    def missing(self, flat: npt.ArrayLike) -> None:
        """Chunks ``flat`` never written (the fill value)."""
        flat = np.asarray(flat, dtype=np.int64).reshape(-1)
        for k in flat[self.path_id[flat] == INLINE].tolist():
            del self.inline[chunk_coords(k, self.shape)]
        self.path_id[flat], self.offset[flat], self.length[flat] = MISSING, 0, 0

    def build(self) -> ChunkManifest:
        """The manifest (its columns are the builder's, made read-only: the builder is
        spent); the URL table keeps only the URLs some chunk names."""
        used = np.unique(self.path_id[self.path_id >= 0])
        paths = list(self.urls)
        if len(used) != len(paths):  # renumber: drop URLs no chunk names any more
            remap = np.full(len(paths) + 2, MISSING, np.int32)
            remap[used] = np.arange(len(used), dtype=np.int32)
            remap[INLINE] = INLINE
            ids = np.where(self.path_id >= 0, remap[np.maximum(self.path_id, 0)],
                           self.path_id)
            paths = [paths[k] for k in used.tolist()]
        else:
            ids = self.path_id
        for column in (self.path_id, self.offset, self.length):
            column.flags.writeable = False  # the manifest's now: a builder is used once
        return ChunkManifest(tuple(paths), ids.reshape(self.shape), self.offset.reshape(
            self.shape), self.length.reshape(self.shape), self.inline)


class Page(NamedTuple):
    """One page of a :class:`PagedManifest`: its chunks' URLs, per chunk an id into them
    (or :data:`MISSING`, :data:`INLINE`), offset and length, and inline bytes by row."""

    urls: Sequence[str]
    ids: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    inline: Mapping[int, bytes]


class Pages(Protocol):
    """Where a paged manifest's chunks are read from: page ``n`` holds chunks ``n * size``
    up to ``(n + 1) * size`` in C order (a parquet archive's record files)."""

    @property
    def size(self) -> int:
        """Chunks a page holds."""
        ...

    def load(self, n: int, rows: int) -> Page:
        """Page ``n``, of ``rows`` chunks (the last page may be shorter than ``size``)."""
        ...


_COLUMNS = frozenset({"paths", "path_id", "offset", "length", "inline"})


class PagedManifest(ChunkManifest):
    """A manifest read a page at a time: :meth:`locate` and :meth:`inline_chunk` load the
    pages holding the chunks asked for (once each, kept), so a time series touching 10^4
    chunks of a 10^8-chunk archive reads a few record files, and opening it none. Its URL
    ids number the URLs in the order pages were loaded (:attr:`table` grows). The columns
    (``path_id``, ``offset``, ``length``, ``paths``, ``inline``) are those of every page,
    loaded on first use and then checked as any manifest's are."""

    _shape: tuple[int, ...]
    _pages: Pages
    _lock: threading.Lock
    _loaded: dict[int, Page]
    _urls: dict[str, int]
    _table: list[str]
    _pinned: tuple[tuple[int, ...], int]
    """The pages :meth:`pin` loaded, and how many URLs of :attr:`table` they name."""

    def __init__(self, shape: Sequence[int], pages: Pages) -> None:  # (not the dataclass's)
        object.__setattr__(self, "_shape", tuple(int(n) for n in shape))
        object.__setattr__(self, "_pages", pages)
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_loaded", {})
        object.__setattr__(self, "_urls", {})
        object.__setattr__(self, "_table", [])
        object.__setattr__(self, "_pinned", ((), 0))

    def __reduce__(self) -> tuple[Callable[..., PagedManifest], tuple[object, ...]]:
        """Pickled with its pinned pages only (:meth:`pin`): what an append may have
        rewritten since it was opened travels with it, the rest is read again."""
        pinned, urls = self._pinned
        return _unpickled, (self._shape, self._pages, {n: self._loaded[n] for n in pinned},
                            self._table[:urls])

    def pin(self, flats: Iterable[int]) -> None:
        """Load the pages holding chunks ``flats`` now and keep them with the manifest, in
        copies and pickles too (those an append of the next version rewrites: their bytes
        on disk may be the next version's by the time a reader of this one needs them)."""
        self.locate(list(flats))
        with self._lock:
            object.__setattr__(self, "_pinned", (tuple(self._loaded), len(self._table)))

    def with_pages(self, pages: Pages) -> PagedManifest:
        """This manifest loading its further pages from ``pages`` (a wrapper of
        :attr:`pages`), keeping those loaded so far: the last, read as the archive opened,
        may have been rewritten on disk since by an append."""
        with self._lock:
            out = PagedManifest(self._shape, pages)
            out._loaded.update(self._loaded)
            out._urls.update(self._urls)
            out._table.extend(self._table)
            object.__setattr__(out, "_pinned", self._pinned)
        return out

    def __getattr__(self, name: str) -> Any:
        """A column, the first time one is asked for: every page loaded."""
        if name not in _COLUMNS:
            raise AttributeError(name)
        self._materialize()
        return object.__getattribute__(self, name)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def table(self) -> Sequence[str]:
        return self._table

    @property
    def pages(self) -> Pages:
        return self._pages

    def locate(self, flat: npt.ArrayLike) -> Located:
        flat = np.asarray(flat, dtype=np.int64)
        size = self._pages.size
        numbers = flat // size
        ids = np.empty(flat.shape, np.int32)
        offset = np.empty(flat.shape, np.uint64)
        length = np.empty(flat.shape, np.uint64)
        for n in np.unique(numbers).tolist():
            page = self._page(n)
            chosen = numbers == n
            rows = flat[chosen] - n * size
            ids[chosen], offset[chosen], length[chosen] = (page.ids[rows], page.offset[rows],
                                                           page.length[rows])
        return Located(ids, offset, length)

    def inline_chunk(self, flat: int) -> bytes:
        n = flat // self._pages.size
        return self._page(n).inline[flat - n * self._pages.size]

    def written(self) -> PresentChunks:
        return PresentChunks(self)

    def _page(self, n: int) -> Page:
        """Page ``n`` with its ids renumbered into :attr:`table` (loaded once)."""
        found: Page | None = self._loaded.get(n)
        if found is not None:
            return found
        with self._lock:
            found = self._loaded.get(n)
            if found is None:
                found = self._loaded[n] = self._numbered(n)
        return found

    def _numbered(self, n: int) -> Page:
        total = math.prod(self._shape)
        size = self._pages.size
        if not 0 <= n * size < max(total, 1):
            raise ModelError(f"no page {n} in a manifest of {total} chunks")
        rows = min(size, total - n * size)
        page = self._pages.load(n, rows)
        ids = np.asarray(page.ids, np.int32)
        if ids.shape != (rows,) or len(page.offset) != rows or len(page.length) != rows:
            raise ModelError(f"page {n} holds {len(ids)} chunks, not {rows}")
        if rows and (ids.min() < INLINE or ids.max() >= len(page.urls)):
            raise ModelError(f"page {n}: path ids must lie in [{INLINE}, {len(page.urls)})")
        marked = np.flatnonzero(ids == INLINE)
        if not np.array_equal(marked, np.array(sorted(page.inline), dtype=np.int64)):
            raise ModelError(f"page {n}: inline chunks disagree with the chunks marked inline")
        urls, table = self._urls, self._table
        used = np.unique(ids[ids >= 0]).tolist()  # (a dictionary may name URLs no row uses)
        remap = np.full(len(page.urls) + 2, MISSING, np.int32)
        remap[INLINE] = INLINE  # (-2, -1: the sentinels)
        for u in used:
            k = urls.get(page.urls[u])
            if k is None:
                k = urls[page.urls[u]] = len(table)
                table.append(page.urls[u])
            remap[u] = k
        return Page(table, remap[ids], np.asarray(page.offset, np.uint64),
                    np.asarray(page.length, np.uint64), dict(page.inline))

    def _materialize(self) -> None:
        """The columns of every page, numbered as an eager read would number them (by first
        use in C order, whatever order pages were read in): written outputs never depend on
        what was read before. (:attr:`table`'s numbering, which :meth:`locate` gives, stays
        as it is: a reader may hold its ids.)"""
        size = self._pages.size
        count = math.ceil(math.prod(self._shape) / size)
        pages = [self._page(n) for n in range(count)]
        with self._lock:
            if "path_id" in self.__dict__:
                return
            built = ManifestBuilder(self._shape)
            for n, page in enumerate(pages):
                built.page(n * size, page)
            whole = built.build()
            for name in ("paths", "path_id", "offset", "length", "inline"):
                object.__setattr__(self, name, getattr(whole, name))


def _unpickled(shape: tuple[int, ...], pages: Pages, pinned: dict[int, Page],
               table: list[str]) -> PagedManifest:
    """A pickled :class:`PagedManifest`, its pinned pages loaded as they were."""
    manifest = PagedManifest(shape, pages)
    manifest._loaded.update(pinned)
    manifest._table.extend(table)
    manifest._urls.update((url, k) for k, url in enumerate(table))
    object.__setattr__(manifest, "_pinned", (tuple(pinned), len(table)))
    return manifest

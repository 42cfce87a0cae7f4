"""What a dataset looks like to a key-value reader: the :class:`View` protocol.

Every way a key-value reader reaches a dataset — the zarr Store (:mod:`.store`), the fsspec
mapper (:mod:`.mapper`), refgrid's zarr codec pipeline (:mod:`.pipeline`) and the HTTP
service (:mod:`refgrid.serve`) — is a thin adapter over a view. A view has its metadata
documents and its keys; an adapter parses a key **once** (:meth:`View.parse`) into what it
names — a document or a directory listing, at hand, or a chunk to read — and reads chunks
through the view, many at once (:meth:`View.read`, :meth:`View.aread`), so concurrent
requests are fetched together. Two views implement it: the native one
(:mod:`.native`: the dataset as it is) and the regular one (:mod:`.regular`: a regular grid
assembled by refgrid's reader).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from refgrid.core.keys import (
    BOOKKEEPING,
    METADATA,
    chunk_key,
    document_node,
    split_key,
)
from refgrid.model.manifest import PresentChunks
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import key_encoding


@dataclass(frozen=True)
class Document:
    """A metadata document (``zarr.json``, or refgrid's bookkeeping), its bytes at hand."""

    text: bytes


@dataclass(frozen=True)
class Directory:
    """A node's directory: the names below it (a trailing ``/`` for nodes)."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class Chunk:
    """A chunk of array ``array`` at ``coords`` (``flat``: its C-order index)."""

    array: str
    coords: tuple[int, ...]
    flat: int


Parsed = Document | Directory | Chunk
"""What a key names; None where it names nothing (an HTTP 404; for a chunk key, a chunk that
reads as the fill value)."""


class View(Protocol):
    """A dataset as a key-value store (see the module docstring)."""

    @property
    def arrays(self) -> Mapping[str, VirtualArray]:
        """Its arrays by path, as its keys name them (``""``: a store whose root is an
        array)."""

    def parse(self, key: str) -> Parsed | None:
        """What ``key`` names — parsed once, by the view that knows its arrays' keys."""

    def all_keys(self) -> Iterator[str]:
        """Every key: the documents, and each array's chunk keys that hold data."""

    def size(self, chunk: Chunk) -> int | None:
        """How many bytes ``chunk`` holds where that is known without reading it."""

    def read(self, chunks: Sequence[Chunk]) -> list[bytes | None]:
        """The bytes of ``chunks`` (None: absent), read together (blocking)."""

    async def aread(self, chunks: Sequence[Chunk]) -> list[bytes | None]:
        """:meth:`read` for an event loop: the chunks asked for by concurrent requests are
        gathered into one read."""

    def close(self) -> None:
        """Give back what the view holds open (files); later reads open them again."""


def contents(view: View, found: Sequence[Parsed | None]) -> list[bytes | None]:
    """What each parsed key holds (None: no bytes — a directory or nothing): documents at
    hand, chunks read together. The one key → bytes dispatch of every adapter."""
    chunks = [f for f in found if isinstance(f, Chunk)]
    read = iter(view.read(chunks) if chunks else [])
    return [next(read) if isinstance(f, Chunk) else _at_hand(f) for f in found]


async def acontents(view: View, found: Sequence[Parsed | None]) -> list[bytes | None]:
    """:func:`contents` for an event loop (:meth:`View.aread`)."""
    chunks = [f for f in found if isinstance(f, Chunk)]
    read = iter(await view.aread(chunks) if chunks else [])
    return [next(read) if isinstance(f, Chunk) else _at_hand(f) for f in found]


def _at_hand(found: Parsed | None) -> bytes | None:
    return found.text if isinstance(found, Document) else None


class Tree:
    """What both views share: the nodes of a dataset by path, their documents, the keys that
    name them, how a key is parsed into one of them, and which chunks the view holds
    (``present``: per array, a boolean per chunk in C order) — what its listings show."""

    def __init__(self, group: VirtualGroup, arrays: Mapping[str, VirtualArray],
                 documents: Mapping[str, bytes],
                 present: Mapping[str, np.ndarray | PresentChunks],
                 extra: Mapping[str, bytes] | None = None) -> None:
        self.groups = {"": group, **{path: node for path, node in group.walk()
                                     if isinstance(node, VirtualGroup)}}
        self.arrays = dict(arrays)
        if "" in self.arrays:  # a store whose root is an array: no root group
            self.groups = {}
        self.documents = dict(documents)
        """Node path → its ``zarr.json``."""
        self.present = {path: mask if isinstance(mask, PresentChunks) else
                        np.asarray(mask, bool).reshape(-1) for path, mask in present.items()}
        """Per array, whether each chunk is held: a mask, or asked chunk by chunk of a paged
        manifest (whose whole mask, :meth:`mask`, only a listing makes)."""
        self.extra = dict(extra or {})
        """Other documents by key, answered but never listed (refgrid's bookkeeping)."""
        self.encodings = {path: key_encoding(a) for path, a in self.arrays.items()}

    def parse(self, key: str) -> Parsed | None:
        """A document, a directory, a chunk the view holds (None: nothing). Chunk keys are
        parsed by each array's own key encoding; a key ending in ``/`` names a directory
        only."""
        directory = key.endswith("/")
        key = key.strip("/")
        if key in self.extra:
            return None if directory else Document(self.extra[key])
        node = document_node(key)
        if node is not None:
            if directory:
                return None
            text = self.documents.get(node)
            return Document(text) if text is not None else None
        if key in self.groups:
            group = self.groups[key]
            return Directory((METADATA, *(f"{n}/" for n in (*group.arrays, *group.groups))))
        if key in self.arrays:
            return Directory(self.array_listing(key))
        found = split_key(key, self.arrays)
        if found is None:
            return None
        path, tail = found
        chunk = self._chunk(path, tail)
        if chunk is None:
            return self.chunk_directory(path, tail)
        return chunk if self.present[path][chunk.flat] and not directory else None

    def locate(self, key: str) -> Chunk | None:
        """The chunk a key names, whether the view holds it or not (None: no chunk key) —
        for a reader that fills what is not held itself (refgrid's codec pipeline)."""
        found = split_key(key.strip("/"), self.arrays)
        return self._chunk(*found) if found is not None else None

    def _chunk(self, path: str, tail: str) -> Chunk | None:
        array = self.arrays[path]
        coords = self.encodings[path].decode(tail, array.grid.ndim)
        if coords is None:
            return None
        counts = array.grid.chunk_counts
        if any(c >= n for c, n in zip(coords, counts, strict=True)):
            return None
        flat = 0
        for c, n in zip(coords, counts, strict=True):
            flat = flat * n + c
        return Chunk(path, coords, flat)

    def array_listing(self, path: str) -> tuple[str, ...]:
        """``zarr.json`` and the first part of each chunk key the array holds (``c/`` for
        Zarr v3's default keys)."""
        array, encoding = self.arrays[path], self.encodings[path]
        present = np.flatnonzero(self.mask(path))
        if not len(present):
            return (METADATA,)
        if encoding.name == "default" and encoding.separator == "/" and array.grid.ndim:
            return (METADATA, "c/")
        counts = array.grid.chunk_counts
        heads: dict[str, None] = {}
        for flat in present.tolist():
            head, sep, _ = encoding.encode(tuple(int(c) for c in np.unravel_index(
                flat, counts))).partition("/")
            heads[head + sep] = None
        return (METADATA, *heads)

    def chunk_directory(self, path: str, tail: str) -> Directory | None:
        """A directory among an array's ``/``-separated chunk keys (``c/0/``), as a static
        server would list the files of a store on disk: the held chunks' next coordinates
        below it."""
        encoding = self.encodings[path]
        if encoding.separator != "/":
            return None
        array = self.arrays[path]
        parts = tail.split("/") if tail else []
        if encoding.name == "default":
            if not parts or parts[0] != "c":
                return None
            parts = parts[1:]
        ndim = array.grid.ndim
        if not ndim or len(parts) >= ndim or not all(p.isascii() and p.isdigit()
                                                     for p in parts):
            return None
        present = self.mask(path).reshape(array.grid.chunk_counts)
        where = tuple(int(p) for p in parts)
        if any(c >= n for c, n in zip(where, present.shape, strict=False)):
            return None
        block = present[where] if parts else present
        if not block.any():
            return None
        below = np.flatnonzero(block.reshape(block.shape[0], -1).any(axis=1))
        last = len(parts) == ndim - 1
        return Directory(tuple(f"{i}" if last else f"{i}/" for i in below.tolist()))

    def document_keys(self) -> Iterator[str]:
        for node in self.documents:
            yield f"{node}/{METADATA}" if node else METADATA

    def keys(self) -> Iterator[str]:
        """Every key the view answers and lists: documents, then the chunks it holds."""
        yield from self.document_keys()
        for path, array in self.arrays.items():
            counts = array.grid.chunk_counts
            for flat in np.flatnonzero(self.mask(path)).tolist():
                yield self.key(path, tuple(int(c) for c in np.unravel_index(flat, counts)))

    def mask(self, path: str) -> np.ndarray:
        """Whether each chunk of array ``path`` is held, as one mask (C order)."""
        present = self.present[path]
        if isinstance(present, PresentChunks):
            present = self.present[path] = present.whole()
        return present

    def key(self, path: str, coords: tuple[int, ...]) -> str:
        """The key of a chunk, in its array's own encoding."""
        return chunk_key(path, coords, self.encodings[path])


__all__ = ["BOOKKEEPING", "Chunk", "Directory", "Document", "Parsed", "Tree", "View"]

"""Opening a source file, local or remote, for metadata reads that are not latency-bound.

HDF5 metadata is scattered through a file, and h5py reads it in many small pieces: over S3 or
HTTP that is thousands of round trips. Small files are fetched whole in one request; larger
ones are read through fsspec's block cache in large blocks, so a scan makes a handful of
requests either way.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO

import fsspec

from refgrid.core.sources import (
    SourceIdentity,
    absent,
    filesystem,
    held,
    identity_difference,
    identity_from_info,
    identity_of,
)
from refgrid.core.typed import StorageOptions
from refgrid.core.util import lazy
from refgrid.errors import ScanError

HEAD_BLOCK = 2**16
"""Bytes :meth:`Source.head` reads at the start of a file, once."""
WHOLE_FILE_LIMIT = 32 * 2**20
"""Remote files up to this size are fetched in one request."""
BLOCK_SIZE = 4 * 2**20
"""Block size of the cache used to read larger remote files."""


@dataclass(frozen=True)
class Source:
    """A file to scan: its URL as references will name it, and how to reach it."""

    url: str
    storage_options: dict[str, object] = field(default_factory=dict)

    @classmethod
    def of(cls, url: str | os.PathLike[str], storage_options: StorageOptions) -> Source:
        text = os.fspath(url)
        if "://" not in text or text.startswith("file://"):
            text = os.path.abspath(text.removeprefix("file://"))
        return cls(text, dict(storage_options))

    @property
    def is_local(self) -> bool:
        return "://" not in self.url

    def filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]:
        return filesystem(self.url, self.storage_options)

    @lazy
    def identity(self) -> SourceIdentity:
        """Size, modification time or ETag (one ``stat`` or ``HEAD``, asked once): recorded
        so readers notice a change, and the size a scan needs."""
        kept = held(self.url)
        if kept is not None:
            return kept[1]
        try:
            if not self.is_local:
                return identity_from_info(self.remote_info)
            return identity_of(self.url, self.storage_options)
        except FileNotFoundError as e:
            raise absent(self.url, e) from e
        except OSError as e:
            raise ScanError(self.url, None, f"cannot read: {e}") from e

    def settled(self, identity: SourceIdentity) -> SourceIdentity:
        """``identity``, taken before a scan, once the scan is done: a local file written to
        while it was scanned (listed before its writer finished) is a :class:`ScanError`, not
        references to bytes that were not there yet. (A remote object is replaced whole.)"""
        if not self.is_local or held(self.url) is not None:
            return identity
        try:
            changed = identity_difference(identity, identity_of(self.url))
        except OSError as e:
            changed = f"then it could not be read: {e}"
        if changed:
            raise ScanError(self.url, None, f"the file changed while it was scanned ({changed})"
                            "; is it still being written? scan it once it is complete")
        return identity

    @lazy
    def remote_info(self) -> dict[str, object]:
        """fsspec's ``info`` of a remote file (one ``HEAD``), kept: the identity comes from
        it, and a file object opened on it is handed it rather than asking again."""
        from refgrid.core.network import remote_info

        return remote_info(*self.filesystem())

    def has_member(self, name: str) -> bool:
        """Whether this URL is a directory (or prefix) holding a file ``name``."""
        if self.is_local:
            return os.path.isfile(os.path.join(self.url, name))
        fs, root = self.filesystem()
        try:
            return bool(fs.isfile(f"{root.rstrip('/')}/{name}"))
        except OSError:
            return False

    def is_directory(self) -> bool:
        if self.is_local:
            return os.path.isdir(self.url)
        fs, root = self.filesystem()
        try:
            return bool(fs.isdir(root))
        except OSError:
            return False

    @lazy
    def start(self) -> bytes:
        """The first :data:`HEAD_BLOCK` bytes, read once: telling the format and reading a
        small file's header (a NetCDF3 header, a DMR++ document) share one request."""
        return self.read_at(0, HEAD_BLOCK)

    def head(self, nbytes: int) -> bytes:
        """The first ``nbytes`` of the file (fewer if it is shorter)."""
        return self.start[:nbytes] if nbytes <= HEAD_BLOCK else self.read_at(0, nbytes)

    def read_at(self, offset: int, nbytes: int) -> bytes:
        """``nbytes`` of the file from ``offset`` (fewer, or none, past its end)."""
        kept = held(self.url)
        if kept is not None:
            return kept[0][offset:offset + nbytes]
        try:
            if self.is_local:
                with open(self.url, "rb") as f:
                    f.seek(offset)
                    return f.read(nbytes)
            fs, path = self.filesystem()
            return fs.cat_file(path, start=offset, end=offset + nbytes)
        except FileNotFoundError as e:
            raise absent(self.url, e) from e
        except OSError as e:
            raise ScanError(self.url, None, f"cannot read: {e}") from e

    @contextmanager
    def open(self) -> Iterator[str | IO[bytes]]:
        """A local path, or a file object whose reads are served from few large requests."""
        if self.is_local:
            yield self.url
            return
        kept = held(self.url)
        if kept is not None:
            yield io.BytesIO(kept[0])
            return
        fs, path = self.filesystem()
        size = self.identity["size"]
        try:
            if size <= WHOLE_FILE_LIMIT:  # a range: without one, s3fs asks for the size again
                yield io.BytesIO(fs.cat_file(path, start=0, end=size))
                return
            with fs.open(path, "rb", block_size=BLOCK_SIZE, cache_type="blockcache",
                         cache_options={"maxblocks": 64}, size=size) as f:
                if isinstance(getattr(type(f), "details", None), property):
                    f.details = self.remote_info  # s3fs asks again at the first read otherwise
                yield f
        except FileNotFoundError as e:
            raise absent(self.url, e) from e


def sizes_or_absent(urls: Sequence[str], storage_options: StorageOptions
                    ) -> dict[str, int | None]:
    """Each file's size, None for one that does not exist (a chunk file a Zarr store never
    wrote); asked concurrently."""
    from refgrid.core.util import thread_pool

    def size(url: str) -> int | None:
        fs, path = filesystem(url, storage_options)
        try:
            return int(fs.size(path))
        except FileNotFoundError:
            return None

    pool = thread_pool("refgrid-sizes", 16)
    return dict(zip(urls, pool.map(size, urls), strict=True))

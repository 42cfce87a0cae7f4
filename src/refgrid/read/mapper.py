"""An fsspec mapper over a refgrid view: the dataset as files, for zarr 3.1 and fsspec tools.

    mapper = refgrid.get_mapper("refs.json")            # the regular view
    ds = xr.open_dataset(mapper, engine="zarr")

A thin adapter over a :class:`~refgrid.read.view.View` — by default the
:class:`~refgrid.read.regular.RegularView`, which stock zarr 3.1 reads (``chunks="native"``
there is the native chunks where the grid is regular): each path is parsed once by the
view into a document, a directory or a chunk, and the chunks of one ``cat_ranges`` call are
read together.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from fsspec import AbstractFileSystem
from fsspec.mapping import FSMap

from refgrid.core.typed import StorageOptions
from refgrid.read.regular import RegularView, ViewSpec
from refgrid.read.view import Chunk, Directory, Document, Parsed, View, acontents, contents
from refgrid.scanners import scan

if TYPE_CHECKING:
    from refgrid.core.sources import Verify
    from refgrid.read.view_chunks import ViewChunks
    from refgrid.scanners import Input


class FileInfo(TypedDict):
    """fsspec's description of a path."""

    name: str
    size: int
    type: Literal["file", "directory"]


class ViewFileSystem(AbstractFileSystem):
    """A view's documents and chunks as files (read-only)."""

    protocol = "refgrid-view"
    cachable = False
    async_impl = True
    asynchronous = True
    """zarr 3.1 awaits the coroutines below directly; a plain (sync) filesystem it would wrap
    to run every chunk in a thread of its own, several times slower for small chunks."""

    def __init__(self, view: View, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.view = view

    def _parsed(self, path: str) -> tuple[str, Parsed | None]:
        key = self._strip_protocol(path).strip("/")
        return key, self.view.parse(key)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: object) -> bytes:
        key, found = self._parsed(path)
        data = contents(self.view, [found])[0]
        if data is None:
            raise FileNotFoundError(key)
        return data[start:end]

    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None,
                        **kwargs: object) -> bytes:
        key, found = self._parsed(path)
        data = (await acontents(self.view, [found]))[0]
        if data is None:
            raise FileNotFoundError(key)
        return data[start:end]

    async def _cat_ranges(self, paths: list[str], starts: list[int | None],
                          ends: list[int | None], on_error: str = "return",
                          **kwargs: object) -> list[bytes | Exception]:
        parsed = [self._parsed(p) for p in paths]
        held = await acontents(self.view, [found for _, found in parsed])
        out: list[bytes | Exception] = []
        for (key, _), data, start, end in zip(parsed, held, starts, ends, strict=True):
            if data is not None:
                out.append(data[start:end])
            elif on_error == "return":
                out.append(FileNotFoundError(key))
            else:
                raise FileNotFoundError(key)
        return out

    async def _exists(self, path: str, **kwargs: object) -> bool:
        return self.exists(path)

    async def _info(self, path: str, **kwargs: object) -> FileInfo:
        return self.info(path)

    async def _ls(self, path: str, detail: bool = True, **kwargs: object
                  ) -> list[FileInfo] | list[str]:
        return self.ls(path, detail)

    async def _find(self, path: str, **kwargs: object) -> list[str] | dict[str, FileInfo]:
        return self.find(path, **kwargs)

    def info(self, path: str, **kwargs: object) -> FileInfo:
        key, found = self._parsed(path)
        if isinstance(found, Directory):
            return {"name": key, "size": 0, "type": "directory"}
        if isinstance(found, Chunk):
            size = self.view.size(found)
            if size is None:
                data = self.view.read([found])[0]
                if data is None:
                    raise FileNotFoundError(path)
                size = len(data)
            return {"name": key, "size": size, "type": "file"}
        if isinstance(found, Document):
            return {"name": key, "size": len(found.text), "type": "file"}
        raise FileNotFoundError(path)

    def ls(self, path: str, detail: bool = True, **kwargs: object) -> list[FileInfo] | list[str]:
        key, found = self._parsed(path)
        if not isinstance(found, Directory):
            raise FileNotFoundError(path)
        prefix = f"{key}/" if key else ""
        entries: list[FileInfo] = [
            {"name": prefix + n.rstrip("/"), "size": 0,
             "type": "directory" if n.endswith("/") else "file"} for n in found.names]
        return entries if detail else [e["name"] for e in entries]


def get_mapper(refs: Input, chunks: ViewChunks = "auto",
               storage_options: StorageOptions | None = None, unpack: bool = False,
               allowed_sources: Sequence[str] | None = None,
               verify_sources: Verify = True) -> FSMap:
    """An fsspec mapper with a regular-grid Zarr v3 view of a refgrid dataset.

    ``refs``: a reference dict, or a path/URL to JSON or parquet references or a Zarr v3
    store. ``chunks``: the view's chunks — ``"auto"`` (blocks of native chunks sized for
    stock zarr), ``"native"``, or a length per dimension name (see
    :mod:`refgrid.read.regular`). ``storage_options`` reach the references and the source
    files. ``unpack=True`` serves packed variables (``scale_factor``/``add_offset``) already
    unpacked and masked, exactly as xarray unpacks the source files: stock xarray cannot do
    that itself, since JSON attributes lose their float32 type and it would unpack in
    float64. Their raw values are then not available through the view.
    ``allowed_sources``: prefixes the files named by references must lie under (see
    :func:`refgrid.scan`). ``verify_sources``: check each source's recorded identity before
    its first read, and every local read (``"strict"``: see the engine).
    """
    options: Mapping[str, Any] = storage_options or {}  # scan's **storage_options: untyped
    group = scan(refs, allowed_sources=allowed_sources, **options)
    view = RegularView(group, ViewSpec.of(chunks, unpack), storage_options, verify_sources,
                       name="<references>" if isinstance(refs, Mapping) else os.fspath(refs))
    return ViewFileSystem(view).get_mapper("")


__all__ = ["ViewFileSystem", "get_mapper"]

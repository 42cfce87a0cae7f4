"""Icechunk output: a virtual dataset committed to an Icechunk repository.

Icechunk is the transactional, versioned store of virtual references that VirtualiZarr
users commit to. The arrays' ``zarr.json`` documents are written as they are; every stored
chunk becomes a virtual reference (``file:///...`` for local sources) carrying the source's
ETag, or else its modification time, as Icechunk's checksum, so that Icechunk too refuses to
read a source changed since it was scanned; inline chunks are written as Icechunk's own
chunks. Icechunk 2 stores rectilinear grids (``chunk_shapes`` as runs, the form it parses);
it decodes every chunk to its declared shape, so a chunk padded inside an irregular archive
cannot stay virtual: each is read once, cropped, re-encoded and stored as Icechunk's own
chunk (:func:`refgrid.read.cropped.cropped_chunks`) — only those are copied. Icechunk 1.x
(Python 3.11) knows only regular grids, so there a rectilinear array is refused, naming it.
Each write is one commit: writing a grown archive again commits its new extent, and the
earlier snapshot still reads the old one; a batch's append (:func:`append_icechunk`) commits
only the new extent's documents and the chunks from the archive's last file on. Sources must
lie under one of the repository's virtual chunk containers
(``icechunk.VirtualChunkContainer``); one that does not is an error naming it.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, cast

import numpy as np

from refgrid.core.jsonio import dumps
from refgrid.core.keys import chunk_key
from refgrid.core.sources import SourceCheck, SourceIdentity, is_local
from refgrid.core.typed import StorageOptions
from refgrid.core.util import import_extra
from refgrid.errors import WriteError
from refgrid.model.manifest import ManifestBuilder, chunk_coords
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import documents, key_encoding, refuse_segments
from refgrid.read.cropped import cropped_chunks, padded_arrays, padded_mask, portable_grid
from refgrid.refs.kerchunk_v2 import require_regular

if TYPE_CHECKING:  # the icechunk extra, imported by import_extra where it is used
    from icechunk import IcechunkStore, Repository, RepositoryConfig, Session
    from zarr.core.buffer import Buffer


def rectilinear_supported(icechunk: ModuleType) -> bool:
    """Icechunk 2 stores rectilinear grids; 1.x only regular ones."""
    return int(str(icechunk.__version__).split(".")[0]) >= 2


def local_access(icechunk: ModuleType) -> object:
    """The credential that lets a repository read ``file://`` containers: Icechunk 2's
    explicit ``LocalFileSystemAccess`` (``None`` is deprecated there), ``None`` on 1.x."""
    return getattr(icechunk.credentials, "LocalFileSystemAccess", None)


def location(url: str) -> str:
    """An Icechunk location: local paths as ``file://`` URLs."""
    if is_local(url):
        return url if url.startswith("file://") else "file://" + url
    return url


def local_repository(path: str | os.PathLike[str], sources: Iterable[str] = (),
                     echo: Callable[[str], object] | None = None) -> Repository:
    """The Icechunk repository at local ``path``, opened with every virtual chunk container
    it has authorized — how to reopen one refgrid wrote, to read it — and, given local
    ``sources``, created when absent with a container for the directory they share (one
    more is added for sources outside the existing ones). ``echo`` is told what was created.
    (What ``refgrid batch --icechunk`` uses; repositories on object stores, or reading remote
    sources, are configured by the caller.)"""
    icechunk = import_extra("icechunk", "icechunk", "Icechunk output")
    urls = list(sources)
    remote = [u for u in urls if not is_local(u)]
    if remote:
        raise WriteError(f"a local Icechunk repository reads local sources only, not "
                         f"{remote[0]}; configure a repository with a container for it in "
                         "Python and pass it to refgrid.batch")
    storage = icechunk.local_filesystem_storage(str(Path(path).resolve()))
    try:
        exists = icechunk.Repository.exists(storage)
        if not exists and not urls:
            raise WriteError(f"{path}: no Icechunk repository there")
        config = icechunk.Repository.open(storage).config if exists else \
            icechunk.RepositoryConfig.default()
        known = [c.url_prefix for c in (config.virtual_chunk_containers or {}).values()]
        needed = _shared_directory(urls) if urls else None
        added = needed is not None and not any(needed.startswith(k) for k in known)
        if added and needed is not None:
            _add_containers(icechunk, config, [needed])
            known.append(needed)
            if echo is not None:
                echo(f"{'created' if not exists else 'updated'} the Icechunk repository {path} "
                     f"with a virtual chunk container for {needed} (the sources' directory)")
        access = {prefix: local_access(icechunk) for prefix in known}
        if not exists:
            return icechunk.Repository.create(storage, config, access)
        repo = icechunk.Repository.open(storage, config, access)
        if added:
            repo.save_config()
        return repo
    except WriteError:
        raise
    except Exception as e:  # icechunk's own errors
        raise WriteError(f"cannot open the Icechunk repository {path}: {type(e).__name__}: "
                         f"{e}") from e


def _shared_directory(urls: list[str]) -> str:
    """The deepest directory every local source lies under, as a ``file://`` prefix."""
    paths = [str(Path(u.removeprefix("file://")).resolve()) for u in urls]
    common = os.path.commonpath([os.path.dirname(p) for p in paths])
    return "file://" + common.rstrip("/") + "/"


def _add_containers(icechunk: ModuleType, config: RepositoryConfig,
                    prefixes: list[str]) -> None:
    for prefix in prefixes:
        config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(
            prefix, icechunk.local_filesystem_store(prefix.removeprefix("file://"))))


def write_icechunk(group: VirtualGroup, target: Repository | Session, *,
                   message: str | None = None, branch: str = "main",
                   storage_options: StorageOptions | None = None) -> str:
    """Write ``group`` into ``target`` (an Icechunk ``Repository``, whose ``branch`` gets a
    new commit, or a writable ``Session``, which is committed) and return the snapshot id.
    ``storage_options`` reach the sources of the padded chunks that are copied."""
    icechunk = import_extra("icechunk", "icechunk", "Icechunk output")
    refuse_segments(group, "Icechunk output")
    if not rectilinear_supported(icechunk):
        for path, node in group.walk():
            if isinstance(node, VirtualArray):
                require_regular(path, node, f"Icechunk {icechunk.__version__} output (Icechunk "
                                            ">= 2, on Python >= 3.12, stores rectilinear grids)")
    session = cast("Repository", target).writable_session(branch) \
        if isinstance(target, icechunk.Repository) else cast("Session", target)
    if getattr(session, "read_only", False):
        raise WriteError("the Icechunk session is read-only: pass a writable session or the "
                         "repository")
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    store = session.store
    buffer = default_buffer_prototype().buffer
    portable = group.with_arrays({path: _without_padded(node)
                                  for path, node in padded_arrays(group).items()})
    for key, document in documents(portable).items():
        sync(store.set(key, buffer.from_bytes(dumps(document).encode())))
    arrays = {path: 0 for path, node in group.walk() if isinstance(node, VirtualArray)}
    _write_chunks(icechunk, store, group, arrays, storage_options)
    return _commit(session, message or "refgrid: write virtual references")


def append_icechunk(repository: Repository, tail: VirtualGroup, starts: Mapping[str, int],
                    metadata: Mapping[str, Mapping[str, object]], *, message: str,
                    parent: str, branch: str = "main",
                    storage_options: StorageOptions | None = None) -> str:
    """Commit to ``branch`` what an append adds (:mod:`refgrid.archive.extend`): the
    ``metadata`` documents (the arrays' new extents), and the chunks of each array
    ``tail[path]`` placed from chunk ``starts[path]`` on along its first dimension — the
    archive's last file again (its padded last chunk, now inside the array, stored
    cropped) and the new files. Every other chunk stays in the snapshots before; the commit
    holds the new references only, on top of snapshot ``parent`` (the one the append was
    planned on: a branch moved since is an error). Returns the snapshot id."""
    icechunk = import_extra("icechunk", "icechunk", "Icechunk output")
    refuse_segments(tail, "Icechunk output")
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    if not rectilinear_supported(icechunk):
        odd = [key for key, doc in metadata.items() if isinstance(doc.get("chunk_grid"), dict)
               and cast("dict[str, object]", doc["chunk_grid"]).get("name") != "regular"]
        if odd:
            raise WriteError(f"{odd[0].removesuffix('/zarr.json')}: the appended archive needs "
                             f"a rectilinear grid, which Icechunk {icechunk.__version__} cannot "
                             "store (Icechunk >= 2, on Python >= 3.12, can)")
    session = repository.writable_session(branch)
    if session.snapshot_id != parent:
        raise WriteError(f"the branch {branch!r} moved to {session.snapshot_id} while an "
                         f"append to {parent} was prepared: run the batch again")
    buffer = default_buffer_prototype().buffer
    for key, document in metadata.items():
        sync(session.store.set(key, buffer.from_bytes(dumps(document).encode())))
    _write_chunks(icechunk, session.store, tail, starts, storage_options)
    return _commit(session, message)


def stored(repository: Repository, keys: Iterable[str], branch: str = "main"
           ) -> dict[str, bytes | None]:
    """The bytes ``branch`` of ``repository`` holds at each of ``keys`` (None: nothing):
    what an append reads back of the snapshot it is planned on (its documents, the last
    piece of an array stored inline)."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    store = repository.readonly_session(branch=branch).store
    found = {key: sync(store.get(key, default_buffer_prototype())) for key in keys}
    return {key: bytes(value.to_bytes()) if value is not None else None
            for key, value in found.items()}


def _write_chunks(icechunk: ModuleType, store: IcechunkStore, group: VirtualGroup,
                  arrays: Mapping[str, int], storage_options: StorageOptions | None) -> None:
    """The chunks of ``group``'s ``arrays`` (by path: the chunk index along the first
    dimension they start at): stored chunks as virtual references, inline ones and padded
    interior ones (read, cropped, re-encoded) as Icechunk's own."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    buffer = default_buffer_prototype().buffer
    padded = padded_arrays(group)
    for path, start in arrays.items():
        node = group[path]
        assert isinstance(node, VirtualArray)
        _chunk_refs(icechunk, store, path, _without_padded(node) if path in padded else node,
                    group.sources, buffer, start)
    check = SourceCheck(group.sources, storage_options)
    for path, node in padded.items():
        if path not in arrays:
            continue
        for coords, data in cropped_chunks(path, node, storage_options or {}, check):
            if data is not None:  # absent: missing in Icechunk too
                sync(store.set(chunk_key(path, _moved(coords, arrays[path]),
                                         key_encoding(node)), buffer.from_bytes(data)))


def _moved(coords: tuple[int, ...], start: int) -> tuple[int, ...]:
    return (coords[0] + start, *coords[1:]) if coords else coords


def _commit(session: Session, message: str) -> str:
    try:
        return str(session.commit(message))
    except Exception as e:  # icechunk's own errors (conflicts, nothing to commit...)
        raise WriteError(f"cannot commit to the Icechunk repository: {type(e).__name__}: "
                         f"{e}") from e


def _chunk_refs(icechunk: ModuleType, store: IcechunkStore, path: str, array: VirtualArray,
                sources: Mapping[str, SourceIdentity], buffer: type[Buffer],
                start: int = 0) -> None:
    from zarr.core.sync import sync

    manifest = array.manifest
    flat, ids, offsets, lengths = manifest.stored()
    urls = [location(u) for u in manifest.paths]
    checksums = [_checksum(sources.get(u)) for u in manifest.paths]
    specs = [icechunk.VirtualChunkSpec(list(_moved(chunk_coords(f, manifest.shape), start)),
                                       urls[i], o, n, **checksums[i])
             for f, i, o, n in zip(flat.tolist(), ids, offsets, lengths, strict=True)]
    if specs:
        failed = store.set_virtual_refs(f"/{path}", specs, validate_containers=True)
        if failed:
            f = failed[0]
            bad = urls[int(manifest.path_id[(f[0] - start, *f[1:])])]
            raise WriteError(f"array {path!r}: {len(failed)} chunk(s) lie outside the "
                             f"repository's virtual chunk containers, e.g. {bad}; add an "
                             "icechunk.VirtualChunkContainer for its prefix")
    for coords, data in manifest.inline.items():
        sync(store.set(chunk_key(path, _moved(coords, start), key_encoding(array)),
                       buffer.from_bytes(data)))


def _without_padded(array: VirtualArray) -> VirtualArray:
    """``array`` on its portable grid, its padded interior chunks marked missing (they are
    written as Icechunk's own chunks instead of virtual references)."""
    built = ManifestBuilder.of(array.manifest)
    built.missing(np.flatnonzero(padded_mask(array.grid)))
    return replace(array, grid=portable_grid(array.grid), manifest=built.build())


def _checksum(identity: SourceIdentity | None) -> dict[str, str | dt.datetime]:
    """The keyword arguments of ``VirtualChunkSpec`` that let Icechunk refuse a changed
    source."""
    if identity is None:
        return {}
    if "etag" in identity:
        return {"etag_checksum": identity["etag"]}
    if "mtime" in identity:  # whole seconds, rounded up: Icechunk compares at that precision
        seconds = int(np.ceil(identity["mtime"]))
        return {"last_updated_at_checksum": dt.datetime.fromtimestamp(seconds, dt.UTC)}
    return {}

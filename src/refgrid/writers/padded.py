"""Padded interior chunks rewritten to their logical extent: the portable form.

Where files are concatenated, an HDF5 chunk that was padded at a file's end sits inside the
combined array. refgrid describes it with ``encoded_chunk_shapes`` (zarr-extensions #74/#75,
a proposal), which other Zarr readers ignore: zarr-python >= 3.2 decodes every chunk to its
declared edge and fails on the padded ones. :func:`rewrite_padded` decodes each such chunk,
crops it to its logical extent, re-encodes it with the array's own codecs and keeps it inline
(small chunks) or as a chunk file in a sidecar directory beside the references, so the grid
becomes a plain rectilinear grid. Only these chunks are copied; every other reference stays a
byte range into the source files.

The sidecar holds one subdirectory per write, named by a hash of its contents
(``OUT.chunks/<hash>/tas/c/3/0/0``): a new write fills a directory the old references never
name, the references are swapped in atomically, and only then are other subdirectories
removed, so at every instant the references on disk name chunk files that exist.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from refgrid.core.keys import chunk_key
from refgrid.core.sources import SourceCheck, SourceIdentity
from refgrid.core.typed import StorageOptions
from refgrid.errors import WriteError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ManifestBuilder
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.read.cropped import cropped_chunks, padded_arrays, portable_grid
from refgrid.writers.atomic import TEMPORARY, clean_leftovers, temporary_for

if TYPE_CHECKING:
    from hashlib import _Hash

Padded = Literal["encoded", "rewrite"]
PADDED_CHOICES: tuple[Padded, ...] = ("encoded", "rewrite")
DEFAULT_PADDED: Padded = "rewrite"
"""The default: every reader (zarr >= 3.2, Icechunk, fsspec) reads the output; only the padded
interior chunks are copied, and an archive without any copies nothing."""
INLINE_LIMIT = 4096
"""Rewritten chunks that encode to at most this many bytes are kept inline."""
STAGING = "staging"
"""Chunk files are written under ``OUT.chunks/.staging.tmp-<pid>-<token>`` first."""


@dataclass(frozen=True)
class PaddedRewrite:
    """What :func:`rewrite_padded` copied: counts, bytes, and where the files went."""

    chunks: int = 0
    inline: int = 0
    bytes: int = 0
    """Encoded bytes of every rewritten chunk (inline ones included)."""
    arrays: tuple[str, ...] = ()
    directory: Path | None = None
    """The sidecar subdirectory holding this write's chunk files (None when all inline)."""
    fresh: bool = False
    """The directory was made by this write (not one an earlier write of the same chunks
    left, which the references on disk may name)."""

    def __str__(self) -> str:
        if not self.chunks:
            return "no padded interior chunks: nothing rewritten"
        where = f"{self.chunks - self.inline} in {self.directory}" if self.directory else \
            "none as files"
        return (f"rewrote {self.chunks} padded chunk(s) of {', '.join(self.arrays)} "
                f"({self.bytes} bytes): {self.inline} inline, {where}")


def sidecar_for(target: Path) -> Path:
    """The sidecar directory of the references at ``target``: ``refs.json.chunks``."""
    return target.with_name(target.name + ".chunks")


def needs_rewrite(group: VirtualGroup) -> bool:
    return bool(padded_arrays(group))


def rewrite_padded(group: VirtualGroup, sidecar: Path, *,
                   inline_limit: int = INLINE_LIMIT,
                   storage_options: StorageOptions | None = None
                   ) -> tuple[VirtualGroup, PaddedRewrite]:
    """``group`` with every padded interior chunk cropped to its logical extent, and a
    report. Chunk files go under a new ``sidecar/<hash>/`` directory; the caller swaps the
    references in and then calls :func:`prune_sidecar`."""
    if inline_limit < 0:
        raise WriteError(f"inline_limit must be >= 0, got {inline_limit}")
    arrays = padded_arrays(group)
    staging = temporary_for(sidecar / STAGING)
    check = SourceCheck(group.sources, storage_options)
    digest = hashlib.sha256()
    rewritten: dict[str, _Rewritten] = {}
    try:
        for path, node in arrays.items():
            rewritten[path] = _rewrite_array(path, node, staging, inline_limit,
                                             dict(storage_options or {}), check, digest)
        total_files = sum(len(r.files) for r in rewritten.values())
        final = sidecar / digest.hexdigest()[:16] if total_files else None
        fresh = final is not None and not final.exists()
        if fresh:
            os.rename(staging, final)  # type: ignore[arg-type]
        else:  # all inline, or the same chunks written before: that directory serves
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise WriteError(f"cannot write padded chunks under {sidecar}: {e}") from e
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    sources = dict(group.sources)
    out = group.with_arrays({path: _with_chunks(arrays[path], done, final, sources)
                             for path, done in rewritten.items()})
    report = PaddedRewrite(
        chunks=sum(r.count for r in rewritten.values()),
        inline=sum(len(r.inline) for r in rewritten.values()),
        bytes=sum(r.nbytes for r in rewritten.values()),
        arrays=tuple(p for p, r in rewritten.items() if r.count),
        directory=final, fresh=fresh)
    return replace(out, sources=sources), report


def prune_sidecar(sidecar: Path, keep: Path | None) -> None:
    """Remove every subdirectory of ``sidecar`` but ``keep`` (and ``sidecar`` itself when
    nothing is kept), once references naming ``keep`` are in place. Staging directories of
    writers still running are left alone."""
    if not sidecar.is_dir():
        return
    clean_leftovers(sidecar / STAGING)
    for entry in sidecar.iterdir():
        if entry != keep and not TEMPORARY.fullmatch(entry.name):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(
                missing_ok=True)
    if keep is None:
        with contextlib.suppress(OSError):  # a concurrent writer's staging directory is there
            sidecar.rmdir()


@dataclass
class _Rewritten:
    count: int
    nbytes: int
    files: dict[tuple[int, ...], tuple[str, int]]
    """Chunk coordinates → (path relative to the sidecar subdirectory, byte count)."""
    inline: dict[tuple[int, ...], bytes]
    grid: RectilinearGrid


def _rewrite_array(path: str, array: VirtualArray, staging: Path, inline_limit: int,
                   storage_options: StorageOptions, check: SourceCheck,
                   digest: _Hash) -> _Rewritten:
    out = _Rewritten(0, 0, {}, {}, portable_grid(array.grid))
    for coords, encoded in cropped_chunks(path, array, storage_options, check):
        if encoded is None:  # absent (writers size such chunks first: not met here)
            continue
        out.count += 1
        out.nbytes += len(encoded)
        if len(encoded) <= inline_limit:
            out.inline[coords] = encoded
            continue
        relative = chunk_key(path, coords)
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(encoded)
        digest.update(relative.encode() + b"\0" + hashlib.sha256(encoded).digest())
        out.files[coords] = (relative, len(encoded))
    return out


def _with_chunks(array: VirtualArray, done: _Rewritten, final: Path | None,
                 sources: dict[str, SourceIdentity]) -> VirtualArray:
    built = ManifestBuilder.of(array.manifest)
    for coords, data in done.inline.items():
        built.inlined(coords, data)
    for coords, (relative, nbytes) in done.files.items():
        assert final is not None
        url = str((final / relative).resolve())
        # its size only: the directory is named by the hash of its contents, and a copy
        # of references and sidecar (a new modification time) is the same output
        sources[url] = {"size": os.stat(url).st_size, "rewritten": True}
        built.range(coords, url, 0, nbytes)
    return replace(array, grid=done.grid, manifest=built.build())

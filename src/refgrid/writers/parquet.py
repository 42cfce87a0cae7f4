"""Parquet references written, whole or appended to: the files :mod:`refgrid.refs.parquet`
lays out (it owns the layout in both directions) swapped in as :mod:`refgrid.writers.atomic`
swaps every output in — a whole write as one directory, an append file by file with
``.zmetadata`` last, so that at every instant the directory reads as one version or the
other (a reader that had loaded the old ``.zmetadata`` may meet a rewritten record file,
whose digest then differs: an error, never other references)."""

from __future__ import annotations

import shutil
from collections.abc import Container, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from refgrid.core.sources import SourceIdentity
from refgrid.grid.rectilinear import GridForm
from refgrid.model.manifest import ChunkManifest
from refgrid.model.virtual import VirtualGroup
from refgrid.refs.parquet import RECORD_SIZE, ZMetadata, appended_files, parquet_files
from refgrid.writers.atomic import replace_directory, temporary_for, write_file


def write_parquet(group: VirtualGroup, target: Path, *, grid_form: GridForm = "auto",
                  record_size: int = RECORD_SIZE, zarr_format: Literal[2, 3] = 3,
                  sidecar: Path | None = None) -> Path:
    """Write ``group`` as a parquet reference directory at ``target``, atomically: it is
    built under a temporary name and renamed (an existing directory is replaced).
    ``zarr_format=2`` writes classic kerchunk's v2 documents (regular grids only);
    ``sidecar``: the directory of rewritten chunks beside it, whose files are named relative
    to it."""
    temporary = temporary_for(target)
    try:
        temporary.mkdir(parents=True)
        for name, data in parquet_files(group, str(target), grid_form=grid_form,
                                        record_size=record_size, zarr_format=zarr_format,
                                        sidecar=sidecar):
            (temporary / name).parent.mkdir(parents=True, exist_ok=True)
            write_file(temporary / name, data)
        replace_directory(temporary, target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return target


def append_parquet(target: Path, meta: ZMetadata | Mapping[str, Any],
                   tail: Mapping[str, tuple[int, ChunkManifest]],
                   metadata: Mapping[str, Mapping[str, Any]],
                   sources: Mapping[str, SourceIdentity], sidecar: Path | None = None,
                   known: Container[str] = (), pieced: Iterable[str] = ()) -> int:
    """Extend the parquet references at ``target`` (whose ``.zmetadata`` is ``meta``, as
    read) in place, writing what changed only (:func:`refgrid.refs.parquet.appended_files`
    says what, and reads and checks all it keeps before the first write): each file swapped
    in whole, ``.zmetadata`` last, then the record files it no longer names removed.
    Returns the number of record files written."""
    if not isinstance(meta, ZMetadata):
        meta = ZMetadata.from_dict(meta, str(target))
    files, stale = appended_files(target, meta, tail, metadata, sources, sidecar, known, pieced)
    written = -1  # (.zmetadata is no record file)
    for name, data in files:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        write_file(target / name, data)
        written += 1
    for name in stale:
        (target / name).unlink(missing_ok=True)
    return written

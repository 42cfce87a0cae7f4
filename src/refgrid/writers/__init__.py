"""Writing a virtual dataset, every output in one package; :func:`write` (``refgrid.write``)
is its front and chooses the form its readers need:

* ``format="json"`` / ``"parquet"``: kerchunk references with Zarr v3 documents inside
  (rectilinear grids), for refgrid's engine, mapper and service, and zarr >= 3.2;
* ``format="kerchunk-v2"``: classic kerchunk references with Zarr v2 keys, for datasets whose
  arrays all have regular grids, read by every kerchunk consumer;
* an Icechunk repository or session as the target: metadata and virtual chunk references
  committed to it (:mod:`refgrid.writers.icechunk`).

``padded="rewrite"`` first rewrites the padded interior chunks of combined archives
(:mod:`refgrid.writers.padded`), so that the references need no ``encoded_chunk_shapes``:
the package sits above :mod:`refgrid.read` because that rewrite reads chunks. The other
modules write what a model becomes: :mod:`~refgrid.writers.references` (the reference
formats, laid out by :mod:`refgrid.refs`: JSON, parquet and classic kerchunk), ``parquet``
(a directory written whole or appended to), ``icechunk``, and ``atomic`` (the swap-in every
output goes through).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast, overload

import numpy as np

from refgrid.core.typed import JSONObject, StorageOptions
from refgrid.errors import ArgumentError, WriteError
from refgrid.grid.rectilinear import GridForm
from refgrid.model.manifest import ManifestBuilder
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.refs.json_refs import to_kerchunk as kerchunk_dict
from refgrid.refs.parquet import RECORD_SIZE
from refgrid.writers.padded import (
    DEFAULT_PADDED,
    INLINE_LIMIT,
    PADDED_CHOICES,
    Padded,
    PaddedRewrite,
    needs_rewrite,
    prune_sidecar,
    rewrite_padded,
    sidecar_for,
)
from refgrid.writers.references import Format, check_format, write_references

if TYPE_CHECKING:
    from icechunk import Repository, Session


@dataclass(frozen=True)
class Saved:
    """Where :func:`save` put the references, and what the padded rewrite copied."""

    path: Path
    rewrite: PaddedRewrite | None = None


def sized(group: VirtualGroup, storage_options: StorageOptions | None = None
          ) -> VirtualGroup:
    """``group`` with every chunk that is a whole file of unknown size (a remote Zarr store's
    chunk files, named without listing the store) given its size — a request per file — and
    those the store never wrote marked missing: references name byte ranges."""
    from refgrid.scanners.source import sizes_or_absent

    arrays = {path: a for path, a in group.walk()
              if isinstance(a, VirtualArray) and a.manifest.unsized.any()}
    if not arrays:
        return group
    urls = sorted({a.manifest.paths[i] for a in arrays.values()
                   for i in np.unique(a.manifest.path_id[a.manifest.unsized]).tolist()})
    found = sizes_or_absent(urls, storage_options or {})
    out = {}
    for path, array in arrays.items():
        m = array.manifest
        lengths = np.array([found.get(u) if found.get(u) is not None else -1
                            for u in m.paths] or [0], dtype=np.int64)
        unsized = np.flatnonzero(m.unsized.reshape(-1))
        known = lengths[m.path_id.reshape(-1)[unsized]]
        built = ManifestBuilder.of(m)
        built.set_lengths(unsized[known >= 0], known[known >= 0])
        built.missing(unsized[known < 0])
        out[path] = replace(array, manifest=built.build())
    return group.with_arrays(out)


def to_kerchunk(group: VirtualGroup, *, grid_form: GridForm = "auto",
                storage_options: StorageOptions | None = None) -> JSONObject:
    """The kerchunk v1 reference dict of ``group`` (see
    :func:`refgrid.refs.json_refs.to_kerchunk`); chunks of unknown size are sized first
    (:func:`sized`)."""
    return kerchunk_dict(sized(group, storage_options), grid_form=grid_form)


@overload
def write(group: VirtualGroup, target: str | os.PathLike[str], *, format: Format | None = None,
          padded: Padded = DEFAULT_PADDED, grid_form: GridForm = "auto",
          record_size: int = RECORD_SIZE, inline_limit: int = INLINE_LIMIT,
          message: str | None = None,
          storage_options: StorageOptions | None = None) -> Path: ...


@overload
def write(group: VirtualGroup, target: Repository | Session, *, format: Format | None = None,
          padded: Padded = DEFAULT_PADDED, grid_form: GridForm = "auto",
          record_size: int = RECORD_SIZE, inline_limit: int = INLINE_LIMIT,
          message: str | None = None,
          storage_options: StorageOptions | None = None) -> str: ...


def write(group: VirtualGroup, target: str | os.PathLike[str] | Repository | Session, *,
          format: Format | None = None,
          padded: Padded = DEFAULT_PADDED, grid_form: GridForm = "auto",
          record_size: int = RECORD_SIZE, inline_limit: int = INLINE_LIMIT,
          message: str | None = None,
          storage_options: StorageOptions | None = None) -> Path | str:
    """Write ``group`` for its readers; returns the path written (or, for an Icechunk
    target, the new snapshot id).

    ``target`` is a path, or an Icechunk ``Repository``/``Session`` (the ``icechunk``
    extra): the arrays' metadata and virtual references are committed with ``message``.

    ``format``: ``"json"`` (kerchunk JSON v1, Zarr v3 documents; the default, or parquet for
    a path ending ``.parq``/``.parquet``), ``"parquet"`` (a directory of columnar records for
    large archives) or ``"kerchunk-v2"`` (classic kerchunk, Zarr v2 keys; JSON, or parquet for
    such a suffix) — regular grids only.

    ``padded`` is what happens to chunks padded inside the array (an HDF5 file's padded last
    chunk, once files are concatenated): ``"rewrite"`` (default) copies just those chunks,
    cropped, inline (up to ``inline_limit`` bytes) or into ``<target>.chunks/`` beside the
    references — or, for Icechunk, as the repository's own chunks — so every rectilinear
    reader (zarr >= 3.2, Icechunk) reads the output; ``"encoded"`` copies nothing and
    describes them with ``encoded_chunk_shapes``, which only refgrid's readers understand.

    ``record_size`` is the number of chunks per parquet record file; ``storage_options``
    reach the sources read by the rewrite. The output appears atomically and a killed write
    leaves no litter (:mod:`refgrid.writers.atomic`).
    """
    group = sized(group, storage_options)
    if _is_icechunk(target):
        from refgrid.writers.icechunk import write_icechunk

        check_icechunk_options(format, padded)
        return write_icechunk(group, cast("Repository | Session", target), message=message,
                              storage_options=storage_options)
    return save(group, cast("str | os.PathLike[str]", target), format=format, padded=padded,
                grid_form=grid_form, record_size=record_size, inline_limit=inline_limit,
                storage_options=storage_options).path


def save(group: VirtualGroup, path: str | os.PathLike[str], *, format: Format | None = None,
         padded: Padded = DEFAULT_PADDED, grid_form: GridForm = "auto",
         record_size: int = RECORD_SIZE, inline_limit: int = INLINE_LIMIT,
         storage_options: StorageOptions | None = None) -> Saved:
    """:func:`write` to a path, also returning the padded rewrite's report (the CLI prints
    it)."""
    if padded not in PADDED_CHOICES:
        raise WriteError(f"unknown padded={padded!r} (choose from {', '.join(PADDED_CHOICES)})")
    check_format(format)  # before any chunk is rewritten
    group = sized(group, storage_options)
    target = Path(path)
    sidecar = sidecar_for(target)
    report: PaddedRewrite | None = None
    if padded == "rewrite" and format != "kerchunk-v2" and needs_rewrite(group):
        group, report = rewrite_padded(group, sidecar, inline_limit=inline_limit,
                                       storage_options=storage_options)
    elif padded == "rewrite":
        report = PaddedRewrite()
    try:
        written = write_references(
            group, target, format=format, grid_form=grid_form, record_size=record_size,
            sidecar=sidecar if report is not None and report.directory is not None else None)
    except BaseException:
        if report is not None and report.directory is not None and report.fresh:
            shutil.rmtree(report.directory, ignore_errors=True)
        raise
    prune_sidecar(sidecar, keep=report.directory if report is not None else None)
    return Saved(written, report)


def check_icechunk_options(format: str | None, padded: str) -> None:
    """An Icechunk target has one form: refuse options asking for another."""
    if format is not None:
        raise ArgumentError(f"an Icechunk output takes no format= (got {format!r}): the "
                            "repository holds Zarr v3 arrays")
    if padded != "rewrite":
        raise ArgumentError(f"an Icechunk output takes no padded={padded!r}: Icechunk decodes "
                            "every chunk to its declared shape, so padded interior chunks are "
                            "always stored cropped, as the repository's own chunks")


def _is_icechunk(target: object) -> bool:
    """Whether ``target`` is an Icechunk object (a ``Repository`` or ``Session``), told by
    its module: ``icechunk`` is imported only when one is written to."""
    return type(target).__module__.split(".")[0] == "icechunk"


__all__ = ["DEFAULT_PADDED", "PADDED_CHOICES", "Padded", "PaddedRewrite", "Saved",
           "check_icechunk_options", "save", "to_kerchunk", "write"]

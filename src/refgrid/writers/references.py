"""Reference sets on disk: kerchunk references (JSON, or parquet for large archives) with
Zarr v3 metadata documents inside, or classic kerchunk's Zarr v2 form for regular grids.

The public ``refgrid.write`` (:mod:`refgrid.writers`) chooses among these and other outputs
and may rewrite padded chunks first; this module only turns a model into files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from refgrid.errors import WriteError
from refgrid.grid.rectilinear import GridForm
from refgrid.model.virtual import VirtualGroup
from refgrid.refs.json_refs import to_kerchunk, to_kerchunk_v2
from refgrid.refs.parquet import RECORD_SIZE
from refgrid.writers.atomic import clean_leftovers, replace_directory, replace_file, temporary_for
from refgrid.writers.parquet import write_parquet

Format = Literal["json", "parquet", "kerchunk-v2"]
FORMATS: tuple[Format, ...] = ("json", "parquet", "kerchunk-v2")
PARQUET_SUFFIXES = (".parq", ".parquet")


def check_format(format: str | None) -> None:
    """Refuse a ``format`` no writer here knows (None: chosen by the path)."""
    if format is not None and format not in FORMATS:
        raise WriteError(f"unknown reference format {format!r} (supported: "
                         f"{', '.join(map(repr, FORMATS))})")


def write_references(group: VirtualGroup, path: str | os.PathLike[str], *,
                     format: Format | None = None, grid_form: GridForm = "auto",
                     record_size: int = RECORD_SIZE, sidecar: Path | None = None) -> Path:
    """Write ``group`` as kerchunk references: JSON v1 (one file), ``"parquet"`` (a
    directory of columnar records, for large archives: it opens without parsing every key),
    or ``"kerchunk-v2"`` (Zarr v2 keys; JSON, or parquet for a ``.parq``/``.parquet`` path).

    ``format`` defaults to parquet for a path ending in ``.parq``/``.parquet``, else JSON;
    ``record_size`` is the number of chunks per parquet record file. The output appears
    atomically: it is written under a temporary name and swapped in, so the path always
    holds the old output or the new one; leftovers of killed writes are removed
    (:mod:`refgrid.writers.atomic`). ``sidecar``: the directory of rewritten chunks beside
    the references (their files are named relative to it, so both may move together).
    """
    target = Path(path)
    parquet_path = target.suffix in PARQUET_SUFFIXES
    chosen = format or ("parquet" if parquet_path else "json")
    check_format(chosen)
    if record_size < 1:
        raise WriteError(f"record_size must be >= 1, got {record_size}")
    version: Literal[2, 3] = 2 if chosen == "kerchunk-v2" else 3
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(target)
        if chosen == "parquet" or (version == 2 and parquet_path):
            return write_parquet(group, target, grid_form=grid_form, record_size=record_size,
                                 zarr_format=version, sidecar=sidecar)
        refs = to_kerchunk_v2(group) if version == 2 else to_kerchunk(
            group, grid_form=grid_form, sidecar=sidecar)
        temporary = temporary_for(target)
        try:
            with open(temporary, "w", encoding="utf-8") as f:
                json.dump(refs, f, separators=(",", ":"))
            if target.is_dir():
                replace_directory(temporary, target)
            else:
                replace_file(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
    except OSError as e:
        raise WriteError(f"cannot write {chosen} references to {target}: {e}") from e
    return target


__all__ = ["FORMATS", "Format", "check_format", "to_kerchunk", "to_kerchunk_v2", "write_references"]

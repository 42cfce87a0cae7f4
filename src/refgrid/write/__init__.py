"""Writing a virtual dataset: kerchunk references (JSON, or parquet for large archives) with
Zarr v3 metadata documents inside."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from refgrid.errors import WriteError
from refgrid.grid import GridForm
from refgrid.model import VirtualGroup
from refgrid.write.atomic import clean_leftovers, replace_directory, replace_file, temporary_for
from refgrid.write.parquet import RECORD_SIZE, write_parquet
from refgrid.write.refs import to_kerchunk

Format = Literal["json", "parquet"]


def write(group: VirtualGroup, path: str | os.PathLike[str], *, format: Format | None = None,
          grid_form: GridForm = "auto", record_size: int = RECORD_SIZE) -> Path:
    """Write ``group`` as kerchunk references: JSON v1 (one file), or ``"parquet"`` (a
    directory of columnar records, for large archives: it opens without parsing every key).

    ``format`` defaults to parquet for a path ending in ``.parq``/``.parquet``, else JSON;
    ``record_size`` is the number of chunks per parquet record file. The output appears
    atomically: it is written under a temporary name and swapped in, so the path always
    holds the old output or the new one; leftovers of killed writes are removed
    (:mod:`refgrid.write.atomic`).
    """
    target = Path(path)
    chosen = format or ("parquet" if target.suffix in (".parq", ".parquet") else "json")
    if chosen not in ("json", "parquet"):
        raise WriteError(f"unknown reference format {chosen!r} (supported: 'json', 'parquet')")
    if record_size < 1:
        raise WriteError(f"record_size must be >= 1, got {record_size}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(target)
        if chosen == "parquet":
            return write_parquet(group, target, grid_form=grid_form, record_size=record_size)
        temporary = temporary_for(target)
        try:
            with open(temporary, "w", encoding="utf-8") as f:
                json.dump(to_kerchunk(group, grid_form=grid_form), f, separators=(",", ":"))
            if target.is_dir():
                replace_directory(temporary, target)
            else:
                replace_file(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
    except OSError as e:
        raise WriteError(f"cannot write {chosen} references to {target}: {e}") from None
    return target


__all__ = ["to_kerchunk", "write"]

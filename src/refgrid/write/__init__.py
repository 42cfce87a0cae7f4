"""Writing a virtual dataset: kerchunk references with Zarr v3 metadata documents."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from refgrid.errors import WriteError
from refgrid.grid import GridForm
from refgrid.model import VirtualGroup
from refgrid.write.refs import to_kerchunk


def write(group: VirtualGroup, path: str | os.PathLike[str], *,
          format: Literal["json"] = "json", grid_form: GridForm = "auto") -> Path:
    """Write ``group`` as kerchunk JSON v1 references (Zarr v3 documents inside).

    The file appears atomically: it is written under a temporary name and renamed.
    """
    if format != "json":
        raise WriteError(f"unknown reference format {format!r} (supported: 'json')")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(to_kerchunk(group, grid_form=grid_form), f, separators=(",", ":"))
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    return target


__all__ = ["to_kerchunk", "write"]

"""Scan a file, write references, read every variable back and compare with ground truth."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ground_truth import ground_truth, restore, same
from refgrid.model.virtual import VirtualArray
from refgrid.scanners import scan

Reader = Callable[[dict[str, Any]], Callable[[str], np.ndarray]]
"""``reader(refs)`` opens references once and returns ``read(variable_path)``."""


@dataclass
class FileResult:
    path: Path
    ok: list[str] = field(default_factory=list)
    reported: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def status(self) -> str:
        if self.error or self.wrong:
            return "failed"
        return "partial" if self.reported or self.unread else "correct"


def stock_zarr_group(refs: dict[str, Any], protocol: str | None = None,
                     options: dict[str, Any] | None = None) -> Any:
    """Open references with *stock* zarr 3 through fsspec's ``reference://`` filesystem."""
    import fsspec
    import zarr

    remote = {**(options or {}), "asynchronous": True} if protocol else {}
    fs = fsspec.filesystem("reference", fo=refs, remote_protocol=protocol,
                           remote_options=remote, asynchronous=True)
    store = zarr.storage.FsspecStore(fs, read_only=True)
    return zarr.open_group(store=store, mode="r", zarr_format=3)


def stock_zarr_reader(refs: dict[str, Any]) -> Callable[[str], np.ndarray]:
    """Read variables with stock zarr (regular grids only)."""
    group = stock_zarr_group(refs)
    return lambda name: group[name][...]


def refgrid_reader(refs: dict[str, Any]) -> Callable[[str], np.ndarray]:
    """Read variables with refgrid's own read path (any grid)."""
    from refgrid.read.array import read
    from refgrid.refs.json_refs import references_to_group

    group = references_to_group(refs)
    return lambda name: read(group[name], path=name)


def engine_reader(refs: dict[str, Any]) -> Callable[[str], np.ndarray]:
    """Read variables raw through the xarray engine, one dataset per group."""
    import xarray as xr

    datasets: dict[str, Any] = {}

    def read(name: str) -> np.ndarray:
        group, _, variable = name.rpartition("/")
        if group not in datasets:
            datasets[group] = xr.open_dataset(refs, engine="refgrid", group=group or None,
                                              decode_cf=False, cache=False)
        return datasets[group][variable].values

    return read


def mapper_reader(refs: dict[str, Any]) -> Callable[[str], np.ndarray]:
    """Read variables with stock zarr through refgrid's regular-grid view (any grid)."""
    import zarr

    from refgrid import get_mapper

    group = zarr.open_group(get_mapper(refs), mode="r", zarr_format=3)
    return lambda name: group[name][...]


def check_file(path: Path, reader: Reader,
               can_read: Callable[[VirtualArray], bool]) -> FileResult:
    """Read every variable through references; ``can_read`` says whether the reader handles
    an array (stock zarr needs a regular grid)."""
    from refgrid.writers.references import to_kerchunk

    result = FileResult(path)
    try:
        group = scan(path, on_error="report")
        truth = ground_truth(path)
        read = reader(to_kerchunk(group))
    except Exception as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    reported = {entry.variable for entry in group.report if entry.action == "skipped"}
    arrays = {p: n for p, n in group.walk() if isinstance(n, VirtualArray)}
    for name, expected in truth.items():
        if name not in arrays:
            (result.reported if name in reported else result.wrong).append(name)
            continue
        array = arrays[name]
        if not can_read(array):
            result.unread.append(name)
            continue
        try:
            values = restore(read(name), dict(array.attrs))
        except Exception as e:
            result.wrong.append(f"{name} ({type(e).__name__}: {e})")
            continue
        if isinstance(expected, Exception):
            result.reported.append(name)  # the C library itself cannot read it
        elif same(values, expected):
            result.ok.append(name)
        else:
            result.wrong.append(name)
    return result


def table(results: list[FileResult]) -> str:
    files = {s: sum(r.status == s for r in results) for s in ("correct", "partial", "failed")}
    lines = [f"files: {files['correct']} correct / {files['partial']} partial / "
             f"{files['failed']} failed; variables: {sum(len(r.ok) for r in results)} ok / "
             f"{sum(len(r.reported) for r in results)} reported / "
             f"{sum(len(r.wrong) for r in results)} wrong / "
             f"{sum(len(r.unread) for r in results)} not readable by this reader"]
    for r in results:
        if r.status != "correct":
            detail = r.error or "; ".join(
                f"{k}: {', '.join(v[:6])}{' …' if len(v) > 6 else ''}"
                for k, v in (("wrong", r.wrong), ("reported", r.reported), ("unread", r.unread))
                if v)
            lines.append(f"  {r.status:8s} {r.path.name}: {detail}")
    return "\n".join(lines)

"""Paths and file lists the tests share (conftest.py holds only pytest fixtures)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"
SHARED = ROOT.parent / "shared"
RECTILINEAR_SCHEMA = SHARED / "spec" / "rectilinear.schema.json"
CORPUS = SHARED / "corpus" / "files"
QUIET_CLUSTER: dict[str, object] = {"dashboard_address": None,
                                    "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"}}
"""A test LocalCluster's options: no dashboard, and the HTTP server distributed's scheduler
starts even so (on port 8787 unless told) on a free port of 127.0.0.1 — the suite's worker
processes start clusters at once, and a taken port is a warning, so an error."""


def zarr_at_least(version: str) -> bool:
    """Whether the installed zarr is ``version`` or newer (the two stacks differ)."""
    import zarr
    from packaging.version import Version

    return Version(zarr.__version__) >= Version(version)


RECTILINEAR = zarr_at_least("3.2")
"""zarr reads rectilinear chunk grids (with ``array.rectilinear_chunks``)."""


def closed(opened: T) -> T:
    """An xarray Dataset or DataTree (ground truth from netCDF4/h5netcdf) loaded into memory
    and its files closed: a test leaves no file open behind it."""
    with opened:
        return opened.load()


def killed(process: subprocess.Popen) -> None:
    """``kill -9`` of a child process, waited for, its pipes closed (no file left open)."""
    process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def data_files(root: Path) -> list[Path]:
    """HDF5 / NetCDF files below ``root`` (by their suffix), sorted."""
    return [p for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in {".nc", ".h5",
                                                                                 ".hdf5"}]


def hdf5_files(root: Path) -> list[Path]:
    return [p for p in data_files(root) if p.read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"]


def netcdf3_files(root: Path) -> list[Path]:
    return [p for p in data_files(root) if p.read_bytes()[:3] == b"CDF"]

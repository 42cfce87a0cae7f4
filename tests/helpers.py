"""Paths and file lists the tests share (conftest.py holds only pytest fixtures)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SHARED = ROOT.parent / "shared"
RECTILINEAR_SCHEMA = SHARED / "spec" / "rectilinear.schema.json"
CORPUS = SHARED / "corpus" / "files"


def data_files(root: Path) -> list[Path]:
    """HDF5 / NetCDF files below ``root`` (by their suffix), sorted."""
    return [p for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in {".nc", ".h5",
                                                                                 ".hdf5"}]


def hdf5_files(root: Path) -> list[Path]:
    return [p for p in data_files(root) if p.read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"]


def netcdf3_files(root: Path) -> list[Path]:
    return [p for p in data_files(root) if p.read_bytes()[:3] == b"CDF"]

"""Shared test fixtures: paths to the bundled fixtures, the shared spec and the corpus."""

from __future__ import annotations

import json
from pathlib import Path

# Order matters: netCDF4 wheels bundle their own HDF5, and if it loads first the hdf5plugin
# filters (blosc, zstd, ...) fail inside h5py with "error during user callback".
import h5py  # noqa: F401
import hdf5plugin  # noqa: F401
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SHARED = ROOT.parent / "shared"
RECTILINEAR_SCHEMA = SHARED / "spec" / "rectilinear.schema.json"


@pytest.fixture(scope="session")
def rectilinear_schema() -> dict:
    """The zarr-extensions rectilinear JSON schema from ../shared/spec (skip when absent)."""
    if not RECTILINEAR_SCHEMA.exists():
        pytest.skip(f"rectilinear schema not found at {RECTILINEAR_SCHEMA} (../shared is absent)")
    return json.loads(RECTILINEAR_SCHEMA.read_text())

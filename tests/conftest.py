"""Shared test fixtures: paths to the bundled fixtures, the shared spec and the corpus."""

from __future__ import annotations

import json
from pathlib import Path

# Order matters: netCDF4 wheels bundle their own HDF5, and if it loads first the hdf5plugin
# filters (blosc, zstd, ...) fail inside h5py with "error during user callback".
import h5py  # noqa: F401
import hdf5plugin  # noqa: F401
import pytest
from hypothesis import settings

from helpers import CORPUS, FIXTURES, RECTILINEAR_SCHEMA

# Properties are about results, not speed: a loaded 2-core CI machine must not fail them.
settings.register_profile("refgrid", deadline=None, print_blob=True)
settings.load_profile("refgrid")


@pytest.fixture(scope="session")
def rectilinear_schema() -> dict:
    """The zarr-extensions rectilinear JSON schema from ../shared/spec (skip when absent)."""
    if not RECTILINEAR_SCHEMA.exists():
        pytest.skip(f"rectilinear schema not found at {RECTILINEAR_SCHEMA} (../shared is absent)")
    return json.loads(RECTILINEAR_SCHEMA.read_text())


@pytest.fixture(scope="session")
def corpus() -> Path:
    """../shared/corpus/files (skip when absent: a user's clone does not have it)."""
    if not CORPUS.is_dir():
        pytest.skip(f"the real-file corpus is absent ({CORPUS}); it ships beside the repo")
    return CORPUS


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 on 127.0.0.1 (a free port), with a request counter."""
    from servers import start_s3

    yield from start_s3()


@pytest.fixture(scope="session")
def http_server(tmp_path_factory):
    """A Range-capable HTTP server on 127.0.0.1 serving a copy of the fixtures."""
    import shutil

    from servers import start_http

    root = tmp_path_factory.mktemp("http")
    shutil.copytree(FIXTURES, root / "fixtures")
    yield from start_http(root)

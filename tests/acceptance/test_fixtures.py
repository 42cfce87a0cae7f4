"""The committed fixtures are exactly what fixtures/generate.py writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import h5py
import netCDF4
import pytest

from fixture_content import describe
from helpers import FIXTURES

DATA_SUFFIXES = {".nc", ".h5"}


def _load_generator():
    spec = importlib.util.spec_from_file_location("fixture_generator", FIXTURES / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _data_files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.suffix in DATA_SUFFIXES)


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fixtures")
    _load_generator().generate(out)
    return out


def test_regenerated_set_of_files_is_the_committed_one(regenerated):
    assert _data_files(regenerated) == _data_files(FIXTURES)


def test_regenerated_files_match_committed_ones(regenerated):
    """Bytes must match when the writing libraries are the versions that wrote the committed
    files (except files that embed creation times); otherwise structure, metadata and values
    must."""
    generator = _load_generator()
    same_versions = (json.loads((FIXTURES / "VERSIONS.json").read_text())
                     == json.loads((regenerated / "VERSIONS.json").read_text()))
    differing = []
    for rel in _data_files(FIXTURES):
        if (FIXTURES / rel).read_bytes() == (regenerated / rel).read_bytes():
            continue
        assert describe(FIXTURES / rel) == describe(regenerated / rel), f"{rel} content differs"
        if rel.as_posix() not in generator.TIMESTAMPED:
            differing.append(rel.as_posix())
    if same_versions:
        assert not differing, f"same library versions yet different bytes: {differing}"


def test_fixtures_stay_small():
    total = sum((FIXTURES / p).stat().st_size for p in _data_files(FIXTURES))
    assert total <= 5 * 2**20, f"fixtures take {total} bytes, over the 5 MB budget"


def test_monthly_and_yearly_lengths():
    lengths = [len(netCDF4.Dataset(p).dimensions["time"])
               for p in sorted((FIXTURES / "monthly" / "chunk10").glob("*.nc"))]
    assert lengths == [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    with h5py.File(FIXTURES / "monthly" / "chunk10" / "tas_200102.nc") as f:
        assert f["tas"].chunks == (10, 6, 8)
        assert f["tas"].compression == "gzip" and f["tas"].shuffle
    with h5py.File(FIXTURES / "monthly" / "contiguous" / "tas_200102.nc") as f:
        assert f["tas"].chunks is None
    with h5py.File(FIXTURES / "yearly" / "chunk100" / "tas_2000.nc") as f:
        assert f["tas"].shape[0] == 366 and f["tas"].chunks[0] == 100
    units = [netCDF4.Dataset(p)["time"].units
             for p in sorted((FIXTURES / "yearly" / "mixed_units").glob("*.nc"))]
    assert units == ["days since 2000-01-01", "hours since 2001-01-01"]


def test_netcdf3_formats():
    formats = {p.name: netCDF4.Dataset(p).data_model
               for p in (FIXTURES / "netcdf3").rglob("*.nc")}
    assert formats["cdf5.nc"] == "NETCDF3_64BIT_DATA"
    assert formats["single_byte_record.nc"] == "NETCDF3_CLASSIC"
    assert {netCDF4.Dataset(p).data_model for p in (FIXTURES / "netcdf3" / "offset64").glob("*")} \
        == {"NETCDF3_64BIT_OFFSET"}


def test_filter_masked_chunks_are_present():
    """Traps the scanner must handle: chunks stored with a filter skipped."""
    with h5py.File(FIXTURES / "features" / "hdf5_filters.h5") as f:
        masks = []
        f["filter_mask"].id.chunk_iter(lambda info: masks.append(info.filter_mask))
    assert 1 in masks and 0 in masks

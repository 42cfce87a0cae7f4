"""The ``refgrid`` command line: scan, combine and demo."""

from __future__ import annotations

import json

from click.testing import CliRunner

from helpers import FIXTURES
from refgrid.cli import main


def test_scan_writes_references_and_prints_the_report(tmp_path):
    out = tmp_path / "refs.json"
    result = CliRunner().invoke(main, ["scan", str(FIXTURES / "features" / "hdf5_filters.h5"),
                                       "-o", str(out), "--report"])
    assert result.exit_code == 0, result.output
    assert "scaleoffset_int: inlined" in result.output
    refs = json.loads(out.read_text())
    assert refs["version"] == 1 and "gzip/zarr.json" in refs["refs"]
    assert not list(tmp_path.glob(".*tmp*")), "temporary file left behind"


def test_scan_errors_are_one_line_without_traceback(tmp_path):
    result = CliRunner().invoke(main, ["scan", "missing.nc", "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 1
    assert "missing.nc: file not found" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "x.json").exists()


def test_bad_storage_option_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, ["scan", "x.nc", "-o", str(tmp_path / "x"), "-s", "anon"])
    assert result.exit_code == 2 and "is not KEY=VALUE" in result.output


def test_demo_writes_verified_references_and_the_year_grid(tmp_path):
    result = CliRunner().invoke(main, ["demo", str(FIXTURES), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "monthly").glob("tas_2001*.json"))) == 12
    grid = json.loads((tmp_path / "monthly" / "year_chunk_grid.json").read_text())
    assert grid["name"] == "rectilinear"
    assert grid["configuration"]["encoded_chunk_shapes"] == [10, 6, 8]
    assert (tmp_path / "tas_2001.json").exists()
    assert 'engine="refgrid"' in result.output


def test_combine_writes_parquet_references_for_a_parq_name(tmp_path):
    import xarray as xr

    months = sorted(str(p) for p in (FIXTURES / "monthly" / "chunk10").glob("tas_2001*.nc"))
    out = tmp_path / "tas.parq"
    for _ in range(2):  # the second run replaces the first directory
        result = CliRunner().invoke(main, ["combine", *months, "-o", str(out)])
        assert result.exit_code == 0, result.output
    assert (out / ".zmetadata").is_file() and (out / "tas" / "refs.0.parq").is_file()
    ours = xr.open_dataset(out, engine="refgrid")
    expected = xr.open_mfdataset(months, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals")
    xr.testing.assert_identical(ours.load(), expected.load())

"""The ``refgrid`` command line: scan, combine and demo."""

from __future__ import annotations

import json

from click.testing import CliRunner

from helpers import FIXTURES, closed
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
    assert "missing.nc: No such file or directory" in result.output
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
    assert grid["name"] == "rectilinear"  # as written: the padded chunks stored cropped
    assert "encoded_chunk_shapes" not in grid["configuration"]
    assert grid["configuration"]["chunk_shapes"][0][:4] == [[10, 3], [1, 1], [10, 2], [8, 1]]
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
    expected = closed(xr.open_mfdataset(months, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals"))
    xr.testing.assert_identical(ours.load(), expected.load())


def test_globs_support_question_marks_classes_and_recursion(tmp_path):
    months = FIXTURES / "monthly" / "chunk10"
    for pattern, count in ((f"{months}/tas_20010?.nc", 9), (f"{months}/tas_20011[01].nc", 2),
                           (f"{FIXTURES}/monthly/**/tas_200112.nc", 3)):
        out = tmp_path / "refs.json"
        result = CliRunner().invoke(main, ["combine", pattern, "-o", str(out),
                                           "--allow-overlap", "--recode"])
        assert result.exit_code == 0, result.output
        assert f"combined {count} files" in result.output, (pattern, result.output)


def test_a_pattern_that_matches_nothing_says_so(tmp_path):
    pattern = str(FIXTURES / "monthly" / "chunk10" / "tas_1999*.nc")
    result = CliRunner().invoke(main, ["combine", pattern, "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 1
    assert f"no file matches {pattern}" in result.output


def test_damaged_files_and_unreachable_servers_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    damaged = tmp_path / "damaged.h5"
    damaged.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 4)
    for args in (["scan", str(damaged)],
                 ["scan", "s3://nobucket/x.nc", "-s", "endpoint_url=http://127.0.0.1:9",
                  "-s", "anon=true"]):
        result = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "x.json")])
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
        assert args[1] in lines[0]
    result = CliRunner().invoke(main, ["--debug", "scan", str(damaged), "-o",
                                       str(tmp_path / "x.json")])
    assert isinstance(result.exception, Exception) and result.exit_code != 0


def test_an_unexpected_error_is_one_line_too(tmp_path, monkeypatch):
    import refgrid

    def broken(*args, **kwargs):
        raise ValueError("something inside a library")

    monkeypatch.setattr(refgrid, "write", broken)
    source = FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"
    result = CliRunner().invoke(main, ["scan", str(source), "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: ValueError: something inside a library (run with "
                                     "--debug for the traceback)")


def test_a_scan_that_hangs_is_stopped(tmp_path, monkeypatch):
    import time

    import refgrid

    monkeypatch.setattr(refgrid, "scan", lambda *a, **k: time.sleep(60))
    source = FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"
    start = time.perf_counter()
    result = CliRunner().invoke(main, ["scan", str(source), "-o", str(tmp_path / "x.json"),
                                       "--timeout", "1"])
    assert time.perf_counter() - start < 10
    assert result.exit_code == 1
    assert "took longer than 1 s and was stopped" in result.output


def test_references_from_outside_the_allowed_sources_are_refused(tmp_path):
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"version": 1, "refs": {
        "zarr.json": json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}),
        "a/zarr.json": json.dumps({
            "zarr_format": 3, "node_type": "array", "shape": [8], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}}),
        "a/c/0": ["/etc/hostname", 0, 8]}}))
    result = CliRunner().invoke(main, ["scan", str(refs), "-o", str(tmp_path / "out.json"),
                                       "--allow-source", str(tmp_path)])
    assert result.exit_code == 1
    assert "outside the allowed sources" in result.output


def test_combine_joins_files_stored_otherwise_in_segments_or_refuses_them_strictly(tmp_path):
    """The default joins January and February (chunked) with a contiguous March as xarray
    reads them; ``--strict-storage`` refuses them naming the file, ``--recode`` copies,
    and both at once are a usage error."""
    import xarray as xr

    files = [str(FIXTURES / "monthly" / "chunk10" / f"tas_20010{m}.nc") for m in (1, 2)] + [
        str(FIXTURES / "monthly" / "contiguous" / "tas_200103.nc")]
    out = tmp_path / "tas.json"
    result = CliRunner().invoke(main, ["combine", *files, "-o", str(out), "--report"])
    assert result.exit_code == 0, result.output
    assert "tas: segmented: stored in 2 runs" in result.output
    expected = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                        data_vars="minimal", compat="equals"))
    xr.testing.assert_identical(closed(xr.open_dataset(out, engine="refgrid")), expected)
    strict = CliRunner().invoke(main, ["combine", *files, "-o", str(tmp_path / "s.json"),
                                       "--strict-storage"])
    assert strict.exit_code != 0 and "tas_200103.nc" in strict.output
    assert "Traceback" not in strict.output and not (tmp_path / "s.json").exists()
    both = CliRunner().invoke(main, ["combine", *files, "-o", str(tmp_path / "b.json"),
                                     "--recode", "--strict-storage"])
    assert both.exit_code == 2 and "exclude each other" in both.output

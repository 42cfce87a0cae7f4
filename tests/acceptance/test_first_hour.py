"""What a new user tries in the first hour either works or says exactly what to do: natural
calls, the service without --allow-source, stock opens without warnings, declared extras,
Icechunk as documented, and messages in a person's words. (The notebooks, the demo and the
Makefile have tests of their own: test_notebooks, test_plain_install, test_makefile.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr
from click.testing import CliRunner

import refgrid
from helpers import FIXTURES, ROOT, closed
from refgrid.cli import main

MONTHLY = FIXTURES / "monthly" / "chunk10"


# -- 2. natural calls ------------------------------------------------------------------------

def test_combine_takes_paths_globs_and_lists_as_the_cli_does(tmp_path):
    files = sorted(MONTHLY.glob("*.nc"))[:3]
    from_groups = refgrid.combine([refgrid.scan(f) for f in files], "time")
    listing = tmp_path / "files.txt"
    listing.write_text("\n".join(map(str, files)))
    for given in ([str(f) for f in files], files, str(MONTHLY / "tas_20010[1-3].nc"),
                  f"@{listing}"):
        assert refgrid.combine(given, "time") == from_groups, given
    ds = xr.open_dataset(refgrid.to_kerchunk(refgrid.combine(files, "time")), engine="refgrid")
    expected = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals"))
    np.testing.assert_array_equal(ds.tas.values, expected.tas.values)


def test_combine_refuses_what_it_cannot_take_saying_what_to_pass():
    with pytest.raises(refgrid.ArgumentError, match=r"groups refgrid\.scan made, or paths"):
        refgrid.combine([refgrid.scan(sorted(MONTHLY.glob("*.nc"))[0]), 3], "time")
    with pytest.raises(refgrid.ArgumentError, match="no file matches"):
        refgrid.combine(str(MONTHLY / "nothing_*.nc"), "time")


def test_the_same_file_twice_is_combined_once_and_said_so(tmp_path):
    first = str(sorted(MONTHLY.glob("*.nc"))[0])
    group = refgrid.combine([first, first, str(sorted(MONTHLY.glob("*.nc"))[1])], "time")
    assert group["tas"].shape[0] == 31 + 28
    duplicates = [e for e in group.report if e.action == "duplicate"]
    assert [(e.url, e.reason) for e in duplicates] == [(first, "named 2 times: combined once")]
    result = CliRunner().invoke(main, ["combine", first, first, "-o",
                                       str(tmp_path / "one.json")])
    assert result.exit_code == 0, result.output
    assert f"note: {first} is named 2 times: combined once" in result.output


def test_scan_of_a_glob_or_a_directory_says_to_combine():
    with pytest.raises(refgrid.ArgumentError, match=r"glob pattern, and refgrid.scan reads one "
                                                    r"file.*refgrid.combine\("):
        refgrid.scan(str(MONTHLY / "*.nc"))
    with pytest.raises(refgrid.FormatError, match=r"holds 12 data file\(s\) \(tas_200101.nc, "
                                                  r"tas_200102.nc, tas_200103.nc, ...\): to "
                                                  r"join them.*refgrid batch"):
        refgrid.scan(MONTHLY)


# -- 3. the service without --allow-source --------------------------------------------------

def test_serve_without_allow_source_says_which_datasets_answer_403_and_the_flag(tmp_path):
    refs = tmp_path / "refs"
    refgrid.write(refgrid.scan(sorted(MONTHLY.glob("*.nc"))[0]), refs / "january.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "refgrid.cli", "serve", str(refs),
                                "--port", str(port), "--no-access-log"],
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
                break
            except OSError:
                time.sleep(0.1)
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/january/native/zarr.json",
                                   timeout=5)
            status, body = 200, ""
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read().decode()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert status == 403 and "--allow-source" in body, body
    assert "(1 of the first 200 checked cannot be served: the index says why)" in err, err
    assert "january answers 403: " in err, err  # (each with the status it answers)
    assert "allow them with --allow-source PREFIX" in err, err


# -- 4. stock opens warn about nothing ------------------------------------------------------

def test_stock_zarr_opens_the_references_without_a_warning(tmp_path):
    import fsspec

    out = refgrid.write(refgrid.scan(sorted(MONTHLY.glob("*.nc"))[0]), tmp_path / "jan.json")
    root = json.loads(json.loads(out.read_text())["refs"]["zarr.json"])
    assert set(root["consolidated_metadata"]["metadata"]) == {"time", "lat", "lon", "tas"}
    fs = fsspec.filesystem("reference", fo=str(out), asynchronous=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # zarr 3.1's notice that numcodecs' codecs are outside the v3 spec (HDF5's deflate
        # has no core codec; zarr >= 3.2 says nothing): not about how the store opens
        warnings.filterwarnings("ignore", "Numcodecs codecs are not in the Zarr version 3")
        ds = xr.open_dataset(zarr.storage.FsspecStore(fs, read_only=True), engine="zarr")
        ds2 = xr.open_zarr(zarr.storage.FsspecStore(fs, read_only=True))
    with xr.open_dataset(sorted(MONTHLY.glob("*.nc"))[0]) as truth:
        np.testing.assert_array_equal(ds.tas.values, truth.tas.values)
        np.testing.assert_array_equal(ds2.tas.values, truth.tas.values)
    assert refgrid.scan(out) == refgrid.scan(sorted(MONTHLY.glob("*.nc"))[0])


# -- 6. outputs whose readers need packages: declared -----------------------------------

def test_every_package_an_output_needs_is_in_a_user_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(d.startswith("fastparquet") for d in extras["kerchunk"])
    assert {"netCDF4", "ipykernel", "ipywidgets"} <= {
        d.split(">")[0].split("=")[0] for d in extras["notebooks"]}
    readme = (ROOT / "README.md").read_text()
    for extra in ("kerchunk", "notebooks"):
        assert f"pip install '.[{extra}]'" in readme, extra


# -- 7. Icechunk as documented -------------------------------------------------------------

def test_batch_icechunk_says_what_it_creates_and_reopening_reads_it(tmp_path):
    icechunk = pytest.importorskip("icechunk")
    from refgrid.writers.icechunk import local_repository

    sources = tmp_path / "data" / "archive"
    sources.mkdir(parents=True)
    files = [sources / p.name for p in sorted((FIXTURES / "netcdf3" / "classic").glob("*.nc"))]
    for f in files:
        f.write_bytes((FIXTURES / "netcdf3" / "classic" / f.name).read_bytes())
    out = tmp_path / "tas.icechunk"
    done = subprocess.run([sys.executable, "-m", "refgrid.cli", "batch", "-q", "--workers",
                           "1", "--icechunk", "-o", str(out), *map(str, files)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (f"created the Icechunk repository {out} with a virtual chunk container for "
            f"file://{sources.resolve()}/ (the sources' directory)") in done.stdout
    repo = local_repository(out)  # reopened later: the README's line
    ds = xr.open_zarr(repo.readonly_session("main").store, consolidated=False)
    expected = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals"))
    np.testing.assert_array_equal(ds.tas.values, expected.tas.values)
    assert isinstance(repo, icechunk.Repository)
    with pytest.raises(refgrid.WriteError, match="no Icechunk repository there"):
        local_repository(tmp_path / "nothing")


def test_batch_without_its_extra_creates_no_repository(tmp_path):
    out = tmp_path / "tas.icechunk"
    code = ("import sys; sys.modules['dask'] = None; from refgrid.cli import main; "
            f"main(['batch', '--icechunk', '-o', {str(out)!r}, {str(MONTHLY)!r} + '/*.nc'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0 and "'batch' extra" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


# -- 8. messages in a person's words -------------------------------------------------------

def test_a_batch_where_every_file_failed_says_why(tmp_path):
    bad = [tmp_path / f"bad{i}.nc" for i in range(4)]
    for path in bad:
        path.write_bytes(b"not a netCDF file at all")
    with pytest.raises(refgrid.BatchError) as caught:
        refgrid.batch([str(p) for p in bad], tmp_path / "out.json", on_error="report",
                      scheduler="synchronous", progress=False)
    message = str(caught.value)
    assert "no file could be scanned (4 failed): " in message
    assert f"{bad[0]}: " in message and "and 1 more" in message and "report.json" in message


def test_report_lines_summarise_repeated_notes():
    files = sorted(MONTHLY.glob("*.nc"))
    group = refgrid.combine(files, "time")  # every file has its own title
    conflicts = [e for e in group.report if e.action == "attribute-conflict"]
    assert len(conflicts) == 11
    from refgrid.core.reprs import report_lines

    lines = report_lines(group.report)
    assert len(lines) == 1, lines
    assert lines[0].startswith("/@title: attribute-conflict in 11 files (tas_200102.nc, "
                               "tas_200103.nc, tas_200104.nc, ... (8 more)): kept ")
    result = CliRunner().invoke(main, ["combine", *map(str, files), "-o", "/dev/null",
                                       "--report", "--padded", "encoded"])
    assert result.output.count("attribute-conflict") == 1, result.output


def test_materialize_draws_no_progress_bar_into_logs(tmp_path):
    refs = refgrid.write(refgrid.combine(sorted(MONTHLY.glob("*.nc"))[:2], "time"),
                         tmp_path / "refs.json")
    done = subprocess.run([sys.executable, "-m", "refgrid.cli", "materialize", str(refs),
                           str(tmp_path / "copy.zarr")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "materialize:" not in done.stderr and "block/s" not in done.stderr, done.stderr


def test_inspect_shows_the_time_range(tmp_path):
    refs = refgrid.write(refgrid.combine(sorted(MONTHLY.glob("*.nc")), "time"),
                         tmp_path / "refs.json")
    result = CliRunner().invoke(main, ["inspect", str(refs)])
    assert "  time: 2001-01-01 to 2001-12-31 (365 steps)" in result.output, result.output
    result = CliRunner().invoke(main, ["inspect", str(refs), "--json"])
    assert json.loads(result.output)["time_ranges"] == {
        "time": {"first": "2001-01-01", "last": "2001-12-31", "steps": 365}}


def test_advise_says_when_the_array_is_far_below_the_chunk_size(tmp_path):
    refs = refgrid.write(refgrid.combine(sorted(MONTHLY.glob("*.nc")), "time"),
                         tmp_path / "refs.json")
    result = CliRunner().invoke(main, ["advise", str(refs)])
    assert "note: the whole array is 0.07 MiB, far below the 10.00 MiB aimed at" in \
        result.output, result.output
    assert "times the bytes it wants" in result.output and "x bytes" not in result.output
    assert "far below" not in CliRunner().invoke(main, ["advise", str(refs), "--size",
                                                        "32KiB"]).output


def test_changed_files_are_reported_with_dates(tmp_path):
    from refgrid.core.sources import identity_difference

    said = identity_difference({"size": 10, "mtime": 1795561642.66},
                               {"size": 12, "mtime": 1795561647.7})
    assert said == ("size 10 bytes, now 12 bytes; modified 2026-11-24 23:07:22.660 UTC, now "
                    "2026-11-24 23:07:27.700 UTC")


def test_the_troubleshooting_section_names_every_error_above():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Troubleshooting", 1)[1].split("\n## ", 1)[0]
    for said in ("--allow-source", "glob pattern", "rectilinear_chunks", "MissingExtraError",
                 "authorize", "consolidated", "PYTHON="):
        assert said in section, said
    assert Path(ROOT / "notebooks").is_dir()

"""A plain ``pip install`` (no extras) into a fresh virtual environment: ``refgrid demo``
runs anywhere (it writes its own inputs), the lines it prints run without a warning, nothing
optional is needed, and a remote URL names the extra it needs."""

from __future__ import annotations

import os
import subprocess
import sys
import venv

import pytest

from helpers import ROOT

NUMCODECS_NOTICE = "Numcodecs codecs are not in the Zarr version 3 specification"
"""zarr 3.1's notice on every array whose codecs are numcodecs' (HDF5's deflate has no Zarr v3
core codec; zarr >= 3.2 says nothing): the only warning allowed, and only there."""


@pytest.mark.slow
def test_plain_install_runs_the_demo_and_names_missing_extras(tmp_path):
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    str(ROOT)], check=True, env=environ, timeout=900)
    anywhere = tmp_path / "anywhere"
    anywhere.mkdir()
    demo = subprocess.run([env / "bin" / "refgrid", "demo", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=environ, timeout=300,
                          cwd=anywhere)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "writing a monthly archive of 2001" in demo.stdout
    assert (tmp_path / "out" / "tas_2001.json").is_file()
    assert len(list((tmp_path / "out" / "inputs").glob("*.nc"))) == 12
    snippet = demo.stdout.split("Open them with xarray:", 1)[1]
    code = "\n".join(line.removeprefix("    ") for line in snippet.splitlines())
    code += "\nprint(ds.tas.shape)"
    quiet = ["-W", "error", "-W", f"ignore:{NUMCODECS_NOTICE}"]  # zarr 3.1's, see below
    ran = subprocess.run([python, *quiet, "-c", code], capture_output=True, text=True,
                         env=environ, timeout=120, cwd=anywhere)
    zarr_version = subprocess.run([python, "-c", "import zarr; print(zarr.__version__)"],
                                  capture_output=True, text=True, env=environ).stdout
    if tuple(map(int, zarr_version.split(".")[:2])) >= (3, 2):
        assert ran.returncode == 0 and "(365, 6, 8)" in ran.stdout, ran.stderr
    else:  # zarr 3.1 (Python 3.11) reads no rectilinear grid: all but that line run
        assert "rectilinear" in ran.stderr.lower() or "chunk_grid" in ran.stderr, ran.stderr
        rest = "\n".join(line for line in code.splitlines() if "zarr >= 3.2" not in line)
        assert rest != code, "the demo no longer marks the line that needs zarr >= 3.2"
        ran = subprocess.run([python, *quiet, "-c", rest], capture_output=True,
                             text=True, env=environ, timeout=120, cwd=anywhere)
        assert ran.returncode == 0 and "(365, 6, 8)" in ran.stdout, ran.stderr
    probe = subprocess.run([python, "-c", """
import sys
import refgrid
for extra in ("s3fs", "aiohttp", "netCDF4", "dask", "kerchunk"):
    try:
        __import__(extra)
    except ImportError:
        print("absent", extra)
try:
    refgrid.scan("s3://bucket/tas.nc")
except refgrid.MissingExtraError as e:
    print("error", e)
import refgrid.serve
try:
    refgrid.serve.make_app(".")
except refgrid.MissingExtraError as e:
    print("error", e)
"""], capture_output=True, text=True, env=environ, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.count("absent") == 5, probe.stdout
    assert "needs the 'remote' extra" in probe.stdout
    assert "pip install 'refgrid[remote]'" in probe.stdout
    assert "needs the 'serve' extra" in probe.stdout
    assert sys.version_info >= (3, 11)

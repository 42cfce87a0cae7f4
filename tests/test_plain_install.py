"""A plain ``pip install`` (no extras) into a fresh virtual environment: ``refgrid demo``
runs, nothing optional is needed, and a remote URL names the extra it needs."""

from __future__ import annotations

import os
import subprocess
import sys
import venv

import pytest

from helpers import FIXTURES, ROOT


@pytest.mark.slow
def test_plain_install_runs_the_demo_and_names_missing_extras(tmp_path):
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    str(ROOT)], check=True, env=environ, timeout=900)
    demo = subprocess.run([env / "bin" / "refgrid", "demo", str(FIXTURES), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, env=environ,
                          timeout=300)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert (tmp_path / "out" / "tas_2001.json").is_file()
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

"""materialize: a virtual dataset copied into a real regular Zarr v3 store — values and
``xr.open_zarr`` equal to the engine's dataset, resumable after SIGKILL without rewriting
what was done, on a LocalCluster too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

import refgrid
from helpers import QUIET_CLUSTER
from refgrid.cli import main
from refgrid.materializing import JOURNAL, materialize
from tests.combining.test_combine import ARCHIVES, _files


def _refs(archive: str, tmp_path: Path) -> Path:
    group = refgrid.combine([refgrid.scan(f) for f in _files(archive)], "time")
    return refgrid.write(group, tmp_path / "refs.json")


def _assert_same(store: Path, refs: Path) -> None:
    ours = xr.open_zarr(store).load()
    expected = xr.open_dataset(refs, engine="refgrid").load()
    xr.testing.assert_identical(ours, expected)
    for name, var in expected.variables.items():
        assert ours[name].dtype == var.dtype, name


@pytest.mark.parametrize("chunks", ["auto", {"time": 30}])
@pytest.mark.parametrize("archive", ARCHIVES)
def test_every_archive_materializes_equal_to_the_engine(archive, chunks, tmp_path):
    refs = _refs(archive, tmp_path)
    result = materialize(refs, tmp_path / "out.zarr", chunks, progress=False)
    _assert_same(tmp_path / "out.zarr", refs)
    assert (tmp_path / "out.zarr" / JOURNAL / "complete.json").is_file()
    assert result.written == result.blocks and result.skipped == 0
    if chunks != "auto":
        assert result.chunks["tas"][0] == 30
        assert xr.open_zarr(tmp_path / "out.zarr")["tas"].encoding["chunks"][0] == 30
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "out.zarr")["tas"].values,
                                  _netcdf4_tas(archive))


def _netcdf4_tas(archive: str) -> np.ndarray:
    """The archive's tas as netCDF4 reads (and unpacks) its files: the ground truth."""
    parts = []
    for f in _files(archive):
        with netCDF4.Dataset(f) as nc:
            values = nc["tas"][...]
            parts.append(np.ma.filled(values.astype(values.dtype.newbyteorder("="))
                                      if values.dtype.kind == "f" else values, np.nan))
    return np.concatenate(parts)


def test_a_second_run_of_a_finished_copy_does_nothing(tmp_path):
    refs = _refs("monthly/chunk10", tmp_path)
    first = materialize(refs, tmp_path / "out.zarr", {"time": 30}, progress=False)
    again = materialize(refs, tmp_path / "out.zarr", {"time": 30}, progress=False)
    assert again.written == 0 and again.skipped == first.blocks
    with pytest.raises(refgrid.WriteError, match="overwrite"):
        materialize(refs, tmp_path / "out.zarr", {"time": 10}, progress=False)
    redone = materialize(refs, tmp_path / "out.zarr", {"time": 10}, progress=False,
                         overwrite=True)
    assert redone.chunks["tas"][0] == 10
    _assert_same(tmp_path / "out.zarr", refs)


def _big_source(tmp_path: Path) -> Path:
    path = tmp_path / "big.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", 3000)
        nc.createDimension("x", 40)
        nc.createDimension("y", 40)
        t = nc.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01"
        t[:] = np.arange(3000)
        v = nc.createVariable("tas", "f4", ("time", "x", "y"), zlib=True, chunksizes=(10, 40, 40),
                              fill_value=-999.0)
        v[:] = np.random.default_rng(1).normal(280, 10, (3000, 40, 40)).astype("f4")
    return path


def test_killed_mid_copy_then_rerun_is_complete_and_equal_without_rewrites(tmp_path):
    source = _big_source(tmp_path)
    refs = refgrid.write(refgrid.scan(source), tmp_path / "big.json")
    store = tmp_path / "out.zarr"
    code = (f"from refgrid.materializing import materialize\n"
            f"if __name__ == '__main__':\n"
            f"    materialize({str(refs)!r}, {str(store)!r}, {{'time': 5}}, progress=False, "
            f"block_bytes=1, workers=1)\n")
    child = subprocess.Popen([sys.executable, "-c", code])
    done = store / JOURNAL / "done"
    deadline = time.time() + 120
    while time.time() < deadline and child.poll() is None:
        if done.is_dir() and len(os.listdir(done)) >= 40:
            break
        time.sleep(0.005)
    assert child.poll() is None, "the copy finished before it could be killed"
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert not (store / JOURNAL / "complete.json").exists()
    finished = set(os.listdir(done))
    assert 40 <= len(finished) < 600
    chunk_files = {p: p.stat().st_mtime_ns for p in (store / "tas" / "c").rglob("*")
                   if p.is_file()}
    result = materialize(refs, store, {"time": 5}, progress=False, block_bytes=1)
    assert result.skipped == len(finished) and result.written == result.blocks - len(finished)
    kept = [p for p, m in chunk_files.items() if p.stat().st_mtime_ns == m]
    assert chunk_files and len(kept) >= len(chunk_files) - 1  # (one block may have been
    # written but not recorded when it was killed: that one is written again)
    _assert_same(store, refs)
    with netCDF4.Dataset(source) as nc:
        nc.set_auto_maskandscale(False)
        np.testing.assert_array_equal(
            xr.open_zarr(store, mask_and_scale=False)["tas"].values, nc["tas"][...])
    assert "tas" not in result.by_xarray


def test_through_a_local_cluster(tmp_path):
    from distributed import Client, LocalCluster

    refs = _refs("yearly/chunk73", tmp_path)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      **QUIET_CLUSTER) as cluster, Client(cluster) as client:
        result = materialize(refs, tmp_path / "out.zarr", {"time": 50}, scheduler=client,
                             progress=False, block_bytes=1)
    assert result.blocks > 2 and result.written == result.blocks
    _assert_same(tmp_path / "out.zarr", refs)


def test_by_address_the_client_made_for_the_job_is_closed(tmp_path):
    """A scheduler address gets a Client of the job's own, closed when it ends (the
    scheduler then counts no client); a caller's Client is left open."""
    from distributed import Client, LocalCluster

    refs = _refs("yearly/chunk73", tmp_path)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      **QUIET_CLUSTER) as cluster:
        materialize(refs, tmp_path / "a.zarr", {"time": 50}, block_bytes=1,
                    scheduler=cluster.scheduler_address, progress=False)
        assert cluster.scheduler.clients == {} or set(cluster.scheduler.clients) <= {
            "fire-and-forget"}
        with Client(cluster) as client:
            materialize(refs, tmp_path / "b.zarr", {"time": 50}, scheduler=client,
                        progress=False)
            assert client.status == "running"
    _assert_same(tmp_path / "a.zarr", refs)


def test_cli_materializes_with_progress_and_names_bad_chunks(tmp_path):
    refs = _refs("monthly/chunk10", tmp_path)
    runner = CliRunner()
    ok = runner.invoke(main, ["materialize", str(refs), str(tmp_path / "out.zarr"),
                              "--chunks", "time:30", "--no-progress"])
    assert ok.exit_code == 0, ok.output
    _assert_same(tmp_path / "out.zarr", refs)
    bad = runner.invoke(main, ["materialize", str(refs), str(tmp_path / "b.zarr"),
                               "--chunks", "height:3"])
    assert bad.exit_code == 1 and "no dimension 'height'" in bad.output
    assert not (tmp_path / "b.zarr").exists()
    garbled = runner.invoke(main, ["materialize", str(refs), str(tmp_path / "c.zarr"),
                                   "--chunks", "time=3"])
    assert garbled.exit_code == 2 and "--chunks" in garbled.output

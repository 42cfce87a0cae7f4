"""Reliability under network faults: a fault-injecting proxy (tests/support/faults.py) between
refgrid and the local HTTP and S3 servers. Scan, engine read, mapper read, batch and serve
through it: every outcome is the values netCDF4 reads from the files, or a named refgrid error
within the timeout — never a hang, never wrong bytes, never a foreign exception."""

from __future__ import annotations

import re
import time
import warnings
from collections import Counter

import numpy as np
import pytest
import xarray as xr

import refgrid
from faults import every_other, first_of_each, start_proxy
from helpers import FIXTURES, QUIET_CLUSTER, RECTILINEAR, closed

MONTHS = ["monthly/chunk10/tas_200101.nc", "monthly/chunk10/tas_200102.nc"]
QUICK = {"read_timeout": 1.0, "connect_timeout": 1.0, "attempts": 3, "retry_seconds": 10.0}
"""Short timeouts, so that a stalled source is given up in seconds."""


@pytest.fixture(scope="module")
def proxy(http_server):
    yield from start_proxy(http_server.url)


@pytest.fixture(autouse=True)
def quick(request):
    if "proxy" in request.fixturenames:  # each test starts with a well server
        request.getfixturevalue("proxy").reset()
    with refgrid.limits(**QUICK):
        yield


def _truth(relative: str) -> xr.Dataset:
    return closed(xr.open_dataset(FIXTURES / relative, engine="netcdf4", mask_and_scale=False))


def _read_everything(url: str) -> xr.Dataset:
    """Scan, then read every variable with the engine and through the mapper."""
    refs = refgrid.to_kerchunk(refgrid.scan(url))
    ours = xr.open_dataset(refs, engine="refgrid", mask_and_scale=False).load()
    view = xr.open_dataset(refgrid.get_mapper(refs), engine="zarr", mask_and_scale=False)
    for key in ours.variables:
        np.testing.assert_array_equal(view[key].values, ours[key].values, err_msg=key)
    return ours


def _tas(refs: dict, **kwargs) -> np.ndarray:
    """``tas`` read through the engine (the coordinates left out: only its chunks read)."""
    return xr.open_dataset(refs, engine="refgrid", drop_variables=["time", "lat", "lon"],
                           **kwargs)["tas"].values


def _assert_like_truth(ours: xr.Dataset, relative: str) -> None:
    truth = _truth(relative)
    for key in truth.variables:
        np.testing.assert_array_equal(ours[key].values, truth[key].values, err_msg=key)


@pytest.mark.parametrize("fault", ["503", "500", "429", "reset", "truncate", "latency",
                                   "norange"])
def test_transient_faults_on_first_requests_read_exactly(proxy, fault):
    proxy.reset(first_of_each(fault, ("GET", "HEAD")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # norange: the whole-file warning
        ours = _read_everything(f"{proxy.url}/fixtures/{MONTHS[0]}")
    _assert_like_truth(ours, MONTHS[0])
    assert any(f == fault for _, _, f in proxy.log), proxy.log


def test_a_server_failing_every_other_request_reads_exactly(proxy):
    """The acceptance case: 503 to every other request."""
    proxy.reset(every_other("503"))
    for relative in MONTHS:
        _assert_like_truth(_read_everything(f"{proxy.url}/fixtures/{relative}"), relative)
    assert sum(f == "503" for _, _, f in proxy.log) >= 3


def test_a_persistent_5xx_is_a_named_error_counting_the_attempts(proxy):
    url = f"{proxy.url}/fixtures/{MONTHS[0]}"
    refs = refgrid.to_kerchunk(refgrid.scan(url))  # scanned while the server is well
    proxy.reset(lambda n, method, path: "503")
    started = time.monotonic()
    with pytest.raises(refgrid.ReadError, match=r"tas_200101\.nc.*HTTP 503 Service "
                                                r"Unavailable \(3 attempts over"):
        _tas(refs)
    with pytest.raises(refgrid.ScanError, match=r"tas_200101\.nc.*503.*3 attempts"):
        refgrid.scan(url)
    assert time.monotonic() - started < 10


def test_a_stalled_source_is_a_named_error_within_the_timeout(proxy):
    url = f"{proxy.url}/fixtures/{MONTHS[1]}"
    refs = refgrid.to_kerchunk(refgrid.scan(url))
    proxy.reset(lambda n, method, path: "stall")
    started = time.monotonic()
    with pytest.raises(refgrid.ScanError, match=r"tas_200102\.nc.*read timeout"):
        refgrid.scan(url)
    with pytest.raises(refgrid.ReadError, match=r"tas_200102\.nc.*no bytes for 1 s \(read "
                                                r"timeout\)"):
        _tas(refs)
    assert time.monotonic() - started < 60  # two errors of a few 1 s attempts each: no hang


def test_a_reset_on_every_request_is_a_named_error(proxy):
    url = f"{proxy.url}/fixtures/{MONTHS[0]}"
    refs = refgrid.to_kerchunk(refgrid.scan(url))
    proxy.reset(lambda n, method, path: "reset" if method == "GET" else None)
    with pytest.raises(refgrid.ReadError, match=r"tas_200101\.nc.*3 attempts"):
        _tas(refs)


def test_a_combined_archive_reads_exactly_through_bursts(proxy):
    urls = [f"{proxy.url}/fixtures/{r}" for r in MONTHS]
    proxy.reset(every_other("502"))
    group = refgrid.combine(urls, "time")
    ours = xr.open_dataset(refgrid.to_kerchunk(group), engine="refgrid").load()
    expected = closed(xr.open_mfdataset([FIXTURES / r for r in MONTHS], combine="nested",
                                 concat_dim="time", data_vars="minimal", compat="equals"))
    for key in expected.variables:
        np.testing.assert_array_equal(ours[key].values, expected[key].values, err_msg=key)


def test_a_batch_with_a_stalled_source_finishes_reporting_it(proxy, tmp_path):
    urls = [f"{proxy.url}/fixtures/monthly/chunk10/tas_2001{m:02d}.nc" for m in (1, 2, 3)]
    proxy.reset(lambda n, method, path: "stall" if "200102" in path else None)
    started = time.monotonic()
    result = refgrid.batch(urls, tmp_path / "out.json", scheduler="synchronous",
                           progress=False, on_error="report",
                           storage_options={"client_kwargs": {}})
    assert time.monotonic() - started < 60
    assert [f.url for f in result.failed] == [urls[1]]
    assert "read timeout" in result.failed[0].message, result.failed[0].message
    ds = xr.open_dataset(result.output, engine="refgrid")
    assert ds.sizes["time"] == 31 + 31


def test_s3_through_bursts_reads_exactly(s3_server, monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    url = s3_server.upload(FIXTURES / MONTHS[0], "faults/tas_200101.nc")
    proxies = start_proxy(s3_server.endpoint)
    proxy = next(proxies)
    try:
        options = {**s3_server.storage_options, "endpoint_url": proxy.url}
        proxy.reset(every_other("503"))
        refs = refgrid.to_kerchunk(refgrid.scan(url, **options))
        ours = xr.open_dataset(refs, engine="refgrid", mask_and_scale=False,
                               storage_options=options).load()
        _assert_like_truth(ours, MONTHS[0])
        assert any(f == "503" for _, _, f in proxy.log)
        proxy.reset(lambda n, method, path: "503")
        with pytest.raises(refgrid.ReadError, match=r"s3://.*tas_200101\.nc"):
            _tas(refs, storage_options=options)
    finally:
        next(proxies, None)


def test_serve_reads_its_sources_through_bursts(proxy, tmp_path):
    from servers import start_refgrid_serve

    refs = tmp_path / "root"
    refgrid.write(refgrid.scan(f"{proxy.url}/fixtures/{MONTHS[0]}"), refs / "jan.json")
    served = start_refgrid_serve(refs, allow_sources=(proxy.url,), recheck=0.0)
    server = next(served)
    try:
        import fsspec

        proxy.reset(every_other("503"))
        ours = xr.open_dataset(fsspec.get_mapper(f"{server.url}/jan/regular"), engine="zarr",
                               mask_and_scale=False)
        _assert_like_truth(ours.load(), MONTHS[0])
    finally:
        next(served, None)


# -- a per-file deadline in batch workers ---------------------------------------------------

def _archive_with_a_hang(tmp_path):
    """Three monthly files and, between them, a FIFO named like one: opening it blocks in C
    until a writer comes, as a stuck file system or a hung library does — no timeout inside
    the scan can end it."""
    import os
    import shutil

    folder = tmp_path / "archive"
    folder.mkdir()
    for month in (1, 3, 4):
        shutil.copy(FIXTURES / "monthly" / "chunk10" / f"tas_2001{month:02d}.nc", folder)
    os.mkfifo(folder / "tas_200102.nc")
    return sorted(str(p) for p in folder.iterdir())


def test_a_hung_scan_is_stopped_and_its_worker_replaced(tmp_path):
    import psutil

    files = _archive_with_a_hang(tmp_path)
    started = time.monotonic()
    result = refgrid.batch(files, tmp_path / "out.json", workers=2, file_timeout=3,
                           progress=False)
    assert time.monotonic() - started < 90
    assert [f.url for f in result.failed] == [files[1]]
    assert "timed out after 3 s" in result.failed[0].message
    assert "its worker process was replaced" in result.failed[0].message
    workers = [c for c in psutil.Process().children(recursive=True)
               if "spawn_main" in " ".join(c.cmdline())]  # not multiprocessing's tracker
    assert result.scanned == 3 and not workers, workers
    ds = xr.open_dataset(result.output, engine="refgrid")
    assert ds.sizes["time"] == 31 + 31 + 30
    again = refgrid.batch(files, tmp_path / "out.json", workers=2, file_timeout=3,
                          progress=False)  # resumed: only the hung file is tried again
    assert again.reused == 3 and [f.url for f in again.failed] == [files[1]]


def test_the_cli_reports_a_hung_file_and_fails_unless_allowed(tmp_path):
    import subprocess
    import sys

    files = _archive_with_a_hang(tmp_path)
    cli = [sys.executable, "-m", "refgrid.cli", "batch", "-q", "--workers", "2",
           "--file-timeout", "3", "-o", str(tmp_path / "out.json"), *files]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "timed out after 3 s" in done.stderr and "1 of 4 files" in done.stderr
    done = subprocess.run([*cli, "--allow-failures"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_a_hung_scan_on_a_cluster_gives_up_only_that_file(tmp_path):
    distributed = pytest.importorskip("distributed")
    files = _archive_with_a_hang(tmp_path)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", **QUIET_CLUSTER) as cluster, \
            distributed.Client(cluster) as client:
        result = refgrid.batch(files, tmp_path / "out.json", scheduler=client,
                               file_timeout=2, progress=False)
    assert [f.url for f in result.failed] == [files[1]]
    assert "timed out after 2 s" in result.failed[0].message
    assert xr.open_dataset(result.output, engine="refgrid").sizes["time"] == 92


def test_the_zarr_store_reads_exactly_through_bursts(proxy, tmp_path):
    """refgrid.open_store over HTTP sources behind the proxy (503 to every other request):
    stock zarr reads the values netCDF4 reads."""
    import zarr

    urls = [f"{proxy.url}/fixtures/{r}" for r in MONTHS]
    refs = refgrid.write(refgrid.combine(urls, "time"), tmp_path / "refs.json")
    proxy.reset(every_other("503"))
    with zarr.config.set(refgrid.zarr_config()):  # zarr 3.1 reads the regular view
        store = refgrid.open_store(refs, chunks="native" if RECTILINEAR
                                   else "auto")
        tas = zarr.open_group(store, mode="r")["tas"][...]
    expected = closed(xr.open_mfdataset([FIXTURES / r for r in MONTHS], combine="nested",
                                 concat_dim="time", data_vars="minimal", compat="equals",
                                 mask_and_scale=False))
    np.testing.assert_array_equal(tas, expected["tas"].values)
    assert sum(f == "503" for _, _, f in proxy.log) >= 1


def test_a_stall_is_retried_once_where_a_503_is_retried_every_attempt(proxy):
    """A stalled request costs a whole timeout per attempt: two attempts, not ``attempts``."""
    url = f"{proxy.url}/fixtures/{MONTHS[1]}"
    proxy.reset(lambda n, method, path: "stall")
    with pytest.raises(refgrid.ScanError, match=r"read timeout\) \(2 attempts"):
        refgrid.scan(url)
    proxy.reset(lambda n, method, path: "503")
    with pytest.raises(refgrid.ScanError, match=r"503.*\(3 attempts"):
        refgrid.scan(url)


STALLED = 2.0
"""The read timeout of the stalled-source tests: long against the time a scan or read takes
besides waiting, so that two read timeouts and four are told apart with room to spare."""


def _attempts(proxy) -> Counter[str]:
    """The stalled requests the server saw, by method."""
    return Counter(method for method, _, fault in proxy.log if fault == "stall")


def test_a_stalled_source_ends_within_two_read_timeouts(proxy):
    """Each attempt at a stalled source costs a whole read timeout, and two are allowed. Two,
    not four: aiohttp sends an idempotent request again, once, when its handler raises one of
    its connection errors (as refgrid's retries once did at the end), and fsspec asks a file's
    ``info`` again with a GET after a HEAD failed — so a scan or read of a stalled file took
    four to eight read timeouts. Counted at the server, and timed (three read timeouts: the
    rest of a scan or read takes far less)."""
    url = f"{proxy.url}/fixtures/{MONTHS[1]}"
    refs = refgrid.to_kerchunk(refgrid.scan(url))
    with refgrid.limits(read_timeout=STALLED, attempts=4, retry_seconds=60.0):
        proxy.reset(lambda n, method, path: "stall")
        started = time.monotonic()
        with pytest.raises(refgrid.ScanError, match=rf"{re.escape(url)}.*no bytes for 2 s "
                                                    r"\(read timeout\) \(2 attempts"):
            refgrid.scan(url)
        assert time.monotonic() - started < 3 * STALLED
        assert _attempts(proxy) == {"GET": 2}, proxy.log
        proxy.reset(lambda n, method, path: "stall")
        started = time.monotonic()
        with pytest.raises(refgrid.ReadError, match=rf"{re.escape(url)}.*read timeout"):
            _tas(refs)  # its chunks and, concurrently, its identity (a HEAD)
        assert time.monotonic() - started < 3 * STALLED
        attempts = _attempts(proxy)
        assert attempts["HEAD"] <= 2 and attempts["GET"] <= 2, proxy.log


@pytest.mark.parametrize("scheduler", ["synchronous", "threads", "processes"])
def test_a_batch_gives_a_stalled_file_two_read_timeouts_with_every_scheduler(
        proxy, tmp_path, scheduler):
    """The read timeout set with ``refgrid.limits`` holds in a batch's worker processes too
    (they knew the environment's alone, 30 s), and a stalled file is given up after its two
    attempts, each one read timeout long: the only requests it gets."""
    urls = [f"{proxy.url}/fixtures/monthly/chunk10/tas_2001{m:02d}.nc" for m in (1, 2, 3)]
    proxy.reset(lambda n, method, path: "stall" if "200102" in path else None)
    with refgrid.limits(read_timeout=STALLED, attempts=4, retry_seconds=60.0):
        result = refgrid.batch(urls, tmp_path / "out.json", scheduler=scheduler,
                               workers=None if scheduler == "synchronous" else 2,
                               progress=False)
    assert [f.url for f in result.failed] == [urls[1]]
    assert re.search(rf"{re.escape(urls[1])}.*no bytes for 2 s \(read timeout\) \(2 "
                     "attempts", result.failed[0].message), result.failed[0].message
    assert sum(_attempts(proxy).values()) == 2, proxy.log
    with xr.open_dataset(result.output, engine="refgrid") as ds:
        assert ds.sizes["time"] == 31 + 31


def test_a_synchronous_batch_keeps_the_per_file_deadline(proxy, tmp_path):
    """In this process too: a stalled file (here 2 attempts of 5 s each) is given up at a
    two-second deadline and the batch goes on; the next file waits for the thread left
    behind (which may hold libhdf5's lock) rather than fail with it."""
    urls = [f"{proxy.url}/fixtures/monthly/chunk10/tas_2001{m:02d}.nc" for m in (1, 2, 3)]
    proxy.reset(lambda n, method, path: "stall" if "200102" in path else None)
    started = time.monotonic()
    with refgrid.limits(read_timeout=5.0, attempts=4, retry_seconds=60.0):
        result = refgrid.batch(urls, tmp_path / "out.json", scheduler="synchronous",
                               progress=False, file_timeout=2)
    assert time.monotonic() - started < 40
    assert [(f.url, f.error) for f in result.failed] == [(urls[1], "TimeoutError")]
    assert "timed out after 2 s" in result.failed[0].message
    with xr.open_dataset(result.output, engine="refgrid") as ds:
        assert ds.sizes["time"] == 31 + 31

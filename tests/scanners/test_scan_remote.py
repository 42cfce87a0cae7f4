"""Scanning over S3 (moto's server) and HTTP (a local server): same model, few requests."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import refgrid
from acceptance import stock_zarr_group
from ground_truth import ground_truth, restore, same
from helpers import FIXTURES
from refgrid.scanners import source
from refgrid.writers.references import to_kerchunk

FILES = ["monthly/chunk10/tas_200101.nc", "features/hdf5_filters.h5",
         "features/netcdf4_features.nc"]


def _same_model_except_urls(remote, local, url):
    """The remote scan equals the local one, with the remote URL in every manifest."""
    for (path, a), (_, b) in zip(remote.walk(), local.walk(), strict=True):
        if isinstance(a, refgrid.VirtualArray):
            assert set(a.manifest.paths) <= {url}, path
            assert np.array_equal(a.manifest.offset, b.manifest.offset), path
            assert np.array_equal(a.manifest.length, b.manifest.length), path
            assert dict(a.manifest.inline) == dict(b.manifest.inline), path
            assert a.grid == b.grid and a.dtype == b.dtype and a.dims == b.dims, path


@pytest.mark.parametrize("name", FILES)
def test_s3_scan_matches_local_and_reads_back(s3_server, name):
    url = s3_server.upload(FIXTURES / name, name)
    s3_server.counter.reset()
    remote = refgrid.scan(url, **s3_server.storage_options)
    requests = len(s3_server.counter)
    assert requests <= 4, s3_server.counter.requests  # size + one whole-file fetch (+ sniff)
    _same_model_except_urls(remote, refgrid.scan(FIXTURES / name), url)
    group = stock_zarr_group(to_kerchunk(remote), "s3", s3_server.storage_options)
    truth = ground_truth(FIXTURES / name)
    for path, node in remote.walk():
        if isinstance(node, refgrid.VirtualArray) and node.grid.is_regular:
            assert same(restore(group[path][...], dict(node.attrs)), truth[path]), path


def test_large_remote_files_are_read_through_a_block_cache(s3_server, monkeypatch):
    """Above the whole-file limit the scan reads big blocks, not thousands of small ranges."""
    name = "features/netcdf4_features.nc"
    url = s3_server.upload(FIXTURES / name, "large/" + name)
    monkeypatch.setattr(source, "WHOLE_FILE_LIMIT", 0)
    monkeypatch.setattr(source, "BLOCK_SIZE", 8192)
    s3_server.counter.reset()
    remote = refgrid.scan(url, **s3_server.storage_options)
    size = (FIXTURES / name).stat().st_size
    assert len(s3_server.counter) <= 3 + size // 8192 + 1, s3_server.counter.requests
    heads = [r for r in s3_server.counter.requests if r.startswith("HEAD")]
    assert len(heads) == 1, s3_server.counter.requests  # the file object is handed it
    _same_model_except_urls(remote, refgrid.scan(FIXTURES / name), url)


def test_http_scan(http_server):
    name = "monthly/chunk10/tas_200102.nc"
    url = f"{http_server.url}/fixtures/{name}"
    http_server.counter.reset()
    remote = refgrid.scan(url)
    assert len(http_server.counter) <= 4, http_server.counter.requests
    _same_model_except_urls(remote, refgrid.scan(FIXTURES / name), url)
    tas = stock_zarr_group(to_kerchunk(remote), "http")["tas"][...]
    with h5py.File(FIXTURES / name) as f:
        np.testing.assert_array_equal(tas, f["tas"][...])


def test_missing_remote_file_names_the_url(http_server):
    with pytest.raises(refgrid.ScanError, match=r"fixtures/absent\.nc: No such file or directory"):
        refgrid.scan(f"{http_server.url}/fixtures/absent.nc")

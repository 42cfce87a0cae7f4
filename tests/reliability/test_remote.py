"""Reliability, remote sources: servers that misbehave give correct data or a named error.

Every server is local (127.0.0.1)."""

from __future__ import annotations

import json
import shutil
import time
import warnings

import numpy as np
import pytest
import xarray as xr

import refgrid
from helpers import FIXTURES, closed
from refgrid.read.fetch import RangeIgnoredWarning

NETCDF3 = "netcdf3/classic/tas_200101.nc"


@pytest.fixture(scope="module")
def range_ignoring_server(tmp_path_factory):
    """Answers every request with the whole file and status 200, as python -m http.server."""
    from servers import start_http

    root = tmp_path_factory.mktemp("plain")
    shutil.copytree(FIXTURES / "netcdf3", root / "netcdf3")
    yield from start_http(root, ignore_range=True)


def test_server_that_ignores_range_gives_correct_values(range_ignoring_server, tmp_path):
    """NetCDF3 values were silently wrong: the whole-file answer was sliced as the range."""
    url = f"{range_ignoring_server.url}/{NETCDF3}"
    expected = xr.open_dataset(FIXTURES / NETCDF3, engine="refgrid").load()
    refs = refgrid.write(refgrid.scan(url), tmp_path / "refs.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = xr.open_dataset(refs, engine="refgrid").load()
        mapped = xr.open_dataset(refgrid.get_mapper(refs), engine="zarr",
                                 consolidated=True).load()
    for name in expected.data_vars:
        np.testing.assert_array_equal(ours[name].values, expected[name].values)
        np.testing.assert_array_equal(mapped[name].values, expected[name].values)
    assert any(issubclass(w.category, RangeIgnoredWarning) for w in caught)


def test_an_s3_object_replaced_after_scanning_is_a_read_error(s3_server, tmp_path):
    """An S3 object overwritten with other bytes of the same size decoded silently."""
    url = s3_server.upload(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc",
                           "changing/tas.nc")
    group = refgrid.scan(url, **s3_server.storage_options)
    assert group.sources[url]["etag"]
    refs = refgrid.write(group, tmp_path / "refs.json")
    options = {"storage_options": s3_server.storage_options}
    np.testing.assert_array_equal(
        xr.open_dataset(refs, engine="refgrid", **options)["tas"].values,
        closed(xr.open_dataset(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"))["tas"].values)
    other = tmp_path / "other.nc"
    data = bytearray((FIXTURES / "monthly" / "chunk10" / "tas_200101.nc").read_bytes())
    data[-100:] = bytes(100)
    other.write_bytes(bytes(data))  # the same size, other bytes
    s3_server.upload(other, "changing/tas.nc")
    with pytest.raises(refgrid.ReadError, match=r"tas\.nc: the source changed.*ETag "):
        xr.open_dataset(refs, engine="refgrid", **options)["tas"].values  # noqa: B018


@pytest.fixture(scope="module")
def dying_server(tmp_path_factory):
    """Sends 100 bytes of every body, then drops the connection."""
    from servers import start_http

    root = tmp_path_factory.mktemp("dying")
    shutil.copytree(FIXTURES / "netcdf3", root / "netcdf3")
    yield from start_http(root, die_after=100)


def test_a_server_dying_mid_read_is_a_read_error(dying_server, tmp_path):
    local = refgrid.scan(FIXTURES / NETCDF3)
    url = f"{dying_server.url}/{NETCDF3}"
    refs = refgrid.to_kerchunk(local)
    moved = json.loads(json.dumps(refs).replace(str(FIXTURES / NETCDF3), url))
    moved.pop("refgrid")  # no identity check: the read itself must notice
    start = time.perf_counter()
    broken = r"array '\w+'.*tas_200101\.nc.*(not completed|short)"
    with pytest.raises(refgrid.ReadError, match=broken):
        xr.open_dataset(moved, engine="refgrid", decode_times=False)["tas"].values  # noqa: B018
    assert time.perf_counter() - start < 30

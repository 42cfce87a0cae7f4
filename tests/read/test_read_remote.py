"""Reading combined datasets whose sources live on S3 (moto's server) or HTTP (local)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import refgrid
from helpers import FIXTURES, closed

MONTHS = [f"monthly/chunkfile/tas_2001{m:02d}.nc" for m in (1, 2, 3)]


def _expected():
    return closed(xr.open_mfdataset([FIXTURES / m for m in MONTHS], combine="nested",
                             concat_dim="time", data_vars="minimal", compat="equals"))


def test_s3_archive_through_engine_and_mapper(s3_server, tmp_path):
    options = s3_server.storage_options
    urls = [s3_server.upload(FIXTURES / m, "read/" + m) for m in MONTHS]
    group = refgrid.combine([refgrid.scan(u, **options) for u in urls], "time",
                            storage_options=options)
    refs = refgrid.write(group, tmp_path / "s3.json")
    expected = _expected()

    s3_server.counter.reset()
    ours = xr.open_dataset(refs, engine="refgrid", storage_options=options)
    np.testing.assert_array_equal(ours.tas.values, expected.tas.values)
    reads = [r for r in s3_server.counter.requests if r.startswith("GET")]
    # one chunk per file, each a byte range: one request per file, plus the lat and lon
    # indexes xarray loads at open
    assert len(reads) <= len(urls) + 2, s3_server.counter.requests

    mapper = refgrid.get_mapper(refs, storage_options=options)
    via_zarr = xr.open_dataset(mapper, engine="zarr")
    np.testing.assert_array_equal(via_zarr.tas.values, expected.tas.values)


def test_http_archive_through_engine(http_server, tmp_path):
    urls = [f"{http_server.url}/fixtures/{m}" for m in MONTHS]
    refs = refgrid.write(refgrid.combine([refgrid.scan(u) for u in urls], "time"),
                         tmp_path / "http.json")
    http_server.counter.reset()
    ours = xr.open_dataset(refs, engine="refgrid")
    np.testing.assert_array_equal(ours.tas.values, _expected().tas.values)
    # a range request per file, and one HEAD per file checking it is the file scanned
    assert len(http_server.counter) <= 2 * len(urls) + 2, http_server.counter.requests
    fresh = xr.open_dataset(refs, engine="refgrid", cache=False)
    http_server.counter.reset()
    fresh.tas[40, 2, 3].values  # noqa: B018 (reading is the point)
    assert len(http_server.counter) == 2  # one chunk, one range; the file's identity check
    unchecked = xr.open_dataset(refs, engine="refgrid", cache=False, verify_sources=False)
    http_server.counter.reset()
    unchecked.tas[40, 2, 3].values  # noqa: B018
    assert len(http_server.counter) == 1


def test_missing_remote_source_is_a_read_error(http_server, tmp_path):
    url = f"{http_server.url}/fixtures/{MONTHS[0]}"
    group = refgrid.scan(url)
    refs = refgrid.to_kerchunk(group)
    broken = {**refs, "refs": {k: [v[0].replace("tas_200101", "gone"), *v[1:]]
                               if isinstance(v, list) else v for k, v in refs["refs"].items()}}
    with pytest.raises(refgrid.RefgridError, match=r"array 'time'.*gone\.nc"):
        xr.open_dataset(broken, engine="refgrid")  # index coordinates are read at open
    ds = xr.open_dataset(broken, engine="refgrid", drop_variables=["time", "lat", "lon"])
    with pytest.raises(refgrid.RefgridError, match=r"array 'tas', chunk tas/c/.*gone\.nc "
                                                   r"bytes \d+-\d+\): source file not found"):
        ds.tas.values  # noqa: B018

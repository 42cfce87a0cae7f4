"""NetCDF3 (CDF-1, CDF-2, CDF-5): values against netCDF4-python, record layouts, and headers
that are malformed on purpose."""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refgrid
from acceptance import check_file, refgrid_reader, stock_zarr_reader, table
from helpers import FIXTURES, netcdf3_files
from refgrid.errors import FormatError
from refgrid.read.array import read


def _check(files):
    for reader, can_read in ((refgrid_reader, lambda a: True),
                              (stock_zarr_reader, lambda a: a.grid.is_regular)):
        results = [check_file(p, reader, can_read) for p in files]
        print("\n" + table(results))
        assert all(r.status == "correct" for r in results), table(results)


def test_fixtures_equal_netcdf4(tmp_path):
    files = netcdf3_files(FIXTURES)
    assert {p.name for p in files} >= {"cdf5.nc", "single_byte_record.nc"}
    _check(files)


def test_corpus_equals_netcdf4(corpus):
    _check(netcdf3_files(corpus))


def test_record_variables_have_one_chunk_per_record():
    group = refgrid.scan(FIXTURES / "netcdf3" / "classic" / "tas_200101.nc")
    tas, flag = group["tas"], group["flag"]
    assert tas.grid.chunk_shape == (1, 6, 8) and flag.grid.chunk_shape == (1,)
    recsize = int(tas.manifest.offset[1, 0, 0] - tas.manifest.offset[0, 0, 0])
    assert recsize == 8 + 6 * 8 * 4 + 4 + 8 * 2  # time, tas, flag (padded), count
    assert group["land"].manifest.shape == (1, 1)  # non-record: one contiguous chunk


def test_a_single_record_variable_is_read_in_few_chunks():
    b = refgrid.scan(FIXTURES / "netcdf3" / "single_byte_record.nc")["b"]
    assert b.shape == (13,) and b.manifest.shape == (1,)  # adjacent, unpadded records


def test_nan_fill_value_on_an_integer_variable_does_not_break_the_file():
    group = refgrid.scan(FIXTURES / "netcdf3" / "cdf5.nc")
    assert np.isnan(group["nan_fill"].attrs["_FillValue"])
    assert group["nan_fill"].fill_value == -2147483647
    assert [e.variable for e in group.report] == ["nan_fill"]
    np.testing.assert_array_equal(read(group["nan_fill"]), np.arange(5))


def test_zero_length_unlimited_dimension():
    v = refgrid.scan(FIXTURES / "netcdf3" / "empty_record.nc")["v"]
    assert v.shape == (0, 3) and read(v).shape == (0, 3)


def _header(path):
    return bytearray((FIXTURES / "netcdf3" / path).read_bytes())


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda b: b[:2], r"magic.*not a NetCDF3 file|not an HDF5/NetCDF4/NetCDF3 file"),
    (lambda b: b"CDF\x07" + b[4:], "not an HDF5/NetCDF4/NetCDF3 file"),
    (lambda b: b[:40], r"beyond the end of the file|truncated"),
    (lambda b: b[:8] + struct.pack(">i", 10) + struct.pack(">i", 2**31 - 1) + b[16:],
     r"dimension list count.*claims 2147483647 entries"),
    (lambda b: b[:8] + struct.pack(">i", 99) + b[12:], r"dimension list tag.*expected 10 or 0"),
])
def test_malformed_headers_name_the_file_and_field(tmp_path, mutate, message):
    path = tmp_path / "bad.nc"
    path.write_bytes(bytes(mutate(_header("single_byte_record.nc"))))
    with pytest.raises(FormatError, match=rf"bad\.nc.*({message})"):
        refgrid.scan(path)


def test_data_beyond_the_end_of_the_file(tmp_path):
    data = _header("classic/tas_200101.nc")
    path = tmp_path / "short.nc"
    path.write_bytes(bytes(data[:-500]))
    with pytest.raises(FormatError, match=r"short\.nc: variable .*begin.*beyond the end of the "
                                          r"file"):
        refgrid.scan(path)


@settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_headers_raise_format_errors_only(tmp_path_factory, data):
    """Mutated headers either scan or raise FormatError: nothing else, and never slowly."""
    name = data.draw(st.sampled_from(["single_byte_record.nc", "cdf5.nc",
                                      "offset64/tas_200102.nc", "empty_record.nc"]))
    raw = _header(name)
    header_end = min(len(raw), 800)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(4, header_end - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(4, len(raw)))]
    path = tmp_path_factory.mktemp("fuzz") / "f.nc"
    path.write_bytes(bytes(raw))
    with contextlib.suppress(FormatError):
        refgrid.scan(path)


def test_remote_scan_reads_only_the_header(http_server):
    name = "netcdf3/offset64/tas_200101.nc"
    http_server.counter.reset()
    group = refgrid.scan(f"{http_server.url}/fixtures/{name}")
    assert group["tas"].shape == (31, 6, 8)
    size = (FIXTURES / name).stat().st_size
    ranges = [r for r in http_server.counter.requests if r.startswith("GET")]
    assert len(http_server.counter) <= 4, http_server.counter.requests
    assert all("bytes=0-" in r for r in ranges) and size > 0

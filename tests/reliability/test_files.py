"""Reliability, source files: damaged or odd files give correct data or a named error.

Ground truth is netCDF4 (netCDF-C): a file it reads, refgrid reads identically; a file it
refuses, refgrid refuses with a :class:`refgrid.RefgridError` naming the file and the reason.
"""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pytest
import xarray as xr

import refgrid
from helpers import closed
from refgrid.read.array import read
from refgrid.scanners.netcdf3 import read_header
from refgrid.scanners.source import Source


def _netcdf3(path: Path) -> None:
    """Two record variables and two fixed-size ones, in NETCDF3_CLASSIC."""
    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as nc:
        nc.createDimension("time", None)
        nc.createDimension("x", 3)
        nc.createVariable("a", "i4", ("x",))[:] = [1, 2, 3]
        nc.createVariable("b", "f8", ("x",))[:] = [4.0, 5.0, 6.0]
        nc.createVariable("r", "i2", ("time", "x"))[:] = np.arange(12).reshape(4, 3)
        nc.createVariable("s", "f4", ("time",))[:] = np.arange(4) / 2


def _patch(path: Path, name: str, vsize: int | None = None, begin: int | None = None) -> None:
    """Rewrite one variable's vsize and/or begin in the header (CDF-1: 4-byte fields)."""
    header, _ = read_header(Source(str(path)))
    var = next(v for v in header.variables if v.name == name)
    data = bytearray(path.read_bytes())
    stored = next(n for n in range(2**16) if struct.pack(">II", n, var.begin) in data)
    at = data.index(struct.pack(">II", stored, var.begin))
    data[at:at + 8] = struct.pack(">II", stored if vsize is None else vsize,
                                  var.begin if begin is None else begin)
    path.write_bytes(bytes(data))


def _netcdf4_read(path: Path) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return closed(xr.open_dataset(path, engine="netcdf4"))


@pytest.mark.parametrize("name, vsize", [("r", 4), ("s", 1000), ("a", 0), ("b", 2**32 - 1)])
def test_netcdf3_vsize_is_computed_not_trusted(tmp_path, name, vsize):
    """The header's vsize was trusted: record data read at wrong offsets."""
    path = tmp_path / "f.nc"
    _netcdf3(path)
    _patch(path, name, vsize=vsize)
    ours = xr.open_dataset(path, engine="refgrid").load()
    xr.testing.assert_identical(ours.drop_encoding(), _netcdf4_read(path).drop_encoding())


@pytest.mark.parametrize("name, other", [("b", "a"), ("s", "r"), ("r", "b")])
def test_netcdf3_overlapping_variables_are_refused_as_netcdf_c_refuses_them(tmp_path, name,
                                                                          other):
    path = tmp_path / "f.nc"
    _netcdf3(path)
    header, _ = read_header(Source(str(path)))
    target = next(v for v in header.variables if v.name == other).begin
    _patch(path, name, begin=target)
    with pytest.raises(OSError):
        netCDF4.Dataset(path)
    with pytest.raises(refgrid.FormatError, match=f"variable '{name}' begin.*overlaps"):
        refgrid.scan(path)


def _damaged_hdf5(path: Path) -> None:
    """``time``'s object header damaged; a dangling soft link and a missing external file."""
    with h5py.File(path, "w", libver="latest") as f:
        f["time"] = np.arange(3.0)
        f["tas"] = np.arange(3.0)
        f["soft"] = h5py.SoftLink("/nowhere")
        f["ext"] = h5py.ExternalLink(str(path.parent / "missing.h5"), "/x")
        address = h5py.h5o.get_info(f["time"].id).addr
    data = bytearray(path.read_bytes())
    assert data[address:address + 4] == b"OHDR"
    data[address + 6] ^= 0xFF  # inside the header: its checksum no longer matches
    path.write_bytes(bytes(data))


def test_hdf5_objects_that_cannot_be_opened_are_never_dropped_silently(tmp_path):
    """h5py's Group.get() returns None for them: they vanished with an empty report."""
    path = tmp_path / "damaged.h5"
    _damaged_hdf5(path)
    with pytest.raises(refgrid.ScanError, match="cannot be opened") as raised:
        refgrid.scan(path)
    assert raised.value.url == str(path)
    group = refgrid.scan(path, on_error="report")
    assert list(group.arrays) == ["tas"]
    reported = {e.variable: e.reason for e in group.report}
    assert set(reported) == {"time", "soft", "ext"}
    assert "'/nowhere'" in reported["soft"] and "missing.h5" in reported["ext"]


# -- sources changed after scanning ----------------------------------------------------------

SOURCE = Path(__file__).resolve().parents[2] / "fixtures" / "monthly" / "chunk10"


@pytest.mark.parametrize("form", ["refs.json", "refs.parq"])
def test_a_source_rewritten_after_scanning_is_a_read_error(tmp_path, form):
    """A source rewritten in place decoded silently to other data."""
    import shutil
    import time

    path = tmp_path / "tas.nc"
    shutil.copy(SOURCE / "tas_200101.nc", path)
    refs = refgrid.write(refgrid.scan(path), tmp_path / form)
    assert refgrid.scan(refs).sources[str(path)]["size"] == path.stat().st_size
    time.sleep(0.01)
    path.write_bytes(path.read_bytes())  # the same bytes, written again: a new mtime
    with pytest.raises(refgrid.ReadError, match=r"tas\.nc: the source changed.*modified 20\d\d-"):
        xr.open_dataset(refs, engine="refgrid")["tas"].values  # noqa: B018
    with pytest.raises(refgrid.ReadError, match="modified 20"):
        mapped = xr.open_dataset(refgrid.get_mapper(refs), engine="zarr", consolidated=True)
        mapped["tas"].values  # noqa: B018
    shutil.copy(SOURCE / "tas_200102.nc", path)  # another file under the same name
    with pytest.raises(refgrid.ReadError, match=r"size [\d,]+ bytes, now [\d,]+ bytes"):
        xr.open_dataset(refs, engine="refgrid")["tas"].values  # noqa: B018
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        anyway = xr.open_dataset(refs, engine="refgrid", verify_sources=False,
                                 decode_times=False)
        assert anyway["lat"].size  # the user's choice: read without the check


def test_combined_references_record_every_source(tmp_path):
    files = [SOURCE / f"tas_2001{m:02d}.nc" for m in (1, 2, 3)]
    group = refgrid.combine([refgrid.scan(f) for f in files], "time")
    assert set(group.sources) == {str(f) for f in files}
    refs = refgrid.write(group, tmp_path / "year.json")
    assert set(refgrid.scan(refs).sources) == {str(f) for f in files}


@pytest.mark.parametrize("form", ["refs.json", "refs.parq"])
def test_stored_identities_read_as_json_reads_them(tmp_path, form):
    """A sources table in JSON (JSON references; parquet's ``.zmetadata`` as written before
    the sources had record files of their own) is parsed by orjson where it can be, and
    read as json reads it: a NaN time reads (orjson refuses it), an entry without a file's
    size is dropped, and so are fields of other names or types; the caller's parsed
    container is not shared."""
    from refgrid.refs.section import stored_identities

    refs = refgrid.write(refgrid.scan(SOURCE / "tas_200101.nc"), tmp_path / form)
    where = refs / ".zmetadata" if refs.is_dir() else refs
    stored = json.loads(where.read_text())
    if stored["refgrid"].pop("source_table", None):  # parquet: as written before 2026-11
        stored["refgrid"]["sources"] = {str(SOURCE / "tas_200101.nc"): refgrid.scan(
            refs).sources[str(SOURCE / "tas_200101.nc")]}
    stored["refgrid"]["sources"].update({
        "/big.nc": {"size": 2**63 - 1}, "/nan.nc": {"size": 1, "mtime": float("nan")},
        "/extra.nc": {"size": 2, "etag": "e", "colour": "red", "version": 3, "mtime": "x"},
        "/bad.nc": {"size": "2"}, "/list.nc": [1, 2], "/float.nc": {"size": 2.0},
        "/huge.nc": {"size": 2**70}, "/negative.nc": {"size": -1}, "/true.nc": {"size": True}})
    where.write_text(json.dumps(stored))
    sources = refgrid.scan(refs).sources
    assert set(sources) == {str(SOURCE / "tas_200101.nc"), "/big.nc", "/nan.nc", "/extra.nc"}
    assert sources["/big.nc"] == {"size": 2**63 - 1}
    assert type(sources["/big.nc"]["size"]) is int
    assert np.isnan(sources["/nan.nc"]["mtime"])
    assert sources["/extra.nc"] == {"size": 2, "etag": "e"}  # (fields of other types dropped)
    refgrid.write(refgrid.scan(refs), tmp_path / "again.parq")  # what was kept is writable
    table = json.loads(where.read_text())
    kept = stored_identities(table)
    kept[str(SOURCE / "tas_200101.nc")]["size"] = -1
    assert table["refgrid"]["sources"][str(SOURCE / "tas_200101.nc")]["size"] > 0


def test_netcdf3_empty_record_variable_with_a_negative_begin(tmp_path):
    """OverflowError at scanners/netcdf3.py."""
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as nc:
        nc.createDimension("time", None)
        nc.createVariable("r", "i2", ("time",))  # no records
    _patch(path, "r", begin=2**31 + 5)  # read back as a negative offset
    with pytest.raises(refgrid.FormatError, match=r"'r' begin.*negative offset"):
        refgrid.scan(path)


def test_netcdf3_zero_length_fill_value_is_reported_not_raised(tmp_path):
    """IndexError for a _FillValue attribute with no values."""
    path = tmp_path / "f.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as nc:
        nc.createDimension("x", 3)
        nc.createVariable("a", "i4", ("x",), fill_value=7)[:] = [1, 2, 3]
    data = bytearray(path.read_bytes())
    at = data.index(b"_FillValue") + len(b"_FillValue") + 2  # name padded to 4 bytes
    assert struct.unpack(">ii", data[at:at + 8]) == (4, 1)  # NC_INT, one value
    begin = read_header(Source(str(path)))[0].variables[0].begin
    data[at + 4:at + 8] = struct.pack(">i", 0)
    del data[at + 8:at + 12]  # the value goes: the header, and the data, move by 4 bytes
    field = data.index(struct.pack(">I", begin), at)
    data[field:field + 4] = struct.pack(">I", begin - 4)
    path.write_bytes(bytes(data))
    group = refgrid.scan(path, on_error="report")
    assert any(e.variable == "a" and "_FillValue" in e.reason for e in group.report)
    np.testing.assert_array_equal(read(group["a"]), [1, 2, 3])

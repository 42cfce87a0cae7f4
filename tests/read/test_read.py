"""refgrid's own read path: every fixture and corpus variable through the references, the
xarray engine against xarray on the sources, native dask chunks, and clear read errors."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import xarray as xr

import refgrid
from acceptance import check_file, engine_reader, mapper_reader, refgrid_reader, table
from ground_truth import assert_like_source
from helpers import FIXTURES, closed, hdf5_files, netcdf3_files
from refgrid.errors import ReadError
from refgrid.model.virtual import same_value
from refgrid.read.array import read
from refgrid.refs.json_refs import references_to_group


def _check(files, reader=refgrid_reader):
    results = [check_file(p, reader, lambda a: True) for p in files]
    print("\n" + table(results))
    failures = [f"{r.path.name}: {r.error or r.wrong}" for r in results if r.status == "failed"]
    assert not failures, "\n".join(failures)
    assert not any(r.unread for r in results)
    return results


def test_every_fixture_variable_reads_back_equal(tmp_path):
    results = _check(hdf5_files(FIXTURES))
    assert any("v" in r.ok for r in results if r.path.name == "shrunk_variable.nc")


def test_every_corpus_variable_reads_back_equal(corpus):
    assert sum(len(r.ok) for r in _check(hdf5_files(corpus))) > 3000


@pytest.mark.parametrize("reader", [engine_reader, mapper_reader], ids=["engine", "mapper"])
def test_every_fixture_variable_through_engine_and_mapper(reader):
    _check(hdf5_files(FIXTURES) + netcdf3_files(FIXTURES), reader)


# netCDF-C's ref_nc_test_netcdf4_4_0.nc has a variable on dimensions (D1, D1): xarray warns
# whenever it opens it, from its own netCDF4 engine as from refgrid's
@pytest.mark.filterwarnings("ignore:Duplicate dimension names present")
@pytest.mark.parametrize("reader", [engine_reader, mapper_reader], ids=["engine", "mapper"])
def test_every_corpus_variable_through_engine_and_mapper(corpus, reader):
    assert sum(len(r.ok) for r in _check(hdf5_files(corpus) + netcdf3_files(corpus),
                                         reader)) > 3000


@pytest.mark.parametrize("name", sorted(str(p.relative_to(FIXTURES)) for p in
                                        FIXTURES.rglob("*.nc")))
def test_every_fixture_file_decodes_like_xarray_on_the_source(name, tmp_path):
    ours, source = _open_both(name, tmp_path)
    for key, variable in ours.variables.items():
        if "flag_meanings" not in source[key].attrs:  # an enum's names: refgrid keeps them
            variable.attrs.pop("flag_values", None)
            variable.attrs.pop("flag_meanings", None)
    xr.testing.assert_identical(ours.load(), source.load())


def test_references_round_trip_to_the_same_model():
    for name in ("features/netcdf4_features.nc", "features/hdf5_types.h5",
                 "features/shrunk_variable.nc", "features/hdf5_filters.h5"):
        group = refgrid.scan(FIXTURES / name, on_error="report")
        assert references_to_group(refgrid.to_kerchunk(group)) == group, name


def _open_both(name, tmp_path, **kwargs):
    refs = refgrid.write(refgrid.scan(FIXTURES / name), tmp_path / "refs.json")
    return (xr.open_dataset(refs, engine="refgrid", **kwargs),
            closed(xr.open_dataset(FIXTURES / name)))


@pytest.mark.parametrize("name", [
    "monthly/chunk10/tas_200101.nc", "monthly/chunkfile/tas_200102.nc",
    "monthly/contiguous/tas_200103.nc", "yearly/chunk73/tas_2000.nc",
    "yearly/mixed_units/tas_2001.nc", "features/netcdf4_features.nc",
    "features/shrunk_variable.nc"])
def test_engine_decodes_exactly_like_xarray_on_the_source(name, tmp_path):
    ours, source = _open_both(name, tmp_path)
    assert set(ours.variables) == set(source.variables)
    for key, expected in source.variables.items():
        got = ours[key]
        assert got.dims == expected.dims, key
        if expected.dtype.kind in "fcmM":
            assert got.dtype == expected.dtype, key
            np.testing.assert_array_equal(got.values, expected.values, err_msg=key)
        else:
            assert (got.values == expected.values).all(), key
    assert same_value(dict(ours.attrs), dict(source.attrs))


def test_engine_is_lazy_and_reads_only_the_chunks_touched(tmp_path, monkeypatch):
    import refgrid.read.array as reader

    ours, _ = _open_both("monthly/chunk10/tas_200101.nc", tmp_path)
    fetched = []
    original = reader.read_ranges
    monkeypatch.setattr(reader, "read_ranges", lambda paths, ids, offsets, *a, **k: fetched.extend(
        offsets.tolist()) or original(paths, ids, offsets, *a, **k))
    ours.tas[12, 2, 3].values  # noqa: B018 (reading is the point)
    assert fetched == [int(refgrid.scan(FIXTURES / "monthly/chunk10/tas_200101.nc")
                           ["tas"].manifest.offset[1, 0, 0])]  # chunk 1 of 4 along time


def test_chunks_follow_the_native_rectilinear_grid(tmp_path):
    ours, _ = _open_both("features/shrunk_variable.nc", tmp_path, chunks={})
    assert ours.v.chunks == ((4, 2, 4),)
    ours, _ = _open_both("monthly/chunk10/tas_200102.nc", tmp_path, chunks={})
    assert ours.tas.chunks == ((10, 10, 8), (6,), (8,))


def test_datatree_opens_nested_groups(tmp_path):
    refs = refgrid.write(refgrid.scan(FIXTURES / "features" / "netcdf4_features.nc"),
                         tmp_path / "refs.json")
    tree = xr.open_datatree(refs, engine="refgrid")
    np.testing.assert_array_equal(tree["model/run1"].ds["t"].values, [7, 8, 9])
    assert tree["model"].attrs["institution"] == "refgrid tests"


def test_missing_source_file_names_array_and_file(tmp_path):
    source = tmp_path / "tas.nc"
    shutil.copy(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc", source)
    group = refgrid.scan(source)
    source.unlink()
    with pytest.raises(ReadError, match=r"array 'tas', chunk tas/c/0/0/0 \(.*tas\.nc bytes "
                                        r"\d+-\d+\): source file not found"):
        read(group["tas"])


def test_short_read_names_array_chunk_url_and_range(tmp_path):
    source = tmp_path / "tas.nc"
    shutil.copy(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc", source)
    group = refgrid.scan(source)
    tas = group["tas"]
    end = int((tas.manifest.offset + tas.manifest.length).max())
    with open(source, "r+b") as f:
        f.truncate(end - 10)
    with pytest.raises(ReadError, match=r"array 'tas', chunk tas/c/\d/0/0 \(.*tas\.nc bytes "
                                        r"\d+-\d+\): short read"):
        read(tas)


def test_corrupt_chunk_names_array_chunk_and_byte_range(tmp_path):
    source = tmp_path / "tas.nc"
    shutil.copy(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc", source)
    tas = refgrid.scan(source)["tas"]
    start = int(tas.manifest.offset[1, 0, 0])
    with open(source, "r+b") as f:
        f.seek(start)
        f.write(b"\x00" * 16)
    with pytest.raises(ReadError, match=r"chunk tas/c/1/0/0 \(.*tas\.nc bytes \d+-\d+\): does "
                                        r"not decode"):
        read(tas, np.s_[10:20])
    np.testing.assert_array_equal(read(tas, np.s_[:10]).shape, (10, 6, 8))  # others still read


def test_fletcher32_mismatch_is_detected(tmp_path):
    source = tmp_path / "f.h5"
    shutil.copy(FIXTURES / "features" / "hdf5_filters.h5", source)
    array = refgrid.scan(source)["fletcher32"]
    start = int(array.manifest.offset[0, 0])
    with open(source, "r+b") as f:
        f.seek(start + 4)
        f.write(b"\x01\x02")
    with pytest.raises(ReadError, match="does not decode"):
        read(array, np.s_[:16, :5])


@pytest.mark.parametrize("chunks", ["auto", "native"])
@pytest.mark.parametrize("name", sorted(str(p.relative_to(FIXTURES)) for p in
                                        FIXTURES.rglob("*.nc")))
def test_every_fixture_file_decodes_through_the_mapper_like_xarray_on_the_source(name, chunks):
    mapper = refgrid.get_mapper(refgrid.to_kerchunk(refgrid.scan(FIXTURES / name)),
                                chunks=chunks, unpack=True)
    assert_like_source(xr.open_dataset(mapper, engine="zarr"),
                       closed(xr.open_dataset(FIXTURES / name)))


def test_a_packed_float_without_fill_value_is_not_masked_at_the_default_fill(tmp_path):
    """No ``_FillValue`` attribute: xarray leaves values equal to netCDF's default fill alone,
    so neither the engine nor the unpacking view may mask them."""
    import netCDF4

    source = tmp_path / "packed.nc"
    with netCDF4.Dataset(source, "w") as ds:
        ds.createDimension("x", 4)
        var = ds.createVariable("p", "f4", ("x",))  # netCDF's default fill, no attribute
        var.set_auto_maskandscale(False)
        var.scale_factor = np.float32(0.5)
        var[:] = np.array([1, 2, netCDF4.default_fillvals["f4"], 4], np.float32)
    expected = closed(xr.open_dataset(source))["p"]
    assert np.isfinite(expected.values).all()  # the premise: xarray does not mask it
    refs = refgrid.to_kerchunk(refgrid.scan(source))
    for ours in (xr.open_dataset(refs, engine="refgrid")["p"],
                 xr.open_dataset(refgrid.get_mapper(refs, unpack=True), engine="zarr")["p"]):
        assert ours.dtype == expected.dtype
        np.testing.assert_array_equal(ours.values, expected.values)


def test_the_engine_keeps_one_prepared_reader_per_variable_and_pickles_without_it():
    import pickle

    import netCDF4

    source = FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"
    ds = xr.open_dataset(source, engine="refgrid", cache=False)
    backend = ds.tas.variable._data
    while not hasattr(backend, "reader"):
        backend = backend.array
    assert backend.reader is None  # nothing decoded at open
    first = ds.tas[3].values
    reader = backend.reader
    assert reader is not None and ds.tas[:, 2].values is not None and backend.reader is reader
    copy = pickle.loads(pickle.dumps(backend))
    assert copy.reader is None
    with netCDF4.Dataset(source) as nc:
        expected = nc["tas"][...].filled()
    np.testing.assert_array_equal(first, expected[3])
    np.testing.assert_array_equal(copy._read((slice(None),) * 3), expected)

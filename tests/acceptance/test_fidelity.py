"""Regression tests for files other projects write that refgrid once misread (issue #11).

Each case builds its own file the way the other project writes it, and compares refgrid's
read with the ground truth: zarr-python's own read of a store, h5py's read of an HDF5 file.
"""

from __future__ import annotations

import time
import tracemalloc
import warnings
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pytest
import xarray as xr
import zarr

import refgrid
from helpers import closed
from refgrid.core.dtypes import original_dtype
from refgrid.grid.json_forms import parse_chunk_grid


def _open(path: Path | str, **kwargs) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_dataset(path, engine="refgrid", **kwargs).load()


def _mapper_open(path: Path | str, **kwargs) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_dataset(refgrid.get_mapper(path), engine="zarr", consolidated=True,
                               **kwargs).load()


# -- Zarr v3 stores ------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", [{"name": "v2", "separator": "."},
                                      {"name": "v2", "separator": "/"},
                                      {"name": "default", "separator": "."}],
                         ids=["v2-dot", "v2-slash", "default-dot"])
def test_store_chunk_key_encodings_read_as_zarr_reads_them(tmp_path, encoding):
    """15: a store written with the v2 chunk key encoding read as all fill values."""
    path = tmp_path / "store.zarr"
    group = zarr.open_group(path, mode="w", zarr_format=3)
    a = group.create_array("a", shape=(10, 4), chunks=(3, 2), dtype="f4",
                           chunk_key_encoding=encoding, dimension_names=["x", "y"])
    a[:] = np.arange(40, dtype="f4").reshape(10, 4)
    s = group.create_array("s", shape=(), dtype="i4", chunk_key_encoding=encoding)
    s[()] = 7
    ds = _open(path)
    np.testing.assert_array_equal(ds["a"].values, zarr.open_array(path / "a")[:])
    assert int(ds["s"]) == 7
    refs = refgrid.to_kerchunk(refgrid.scan(path))
    np.testing.assert_array_equal(_open(refs)["a"].values, a[:])


def test_store_that_is_one_array_is_shown_under_its_name(tmp_path):
    """16: a store that is an array at its root opened as an empty Dataset."""
    array = zarr.create_array(tmp_path / "tas.zarr", shape=(5,), chunks=(2,), dtype="i2",
                              zarr_format=3, dimension_names=["time"])
    array[:] = [1, 2, 3, 4, 5]
    ds = _open(tmp_path / "tas.zarr")
    assert list(ds.data_vars) == ["tas"]
    np.testing.assert_array_equal(ds["tas"].values, array[:])
    assert ds["tas"].dims == ("time",)


# -- chunk-grid JSON -------------------------------------------------------------------------

def _rectilinear(edges) -> dict:
    return {"name": "rectilinear", "configuration": {"kind": "inline", "chunk_shapes": [edges]}}


@pytest.mark.parametrize("edges", [[2**63], [[2**64, 1]], [5, -1], [[3, 0]]])
def test_grid_edges_out_of_range_are_grid_errors(edges):
    """18: an edge >= 2**63 raised a raw OverflowError."""
    with pytest.raises(refgrid.GridError, match="dimension 0"):
        parse_chunk_grid(_rectilinear(edges), [5])


@pytest.mark.parametrize("repeat", [10**8, 10**12, 2**70])
def test_runs_past_the_end_are_not_expanded(repeat):
    """18: [[1, 10**8]] on a dimension of 5 took 6 s and 800 MB (10**12: MemoryError)."""
    tracemalloc.start()
    start = time.process_time()  # (CPU time: a loaded machine does not trip it)
    grid = parse_chunk_grid(_rectilinear([[1, repeat]]), [5])
    elapsed = time.process_time() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert grid.chunk_counts == (5,)
    assert elapsed < 0.5 and peak < 10**6


def test_encoded_runs_must_declare_as_many_edges():
    doc = {"name": "rectilinear", "configuration": {
        "kind": "inline", "chunk_shapes": [[[2, 10**12]]],
        "encoded_chunk_shapes": [[[2, 10**12 - 1]]]}}
    with pytest.raises(refgrid.GridError, match="must be equal"):
        parse_chunk_grid(doc, [5])


# -- HDF5 files of other projects ----------------------------------------------------------

def test_coordinate_shorter_than_its_unlimited_dimension_is_padded(tmp_path):
    """19: netCDF4 pads a coordinate holding fewer values than its unlimited dimension."""
    path = tmp_path / "unlim.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", None)
        nc.createVariable("time", "f8", ("time",))[:2] = [10, 11]
        nc.createVariable("v", "f4", ("time",))[:] = np.arange(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = closed(xr.open_dataset(path, engine="netcdf4"))
    xr.testing.assert_identical(_open(path), expected)


def test_variable_using_one_dimension_twice_reads_as_hdf5_holds_it(tmp_path):
    """19: temp(time, time). netCDF-C reads this variable wrongly (it lays the stored 3x3
    values out with a row length of 5); refgrid reads what HDF5 holds, padded with the fill
    value to the dimension's length."""
    path = tmp_path / "twice.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", None)
        nc.createVariable("v", "f4", ("time",))[:] = np.arange(5)
        nc.createVariable("temp", "i4", ("time", "time"))[:3, :3] = np.arange(9).reshape(3, 3)
    with h5py.File(path) as f:
        stored, fill = f["temp"][()], f["temp"].fillvalue
    expected = np.full((5, 5), fill, "i4")
    expected[:3, :3] = stored
    np.testing.assert_array_equal(_open(path, mask_and_scale=False)["temp"].values, expected)


def test_space_padded_strings_are_stripped_as_hdf5_strips_them(tmp_path):
    """20: H5T_STR_SPACEPAD strings came back with their padding."""
    path = tmp_path / "spacepad.h5"
    with h5py.File(path, "w") as f:
        tid = h5py.h5t.C_S1.copy()
        tid.set_size(8)
        tid.set_strpad(h5py.h5t.STR_SPACEPAD)
        d = h5py.h5d.create(f.id, b"names", tid, h5py.h5s.create_simple((3,)))
        d.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array([b"ab      ", b"cdef    ", b"g       "]))
    with h5py.File(path) as f:
        expected = f["names"][()]
    assert list(expected) == [b"ab", b"cdef", b"g"]
    np.testing.assert_array_equal(_open(path)["names"].values, expected)


def _as_records(values: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Records stock zarr gives as raw bytes (nested, array members), viewed as h5py's."""
    return values.view(expected.dtype) if values.dtype.kind == "V" and \
        expected.dtype.fields is not None and values.dtype.fields is None else values


def _strings_everywhere(path: Path) -> None:
    """Every dataset of ``path`` as h5py and h5netcdf read it, through the scan, the engine,
    ``open_store`` and ``get_mapper`` (stock zarr over refgrid's stores)."""
    import h5netcdf

    from hdf5_strings import h5py_values, same_strings
    from refgrid.read.array import read

    expected = h5py_values(path)
    with h5netcdf.File(path, "r", phony_dims="sort") as f:
        for name, values in expected.items():
            assert same_strings(f.variables[name][...], values), name
    group = refgrid.scan(path)
    ds = _open(path)
    store = refgrid.open_store(path)
    stored = zarr.open_group(store, mode="r")
    mapped = zarr.open_group(refgrid.get_mapper(path), mode="r")
    for name, values in expected.items():
        array = group[name]
        assert isinstance(array, refgrid.VirtualArray)
        ours = read(array)
        assert same_strings(ours.view(original_dtype(array.attrs, ours.dtype)), values), name
        assert same_strings(ds[name].values, values), name
        assert same_strings(_as_records(stored[name][...], values), values), name
        assert same_strings(_as_records(mapped[name][...], values), values), name
    store.close()


def test_c_strings_end_at_their_nul_as_hdf5_reads_them(tmp_path):
    """#51: C strings (``H5T_STR_NULLTERM``) came back with the bytes the file holds after
    their NUL (``b"swe\\x00et"`` where h5py and h5netcdf read ``b"swe"``), chunked or
    contiguous, alone or a compound's member; they stay byte ranges of the file."""
    from hdf5_strings import write_c_strings

    path = write_c_strings(tmp_path / "c_strings.h5")
    with h5py.File(path) as f:
        assert f["strings"][()].tolist() == [b"swe", b"ab", b"abcdef", b"x", b""]
    _strings_everywhere(path)
    assert not refgrid.scan(path)["strings"].manifest.inline  # referenced, decoded on read
    chars = tmp_path / "chars.nc"  # netCDF's char: C strings of one byte, read as stored
    with netCDF4.Dataset(chars, "w") as nc:
        nc.createDimension("n", 3)
        nc.createVariable("c", "S1", ("n",))[:] = np.array([b"a", b"", b"c"])
    assert refgrid.scan(chars)["c"].codecs == ({"name": "bytes"},)  # (no refgrid codec)


def test_string_members_and_elements_read_as_hdf5_reads_them(tmp_path):
    """#51: C strings as array elements and members of compounds stored as raw bytes kept
    the bytes after their NUL, space-padded members their spaces; compounds with string
    members were refused by a numpy warning (h5py's metadata on their type)."""
    from hdf5_strings import write_string_members

    _strings_everywhere(write_string_members(tmp_path / "members.h5"))


@pytest.mark.parametrize("order", ["<", ">"])
def test_vlen_integer_sequences_read_as_integer_arrays(tmp_path, order):
    """21: PyTables' unicode atoms (vlen of uint32) were read as strings/bytes."""
    path = tmp_path / "vlen.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("v", (3,), dtype=h5py.vlen_dtype(np.dtype(order + "u4")))
        d[0], d[1], d[2] = [104, 105], [0x263A], []
    with h5py.File(path) as f:
        expected = f["v"][()]
    got = _open(path)["v"]
    assert got.dtype == object and "_refgrid_vlen_dtype" not in got.attrs
    for a, b in zip(got.values, expected, strict=True):
        assert a.dtype == np.dtype("u4") and np.array_equal(a, b)


def test_array_typed_elements_and_compound_array_members(tmp_path):
    """22: H5T_ARRAY datasets were skipped; compounds with array members came back raw."""
    path = tmp_path / "arrays.h5"
    member = np.dtype([("x", "<i4"), ("v", "<f4", (3,))])
    with h5py.File(path, "w") as f:
        f.create_dataset("grid", shape=(3,), dtype=np.dtype(("<f8", (2, 2))), chunks=(2,),
                         compression="gzip", shuffle=True)[...] = np.arange(12.0).reshape(3, 2, 2)
        f.create_dataset("plain", shape=(2,), dtype=np.dtype((">i2", (3,))))[...] = \
            np.arange(6).reshape(2, 3)
        f.create_dataset("names", shape=(2,), dtype=np.dtype(("S4", (2,))))[...] = \
            [[b"ab", b"cd"], [b"ef", b"gh"]]
        f.create_dataset("records", data=np.array([(i, [i, i + 1, i + 2]) for i in range(4)],
                                                  member))
    ds = _open(path)
    with h5py.File(path) as f:
        for name in ("grid", "plain", "names"):
            np.testing.assert_array_equal(ds[name].values, f[name][()])
            assert ds[name].shape == f[name][()].shape
        assert ds["records"].dtype == member
        np.testing.assert_array_equal(ds["records"].values, f["records"][()])


def test_mapper_serves_compounds_typed_for_stock_zarr(tmp_path):
    """22: through the mapper, compounds came back as raw bytes plus _refgrid_dtype."""
    path = tmp_path / "compounds.h5"
    kinds = {"aligned": np.dtype([("a", "u1"), ("b", "<f8")], align=True),
             "nested": np.dtype([("a", "<i4"), ("b", [("c", "<f4"), ("d", "<i2")])]),
             "big_endian_gaps": np.dtype({"names": ["a", "b"], "formats": [">i4", ">f8"],
                                          "offsets": [0, 8], "itemsize": 24})}
    with h5py.File(path, "w") as f:
        for name, kind in kinds.items():
            values = np.zeros(5, kind)
            values["a"] = np.arange(5)
            f.create_dataset(name, data=values, chunks=(2,))
    ds = _mapper_open(path)
    with h5py.File(path) as f:
        for name in kinds:
            expected = f[name][()]
            assert ds[name].dtype.names == expected.dtype.names, name
            assert "_refgrid_dtype" not in ds[name].attrs
            for field in expected.dtype.names:
                np.testing.assert_array_equal(ds[name].values[field], expected[field])


@pytest.mark.parametrize("user_block", [512, 4096, 32768, 65536])
def test_hdf5_after_a_user_block_of_any_size(tmp_path, user_block):
    """23: files with a user block beyond 2048 bytes were refused as not HDF5."""
    path = tmp_path / "ub.h5"
    with h5py.File(path, "w", userblock_size=user_block) as f:
        f["x"] = np.arange(6.0)
    with open(path, "r+b") as f:
        f.write(b"a user block " * 20)
    np.testing.assert_array_equal(_open(path)["x"].values, np.arange(6.0))


# -- the mapper with stock zarr ------------------------------------------------------------

def _nexus(path: Path) -> None:
    """NeXus-like nesting: groups and arrays interleaved at every level."""
    with h5py.File(path, "w") as f:
        entry = f.create_group("entry")
        entry.create_dataset("title", data=np.arange(2))
        detector = entry.create_group("instrument").create_group("detector")
        detector.create_dataset("data", data=np.arange(6.0))
        entry["instrument"].create_dataset("name", data=np.arange(3))
        entry.create_group("sample").create_dataset("temp", data=np.arange(3, dtype="f4"))
        packed = f.create_dataset("packed", data=np.array([1.0, -999.0, 3.0]))
        packed.attrs["_FillValue"] = -999.0
        packed.attrs["scale_factor"] = 2.0


def test_mapper_consolidated_metadata_lists_parents_before_children(tmp_path):
    """24: groups first, then arrays: zarr 3.1 then lost children of non-contiguous
    parents ("No group found in store")."""
    path = tmp_path / "nexus.h5"
    _nexus(path)
    mapper = refgrid.get_mapper(path)
    listed = list(zarr.open_group(mapper, mode="r").metadata.consolidated_metadata.metadata)
    assert listed == sorted(listed, key=lambda p: (p.count("/"), p))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = xr.open_datatree(mapper, engine="zarr", consolidated=True)
    assert set(tree.groups) == {"/", "/entry", "/entry/instrument", "/entry/sample",
                                "/entry/instrument/detector"}
    np.testing.assert_array_equal(tree["entry/instrument/detector/data"].values, np.arange(6.0))


@pytest.mark.parametrize("unpack", [False, True])
def test_mapper_float_fill_value_on_a_packed_float64_variable(tmp_path, unpack):
    """24: "Failed to decode fill_value: expected str or bytes for dtype float64"."""
    path = tmp_path / "nexus.h5"
    _nexus(path)
    expected = closed(xr.open_dataset(path, engine="h5netcdf",
                                      phony_dims="access"))["packed"].values
    got = _mapper_open(path) if not unpack else xr.open_dataset(
        refgrid.get_mapper(path, unpack=True), engine="zarr", consolidated=True)
    np.testing.assert_array_equal(got["packed"].values, expected)
    np.testing.assert_array_equal(_open(path)["packed"].values, expected)


# -- sharded stores --------------------------------------------------------------------------

def _sharded_store(path: Path) -> np.ndarray:
    """A group with a regular sharded array, written by zarr 3.1's own sharding codec; the
    last shard is partial and one shard is never written."""
    group = zarr.open_group(path, mode="w", zarr_format=3)
    a = group.create_array("a", shape=(9, 5), chunks=(2, 2), shards=(4, 4), dtype="f8",
                           dimension_names=["x", "y"], fill_value=np.nan)
    a[:7, :] = np.arange(35.0).reshape(7, 5)
    return a[:]


def test_sharded_store_reads_as_zarr_reads_it(tmp_path):
    """17: sharded arrays raised "codec not available"."""
    expected = _sharded_store(tmp_path / "s.zarr")
    np.testing.assert_array_equal(_open(tmp_path / "s.zarr")["a"].values, expected)
    np.testing.assert_array_equal(_mapper_open(tmp_path / "s.zarr")["a"].values, expected)
    refs = refgrid.to_kerchunk(refgrid.scan(tmp_path / "s.zarr"))  # inner chunks as refs
    np.testing.assert_array_equal(_open(refs)["a"].values, expected)


def test_rectilinear_shard_grid(tmp_path):
    """17: shards of different lengths along a dimension, as zarr >= 3.2 writes them: the
    outer grid is the zarr-extensions ``rectilinear`` grid, each shard file a standard
    ``sharding_indexed`` shard (built here by zarr 3.1 one shard at a time)."""
    import json

    values = np.arange(60, dtype="<i4").reshape(10, 6)
    edges = [4, 6]  # shard lengths along x; y is one shard of 6
    store = tmp_path / "rect.zarr"
    (store / "t").mkdir(parents=True)
    start = 0
    for k, n in enumerate(edges):
        part = zarr.create_array(tmp_path / f"part{k}.zarr", shape=(n, 6), shards=(n, 6),
                                 chunks=(2, 3), dtype="<i4", zarr_format=3)
        part[:] = values[start:start + n]
        start += n
        (store / "t" / "c" / str(k)).mkdir(parents=True)
        (store / "t" / "c" / str(k) / "0").write_bytes(
            (tmp_path / f"part{k}.zarr" / "c" / "0" / "0").read_bytes())
    doc = json.loads((tmp_path / "part0.zarr" / "zarr.json").read_text())
    doc |= {"shape": [10, 6], "dimension_names": ["x", "y"],
            "chunk_grid": {"name": "rectilinear",
                           "configuration": {"kind": "inline", "chunk_shapes": [edges, [6]]}}}
    (store / "t" / "zarr.json").write_text(json.dumps(doc))
    (store / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group",
                                                 "attributes": {}}))
    np.testing.assert_array_equal(_open(store)["t"].values, values)
    np.testing.assert_array_equal(_mapper_open(store)["t"].values, values)
    np.testing.assert_array_equal(_open(store)["t"].isel(x=slice(3, 9), y=[0, 5]).values,
                                  values[3:9][:, [0, 5]])


def test_damaged_shard_index_is_a_named_error(tmp_path):
    _sharded_store(tmp_path / "s.zarr")
    shard = tmp_path / "s.zarr" / "a" / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF  # inside the index: its crc32c no longer matches
    shard.write_bytes(bytes(data))
    with pytest.raises(refgrid.FormatError, match="checksum"):
        refgrid.scan(tmp_path / "s.zarr")

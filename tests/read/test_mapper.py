"""The regular-grid view: stock zarr / xarray read every refgrid dataset through it."""

from __future__ import annotations

import json

import netCDF4
import numpy as np
import pytest
import xarray as xr
import zarr

import refgrid
from ground_truth import ground_truth, restore, same
from helpers import FIXTURES, closed
from tests.combining.test_combine import ARCHIVES, _combined

VIEWS = ["auto", "native", {"time": 4}]


@pytest.mark.parametrize("chunks", VIEWS, ids=["auto", "native", "time4"])
@pytest.mark.parametrize("archive", [a for a, (_, _, same_units) in ARCHIVES.items()
                                     if same_units])
def test_combined_archives_raw_values_with_stock_xarray(archive, chunks, tmp_path):
    _, refs, files = _combined(archive, tmp_path)
    raw = {"mask_and_scale": False, "decode_times": False}
    ours = xr.open_dataset(refgrid.get_mapper(refs, chunks=chunks), engine="zarr", **raw)
    expected = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals", **raw))
    for key, want in expected.variables.items():
        assert ours[key].dtype == want.dtype, key
        np.testing.assert_array_equal(ours[key].values, want.values, err_msg=key)


@pytest.mark.parametrize("chunks", VIEWS, ids=["auto", "native", "time4"])
@pytest.mark.parametrize("archive", ARCHIVES)
def test_combined_archives_read_with_stock_xarray(archive, chunks, tmp_path):
    _, refs, files = _combined(archive, tmp_path)
    expected = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals"))
    unpacked = xr.open_dataset(refgrid.get_mapper(refs, chunks=chunks, unpack=True),
                               engine="zarr")
    ours = xr.open_dataset(refgrid.get_mapper(refs, chunks=chunks), engine="zarr")
    for key, want in expected.variables.items():
        assert unpacked[key].dtype == want.dtype, key  # exact, packed variables included
        np.testing.assert_array_equal(unpacked[key].values, want.values, err_msg=key)
        got = ours[key].values
        if "scale_factor" in want.encoding:  # JSON attributes: float64 unpacking, <= 1 ulp
            np.testing.assert_allclose(got.astype(want.dtype), want.values, rtol=1.2e-7)
        else:
            assert ours[key].dtype == want.dtype, key
            np.testing.assert_array_equal(got, want.values, err_msg=key)


def test_regular_arrays_keep_their_native_chunks_served_decoded(tmp_path):
    source = FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"
    group = refgrid.scan(source)
    mapper = refgrid.get_mapper(refgrid.to_kerchunk(group), chunks="native")
    doc = json.loads(mapper.fs.view.documents["tas"])
    assert doc["chunk_grid"]["configuration"]["chunk_shape"] == [10, 6, 8]
    assert doc["codecs"] == [{"name": "bytes", "configuration": {"endian": "little"}}]
    with netCDF4.Dataset(source) as nc:
        expected = nc["tas"][10:20].filled().astype("<f4")
    assert mapper["tas/c/1/0/0"] == expected.tobytes()


def test_a_chunk_that_does_not_decode_is_a_read_error_naming_it(tmp_path):
    """Through the mapper a damaged chunk raised zlib.error from inside zarr."""
    source = tmp_path / "tas.nc"
    source.write_bytes((FIXTURES / "monthly" / "chunk10" / "tas_200101.nc").read_bytes())
    group = refgrid.scan(source)
    tas = group["tas"]
    data = bytearray(source.read_bytes())
    start = int(tas.manifest.offset[1, 0, 0])
    data[start:start + 16] = bytes(16)
    source.write_bytes(bytes(data))
    mapper = refgrid.get_mapper(refgrid.to_kerchunk(group), chunks="native",
                                verify_sources=False)
    with pytest.raises(refgrid.ReadError, match=r"tas/c/1/0/0"):
        xr.open_dataset(mapper, engine="zarr", consolidated=True)["tas"].values  # noqa: B018


def test_irregular_arrays_get_a_regular_view_of_the_most_common_length(tmp_path):
    _, refs, _ = _combined("monthly/chunkfile", tmp_path)
    view = json.loads(refgrid.get_mapper(refs, chunks="native").fs.view.documents["tas"])
    assert view["chunk_grid"] == {"name": "regular", "configuration": {
        "chunk_shape": [31, 6, 8]}}
    assert view["codecs"] == [{"name": "bytes", "configuration": {"endian": "little"}}]
    assert json.loads(refgrid.get_mapper(refs, chunks={"time": 7}).fs.view.documents["tas"])[
        "chunk_grid"]["configuration"]["chunk_shape"] == [7, 6, 8]


@pytest.mark.parametrize("chunks", ["auto", "native"])
def test_every_fixture_variable_through_the_view(chunks):
    for name in ("features/netcdf4_features.nc", "features/shrunk_variable.nc",
                 "features/hdf5_filters.h5", "features/hdf5_layouts_latest.h5",
                 "netcdf3/cdf5.nc"):
        group = refgrid.scan(FIXTURES / name, on_error="report")
        root = zarr.open_group(refgrid.get_mapper(refgrid.to_kerchunk(group), chunks=chunks),
                               mode="r")
        truth = ground_truth(FIXTURES / name)
        for path, node in group.walk():
            if isinstance(node, refgrid.VirtualArray) and path in truth:
                assert same(restore(root[path][...], dict(node.attrs)), truth[path]), (name,
                                                                                       path)


def test_consolidated_metadata_and_listing(tmp_path):
    group = refgrid.scan(FIXTURES / "features" / "netcdf4_features.nc")
    mapper = refgrid.get_mapper(refgrid.to_kerchunk(group))
    consolidated = zarr.open_consolidated(mapper, zarr_format=3)
    assert "model/run1/t" in dict(consolidated.members(max_depth=None))
    assert set(mapper.fs.ls("model", detail=False)) == {"model/zarr.json", "model/t",
                                                        "model/run1"}
    tree = xr.open_datatree(mapper, engine="zarr")
    np.testing.assert_array_equal(tree["model/run1"].ds["t"].values, [7, 8, 9])


def test_missing_source_is_an_error_not_fill_values(tmp_path):
    import shutil

    source = tmp_path / "tas.nc"
    shutil.copy(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc", source)
    refs = refgrid.to_kerchunk(refgrid.scan(source))
    source.unlink()
    tas = zarr.open_group(refgrid.get_mapper(refs, chunks="native"), mode="r")["tas"]
    with pytest.raises(refgrid.RefgridError, match=r"array 'tas', chunk tas/c/0/0/0 \(.*tas\.nc "
                                                   r"bytes \d+-\d+\): source file not found"):
        tas[0]


# -- assembled view chunks --------------------------------------------------------------------

def _small_chunks(path, shape=(120, 40, 30), chunks=(1, 10, 10), skip_every=0):
    """A zlib NetCDF4 variable of many small chunks; with ``skip_every`` some time steps are
    never written (missing chunks, read as the fill value)."""
    values = np.random.default_rng(1).random(shape, dtype="f4")
    with netCDF4.Dataset(path, "w") as nc:
        for k, n in enumerate(shape):
            nc.createDimension(f"d{k}", n)
        v = nc.createVariable("v", "f4", tuple(f"d{k}" for k in range(len(shape))),
                              zlib=True, chunksizes=chunks, fill_value=-9.0)
        for t in range(shape[0]):
            if not skip_every or t % skip_every:
                v[t] = values[t]
    return path


def test_auto_view_assembles_whole_native_chunks_into_fewer_larger_ones(tmp_path):
    source = _small_chunks(tmp_path / "small.nc")
    refs = refgrid.to_kerchunk(refgrid.scan(source))
    auto = refgrid.get_mapper(refs)
    block = json.loads(auto.fs.view.documents["v"])["chunk_grid"]["configuration"][
        "chunk_shape"]
    assert block != [1, 10, 10]
    assert all(b % n == 0 or b == size
               for b, n, size in zip(block, (1, 10, 10), (120, 40, 30), strict=True))
    with netCDF4.Dataset(source) as nc:
        truth = nc["v"][...].filled()
    calls = {}
    for chunks in ("auto", "native"):
        mapper = refgrid.get_mapper(refs, chunks=chunks)
        served = []
        view = mapper.fs.view
        real = view._assembled
        view._assembled = lambda c, real=real, served=served: served.append(c) or real(c)
        v = zarr.open_group(mapper, mode="r")["v"]
        for selection in (np.s_[:, 17, 21], np.s_[55], np.s_[3:9, 5:35, :], np.s_[...]):
            np.testing.assert_array_equal(v[selection], truth[selection])
        calls[chunks] = len(served)
    assert calls["auto"] < calls["native"] / 4


def test_auto_view_fills_missing_native_chunks(tmp_path):
    source = _small_chunks(tmp_path / "holes.nc", shape=(40, 20, 20), skip_every=3)
    refs = refgrid.to_kerchunk(refgrid.scan(source))
    assert (refgrid.scan(source)["v"].manifest.path_id < 0).any()
    ours = xr.open_dataset(refgrid.get_mapper(refs), engine="zarr")["v"].values
    np.testing.assert_array_equal(ours, closed(xr.open_dataset(source))["v"].values)


def test_view_chunk_choice():
    from refgrid.read.view_chunks import MAX_BLOCK_BYTES, view_chunks

    def array(shape, chunks, dtype="f4"):
        grid = refgrid.RectilinearGrid.regular(shape, chunks)
        return refgrid.VirtualArray("t", ("time", "lat", "lon"), np.dtype(dtype), grid,
                                    refgrid.ChunkManifest.empty(grid.chunk_counts))

    small = array((10_000, 100, 100), (1, 10, 10))
    shape, native = view_chunks(small, "auto")
    assert not native and np.prod(shape) > 100 and np.prod(shape) * 4 <= MAX_BLOCK_BYTES
    assert [s % n for s, n in zip(shape, (1, 10, 10), strict=True)] == [0, 0, 0]
    maps = array((2000, 720, 1440), (1, 720, 1440), "f8")  # 8 MiB chunks: already large
    assert view_chunks(maps, "auto") == ((1, 720, 1440), True)
    huge = array((4, 4000, 4000), (1, 4000, 4000), "f8")  # a native chunk over the cap
    assert view_chunks(huge, "auto") == ((1, 4000, 4000), True)
    overhang = array((4, 3000, 3000), (1, 4000, 4000), "f8")  # chunks past the array's end
    assert view_chunks(overhang, "auto") == ((1, 3000, 3000), False)
    assert view_chunks(small, "native") == ((1, 10, 10), True)
    assert view_chunks(small, {"time": 5}) == ((5, 10, 10), False)
    strings = refgrid.VirtualArray("s", ("time",), np.dtypes.StringDType(),
                                   refgrid.RectilinearGrid.regular((500,), (1,)),
                                   refgrid.ChunkManifest.empty((500,)))
    assert view_chunks(strings, "auto") == ((1,), True)  # vlen: served as stored
    with pytest.raises(refgrid.ArgumentError, match="chunks must be 'auto', 'native'"):
        view_chunks(small, "large")


def test_zarr_awaits_the_view_directly_and_sync_use_still_works(tmp_path):
    """zarr wraps a sync filesystem to run each chunk in a thread; the view is awaited."""
    source = FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"
    mapper = refgrid.get_mapper(refgrid.to_kerchunk(refgrid.scan(source)), chunks="native")
    store = zarr.storage.FsspecStore.from_mapper(mapper, read_only=True)
    assert store.fs is mapper.fs
    with netCDF4.Dataset(source) as nc:
        expected = nc["tas"][10:20].filled().astype("<f4").tobytes()
    assert mapper["tas/c/1/0/0"] == expected  # the mapping, as before
    assert mapper.fs.cat_file("tas/c/1/0/0", 4, 12) == expected[4:12]
    assert "tas/c/9/0/0" not in mapper
    tas = zarr.open_group(store, mode="r")["tas"]
    np.testing.assert_array_equal(tas[10:20], np.frombuffer(expected, "<f4").reshape(10, 6, 8))
    assert sorted(mapper.fs.find("")) == sorted(mapper.fs.find("", detail=False))

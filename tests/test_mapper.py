"""The regular-grid view: stock zarr / xarray read every refgrid dataset through it."""

from __future__ import annotations

import netCDF4
import numpy as np
import pytest
import xarray as xr
import zarr

import refgrid
from ground_truth import ground_truth, restore, same
from helpers import FIXTURES
from test_combine import ARCHIVES, _combined


@pytest.mark.parametrize("archive", [a for a, (_, _, same_units) in ARCHIVES.items()
                                     if same_units])
def test_combined_archives_raw_values_with_stock_xarray(archive, tmp_path):
    _, refs, files = _combined(archive, tmp_path)
    raw = {"mask_and_scale": False, "decode_times": False}
    ours = xr.open_dataset(refgrid.get_mapper(refs), engine="zarr", **raw)
    expected = xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals", **raw)
    for key, want in expected.variables.items():
        assert ours[key].dtype == want.dtype, key
        np.testing.assert_array_equal(ours[key].values, want.values, err_msg=key)


@pytest.mark.parametrize("archive", ARCHIVES)
def test_combined_archives_read_with_stock_xarray(archive, tmp_path):
    _, refs, files = _combined(archive, tmp_path)
    expected = xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals")
    unpacked = xr.open_dataset(refgrid.get_mapper(refs, unpack=True), engine="zarr")
    ours = xr.open_dataset(refgrid.get_mapper(refs), engine="zarr")
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
    mapper = refgrid.get_mapper(refgrid.to_kerchunk(group))
    doc = mapper.fs.documents["tas"]
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
    mapper = refgrid.get_mapper(refgrid.to_kerchunk(group), verify_sources=False)
    with pytest.raises(refgrid.ReadError, match=r"tas/c/1/0/0"):
        xr.open_dataset(mapper, engine="zarr", consolidated=True)["tas"].values  # noqa: B018


def test_irregular_arrays_get_a_regular_view_of_the_most_common_length(tmp_path):
    _, refs, _ = _combined("monthly/chunkfile", tmp_path)
    view = refgrid.get_mapper(refs).fs.documents["tas"]
    assert view["chunk_grid"] == {"name": "regular", "configuration": {
        "chunk_shape": [31, 6, 8]}}
    assert view["codecs"] == [{"name": "bytes", "configuration": {"endian": "little"}}]
    assert refgrid.get_mapper(refs, chunks={"time": 7}).fs.documents["tas"]["chunk_grid"][
        "configuration"]["chunk_shape"] == [7, 6, 8]


def test_every_fixture_variable_through_the_view():
    for name in ("features/netcdf4_features.nc", "features/shrunk_variable.nc",
                 "features/hdf5_filters.h5", "features/hdf5_layouts_latest.h5",
                 "netcdf3/cdf5.nc"):
        group = refgrid.scan(FIXTURES / name, on_error="report")
        root = zarr.open_group(refgrid.get_mapper(refgrid.to_kerchunk(group)), mode="r")
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
    tas = zarr.open_group(refgrid.get_mapper(refs), mode="r")["tas"]  # passed through
    with pytest.raises(refgrid.RefgridError, match=r"array 'tas': source file not found: "
                                                   r".*tas\.nc \(chunk tas/c/0/0/0"):
        tas[0]

"""Every variable of every HDF5/NetCDF4 fixture and corpus file reads back equal to ground
truth through refgrid's references with *stock* zarr + fsspec ``reference://``."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from acceptance import FileResult, check_file, stock_zarr_group, stock_zarr_reader, table
from helpers import FIXTURES, closed, hdf5_files
from refgrid.grid.json_forms import emit_chunk_grid
from refgrid.model.manifest import INLINE
from refgrid.scanners import scan


def _check_all(files) -> list[FileResult]:
    results = [check_file(p, stock_zarr_reader, lambda a: a.grid.is_regular) for p in files]
    print("\n" + table(results))
    return results


def _assert_nothing_wrong(results: list[FileResult]) -> None:
    failures = [f"{r.path.name}: {r.error or r.wrong}" for r in results if r.status == "failed"]
    assert not failures, "\n".join(failures)


def test_fixtures_read_back_equal_to_ground_truth():
    results = _check_all(hdf5_files(FIXTURES))
    _assert_nothing_wrong(results)
    # what stock zarr cannot read here is exactly what needs a rectilinear grid
    unread = {(r.path.name, v) for r in results for v in r.unread}
    assert unread == {("shrunk_variable.nc", "v")}
    assert sum(len(r.ok) for r in results) > 200


def test_corpus_reads_back_equal_to_ground_truth(corpus):
    results = _check_all(hdf5_files(corpus))
    _assert_nothing_wrong(results)
    assert not any(r.unread for r in results)
    assert sum(len(r.ok) for r in results) > 3000


def test_most_stored_bytes_stay_referenced(corpus):
    """Across the corpus, >= 95% of the stored bytes of chunked and contiguous datasets are
    byte-range references, not copies."""
    stored = referenced = 0
    for path in hdf5_files(corpus):
        arrays = dict(scan(path, on_error="report").walk())
        for name, size in _referenceable_storage(path):
            stored += size
            if name in arrays:
                m = arrays[name].manifest
                referenced += int(m.length[m.path_id >= 0].sum())
    share = referenced / stored
    print(f"\nreferenced {referenced:,} of {stored:,} stored bytes ({share:.1%})")
    assert share >= 0.95


def _referenceable_storage(path):
    """(dataset path, stored bytes) of every chunked or contiguous dataset of a file."""
    found = []
    with h5py.File(path) as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and obj.shape is not None and \
                    obj.id.get_create_plist().get_layout() in (h5py.h5d.CHUNKED,
                                                               h5py.h5d.CONTIGUOUS):
                found.append((name, obj.id.get_storage_size()))
        f.visititems(visit)
    return found


# -- the traps other tools fall into ----------------------------------------------------------

def _refs(path):
    from refgrid.writers.references import to_kerchunk

    return to_kerchunk(scan(path, on_error="report"))


def test_scalar_chunk_key_is_c_not_empty():
    refs = _refs(FIXTURES / "features" / "netcdf4_features.nc")
    keys = refs["refs"]
    assert "scalar/c" in keys and "scalar/" not in keys and "scalar/0" not in keys
    assert stock_zarr_reader(refs)("scalar") == 3.25


def test_compact_layout_is_inlined_not_fill():
    path = FIXTURES / "features" / "hdf5_layouts_latest.h5"
    array = scan(path)["compact"]
    assert array.manifest.path_id[0, 0] == INLINE
    got = stock_zarr_reader(_refs(path))("compact")
    np.testing.assert_array_equal(got, np.arange(15, dtype="i2").reshape(5, 3))


def test_filter_masked_chunks_are_inlined_and_reported():
    path = FIXTURES / "features" / "hdf5_filters.h5"
    group = scan(path)
    assert (group["filter_mask"].manifest.path_id == INLINE).sum() == 1
    assert any(e.variable == "filter_mask" and "filter_mask" in e.reason for e in group.report)
    with h5py.File(path) as f:
        np.testing.assert_array_equal(stock_zarr_reader(_refs(path))("filter_mask"),
                                      f["filter_mask"][...])


def test_inline_bytes_are_stored_verbatim_as_base64():
    import base64

    path = FIXTURES / "features" / "hdf5_layouts_latest.h5"
    value = _refs(path)["refs"]["compact/c/0/0"]
    assert value.startswith("base64:")
    assert base64.b64decode(value[7:]) == np.arange(15, dtype="<i2").tobytes()


def test_netcdf_default_fill_value_not_zero():
    path = FIXTURES / "features" / "netcdf4_features.nc"
    got = stock_zarr_reader(_refs(path))("unwritten")
    np.testing.assert_array_equal(got, np.full(4, 9.969209968386869e36, dtype="f4"))
    partial = stock_zarr_reader(_refs(path))("partial")
    assert (partial[2:] == -2147483647).all()


def test_phony_dimensions_are_unique_per_length():
    group = scan(FIXTURES / "features" / "hdf5_layouts_latest.h5")
    len5, len7, both = group["len5"].dims, group["len7"].dims, group["len5x7"].dims
    assert len5 != len7
    assert both == (len5[0], len7[0])
    names = {}
    for _, node in group.walk():
        for dim, n in zip(getattr(node, "dims", ()), getattr(node, "shape", ()), strict=True):
            assert names.setdefault(dim, n) == n, f"{dim} used for lengths {names[dim]} and {n}"


# the file holds an HDF5 opaque type on purpose; netCDF4, the ground truth here, warns that it
# skips that variable when it opens the file
@pytest.mark.filterwarnings("ignore:WARNING. variable 'opaque' has unsupported datatype")
def test_odd_attributes_do_not_fail_the_file():
    import netCDF4

    path = FIXTURES / "features" / "hdf5_types.h5"
    group = scan(path, on_error="report")
    with netCDF4.Dataset(path) as nc:  # Latin-1 bytes: UTF-8 with replacement, as netCDF4
        assert group.attrs["non_utf8"] == nc.getncattr("non_utf8") == "caf\ufffd"
    assert group.attrs["array"] == [0.0, 1.0, 2.0, 3.0]
    assert np.isnan(group.attrs["nan"])
    assert "ref" not in group.attrs
    assert any(e.variable == "/@ref" and e.action == "attribute-skipped" for e in group.report)


def test_unsupported_filters_are_served_and_reported_never_dropped():
    path = FIXTURES / "features" / "hdf5_filters.h5"
    group = scan(path)
    reported = {e.variable: e for e in group.report}
    for name in ("scaleoffset_int", "scaleoffset_float"):
        assert name in group.arrays
        assert reported[name].action == "inlined" and "scaleoffset" in reported[name].reason
        with h5py.File(path) as f:
            np.testing.assert_array_equal(stock_zarr_reader(_refs(path))(name), f[name][...])


def test_on_error_raise_names_file_variable_and_reason():
    from refgrid.errors import ScanError

    path = FIXTURES / "features" / "hdf5_filters.h5"
    with pytest.raises(ScanError, match=r"hdf5_filters\.h5: variable 'scaleoffset_int': HDF5 "
                                        r"filter 6 \(scaleoffset\) has no Zarr codec.*exceed"):
        scan(path, fallback_inline_limit=100)
    group = scan(path, fallback_inline_limit=100, on_error="report")
    assert "scaleoffset_int" not in group.arrays and "gzip" in group.arrays
    assert {e.variable for e in group.report if e.action == "skipped"} == {
        "scaleoffset_int", "scaleoffset_float"}


def test_variable_shorter_than_its_dimension_stays_regular_when_padding_is_fill():
    """netCDF-C fills an edge chunk's padding: the chunk is read further, the grid regular."""
    short = scan(FIXTURES / "features" / "netcdf4_features.nc")["short"]
    assert short.shape == (10,)
    assert short.grid.is_regular and short.grid.lengths(0).tolist() == [4, 4, 2]
    assert short.manifest.missing.tolist() == [False, False, True]


def test_variable_shorter_than_its_dimension_with_stale_padding_is_cut():
    """Stale values past the extent must not leak: the edge chunk's padding is cut off."""
    v = scan(FIXTURES / "features" / "shrunk_variable.nc")["v"]
    assert v.grid.lengths(0).tolist() == [4, 2, 4]
    assert emit_chunk_grid(v.grid)["configuration"]["encoded_chunk_shapes"] == [4]
    assert v.manifest.missing.tolist() == [False, False, True]


def test_scan_errors_are_clear(tmp_path):
    from refgrid.errors import FormatError, ScanError

    with pytest.raises(ScanError, match=r"nope\.nc: No such file or directory"):
        scan("nope.nc")
    with pytest.raises(FormatError, match=r"VERSIONS\.json: .*not Zarr references"):
        scan(FIXTURES / "VERSIONS.json")
    (tmp_path / "junk.bin").write_bytes(b"GRIB" + bytes(100))
    with pytest.raises(FormatError, match=r"junk\.bin: not an HDF5/NetCDF4/NetCDF3 file"):
        scan(tmp_path / "junk.bin")


@pytest.mark.parametrize("name", ["monthly/chunk10/tas_200101.nc", "yearly/chunk73/tas_2000.nc",
                                  "monthly/contiguous/tas_200102.nc",
                                  "features/netcdf4_features.nc"])
def test_stock_xarray_zarr_engine_decodes_like_the_source(name):
    """Decoded values (times, packing, masking) equal xarray's decode of the source file.
    Packed data decodes to float64 from Zarr but float32 from netCDF: JSON attributes do not
    keep scale_factor's float32 type, so values are compared in the source's dtype."""
    import xarray as xr

    group = stock_zarr_group(_refs(FIXTURES / name))
    ours = xr.open_dataset(group.store, engine="zarr", zarr_format=3, consolidated=False)
    source = closed(xr.open_dataset(FIXTURES / name))
    assert set(source.variables) <= set(ours.variables)
    for key, expected in source.variables.items():
        got = ours[key]
        assert got.dims == expected.dims, key
        values = got.values.astype(expected.dtype) if expected.dtype.kind == "f" else got.values
        if "scale_factor" in expected.encoding:  # unpacked in float64, not float32: 1 ulp
            np.testing.assert_allclose(values, expected.values, rtol=1.2e-7, err_msg=key)
        elif expected.dtype.kind in "fM":
            np.testing.assert_array_equal(values, expected.values, err_msg=key)
        else:
            assert (values == expected.values).all(), key
        ignored = {"_FillValue", "_refgrid_attribute_types", "_refgrid_encoding"}
        assert {k: v for k, v in got.attrs.items() if k not in ignored} == {
            k: v for k, v in expected.attrs.items() if k not in ignored}, key

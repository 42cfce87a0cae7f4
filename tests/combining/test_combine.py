"""Combining files of irregular length: values against xarray.open_mfdataset, grid JSON
against the spec, and every error path naming the variable and the offending files."""

from __future__ import annotations

import json
from dataclasses import replace

import jsonschema
import numpy as np
import pytest
import xarray as xr

import refgrid
from helpers import FIXTURES, closed
from refgrid.combining import CombineError, combine
from refgrid.grid.json_forms import emit_chunk_grid, parse_chunk_grid
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import INLINE, ChunkManifest

# archive → (chunk_grid name of tas, encoded_chunk_shapes expected, same time units)
ARCHIVES = {
    "monthly/chunk10": ("rectilinear", [10, 6, 8], True),      # padded interior chunks
    "monthly/chunkfile": ("rectilinear", None, True),          # chunk = whole file
    "monthly/contiguous": ("rectilinear", None, True),         # contiguous files
    "yearly/chunk73": ("rectilinear", [73, 3, 4], True),       # 366 = 5 x 73 + 1
    "yearly/chunk100": ("rectilinear", [100, 3, 4], True),
    "yearly/last_ragged": ("regular", None, True),             # only the last file ragged
    "yearly/mixed_units": ("rectilinear", [73, 3, 4], False),  # days vs hours since
    "netcdf3/classic": ("regular", None, True),                # one chunk per record
    "netcdf3/offset64": ("regular", None, True),
}


def _files(archive):
    return sorted((FIXTURES / archive).glob("*.nc"))


def _combined(archive, tmp_path):
    files = _files(archive)
    group = combine([refgrid.scan(f) for f in reversed(files)], "time")  # order by time
    return group, refgrid.write(group, tmp_path / "combined.json", padded="encoded"), files


@pytest.mark.parametrize("archive", ARCHIVES)
def test_combined_archive_equals_open_mfdataset(archive, tmp_path):
    _, refs, files = _combined(archive, tmp_path)
    ours = xr.open_dataset(refs, engine="refgrid")
    # data_vars="minimal": variables without "time" stay single (refgrid checks they are
    # identical) instead of being broadcast along time as data_vars="all" would
    expected = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals"))
    assert set(ours.variables) == set(expected.variables)
    for key in expected.variables:
        assert ours[key].dtype == expected[key].dtype, key
        np.testing.assert_array_equal(ours[key].values, expected[key].values, err_msg=key)
    if ARCHIVES[archive][2]:  # raw values too, where every file has the same encoding
        raw = xr.open_dataset(refs, engine="refgrid", mask_and_scale=False, decode_times=False)
        expected_raw = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                         data_vars="minimal", compat="equals", mask_and_scale=False,
                                         decode_times=False))
        for key in expected_raw.variables:
            np.testing.assert_array_equal(raw[key].values, expected_raw[key].values,
                                          err_msg=key)


@pytest.mark.parametrize("archive", ARCHIVES)
def test_zarr_json_is_shortest_and_carries_encoded_extents_exactly_when_needed(
        archive, tmp_path, rectilinear_schema):
    name, encoded, _ = ARCHIVES[archive]
    _, refs, _ = _combined(archive, tmp_path)
    doc = json.loads(json.loads(refs.read_text())["refs"]["tas/zarr.json"])
    grid = doc["chunk_grid"]
    assert grid["name"] == name
    if name == "rectilinear":
        jsonschema.validate(grid, rectilinear_schema)
        assert grid["configuration"].get("encoded_chunk_shapes") == encoded
    assert parse_chunk_grid(grid, doc["shape"]).shape == tuple(doc["shape"])


def test_monthly_chunk10_grid_json(tmp_path):
    group, _, _ = _combined("monthly/chunk10", tmp_path)
    assert emit_chunk_grid(group["tas"].grid) == {"name": "rectilinear", "configuration": {
        "kind": "inline",
        "chunk_shapes": [[[10, 3], [1, 1], [10, 2], [8, 1], [10, 3], [1, 1], [10, 6], [1, 1],
                          [10, 6], [1, 1], [10, 3], [1, 1], [10, 6], [1, 1], [10, 6], [1, 1]],
                         [[6, 1]], [[8, 1]]],
        "encoded_chunk_shapes": [10, 6, 8]}}
    assert group["time"].manifest.path_id.tolist() == [INLINE]  # the coordinate is inlined


def test_native_chunks_through_dask(tmp_path):
    _, refs, _ = _combined("monthly/chunkfile", tmp_path)
    ds = xr.open_dataset(refs, engine="refgrid", chunks={})
    assert ds.tas.chunks[0] == (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def test_mixed_time_units_are_reencoded_to_the_first_files(tmp_path):
    group, refs, _ = _combined("yearly/mixed_units", tmp_path)
    assert group["time"].attrs["units"] == "days since 2000-01-01"
    raw = xr.open_dataset(refs, engine="refgrid", decode_times=False)
    np.testing.assert_array_equal(raw.time.values, np.arange(366 + 365, dtype="f8"))


def test_attribute_conflicts_keep_the_first_and_are_recorded(tmp_path):
    group, _, files = _combined("monthly/chunk10", tmp_path)
    assert group.attrs["title"] == "daily tas, 2001-01"
    conflicts = [e for e in group.report if e.action == "attribute-conflict"]
    assert len(conflicts) == 11 and conflicts[0].url == str(files[1])


def test_groups_are_combined_group_by_group():
    source = FIXTURES / "features" / "netcdf4_features.nc"
    one = refgrid.scan(source)
    both = combine([one, one], "time", sources=["a.nc", "b.nc"])
    assert both["long"].shape == (20,)
    assert both["model/run1/t"] == one["model/run1/t"]  # no time dimension: taken once
    assert both["model"].attrs == one["model"].attrs


# -- errors name the variable and every offending file ---------------------------------------

def _monthly(*months, kind="chunk10"):
    return [refgrid.scan(FIXTURES / "monthly" / kind / f"tas_2001{m:02d}.nc") for m in months]


def test_overlapping_files_name_both():
    jan = _monthly(1)[0]
    with pytest.raises(CombineError, match=r"time: b\.nc ends at 2001-01-31.* but a\.nc|"
                                           r"time: a\.nc ends at 2001-01-31.*but b\.nc starts"):
        combine([jan, jan], "time", sources=["a.nc", "b.nc"])
    assert combine([jan, jan], "time", overlap="allow")["tas"].shape == (62, 6, 8)


def test_files_with_other_codecs_join_in_segments_read_as_xarray_reads_them(tmp_path):
    files = [FIXTURES / "monthly" / "chunk10" / f"tas_20010{m}.nc" for m in (1, 2)] + [
        FIXTURES / "monthly" / "contiguous" / "tas_200103.nc"]
    group = combine([refgrid.scan(f) for f in files], "time")
    assert group["tas"].segments is not None and len(group["tas"].segments) == 2
    ours = xr.open_dataset(refgrid.write(group, tmp_path / "refs.json"), engine="refgrid")
    expected = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                        data_vars="minimal", compat="equals"))
    xr.testing.assert_identical(ours.tas, expected.tas)
    assert ours.tas.dtype == expected.tas.dtype
    with pytest.raises(CombineError, match=r"tas: codecs differs in m3\.nc from m1\.nc.*"
                                           r"codecs='recode'"):
        combine(_monthly(1, 2) + _monthly(3, kind="contiguous"), "time",
                sources=["m1.nc", "m2.nc", "m3.nc"], codecs="error")


def test_compression_level_alone_is_fine():
    jan, feb = _monthly(1, 2)
    tas = feb["tas"]
    codecs = tuple({**c, "configuration": {**c.get("configuration", {}), "level": 9}}
                   if c["name"] == "numcodecs.zlib" else c for c in tas.codecs)
    feb = replace(feb, arrays={**feb.arrays, "tas": replace(tas, codecs=codecs)})
    joined = combine([jan, feb], "time")["tas"]
    assert joined.shape == (59, 6, 8) and joined.segments is None  # (not a segment either)


def test_shape_dtype_and_missing_variables_name_every_file():
    def only_tas(group):
        return replace(group, arrays={k: group.arrays[k] for k in ("time", "tas")})

    monthly = only_tas(_monthly(1)[0])
    yearly = only_tas(refgrid.scan(FIXTURES / "yearly" / "chunk73" / "tas_2002.nc"))
    with pytest.raises(CombineError, match=r"tas: shape on other dimensions differs in y\.nc"):
        combine([monthly, yearly], "time", sources=["m.nc", "y.nc"])
    jan, feb, mar = _monthly(1, 2, 3)
    feb = replace(feb, arrays={k: v for k, v in feb.arrays.items() if k != "tas"})
    mar = replace(mar, arrays={k: v for k, v in mar.arrays.items() if k != "tas"})
    with pytest.raises(CombineError, match=r"variables are not in every file: tas missing from "
                                           r"b\.nc, c\.nc"):
        combine([jan, feb, mar], "time", sources=["a.nc", "b.nc", "c.nc"])


def _decoded(tas: refgrid.VirtualArray) -> np.ndarray:
    """A file's ``tas`` as xarray decodes its stored values under its attributes."""
    from refgrid.core.dtypes import reader_attrs
    from refgrid.read.array import read

    variable = xr.Variable(tas.dims, read(tas), reader_attrs(tas.attrs))
    return xr.conventions.decode_cf_variable("tas", variable, decode_times=False).values


def test_units_must_agree_and_packing_decodes_per_file():
    a, b = (refgrid.scan(FIXTURES / "yearly" / "chunk73" / f"tas_{y}.nc") for y in (2000, 2001))
    tas = b["tas"]
    other = replace(b, arrays={**b.arrays, "tas": replace(tas, attrs={**tas.attrs,
                                                                      "units": "degC"})})
    with pytest.raises(CombineError, match=r"tas: units differs in b\.nc from a\.nc"):
        combine([a, other], "time", sources=["a.nc", "b.nc"])
    packed = replace(tas, attrs={**tas.attrs, "scale_factor": 0.02})
    joined = combine([a, replace(b, arrays={**b.arrays, "tas": packed})], "time")["tas"]
    from refgrid.read.array import read

    expected = np.concatenate([_decoded(a["tas"]), _decoded(packed)])
    assert joined.dtype == expected.dtype
    np.testing.assert_array_equal(read(joined), expected)


def test_variables_without_the_concat_dimension_must_be_identical_or_stacked():
    jan, feb = _monthly(1, 2)
    lat = feb["lat"]
    data = (np.arange(6, dtype="<f8") * 3).tobytes()
    grid = RectilinearGrid.regular([6], [6])
    other = replace(lat, grid=grid, codecs=({"name": "bytes", "configuration":
                                             {"endian": "little"}},),
                    manifest=ChunkManifest((), np.array([INLINE]), np.zeros(1), np.zeros(1),
                                           {(0,): data}))
    feb = replace(feb, arrays={**feb.arrays, "lat": other})
    with pytest.raises(CombineError, match=r"lat: has no 'time' dimension and differs in "
                                           r"feb\.nc from jan\.nc"):
        combine([jan, feb], "time", sources=["jan.nc", "feb.nc"])
    stacked = combine([jan, feb], "time", others="stack")
    assert stacked["lat"].dims == ("file", "lat") and stacked["lat"].shape == (2, 6)
    from refgrid.read.array import read

    np.testing.assert_array_equal(read(stacked["lat"])[1], np.arange(6) * 3.0)


def test_nothing_to_combine():
    with pytest.raises(CombineError, match="nothing to combine"):
        combine([], "time")


def _mixture():
    return [FIXTURES / "monthly" / "chunk10" / "tas_200101.nc",
            FIXTURES / "monthly" / "contiguous" / "tas_200102.nc",
            FIXTURES / "monthly" / "chunkfile" / "tas_200103.nc"]


def _open_all(refs, group=None, **decode):
    """The combined dataset through refgrid's engine and through the mapper + stock xarray."""
    engine = xr.open_dataset(refs, engine="refgrid", group=group, **decode)
    mapper = xr.open_dataset(refgrid.get_mapper(refs), engine="zarr", group=group, **decode)
    return engine, mapper


@pytest.mark.parametrize("decode", [{}, {"mask_and_scale": False, "decode_times": False}])
def test_chunked_and_contiguous_mixture_with_recode(tmp_path, decode):
    files = _mixture()
    group = combine([refgrid.scan(f) for f in files], "time", codecs="recode")
    assert [e.variable for e in group.report if e.action == "inlined"] == ["tas"]
    refs = refgrid.write(group, tmp_path / "mix.json")
    expected = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals", **decode))
    for ours in _open_all(refs, **decode):
        for key in expected.variables:
            np.testing.assert_array_equal(ours[key].values, expected[key].values, err_msg=key)


@pytest.mark.parametrize("decode", [{}, {"mask_and_scale": False, "decode_times": False}])
@pytest.mark.parametrize("group", [None, "surface", "surface/upper"])
def test_groups_archive_is_combined_group_by_group(tmp_path, group, decode):
    files = sorted((FIXTURES / "groups").glob("*.nc"))
    combined = combine([refgrid.scan(f) for f in reversed(files)], "time")
    refs = refgrid.write(combined, tmp_path / "groups.json")
    expected = closed(xr.open_mfdataset(files, group=group, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals", **decode))
    for ours in _open_all(refs, group=group, **decode):
        for key in expected.variables:
            np.testing.assert_array_equal(ours[key].values, expected[key].values, err_msg=key)


def test_chunking_on_other_dimensions_must_agree():
    jan, feb = _monthly(1, 2)
    tas = feb["tas"]
    grid = RectilinearGrid.regular(tas.shape, (10, 3, 8))
    feb = replace(feb, arrays={**feb.arrays, "tas": replace(
        tas, grid=grid, manifest=ChunkManifest.empty(grid.chunk_counts))})
    with pytest.raises(CombineError, match=r"tas: chunking on other dimensions differs in "
                                           r"feb\.nc from jan\.nc"):
        combine([jan, feb], "time", sources=["jan.nc", "feb.nc"])


def test_fill_values_that_differ_decode_per_file():
    a, b = (refgrid.scan(FIXTURES / "yearly" / "chunk73" / f"tas_{y}.nc") for y in (2000, 2001))
    attrs = {k: v for k, v in b["tas"].attrs.items() if k != "missing_value"}
    marked = replace(b["tas"], fill_value=np.float32(-1), attrs={**attrs, "_FillValue": -1.0})
    joined = combine([a, replace(b, arrays={**b.arrays, "tas": marked})], "time")["tas"]
    from refgrid.read.array import read

    np.testing.assert_array_equal(read(joined), np.concatenate([_decoded(a["tas"]),
                                                                _decoded(marked)]))


def _levels(path, levels, values=None):
    """A file of ``t`` along a ``lev`` coordinate of ``levels`` (as given: falling or not)."""
    lev = np.asarray(levels, dtype="f8")
    data = np.asarray(values if values is not None else lev * 10.0, dtype="f4")
    xr.Dataset({"t": (("lev",), data)}, coords={"lev": ("lev", lev, {"units": "hPa"})}
               ).to_netcdf(path, encoding={"t": {"_FillValue": None}, "lev": {"_FillValue": None}})
    return str(path)


@pytest.mark.parametrize("given", [(0, 1), (1, 0)])
def test_files_along_a_falling_coordinate_combine_highest_first_as_xarray(tmp_path, given):
    """Pressure levels written from the surface up: each file's values fall, so the files
    are ordered highest first — as xarray orders them — whatever order they are given in."""
    files = [_levels(tmp_path / "low.nc", [1000, 925, 850]),
             _levels(tmp_path / "high.nc", [700, 500, 300])]
    chosen = [files[k] for k in given]
    out = refgrid.write(combine(chosen, "lev"), tmp_path / "refs.json")
    ours = closed(xr.open_dataset(out, engine="refgrid"))
    expected = closed(xr.open_mfdataset(chosen, combine="by_coords"))
    xr.testing.assert_identical(ours, expected)
    assert ours["lev"].values.tolist() == [1000, 925, 850, 700, 500, 300]


def test_files_along_a_coordinate_that_rises_in_one_and_falls_in_another_are_refused(tmp_path):
    files = [_levels(tmp_path / "low.nc", [1000, 925, 850]),
             _levels(tmp_path / "high.nc", [300, 500, 700])]
    with pytest.raises(CombineError, match=r"lev: its values increase in .*high\.nc but "
                                           r"decrease in .*low\.nc"):
        combine(files, "lev")
    overlapping = [files[0], _levels(tmp_path / "mid.nc", [900, 800])]
    with pytest.raises(CombineError, match=r"ends at 850.* starts at 900.*overlap"):
        combine(overlapping, "lev")

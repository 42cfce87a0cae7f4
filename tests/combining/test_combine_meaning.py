"""Values whose meaning depends on per-file metadata stay right when files are combined, or
the combine is refused naming the variable and the files.

Archives write times in units relative to each file's start, change epoch, unit or type
along the way; bounds, climatologies and other time variables follow their file's units.
Every combined archive is compared with xarray's ``open_mfdataset`` of the same files (and,
for what xarray does not decode, with each file's own dates), through the engine, batch,
append and materialize."""

from __future__ import annotations

from dataclasses import replace

import cftime
import netCDF4
import numpy as np
import pytest
import xarray as xr

import refgrid
from helpers import closed
from realistic import Month, months, write
from refgrid.errors import CombineError

TIME_VARS = ("time", "time_bnds", "forecast_reference_time", "reference_time")


def _expected(files: list) -> xr.Dataset:
    return closed(xr.open_mfdataset(files, combine="nested", concat_dim="time", data_vars="minimal",
                             compat="equals", coords="minimal"))


def _file_dates(files: list, name: str) -> np.ndarray:
    """``name`` in every file decoded with that file's time units (what xarray leaves raw)."""
    out = []
    for path in files:
        with netCDF4.Dataset(path) as ds:
            time = ds["time"]
            out.append(cftime.num2date(ds[name][:], time.units, time.calendar,
                                       only_use_cftime_datetimes=True))
    return np.concatenate(out)


def _assert_like_xarray(ours: xr.Dataset, files: list) -> None:
    expected = _expected(files)
    try:
        assert set(ours.variables) == set(expected.variables)
        for key in expected.variables:
            assert ours[key].attrs.keys() == expected[key].attrs.keys(), key
            if key != "climatology_bnds":  # raw numbers there: each file's own units
                assert ours[key].dtype == expected[key].dtype, key
                np.testing.assert_array_equal(ours[key].values, expected[key].values,
                                              err_msg=key)
        # xarray does not decode climatology bounds: ours are in the combined time's units
        time = ours["time"].encoding
        mine = cftime.num2date(ours["climatology_bnds"].values, time["units"],
                               time.get("calendar", "standard"),
                               only_use_cftime_datetimes=True)
        np.testing.assert_array_equal(mine, _file_dates(files, "climatology_bnds"))
    finally:
        expected.close()


# -- mixed units, as archives have them --------------------------------------------------------

MIXED = {
    # units relative to each file's start, days in one year and hours in the next
    "per-file-epochs": months(2001, 3, "days since {start}") + months(2002, 2,
                                                                       "hours since {start}"),
    # one epoch, three units
    "days-hours-seconds": [
        *months(2001, 2, "days since 2001-01-01"),
        *months(2001, 4, "hours since 1970-01-01")[2:3],
        *months(2001, 4, "seconds since 2001-01-01 00:00:00")[3:4]],
    # integer storage: hours, then minutes of another epoch (multiples of 60: exact)
    "integers": [*months(2001, 2, "hours since 2001-01-01", dtype="i4"),
                 *months(2001, 3, "minutes since 1990-01-01", dtype="i8")[2:]],
    # other calendars: each archive in one calendar
    "noleap": months(2001, 3, "days since {start}", calendar="noleap"),
    "360_day": months(2001, 3, "hours since {start}", calendar="360_day"),
    "gregorian-is-standard": [*months(2001, 1, "days since 2001-01-01"),
                              *months(2001, 2, "hours since 2001-02-01",
                                      calendar="gregorian")[1:]],
}


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    root = tmp_path_factory.mktemp("meaning")
    return {name: write(root / name, spec) for name, spec in MIXED.items()}


@pytest.mark.parametrize("name", MIXED)
def test_mixed_units_combine_reads_like_open_mfdataset(archives, name, tmp_path):
    files = archives[name]
    group = refgrid.combine([str(f) for f in reversed(files)], "time")
    out = refgrid.write(group, tmp_path / "refs.json")
    with xr.open_dataset(out, engine="refgrid") as ours:
        _assert_like_xarray(ours, files)
    assert group["time"].attrs["units"] == MIXED[name][0].units


def test_the_report_names_each_reencoded_variable_once_and_no_units_conflict(archives):
    files = archives["per-file-epochs"]
    group = refgrid.combine([str(f) for f in files], "time")
    reencoded = [e.variable for e in group.report if e.action == "re-encoded"]
    assert sorted(reencoded) == ["climatology_bnds", "forecast_reference_time", "time",
                                 "time_bnds"]
    conflicts = {e.variable for e in group.report if e.action == "attribute-conflict"}
    assert not {v for v in conflicts if v.endswith(("@units", "@calendar"))}, conflicts
    assert "days since 2001-01-01" in next(e.reason for e in group.report
                                           if e.variable == "time_bnds")


def test_times_stay_references_where_every_file_has_the_same_units(tmp_path):
    files = write(tmp_path, months(2001, 3, "days since 2001-01-01"))
    group = refgrid.combine([str(f) for f in files], "time")
    # forecast_reference_time is in hours since each file's start: that one is re-encoded
    assert [e.variable for e in group.report if e.action == "re-encoded"] == [
        "forecast_reference_time"]
    assert group["time_bnds"].manifest.paths  # plain references to the files
    with xr.open_dataset(refgrid.write(group, tmp_path / "r.json"), engine="refgrid") as ours:
        _assert_like_xarray(ours, files)


@pytest.mark.parametrize("form", ["parquet", "json"])
def test_batch_and_append_with_a_third_units_read_like_open_mfdataset(tmp_path, form):
    first = write(tmp_path / "src", months(2001, 2, "days since {start}"))
    output = tmp_path / ("out.parq" if form == "parquet" else "out.json")
    refgrid.batch(str(tmp_path / "src" / "*.nc"), output, scheduler="synchronous")
    later = write(tmp_path / "src", [*months(2001, 4, "hours since {start}")[2:3],
                                     *months(2001, 4, "days since 1850-01-01")[3:]])
    result = refgrid.batch(str(tmp_path / "src" / "*.nc"), output, scheduler="synchronous")
    assert result.scanned == 2 and result.reused == 2
    with xr.open_dataset(output, engine="refgrid") as ours:
        _assert_like_xarray(ours, [*first, *later])
    notes = [n for n in result.notes if ": re-encoded: " in n]
    assert len(notes) == 4, notes  # time, time_bnds, climatology_bnds, forecast_reference_time


def test_materialize_copies_the_reencoded_values(archives, tmp_path):
    files = archives["per-file-epochs"]
    refs = refgrid.write(refgrid.combine([str(f) for f in files], "time"),
                         tmp_path / "refs.json")
    store = tmp_path / "copy.zarr"
    refgrid.materialize(refs, store, scheduler="synchronous", progress=False)
    with xr.open_zarr(store) as copy, _expected(files) as expected:
        for name in ("time", "time_bnds", "forecast_reference_time", "pr", "tas"):
            np.testing.assert_array_equal(copy[name].values, expected[name].values,
                                          err_msg=name)


# -- refused by name where re-encoding cannot be exact -----------------------------------------

def _refused(tmp_path, files: list[Month], match: str) -> None:
    paths = write(tmp_path, files)
    with pytest.raises(CombineError, match=match):
        refgrid.combine([str(p) for p in paths], "time")


def test_a_change_of_calendar_is_refused_naming_the_files(tmp_path):
    _refused(tmp_path, [*months(2001, 1, "days since 2001-01-01"),
                        *months(2001, 2, "days since 2001-01-01", calendar="noleap")[1:]],
             r"time: calendar 'noleap' in .*clim_200102\.nc differs from 'standard' in "
             r".*clim_200101\.nc")


def test_times_an_integer_cannot_hold_are_refused_naming_file_and_variable(tmp_path):
    # noon of each day in whole days: impossible
    _refused(tmp_path, [*months(2001, 1, "days since 2001-01-01", dtype="i4"),
                        *months(2001, 2, "hours since 2001-02-01", dtype="i4")[1:]],
             r"time: the times of .*clim_200102\.nc \('hours since 2001-02-01'\) need values "
             r"int32 cannot hold in 'days since 2001-01-01'")


def test_a_coordinate_of_another_type_is_refused_where_a_value_would_change(tmp_path):
    ok = write(tmp_path / "ok", [*months(2001, 1, "hours since 2001-01-01", dtype="i4"),
                                 *months(2001, 2, "hours since 2001-01-01", dtype="i8")[1:]])
    assert refgrid.combine([str(p) for p in ok], "time")["time"].shape == (59,)
    a, b = (refgrid.scan(p) for p in ok)
    time = b["time"]
    # the second file's times as fractions of hours, in float64
    frac = replace(time, dtype=np.dtype("f8"), attrs=dict(time.attrs))
    from refgrid.combining.concat import inlined

    frac = inlined(frac, np.arange(744, 744 + 28 * 24, 24, dtype="f8") + 0.5, pieces=False)
    b = replace(b, arrays={**b.arrays, "time": frac})
    with pytest.raises(CombineError, match=r"time: values of b\.nc \(float64\) cannot be held "
                                           r"exactly by a\.nc's type int32"):
        refgrid.combine([a, b], "time", sources=["a.nc", "b.nc"])


def test_time_variables_without_the_concat_dimension_are_compared_as_dates(tmp_path):
    # reference_time is 1999-12-01 in every file, in each file's units: equal as dates
    files = write(tmp_path / "same", months(2001, 2, "days since {start}"))
    group = refgrid.combine([str(f) for f in files], "time")
    with xr.open_dataset(refgrid.write(group, tmp_path / "r.json"), engine="refgrid") as ds:
        assert ds["reference_time"].values == np.datetime64("1999-12-01")
    # the same numbers in other units are other dates: refused
    other = write(tmp_path / "other", [
        *months(2001, 1, "days since 2001-01-01"),
        replace(months(2001, 2, "days since 2001-02-01")[1],
                extra={"reference_time.units": "days since 2001-01-01"})])
    with pytest.raises(CombineError, match=r"reference_time: has no 'time' dimension and "
                                           r"differs in .*clim_200102\.nc"):
        refgrid.combine([str(f) for f in other], "time")


def test_packed_times_in_other_units_are_refused(tmp_path):
    a, b = (refgrid.scan(p) for p in write(tmp_path, [
        *months(2001, 1, "days since 2001-01-01"), *months(2001, 2, "hours since {start}")[1:]]))
    a, b = ([replace(g, arrays={**g.arrays, "forecast_reference_time": replace(
        g["forecast_reference_time"], attrs={**g["forecast_reference_time"].attrs,
                                             "scale_factor": 0.5,
                                             "units": u})}) for g, u in
             ((a, "hours since 2001-01-01"), (b, "hours since 2001-02-01"))])
    with pytest.raises(CombineError, match=r"forecast_reference_time: packed times "
                                           r"\(scale_factor\) in other units in b\.nc"):
        refgrid.combine([a, b], "time", sources=["a.nc", "b.nc"])


def test_times_in_some_files_only_are_refused(tmp_path):
    files = write(tmp_path, [*months(2001, 1, "days since 2001-01-01"),
                             replace(months(2001, 2, "days since 2001-01-01")[1],
                                     extra={"forecast_reference_time.units": "hours"})])
    with pytest.raises(CombineError, match=r"forecast_reference_time: holds CF times in "
                                           r".*clim_200101\.nc but not in .*clim_200102\.nc"):
        refgrid.combine([str(f) for f in files], "time")


# -- the hunt: every attribute that changes what a number means --------------------------------

HUNT = {
    "units": ("tas.units", "degC", r"tas: units differs in .*200102\.nc .*\('degC' vs 'K'\)"),
    "valid_range": ("pr.valid_range", np.array([0, 10000], "i2"), r"pr: valid_range differs"),
    "valid_min": ("tas.valid_min", np.float32(0), r"tas: valid_min differs"),
    "valid_max": ("tas.valid_max", np.float32(400), r"tas: valid_max differs"),
    "constant units": ("orog.units", "ft", r"orog: has no 'time' dimension and its units "
                                           r"differs in .*200102\.nc"),
    "constant packing": ("orog.scale_factor", np.float32(2), r"orog: has no 'time' dimension "
                                                             r"and its scale_factor differs"),
    "attribute type": ("tas.valid_max", np.float64(400), r"tas: valid_max differs"),
}


@pytest.mark.parametrize("case", HUNT)
def test_an_attribute_that_changes_meaning_must_agree(tmp_path, case):
    key, value, match = HUNT[case]
    jan, feb = months(2001, 2, "days since 2001-01-01")
    if case == "attribute type":  # float32 in one file, float64 in the other
        jan = replace(jan, extra={key: np.float32(400)})
    _refused(tmp_path, [jan, replace(feb, extra={key: value})], match)


DECODED_PER_FILE = {
    "scale_factor type": ("pr.scale_factor", np.float64(0.001)),
    "add_offset": ("pr.add_offset", np.float32(1)),
    "missing_value": ("tas.missing_value", np.float32(-1)),
    "_Unsigned": ("pr._Unsigned", "true"),
}


@pytest.mark.parametrize("case", DECODED_PER_FILE)
@pytest.mark.filterwarnings("ignore:variable 'tas' has multiple fill values")  # (xarray's
# own warning, reading the file with both markers, as refgrid decoding it does)
def test_packing_and_markers_that_differ_decode_per_file_as_xarray(tmp_path, case):
    """What xarray applies to each file before joining them (mask and scale) may differ:
    each file's values are decoded by its own attributes (segments), and read exactly as
    ``open_mfdataset`` reads them, types included; the strict choice still refuses."""
    key, value = DECODED_PER_FILE[case]
    files = write(tmp_path, [*months(2001, 1, "days since 2001-01-01"), replace(
        months(2001, 2, "days since 2001-01-01")[1], extra={key: value})])
    group = refgrid.combine([str(f) for f in files], "time")
    variable = key.split(".")[0]
    assert [e.action for e in group.report if e.variable == variable] == ["segmented"]
    with xr.open_dataset(refgrid.write(group, tmp_path / "refs.json"), engine="refgrid") as ours:
        _assert_like_xarray(ours, files)
    with pytest.raises(CombineError, match=rf"{variable}: {key.split('.')[1]} differs"):
        refgrid.combine([str(f) for f in files], "time", codecs="error")


def test_equivalent_calendar_names_and_harmless_attributes_combine(tmp_path):
    jan, feb = months(2001, 2, "days since 2001-01-01")
    files = write(tmp_path, [jan, replace(feb, extra={"tas.long_name": "air temperature",
                                                      "time.calendar": "gregorian"})])
    group = refgrid.combine([str(f) for f in files], "time")
    assert [e.variable for e in group.report if e.action == "attribute-conflict"] == [
        "tas@long_name", "/@title"]


def test_stacked_constants_keep_one_meaning(tmp_path):
    jan, feb = months(2001, 2, "days since 2001-01-01")
    files = write(tmp_path, [jan, replace(feb, extra={"orog.units": "ft"})])
    with pytest.raises(CombineError, match=r"orog: has no 'time' dimension and its units "
                                           r"differs"):
        refgrid.combine([str(f) for f in files], "time", others="stack")


def test_a_resumed_batch_with_rewritten_chunks_writes_what_a_fresh_one_writes(tmp_path):
    """The README's claim where padded chunks are rewritten into the sidecar (chunks of 10 x
    45 x 90 floats: too large to inline): a batch killed after two files and run again
    rebuilds, byte for byte what a fresh one writes (the sidecar files' identities hold their
    sizes only, not the times they were written); a batch that appends the third file puts
    its rewritten chunks in a second sidecar directory (one per write: the first is never
    copied) and reads the same values."""
    files = write(tmp_path / "src", months(2001, 3, "days since {start}"), lat=45, lon=90)
    fresh, resumed, appended = tmp_path / "fresh", tmp_path / "resumed", tmp_path / "appended"
    refgrid.batch([str(f) for f in files], fresh / "out.parq", scheduler="synchronous")
    refgrid.batch([str(f) for f in files[:2]], resumed / "out.parq", scheduler="synchronous")
    (resumed / "out.parq.report.json").unlink()  # killed before its report: rebuilt
    again = refgrid.batch([str(f) for f in files], resumed / "out.parq",
                          scheduler="synchronous")
    refgrid.batch([str(f) for f in files[:2]], appended / "out.parq", scheduler="synchronous")
    grown = refgrid.batch([str(f) for f in files], appended / "out.parq",
                          scheduler="synchronous")
    assert again.update.startswith("rebuild") and grown.update.startswith("append")
    assert any((fresh / "out.parq.chunks").rglob("c/*/*/*"))

    def tree(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file()}

    for name in ("out.parq", "out.parq.chunks"):
        assert tree(fresh / name) == tree(resumed / name), name
    assert len(list((appended / "out.parq.chunks").iterdir())) == 2
    with xr.open_dataset(fresh / "out.parq", engine="refgrid") as a, \
            xr.open_dataset(appended / "out.parq", engine="refgrid") as b:
        xr.testing.assert_identical(a.load(), b.load())


def test_original_shape_is_the_shape_opened(tmp_path):
    """The README's claim: a single file's ``original_shape`` is xarray's; a combined
    archive's is the whole archive's shape (``open_mfdataset`` reports the first file's)."""
    files = write(tmp_path, months(2001, 2, "days since 2001-01-01"))
    with xr.open_dataset(refgrid.write(refgrid.scan(files[0]), tmp_path / "one.json"),
                         engine="refgrid") as one, xr.open_dataset(files[0]) as truth:
        assert one["tas"].encoding["original_shape"] == truth["tas"].encoding[
            "original_shape"] == (31, 3, 4)
    combined = refgrid.write(refgrid.combine([str(f) for f in files], "time"),
                             tmp_path / "two.json")
    with xr.open_dataset(combined, engine="refgrid") as both:
        assert both["tas"].encoding["original_shape"] == (59, 3, 4)


def test_time_units_that_cannot_be_decoded_are_a_named_refusal(tmp_path):
    files = write(tmp_path, [
        *months(2001, 1, "days since 2001-01-01"),
        replace(months(2001, 2, "days since 2001-01-01")[1],
                extra={"reference_time.units": "days since last frost"})])
    with pytest.raises(CombineError, match=r"reference_time: .*cannot be decoded"):
        refgrid.combine([str(f) for f in files], "time")


def test_batch_combines_what_combine_combines_whatever_a_worker_inlined(tmp_path,
                                                                        monkeypatch):
    """A worker inlines small time variables into its record, leaves large ones referenced:
    files on either side of the limit still combine (read and written anew)."""
    import refgrid.combining.concat

    files = write(tmp_path / "src", [*months(2001, 1, "days since 2001-01-01"),
                                     *months(2001, 2, "days since 2001-01-01")[1:]])
    sizes = [refgrid.scan(f)["time_bnds"].shape[0] * 16 for f in files]
    monkeypatch.setattr(refgrid.combining.concat, "INLINE_TIMES_LIMIT", min(sizes))  # 1st only
    result = refgrid.batch([str(f) for f in files], tmp_path / "out.json",
                           scheduler="synchronous")
    with xr.open_dataset(result.output, engine="refgrid") as ours, _expected(files) as truth:
        np.testing.assert_array_equal(ours["time_bnds"].values, truth["time_bnds"].values)


def test_stacked_constants_of_other_codecs_name_the_files(tmp_path):
    jan, feb = (refgrid.scan(p) for p in write(tmp_path, months(2001, 2,
                                                                "days since 2001-01-01")))
    orog = feb["orog"]
    feb = replace(feb, arrays={**feb.arrays, "orog": replace(orog, codecs=(
        *orog.codecs, {"name": "numcodecs.zlib", "configuration": {"level": 1}}))})
    with pytest.raises(CombineError, match=r"orog: has no 'time' dimension and its codecs "
                                           r"differs in b\.nc from a\.nc"):
        refgrid.combine([jan, feb], "time", sources=["a.nc", "b.nc"], others="stack")

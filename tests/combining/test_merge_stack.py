"""Merging file sets, stacking members, choosing variables, filling absent ones and times from
file names: each combined archive read back equals xarray's reading of the same NetCDF files.

Archives are rarely one regular file series. CMIP keeps one variable per file set, each split
along time its own way, in one directory per ensemble member; satellite products write one
file a day with the date only in the name, and add a variable one day. A combine that gets
these wrong either refuses a sound archive or — worse — silently puts data at the wrong time
or member; so every result is compared with ``xr.open_mfdataset``/``xr.merge``/``xr.concat``
of the source files, and every refusal must name what differs and where."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cftime
import netCDF4
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from zarr.storage import FsspecStore

import refgrid
from helpers import RECTILINEAR, closed
from refgrid import ArgumentError, CombineError
from shaped_archives import dated, dated_expected

EPOCH = pd.Timestamp("2001-01-01")
MONTHS = (("2001-01-01", 31), ("2001-02-01", 28), ("2001-03-01", 31), ("2001-04-01", 30))
MEMBERS = ("r1i1p1f1", "r2i1p1f1", "r3i1p1f1")
TAS_FILES = ((0,), (1,), (2,), (3,))  # months per file: tas in month files ...
PR_FILES = ((0, 1), (2, 3))  # ... pr in two-month files: the two grids differ along time
LAT = np.array([-10.0, 0.0, 10.0])
LON = np.array([0.0, 90.0, 180.0, 270.0])
SEED = {"tas": 1, "pr": 2}
FILL = np.float32(1e20)
ENCODED = ("units", "calendar", "dtype", "_FillValue", "scale_factor", "add_offset")
"""The encoding a reader needs to write the data back as the sources hold it."""


# -- writing archives --------------------------------------------------------------------------

def _write(path: Path, var: str, start: str, days: int, *, member: int = 1,
           units: str | None = None, lat: np.ndarray = LAT, packed: float | None = None,
           extra: dict | None = None) -> Path:
    """One NetCDF4 file of daily ``var`` from ``start``: float32 with a _FillValue (a NaN
    stored as it), zlib, chunked whole along time and split along lon; times in ``units``
    (default: days since the file's start, as CMIP writes them) with ``time_bnds``; the global
    attribute ``realization``. Values depend on the day, not on the file, so archives split
    differently hold the same data."""
    first = (pd.Timestamp(start) - EPOCH).days
    day = np.arange(first, first + days)
    grid = np.arange(lat.size * LON.size).reshape(lat.size, LON.size)
    data = (member * 10 + SEED.get(var, 0) + 0.01 * day[:, None, None] + 0.1 * grid)
    data = data.astype("f4")
    data[day % 17 == 0, 0, 0] = np.nan
    units = units or f"days since {start}"
    step, _, epoch = units.partition(" since ")
    offset = (pd.Timestamp(start) - pd.Timestamp(epoch)) / pd.Timedelta(1, step)
    per_day = pd.Timedelta(days=1) / pd.Timedelta(1, step)
    time = offset + (np.arange(days) + 0.5) * per_day
    bnds = np.stack([time - 0.5 * per_day, time + 0.5 * per_day], axis=1)
    ds = xr.Dataset(
        {var: (("time", "lat", "lon"), data, {"standard_name": var, "units": "K"}),
         "time_bnds": (("time", "bnds"), bnds)},
        coords={"time": ("time", time, {"units": units, "calendar": "standard",
                                         "bounds": "time_bnds", "standard_name": "time"}),
                "lat": ("lat", lat, {"units": "degrees_north"}),
                "lon": ("lon", LON, {"units": "degrees_east"})},
        attrs={"realization": np.int32(member), "variable_id": var})
    encoding = {var: {"dtype": "f4", "_FillValue": FILL, "zlib": True,
                      "chunksizes": (days, lat.size, 2)},
                **{name: {"_FillValue": None} for name in ("time", "time_bnds", "lat", "lon")}}
    if packed is not None:
        encoding[var] = {"dtype": "i2", "scale_factor": packed, "add_offset": 0.0,
                         "_FillValue": np.int16(-32767), "zlib": True}
    for name, (dims, values, attrs, enc) in (extra or {}).items():
        ds[name] = (dims, values, attrs)
        encoding[name] = enc
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.to_netcdf(path, engine="netcdf4", encoding=encoding)
    return path


def _member(root: Path, member: str, index: int, *, tas=TAS_FILES, pr=PR_FILES,
            year_shift: int = 0, **options) -> list[Path]:
    """A member's directory: tas and pr files split by months as ``tas``/``pr`` say."""
    files = []
    for var, split in (("tas", tas), ("pr", pr)):
        for months in split:
            start = pd.Timestamp(MONTHS[months[0]][0]) + pd.DateOffset(years=year_shift)
            days = sum(MONTHS[m][1] for m in months)
            name = f"{var}_day_{start:%Y%m}.nc"
            files.append(_write(root / member / name, var, f"{start:%Y-%m-%d}", days,
                                member=index, **options))
    return sorted(files)


@pytest.fixture(scope="module")
def cmip(tmp_path_factory) -> tuple[Path, list[Path]]:
    """Three members in directories, tas in month files and pr in two-month files, each file
    in its own time units."""
    root = tmp_path_factory.mktemp("cmip")
    files = [f for k, m in enumerate(MEMBERS, 1) for f in _member(root, m, k)]
    return root, sorted(files)


# -- ground truth ------------------------------------------------------------------------------

def _mf(files, **options) -> xr.Dataset:
    """xarray's reading of one file series (bounds kept as coordinates, as refgrid keeps them
    once per member)."""
    return closed(xr.open_mfdataset(
        [str(f) for f in files], combine="nested", concat_dim="time", data_vars="minimal",
        coords="minimal", compat="override", join="exact", decode_coords="all", **options))


def _expected_member(files: list[Path], order=("pr", "tas"), join="exact") -> xr.Dataset:
    """One member: each file set (in the order refgrid meets them: pr before tas in sorted
    names; the first set's attributes are kept) read by xarray, then merged."""
    sets = [_mf([f for f in files if f.name.startswith(f"{v}_")]) for v in order]
    return xr.merge(sets, join=join, compat="no_conflicts", combine_attrs="override")


def _expected_cmip(files: list[Path], values, dim: str = "member",
                   order=("pr", "tas"), join="exact") -> xr.Dataset:
    """xarray's reading of the members' files; ``join="outer"``: members that cover other
    times aligned on all of them (each member's bounds agree where it has them: the first
    member's, which has them all, are kept)."""
    by_member = {}
    for f in files:
        by_member.setdefault(f.parent.name, []).append(f)
    members = [_expected_member(by_member[m], order, join) for m in sorted(by_member)]
    stacked = xr.concat(members, dim=dim, data_vars="all", coords="minimal",
                        compat="equals" if join == "exact" else "no_conflicts",
                        join=join, combine_attrs="override")
    return stacked.assign_coords({dim: (dim, np.asarray(values))})


def _ours(refs, **options) -> xr.Dataset:
    return closed(xr.open_dataset(refs, engine="refgrid", decode_coords="all", **options))


def _assert_same(ours: xr.Dataset, expected: xr.Dataset, encoded=()) -> None:
    """Values, attributes, dtypes; and the encoding of ``encoded`` variables."""
    xr.testing.assert_identical(ours, expected)
    for name in expected.variables:
        assert ours[name].dtype == expected[name].dtype, name
    for name in encoded:
        mine = {k: ours[name].encoding.get(k) for k in ENCODED}
        theirs = {k: expected[name].encoding.get(k) for k in ENCODED}
        np.testing.assert_equal(mine, theirs, err_msg=name)


def _source_encoding(path: Path, names) -> dict:
    with xr.open_dataset(path) as ds:
        return {n: {k: ds[n].encoding.get(k) for k in ENCODED} for n in names}


# -- merge and stack: the CMIP archive ---------------------------------------------------------

@pytest.fixture(scope="module")
def cmip_combined(cmip):
    """The whole archive: file sets merged per member, members stacked by directory."""
    _, files = cmip
    return refgrid.combine([str(f) for f in files], merge=True, stack_dim="member",
                           stack_by="{member}/*.nc")


@pytest.mark.parametrize("name", ["refs.json", "refs.parq"])
def test_merged_and_stacked_archive_equals_xarray(cmip, cmip_combined, tmp_path, name):
    """Per member, each variable's files concatenated and the sets merged; members stacked
    along a new leading dimension holding the directory names; bounds kept once."""
    _, files = cmip
    expected = _expected_cmip(files, list(MEMBERS))
    out = refgrid.write(cmip_combined, tmp_path / name)
    ours = _ours(out)
    _assert_same(ours, expected)
    # times keep the first file's units (every other file's are re-encoded to them)
    first = _source_encoding(files[0], ["time", "pr"])
    for var in ("time", "pr"):
        np.testing.assert_equal({k: ours[var].encoding.get(k) for k in ENCODED}, first[var],
                                err_msg=var)
    assert ours["time"].encoding["units"] == "days since 2001-01-01"
    tas = _source_encoding(next(f for f in files if f.name.startswith("tas")), ["tas"])["tas"]
    np.testing.assert_equal({k: ours["tas"].encoding.get(k) for k in ENCODED}, tas)
    assert ours["tas"].encoding["zlib"] is True
    assert ours["member"].dtype.kind == "U"
    assert ours["time_bnds"].dims == ("time", "bnds")  # once, not per member


@pytest.mark.parametrize("name", ["refs.json", "refs.parq"])
def test_merged_and_stacked_archive_through_open_store(cmip, cmip_combined, tmp_path, name):
    """zarr (through refgrid's store) reads the same values as xarray from the sources."""
    if not RECTILINEAR:
        pytest.skip(f"zarr {zarr.__version__} reads no rectilinear grid")
    _, files = cmip
    out = refgrid.write(cmip_combined, tmp_path / name)
    store = refgrid.open_store(out)
    with zarr.config.set({"array.rectilinear_chunks": True}):
        ours = closed(xr.open_zarr(store, consolidated=False, decode_coords="all"))
        group = zarr.open_group(store, mode="r")
        assert group["tas"].read_chunk_sizes[1] == (31, 28, 31, 30)
        assert group["pr"].read_chunk_sizes[1] == (59, 61)
        assert group["tas"].read_chunk_sizes[0] == (1, 1, 1)
    store.close()
    xr.testing.assert_identical(ours, _expected_cmip(files, list(MEMBERS)))


def test_each_file_set_keeps_its_own_chunk_grid_along_time(cmip_combined, tmp_path):
    """tas in month files, pr in two-month files: one grid per variable, each chunk one
    source chunk (nothing re-chunked, nothing copied)."""
    g = cmip_combined
    assert g["tas"].dims == ("member", "time", "lat", "lon")
    assert g["tas"].grid.lengths(1).tolist() == [31, 28, 31, 30]
    assert g["pr"].grid.lengths(1).tolist() == [59, 61]
    assert g["tas"].grid.lengths(0).tolist() == [1, 1, 1]
    assert g["tas"].manifest.missing.sum() == 0 and g["pr"].manifest.missing.sum() == 0
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    assert ours["tas"].encoding["preferred_chunks"]["time"] == (31, 28, 31, 30)
    assert ours["pr"].encoding["preferred_chunks"]["time"] == (59, 61)


def test_the_order_files_are_given_in_does_not_matter(cmip, tmp_path):
    """Files given newest first, members last first: times and members are ordered by value;
    the file set met first (now tas) gives the global attributes, as xr.merge's first
    dataset does."""
    _, files = cmip
    g = refgrid.combine([str(f) for f in reversed(files)], merge=True, stack_dim="member",
                        stack_by="{member}/*.nc")
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    _assert_same(ours, _expected_cmip(files, list(MEMBERS), order=("tas", "pr")))
    assert ours.attrs["variable_id"] == "tas"
    assert g["pr"].grid.lengths(1).tolist() == [59, 61]


@pytest.mark.skipif(not RECTILINEAR, reason="zarr >= 3.2 reads rectilinear grids")
def test_stock_zarr_reads_the_references_through_fsspec(cmip, cmip_combined, tmp_path):
    """No refgrid on the read path: fsspec's reference:// filesystem and zarr's own codecs."""
    _, files = cmip
    out = refgrid.write(cmip_combined, tmp_path / "refs.json")
    store = FsspecStore.from_url("reference://", storage_options={"fo": str(out)},
                                 read_only=True)
    with zarr.config.set({"array.rectilinear_chunks": True}):
        ours = closed(xr.open_zarr(store, consolidated=False, decode_coords="all"))
    xr.testing.assert_identical(ours, _expected_cmip(files, list(MEMBERS)))


@pytest.mark.parametrize("stack_by", ["attribute:realization", "r{member:d}i1p1f1/*.nc"])
def test_stack_by_attribute_or_integer_field_gives_integer_members(cmip, tmp_path, stack_by):
    """The value from a global attribute, or an integer field of the name: an int64
    coordinate."""
    _, files = cmip
    g = refgrid.combine([str(f) for f in files], merge=True, stack_dim="member",
                        stack_by=stack_by)
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    _assert_same(ours, _expected_cmip(files, np.array([1, 2, 3], dtype="int64")))
    assert ours["member"].dtype == np.int64


def test_stack_by_date_gives_a_cf_time_coordinate(tmp_path):
    """Forecasts in a directory per start date: the new dimension holds the dates, encoded as
    CF times (days since 1970-01-01)."""
    inits = pd.DatetimeIndex(["2001-01-01", "2001-02-01", "2001-03-01"]).as_unit("ns")
    files, per_init = [], []
    for k, init in enumerate(inits):
        parts = []
        for part in range(2):
            ds = xr.Dataset({"t2m": (("step", "x"), np.full((3, 2), k * 10 + part, "f4"))},
                            coords={"step": np.arange(3) + 3 * part, "x": [0, 1]})
            path = tmp_path / f"init_{init:%Y%m%d}" / f"fc_{part}.nc"
            path.parent.mkdir(exist_ok=True)
            ds.to_netcdf(path, engine="netcdf4")
            files.append(path)
            parts.append(path)
        per_init.append(closed(xr.open_mfdataset(
            parts, combine="nested", concat_dim="step", data_vars="minimal",
            coords="minimal", compat="override", join="exact")))
    expected = xr.concat(per_init, dim=pd.Index(inits, name="init"), data_vars="all",
                         coords="minimal", compat="equals", join="exact")
    g = refgrid.combine([str(f) for f in files], "step", stack_dim="init",
                        stack_by="init_%Y%m%d/*.nc")
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    _assert_same(ours, expected)
    assert ours["init"].encoding["units"] == "days since 1970-01-01"
    assert ours["init"].encoding["calendar"] == "standard"


@pytest.mark.parametrize(("odd", "what"), [
    # one Zarr array has one grid: a member whose tas comes in two-month files cannot share
    # tas's grid with the others (refused, not re-chunked)
    ({"tas": PR_FILES}, "chunking"),
    # same file lengths, same numbers in the files (days since each file's start), a year
    # later: the members' times differ as dates
    ({"year_shift": 1}, "time"),
], ids=["time-chunks", "times"])
def test_members_that_differ_along_time_are_refused_naming_them(cmip, tmp_path, odd, what):
    _, files = cmip
    other = _member(tmp_path, "r2i1p1f1", 2, **odd)
    r1 = [f for f in files if f.parent.name == "r1i1p1f1"]
    with pytest.raises(CombineError, match=r"do not agree") as caught:
        refgrid.combine([str(f) for f in [*r1, *other]], merge=True, stack_dim="member",
                        stack_by="{member}/*.nc")
    message = str(caught.value)
    assert "member=r1i1p1f1" in message and "member=r2i1p1f1" in message, message
    assert what in message and "others='stack'" not in message, message


def test_a_member_missing_months_is_joined_as_xarray_s_outer_join(cmip, tmp_path):
    """r2 has no file for March and April: with missing='fill' the other members' files for
    them stand in with no chunk — r2's tas and pr read as NaN there, as xarray's outer join
    gives — its grid along time is the others' and the report names the member."""
    _, files = cmip
    short = _member(tmp_path, "r2i1p1f1", 2, tas=TAS_FILES[:2], pr=PR_FILES[:1])
    chosen = [f for f in files if f.parent.name != "r2i1p1f1"] + short
    with pytest.raises(CombineError, match=r"do not agree along 'time': member=r2i1p1f1 .*"
                                           r"lacks 61 of the 120 .*2001-03-01T12:00:00.*"
                                           r"member=r1i1p1f1.*missing='fill'"):
        refgrid.combine([str(f) for f in chosen], merge=True, stack_dim="member",
                        stack_by="{member}/*.nc")
    g = refgrid.combine([str(f) for f in chosen], merge=True, stack_dim="member",
                        stack_by="{member}/*.nc", missing="fill")
    assert g["tas"].grid.lengths(1).tolist() == [31, 28, 31, 30]
    assert g["pr"].grid.lengths(1).tolist() == [59, 61]
    assert g["pr"].manifest.missing[:, :, 0, 0].tolist() == [[False, False], [False, True],
                                                             [False, False]]
    filled = [e for e in g.report if e.action == "filled"]
    assert len(filled) == 2 and all("member=r2i1p1f1" in e.reason and "outer join" in
                                    e.reason for e in filled), filled
    for name in ("refs.json", "refs.parq"):
        ours = _ours(refgrid.write(g, tmp_path / name))
        expected = _expected_cmip(chosen, list(MEMBERS), join="outer")
        _assert_same(ours, expected)
        assert np.isnan(ours["tas"].sel(member="r2i1p1f1").values[59:]).all()
    if RECTILINEAR:  # zarr itself, through refgrid's store
        store = refgrid.open_store(tmp_path / "refs.parq")
        with zarr.config.set({"array.rectilinear_chunks": True}):
            through = closed(xr.open_zarr(store, consolidated=False, decode_coords="all"))
        store.close()
        xr.testing.assert_identical(through, expected)


@pytest.mark.parametrize("lacking", ["first", "middle"])
def test_a_first_member_missing_months_keeps_its_own_attributes_and_units(tmp_path, lacking):
    """r1's tas lacks January and its pr January and February, its times in other units
    (or its tas lacks only February, between its own files): files of r2 stand in, but r1
    keeps its own global attributes and its time encoding — xarray's first member's — and
    its values read NaN there."""
    tas = ((1,), (2,), (3,)) if lacking == "first" else ((0,), (2,), (3,))
    pr = ((2, 3),) if lacking == "first" else None
    r1 = _member(tmp_path, "r1i1p1f1", 1, tas=tas, pr=pr or ((0, 1), (2, 3)),
                 units="hours since 2001-03-01" if lacking == "first" else None)
    r2 = _member(tmp_path, "r2i1p1f1", 2)
    chosen = [*r1, *r2]
    g = refgrid.combine([str(f) for f in chosen], stack_dim="member",
                        stack_by="{member}/*.nc", merge=True, missing="fill")
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    expected = _expected_cmip(chosen, ["r1i1p1f1", "r2i1p1f1"], join="outer")
    _assert_same(ours, expected, encoded=("time",))
    assert ours.attrs["realization"] == 1


def test_a_batch_joins_a_member_missing_months_as_combine_does(cmip, tmp_path):
    """The batch's combine of its records (no source opened) stands the same files in."""
    _, files = cmip
    short = _member(tmp_path, "r2i1p1f1", 2, tas=TAS_FILES[:2], pr=PR_FILES[:1])
    chosen = [f for f in files if f.parent.name != "r2i1p1f1"] + short
    options = {"merge": True, "stack_dim": "member", "stack_by": "{member}/*.nc"}
    with pytest.raises(CombineError, match=r"do not agree along 'time'"):
        refgrid.batch([str(f) for f in chosen], tmp_path / "refused.parq", progress=False,
                      scheduler="synchronous", **options)
    result = refgrid.batch([str(f) for f in chosen], tmp_path / "cmip.parq", progress=False,
                           scheduler="synchronous", missing="fill", **options)
    assert any("member=r2i1p1f1" in note and "outer join" in note for note in result.notes)
    _assert_same(_ours(tmp_path / "cmip.parq"),
                 _expected_cmip(chosen, list(MEMBERS), join="outer"))


@pytest.mark.parametrize("pr_months", [(0, 1), (2, 3)], ids=["early", "late"])
def test_sets_of_other_periods_merge_as_xarray_s_outer_join(tmp_path, pr_months):
    """tas from January to April, pr for two of the months: pr reads NaN in the others
    (tas's files stand in, pr's grid filled over their length), and each set keeps its
    own attributes."""
    tas = [_write(tmp_path / f"tas_{m}.nc", "tas", *MONTHS[m]) for m in range(4)]
    pr = [_write(tmp_path / f"pr_{m}.nc", "pr", *MONTHS[m]) for m in pr_months]
    for first, then in ((tas, pr), (pr, tas)):
        g = refgrid.combine([str(f) for f in [*first, *then]], merge=True, missing="fill")
        expected = xr.merge([_mf(first), _mf(then)], join="outer", compat="no_conflicts",
                            combine_attrs="override")
        ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
        _assert_same(ours, expected)
        assert g["pr"].grid.lengths(0).tolist() == [31, 28, 31, 30]


@pytest.mark.parametrize("case", ["interleaved", "repeated", "per-file", "descending",
                                  "calendar"])
def test_joins_xarray_would_not_make_are_refused_by_name(tmp_path, case):
    """Members whose times interleave (a file would stand in among a member's own values),
    repeat, are kept per file (others='stack'), decrease within a file, or cannot be
    decoded: a CombineError names the part or file, in combine and in batch alike."""
    def one(member, start, days, **options):
        return _write(tmp_path / member / f"tas_{start}.nc", "tas", start, days, **options)

    options = {}
    if case == "interleaved":  # r2 fills mid-January, where r1 has days before and after
        files = [one("r1", "2001-01-01", 10), one("r1", "2001-01-21", 11),
                 one("r2", "2001-01-01", 31), one("r2", "2001-01-11", 5)]
        options["overlap"] = "allow"
        match = r"r2 .*repeats|stand in.*among its own"
    elif case == "repeated":
        files = [one("r1", "2001-01-01", 10), one("r1", "2001-01-05", 10),
                 one("r2", "2001-01-01", 31)]
        options["overlap"] = "allow"
        match = r"member=r1 .*repeats values of 'time'"
    elif case == "per-file":
        files = [one("r1", "2001-01-01", 10), one("r1", "2001-01-11", 10),
                 one("r2", "2001-01-01", 10)]
        options["others"] = "stack"
        match = r"others='stack' keeps variables"
    elif case == "descending":
        files = [one("r1", "2001-01-01", 10, units="days since 2001-02-01"),
                 one("r2", "2001-01-11", 10)]
        for f in files[:1]:
            with netCDF4.Dataset(f, "a") as nc:
                nc["time"][:] = nc["time"][::-1]
        match = r"tas_2001-01-01\.nc: its values of 'time' do not increase"
    else:
        files = [one("r1", "2001-01-01", 10), one("r2", "2001-01-11", 10)]
        with netCDF4.Dataset(files[1], "a") as nc:
            nc["time"].calendar = "no such calendar"
        match = r"cannot decode the times of .*tas_2001-01-11\.nc"
    common = {"stack_dim": "member", "stack_by": "{member}/*.nc", "missing": "fill", **options}
    with pytest.raises(CombineError, match=match):
        refgrid.combine([str(f) for f in files], **common)
    if case != "per-file":  # (a batch has no others='stack')
        with pytest.raises(CombineError, match=match):
            refgrid.batch([str(f) for f in files], tmp_path / f"{case}.parq", progress=False,
                          scheduler="synchronous", **common)


def test_a_part_whose_absent_values_no_whole_file_holds_is_refused(tmp_path):
    """tas lacks April, which only pr's March-April file holds: no file stands in for just
    April (a grid cut mid-chunk would need copying), so the join is refused naming it."""
    tas = [_write(tmp_path / f"tas_{m}.nc", "tas", *MONTHS[m]) for m in range(3)]
    pr = [_write(tmp_path / "pr_01.nc", "pr", "2001-01-01", 59),
          _write(tmp_path / "pr_23.nc", "pr", "2001-03-01", 61)]
    with pytest.raises(CombineError, match=r"lacks time 2001-04-01T12:00:00.*pr_23\.nc.*one grid"):
        refgrid.combine([str(f) for f in [*tas, *pr]], merge=True, missing="fill")


def test_members_of_the_same_dates_in_other_units_stack(cmip, tmp_path):
    """The same dates written in other units (hours since 2000) are the same times: the
    member stacks, the first member's encoding is kept."""
    _, files = cmip
    other = _member(tmp_path, "r2i1p1f1", 2, units="hours since 2000-01-01")
    r1 = [f for f in files if f.parent.name == "r1i1p1f1"]
    both = [*r1, *other]
    g = refgrid.combine([str(f) for f in both], merge=True, stack_dim="member",
                        stack_by="{member}/*.nc")
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    _assert_same(ours, _expected_cmip(both, ["r1i1p1f1", "r2i1p1f1"]))
    assert ours["time"].encoding["units"] == "days since 2001-01-01"


@pytest.mark.parametrize("stack_by", ["{member}/*.nc", "attribute:realization"])
def test_duplicate_member_values_are_refused(cmip, tmp_path, stack_by):
    """Two directories of the same member (a copy, or a wrong attribute): their files would
    be one member's — refused, naming both."""
    _, files = cmip
    r1 = [f for f in files if f.parent.name == "r1i1p1f1"]
    if stack_by.startswith("attribute"):  # another directory, the same realization
        copy = _member(tmp_path, "r4i1p1f1", 1)
    else:  # the same directory name elsewhere
        (tmp_path / "copy" / "r1i1p1f1").mkdir(parents=True)
        copy = [Path(shutil.copy(f, tmp_path / "copy" / "r1i1p1f1" / f.name)) for f in r1]
    with pytest.raises(CombineError) as caught:
        refgrid.combine([str(f) for f in [*r1, *copy]], merge=True, stack_dim="member",
                        stack_by=stack_by)
    message = str(caught.value)
    assert str(r1[0].parent) in message and str(copy[0].parent) in message, message


# -- merging combined datasets -----------------------------------------------------------------

def test_merge_of_combined_sets_equals_xr_merge(cmip, tmp_path):
    _, files = cmip
    r1 = [f for f in files if f.parent.name == "r1i1p1f1"]
    tas = [str(f) for f in r1 if f.name.startswith("tas")]
    pr = [str(f) for f in r1 if f.name.startswith("pr")]
    g = refgrid.merge([refgrid.combine(tas), refgrid.combine(pr)], sources=["tas", "pr"])
    expected = xr.merge([_mf(tas), _mf(pr)], join="exact", compat="no_conflicts",
                        combine_attrs="override")
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    _assert_same(ours, expected, encoded=("time", "tas", "pr"))
    assert g["tas"].grid.lengths(0).tolist() == [31, 28, 31, 30]
    assert g["pr"].grid.lengths(0).tolist() == [59, 61]
    conflicts = [e for e in g.report if e.action == "attribute-conflict"]
    assert [e.variable for e in conflicts] == ["/@variable_id"], conflicts


@pytest.mark.parametrize("periods", [
    # Feb-Mar against Jan-Feb: 59 days each, the same numbers (days since each file's start)
    pytest.param(((1, 2), (0, 1)), id="same-length"),
    pytest.param(((0, 1, 2), (0, 1)), id="other-length"),
])
def test_merge_of_sets_of_other_periods_is_refused(cmip, tmp_path, periods):
    """Sets covering other periods cannot be put side by side: whatever numbers the files
    hold, their dates differ."""
    tas_months, pr_months = periods
    tas = [_write(tmp_path / f"tas_{m}.nc", "tas", *MONTHS[m]) for m in tas_months]
    pr = [_write(tmp_path / f"pr_{m}.nc", "pr", *MONTHS[m]) for m in pr_months]
    with pytest.raises(CombineError, match=r"time(_bnds)?: differs between the file sets of "
                                           r"tas set and of pr set"):
        refgrid.merge([refgrid.combine([str(f) for f in tas]),
                       refgrid.combine([str(f) for f in pr])], sources=["tas set", "pr set"])
    with pytest.raises(CombineError, match=r"do not agree along 'time'.*missing='fill'"):
        refgrid.combine([str(f) for f in [*tas, *pr]], merge=True)


def test_merge_of_sets_on_other_latitudes_names_the_first_difference(tmp_path):
    shifted = LAT.copy()
    shifted[1] = 0.5
    tas = [_write(tmp_path / f"tas_{m}.nc", "tas", *MONTHS[m]) for m in (0, 1)]
    pr = [_write(tmp_path / "pr_0.nc", "pr", "2001-01-01", 59, lat=shifted)]
    with pytest.raises(CombineError, match=r"lat: differs between the file sets of tas set "
                                           r"and of pr set: at \{'lat': 1\}: .*0\.0.* vs "
                                           r".*0\.5"):
        refgrid.merge([refgrid.combine([str(f) for f in tas]),
                       refgrid.combine([str(f) for f in pr])], sources=["tas set", "pr set"])
    with pytest.raises(CombineError, match=r"lat: differs between the file sets"):
        refgrid.combine([str(f) for f in [*tas, *pr]], merge=True)


# -- a drifting archive: times from names, a variable added on the way -------------------------

DAYS = pd.date_range("2002-03-01", periods=6, freq="D").as_unit("ns")


def _daily(root: Path, *, scalar_time: bool = False, ice_fill: bool = True) -> list[Path]:
    """Files ``sst_YYYYMMDD.nc`` of (lat, lon) fields, no time dimension (or a scalar
    ``time`` at noon); ``ice`` only from the fourth day."""
    files = []
    for k, day in enumerate(DAYS):
        sst = np.full((3, 4), 270 + k, "f4")
        sst[0, k % 4] = np.nan
        variables = {"sst": (("lat", "lon"), sst, {"units": "K"})}
        encoding = {"sst": {"_FillValue": np.float32(-999.0), "zlib": True,
                            "chunksizes": (3, 2)}}
        if k >= 3:
            variables["ice"] = (("lat", "lon"), np.full((3, 4), k / 10, "f4"), {"units": "1"})
            encoding["ice"] = {"_FillValue": np.float32(-1.0) if ice_fill else None}
        coords = {"lat": [1.0, 2.0, 3.0], "lon": [0.0, 1.0, 2.0, 3.0]}
        if scalar_time:
            coords["time"] = day + pd.Timedelta(hours=12)
            encoding["time"] = {"units": "hours since 2002-01-01", "dtype": "f8"}
        path = root / f"sst_{day:%Y%m%d}.nc"
        xr.Dataset(variables, coords=coords).to_netcdf(path, engine="netcdf4",
                                                        encoding=encoding)
        files.append(path)
    return files


def test_times_from_names_and_a_variable_added_halfway(tmp_path):
    """Each file one time step at the date of its name; ``ice`` reads as NaN before it
    existed (no bytes stored there), as ``open_mfdataset`` fills it; the report names the
    files it was filled in."""
    files = _daily(tmp_path)
    g = refgrid.combine([str(f) for f in files], time_from="sst_%Y%m%d.nc", missing="fill")
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    expected = closed(xr.open_mfdataset(
        [str(f) for f in files], combine="nested", concat_dim=[pd.Index(DAYS, name="time")],
        data_vars="all", coords="minimal", compat="override", join="outer"))
    _assert_same(ours, expected)
    assert ours["time"].encoding["units"] == "days since 1970-01-01"
    assert ours["time"].encoding["calendar"] == "standard"
    assert ours["time"].encoding["dtype"] == np.int64
    assert ours["sst"].dims == ("time", "lat", "lon") and ours["lat"].dims == ("lat",)
    np.testing.assert_equal({k: ours["ice"].encoding.get(k) for k in ENCODED},
                            _source_encoding(files[-1], ["ice"])["ice"])
    filled = [e for e in g.report if e.action == "filled"]
    assert [e.variable for e in filled] == ["ice"], g.report
    assert all(str(f) in filled[0].reason for f in files[:3]), filled[0].reason
    assert not any(str(f) in filled[0].reason for f in files[3:]), filled[0].reason
    assert g["ice"].manifest.missing.tolist() == [[[True]]] * 3 + [[[False]]] * 3
    refs = json.loads((tmp_path / "refs.json").read_text())["refs"]
    assert sorted(k for k in refs if k.startswith("ice/c/")) == [
        "ice/c/3/0/0", "ice/c/4/0/0", "ice/c/5/0/0"]


def test_a_variable_missing_from_some_files_is_refused_by_default(tmp_path):
    files = _daily(tmp_path)
    with pytest.raises(CombineError, match=r"variables are not in every file: ice missing "
                                           r"from .*sst_20020301\.nc.*missing='fill'"):
        refgrid.combine([str(f) for f in files], time_from="sst_%Y%m%d.nc")


def test_a_variable_without_fill_value_cannot_be_filled(tmp_path):
    """Without a _FillValue a reader would take the fill for data: refused."""
    files = _daily(tmp_path, ice_fill=False)
    with pytest.raises(CombineError, match=r"ice: .*cannot be filled"):
        refgrid.combine([str(f) for f in files], time_from="sst_%Y%m%d.nc", missing="fill")


def test_a_scalar_time_is_the_file_s_own_and_its_name_checks_it(tmp_path):
    """Files holding a scalar ``time`` at noon: it is their time, as ``open_mfdataset``
    keeps it (the name's date, midnight, once replaced it); data variables gain the
    dimension; the report says once that the files kept their own time."""
    files = _daily(tmp_path, scalar_time=True)[:3]
    g = refgrid.combine([str(f) for f in files], time_from="sst_%Y%m%d.nc")
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    expected = closed(xr.open_mfdataset(
        [str(f) for f in files], combine="nested", concat_dim="time", data_vars="all",
        coords="different", compat="equals", join="exact", decode_coords="all"))
    _assert_same(ours, expected, encoded=["time"])
    assert ours["time"].values.tolist() == (DAYS[:3] + pd.Timedelta(hours=12)).asi8.tolist()
    assert [(e.variable, e.action) for e in g.report] == [("time", "own-time")], g.report


def test_times_from_names_in_other_units_and_calendar(tmp_path):
    """time_units and calendar say how the dates of the names are written."""
    files = _daily(tmp_path)[:3]
    g = refgrid.combine([str(f) for f in files], time_from="sst_%Y%m%d.nc",
                        time_units="hours since 2002-01-01", calendar="noleap")
    raw = closed(xr.open_dataset(refgrid.write(g, tmp_path / "refs.json"), engine="refgrid",
                                 decode_times=False))
    assert raw["time"].attrs["units"] == "hours since 2002-01-01"
    assert raw["time"].attrs["calendar"] == "noleap"
    assert raw["time"].dtype == np.int64
    np.testing.assert_array_equal(raw["time"].values, [1416, 1440, 1464])  # (31 + 28) * 24


DATED = {"standard": ["2003-01-01", "2003-01-02", "2003-01-03"],
         "noleap": ["2004-02-28", "2004-03-01", "2004-03-02"],
         "360_day": ["2000-02-29", "2000-02-30", "2000-03-01"]}
"""Days of each calendar (noleap: no 29 February in a leap year; 360-day: a 30th)."""


@pytest.mark.parametrize(("forms", "calendar", "bounds", "said"), [
    ("scalar", "standard", False, {"own-time", "re-encoded"}),  # noon, units of each day
    ("scalar", "noleap", True, {"own-time", "re-encoded"}),
    ("scalar", "360_day", False, {"own-time", "re-encoded"}),
    ("step", "standard", True, {"own-time", "re-encoded"}),
    ("dimension", "standard", False, {"from-name"}),
    ("dimension", "360_day", False, {"from-name"}),
    ("none", "noleap", False, {"from-name"}),
    (["dimension", "none", "scalar", "step"], "standard", False,
     {"from-name", "own-time", "re-encoded"}),
], ids=["scalar", "scalar-noleap-bounds", "scalar-360day", "step-bounds", "dimension",
        "dimension-360day", "none-noleap", "mixed"])
def test_each_way_a_file_holds_its_time_combines_as_xarray_reads_it(tmp_path, forms,
                                                                     calendar, bounds, said):
    """time_from against ``open_mfdataset(concat_dim="time")`` whose ``preprocess`` gives a
    file without a time coordinate its name's date: a file's own time (scalar or a step,
    with its bounds) is kept whatever its units and calendar; a dimension of one step
    without coordinate, or no time, takes the name's date (in the calendar asked for). The
    report holds one entry per kind of thing done, each true."""
    days = DATED[calendar] + (["2003-01-04"] if isinstance(forms, list) else [])
    files = dated(tmp_path / "src", forms, days, calendar=calendar, bounds=bounds)
    mixed = {"time_units": "hours since 2003-01-01"} if isinstance(forms, list) else {}
    g = refgrid.combine([str(f) for f in files], time_from="sst_%Y%m%d.nc",
                        calendar=calendar, **mixed)
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    xr.testing.assert_identical(ours, dated_expected(files, calendar))
    timed = [e for e in g.report if e.variable == "time"]
    assert sorted(e.action for e in timed) == sorted(said), g.report
    owned = [e for e in timed if e.action == "own-time"]
    assert all("keep their own" in e.reason and "year, month and day" in e.reason
               for e in owned), owned
    named = [e for e in timed if e.action == "from-name"]
    assert all(f"({calendar})" in e.reason for e in named), named
    if bounds:
        assert ours["time_bnds"].dims == ("time", "nv")


@pytest.mark.parametrize(("pattern", "name", "time", "agrees"), [
    ("sst_%Y%m%d.nc", "sst_20030102.nc", "2003-01-02 12:00:00", True),
    ("sst_%Y%m%d.nc", "sst_20030102.nc", "2003-01-02 23:59:59", True),
    ("sst_%Y%m%d.nc", "sst_20030102.nc", "2003-01-03 00:00:00", False),  # the next day
    ("sst_%Y%m%d.nc", "sst_20030102.nc", "2003-01-01 23:00:00", False),
    ("tas_%Y%m.nc", "tas_200302.nc", "2003-02-28 18:00:00", True),
    ("tas_%Y%m.nc", "tas_200302.nc", "2003-03-01 00:00:00", False),
    ("tas_%Y.nc", "tas_2003.nc", "2003-07-02 06:00:00", True),
    ("f_%Y%m%d%H.nc", "f_2003010206.nc", "2003-01-02 06:30:00", True),
    ("f_%Y%m%d%H.nc", "f_2003010206.nc", "2003-01-02 07:00:00", False),
    ("f_%Y%j.nc", "f_2004061.nc", "2004-03-01 12:00:00", True),  # a leap year's day 61
    ("f_%Y%j.nc", "f_2004061.nc", "2004-03-02 12:00:00", False),
])
def test_the_name_checks_a_file_s_own_time_in_the_period_it_gives(tmp_path, pattern, name,
                                                                 time, agrees):
    """A name denotes a period as long as its pattern's finest field; a file's own time
    agrees when it falls in it (the same year, month, day, hour... as the name), and is then
    kept exactly; else the combine is refused naming the file, the variable and both."""
    path = tmp_path / name
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("x", 2)
        nc.createVariable("v", "f4", ("x",))[:] = [1.0, 2.0]
        t = nc.createVariable("time", "f8", ())
        t.units = "seconds since 2000-01-01"
        t[...] = (pd.Timestamp(time) - pd.Timestamp("2000-01-01")).total_seconds()
    if agrees:
        g = refgrid.combine([str(path)], time_from=pattern)
        ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
        assert ours["time"].values.tolist() == [pd.Timestamp(time).value]
        assert ours["v"].dims == ("time", "x")
        return
    with pytest.raises(CombineError, match=rf"{name}: its own 'time' \({time}\) disagrees "
                                           rf"with its name, which gives year"):
        refgrid.combine([str(path)], time_from=pattern)


@pytest.mark.parametrize(("pattern", "names", "calendar", "dates"), [
    ("t_%Y%j.nc", ["t_2004059.nc", "t_2004060.nc", "t_2004061.nc"], "noleap",
     [(2004, 2, 28), (2004, 3, 1), (2004, 3, 2)]),
    ("t_%Y%m%d.nc", ["t_20000229.nc", "t_20000230.nc", "t_20000301.nc"], "360_day",
     [(2000, 2, 29), (2000, 2, 30), (2000, 3, 1)]),
    ("t_%Y%j.nc", ["t_2000045.nc", "t_2000360.nc"], "360_day", [(2000, 2, 15), (2000, 12, 30)]),
])
def test_a_name_gives_its_date_in_the_calendar_asked_for(tmp_path, pattern, names,
                                                         calendar, dates):
    """Day 61 of a noleap year is 2 March (of the standard calendar's leap year: 1 March),
    a 360-day February has a 30th and its day 45 is 15 February."""
    for k, name in enumerate(names):
        with netCDF4.Dataset(tmp_path / name, "w") as nc:
            nc.createDimension("x", 1)
            nc.createVariable("v", "f4", ("x",))[:] = [k]
    g = refgrid.combine([str(tmp_path / n) for n in names], time_from=pattern,
                        calendar=calendar)
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    assert ours["time"].values.tolist() == [cftime.datetime(*d, calendar=calendar)
                                             for d in dates]
    assert ours["v"].values[:, 0].tolist() == list(range(len(names)))


def test_a_time_the_name_cannot_give_or_check_is_refused_naming_it(tmp_path):
    """Own times without CF units or with no value, a time dimension of several steps
    without a coordinate, a time along another dimension: each a CombineError naming the
    file and the way out; and files of both kinds whose first file's units cannot hold the
    others' noon."""
    def refused(files, match, **options):
        with pytest.raises(CombineError, match=match):
            refgrid.combine([str(f) for f in files], time_from="sst_%Y%m%d.nc", **options)

    unitless = dated(tmp_path / "a", "scalar", ["2003-01-01"])
    with netCDF4.Dataset(unitless[0], "a") as nc:
        nc["time"].units = "hours"
    refused(unitless, r"sst_20030101\.nc: its own 'time' has no CF time units \('hours'\)"
                      r".*drop_variables=\['time'\]")
    empty = dated(tmp_path / "b", "step", ["2003-01-01"], calendar="noleap")  # (NaN would
    # decode to its units' epoch, 2003-01-01: in the day its name gives)
    with netCDF4.Dataset(empty[0], "a") as nc:
        nc["time"].missing_value = -1.0
        nc["time"][:] = [-1.0]
    refused(empty, r"sst_20030101\.nc: its own 'time' \(no value \(its fill value\)\) "
                   r"disagrees with its name, which gives year 2003, month 1, day 1")
    steps = tmp_path / "c" / "sst_20030101.nc"
    steps.parent.mkdir()
    with netCDF4.Dataset(steps, "w") as nc:
        nc.createDimension("time", 2)
        nc.createVariable("sst", "f4", ("time",))[:] = [1.0, 2.0]
    refused([steps], r"sst_20030101\.nc: has 2 steps along 'time' and no 'time' coordinate")
    aside = tmp_path / "d" / "sst_20030101.nc"
    aside.parent.mkdir()
    with netCDF4.Dataset(aside, "w") as nc:
        nc.createDimension("record", 1)
        t = nc.createVariable("time", "f8", ("record",))
        t.units, t[:] = "days since 2003-01-01", [0.0]
    refused([aside], r"sst_20030101\.nc: its 'time' runs along \('record',\), not along "
                     r"'time'")
    mixed = dated(tmp_path / "e", ["none", "scalar"], ["2003-01-01", "2003-01-02"])
    refused(mixed, r"time: the times of .*sst_20030102\.nc \('hours since 2003-01-02'\) "
                   r"need values int64 cannot hold in 'days since 1970-01-01'")
    g = refgrid.combine([str(f) for f in mixed], time_from="sst_%Y%m%d.nc",
                        time_units="hours since 2003-01-01")
    assert _ours(refgrid.write(g, tmp_path / "e.json"))["time"].values.tolist() == [
        pd.Timestamp(t).value for t in ("2003-01-01", "2003-01-02 12:00")]


def test_groups_absent_from_early_files_are_filled(tmp_path):
    """A group ``qc`` that later files hold: its variables read as NaN before, as the
    variables would if xarray had filled them; refused without missing='fill'."""
    files, expected = [], []
    for k, (start, days) in enumerate(MONTHS[:3]):
        path = tmp_path / f"f{k}.nc"
        with netCDF4.Dataset(path, "w") as nc:
            nc.createDimension("time", days)
            time = nc.createVariable("time", "f8", ("time",))
            time.units, time.calendar = f"days since {start}", "standard"
            time[:] = np.arange(days) + 0.5
            tas = nc.createVariable("tas", "f4", ("time",), fill_value=FILL)
            tas[:] = np.arange(days) + k * 100
            if k:
                qc = nc.createGroup("qc")
                flag = qc.createVariable("flag", "f4", ("time",), fill_value=np.float32(-9))
                flag[:] = np.arange(days) % 3
        if k:
            expected.append(closed(xr.open_dataset(path, group="qc")))
        else:
            expected.append(xr.Dataset({"flag": ("time", np.full(days, np.nan, "f4"))}))
        files.append(path)
    with pytest.raises(CombineError, match=r"groups are not in every file: group qc missing "
                                           r"from .*f0\.nc"):
        refgrid.combine([str(f) for f in files])
    g = refgrid.combine([str(f) for f in files], missing="fill")
    filled = [e for e in g.report if e.action == "filled"]
    assert [e.variable for e in filled] == ["qc"] and str(files[0]) in filled[0].reason
    out = refgrid.write(g, tmp_path / "refs.json")
    ours = closed(xr.open_dataset(out, engine="refgrid", group="qc"))
    truth = xr.concat(expected, dim="time", data_vars="all", coords="minimal",
                      compat="equals", join="exact")
    np.testing.assert_array_equal(ours["flag"].values, truth["flag"].values)
    assert ours["flag"].dtype == np.float32
    root = _ours(out)
    _assert_same(root, _mf(files), encoded=("tas", "time"))


# -- choosing variables ------------------------------------------------------------------------

def _with_projection(root: Path) -> list[Path]:
    """Three month files of tas whose ``projection`` (a scalar without time) differs per
    file, and tas read with an auxiliary coordinate ``height``."""
    files = []
    for k, (start, days) in enumerate(MONTHS[:3]):
        extra = {"projection": ((), np.int32(k), {"note": f"granule {k}"}, {}),
                 "height": ((), 2.0, {"units": "m"}, {"_FillValue": None})}
        path = _write(root / f"tas_{k}.nc", "tas", start, days, extra=extra)
        with netCDF4.Dataset(path, "a") as nc:
            nc["tas"].coordinates = "height"
        files.append(path)
    return files


def test_an_odd_variable_breaks_a_combine_and_drop_variables_mends_it(tmp_path):
    files = _with_projection(tmp_path)
    names = [str(f) for f in files]
    with pytest.raises(CombineError, match=r"projection: has no 'time' dimension and differs"):
        refgrid.combine(names)
    g = refgrid.combine(names, drop_variables=["projection"])
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    expected = _mf(files, drop_variables=["projection"])
    _assert_same(ours, expected, encoded=("tas", "time"))
    assert "projection" not in g.arrays


def test_variables_keep_what_the_chosen_are_read_with(tmp_path):
    """``variables=["tas"]``: tas, its dimensions' coordinates, its bounds and its auxiliary
    coordinate — not the odd projection (so the combine works)."""
    files = _with_projection(tmp_path)
    g = refgrid.combine([str(f) for f in files], variables=["tas"])
    assert set(g.arrays) == {"tas", "time", "lat", "lon", "time_bnds", "height"}
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    # xarray's ds[["tas"]] would leave out time_bnds (a coordinate along 'bnds', which tas
    # lacks): what tas is read with is every variable but the projection
    expected = _mf(files, drop_variables=["projection"])
    _assert_same(ours, expected, encoded=("tas", "time"))
    assert set(ours.coords) == {"time", "lat", "lon", "time_bnds", "height"}


def test_a_name_no_file_holds_is_an_argument_error(tmp_path):
    files = [str(f) for f in _with_projection(tmp_path)]
    with pytest.raises(ArgumentError, match=r"no file holds 'nope'"):
        refgrid.combine(files, variables=["tas", "nope"])
    with pytest.raises(ArgumentError, match=r"no file holds 'nope'"):
        refgrid.combine(files, drop_variables="nope")
    with pytest.raises(ArgumentError, match="nope"):
        refgrid.scan(files[0], variables=["nope"])


def test_scan_chooses_variables_too(tmp_path):
    path = _with_projection(tmp_path)[0]
    kept = refgrid.scan(path, variables=["tas"])
    assert set(kept.arrays) == {"tas", "time", "lat", "lon", "time_bnds", "height"}
    expected = closed(xr.open_dataset(path, decode_coords="all",
                                      drop_variables=["projection"]))
    _assert_same(_ours(refgrid.write(kept, tmp_path / "kept.json")), expected, encoded=("tas",))
    for drop in (["projection"], "tas"):
        dropped = refgrid.scan(path, drop_variables=drop)
        ours = _ours(refgrid.write(dropped, tmp_path / f"dropped_{len(drop)}.json"))
        _assert_same(ours, closed(xr.open_dataset(path, decode_coords="all",
                                                  drop_variables=drop)))


# -- packing: one encoding per array -----------------------------------------------------------

def test_files_packed_differently_join_in_segments_in_a_set_and_a_merge(tmp_path):
    """pr packed by 0.01 in one file and 0.02 in the next: each file decoded by its own
    packing, as xarray reads them, whether concatenated, merged or stacked as members."""
    tas = [_write(tmp_path / "a" / f"tas_{m}.nc", "tas", *MONTHS[m]) for m in (0, 1)]
    pr = [_write(tmp_path / "a" / "pr_0.nc", "pr", *MONTHS[0], packed=0.01),
          _write(tmp_path / "a" / "pr_1.nc", "pr", *MONTHS[1], packed=0.02)]
    joined = refgrid.combine([str(f) for f in pr])
    assert [e.action for e in joined.report if e.variable == "pr"] == ["segmented"]
    _assert_same(_ours(refgrid.write(joined, tmp_path / "pr.json")), _mf(pr))
    merged = refgrid.combine([str(f) for f in [*tas, *pr]], merge=True)
    _assert_same(_ours(refgrid.write(merged, tmp_path / "merged.json")),
                 _expected_member([*tas, *pr], order=("tas", "pr")))
    files = []
    for k, (member, factor) in enumerate(zip(MEMBERS[:2], (0.01, 0.02), strict=True), 1):
        files += [_write(tmp_path / "b" / member / f"pr_{m}.nc", "pr", *MONTHS[m], member=k,
                         packed=factor) for m in (0, 1)]
    stacked = refgrid.combine([str(f) for f in files], stack_dim="member",
                              stack_by="{member}/*.nc")
    members = [_mf([f for f in files if f.parent.name == m]) for m in MEMBERS[:2]]
    expected = xr.concat(members, dim="member", data_vars="all", coords="minimal",
                         compat="equals", join="exact", combine_attrs="override")
    _assert_same(_ours(refgrid.write(stacked, tmp_path / "stacked.json")),
                 expected.assign_coords(member=("member", np.asarray(MEMBERS[:2]))))


def test_packed_members_packed_alike_stack_like_xarray(tmp_path):
    files = []
    for k, member in enumerate(MEMBERS[:2], 1):
        files += [_write(tmp_path / member / f"pr_{m}.nc", "pr", *MONTHS[m], member=k,
                         packed=0.01) for m in (0, 1)]
    g = refgrid.combine([str(f) for f in files], stack_dim="member", stack_by="{member}/*.nc")
    ours = _ours(refgrid.write(g, tmp_path / "refs.json"))
    members = [_mf([f for f in files if f.parent.name == m]) for m in MEMBERS[:2]]
    expected = xr.concat(members, dim="member", data_vars="all", coords="minimal",
                         compat="equals", join="exact", combine_attrs="override")
    expected = expected.assign_coords(member=("member", np.asarray(MEMBERS[:2])))
    _assert_same(ours, expected, encoded=("pr", "time"))

"""File-name patterns (``core/names.py``): what they read, how they are typed, and the
error contract on any pattern and any path (fuzzed)."""

from __future__ import annotations

import contextlib
from datetime import datetime

import cftime
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refgrid.core.names import NamePattern, date_of, from_json, to_json
from refgrid.errors import ArgumentError


@pytest.mark.parametrize(("pattern", "path", "expected"), [
    ("{member}/tas_*.nc", "s3://b/cmip/r1i1p1f1/tas_2000.nc", {"member": "r1i1p1f1"}),
    ("run{run:d}.nc", "/data/run007.nc", {"run": 7}),
    ("sst_%Y%m%d.nc", "/d/sst_20030102.nc", {"date": datetime(2003, 1, 2)}),
    ("f_%Y%j_%H%M.h5", "f_2004060_1230.h5", {"date": datetime(2004, 2, 29, 12, 30)}),
    ("x_%y%m.nc", "x_9912.nc", {"date": datetime(1999, 12, 1)}),
    ("%Y/%m/day_%d.nc", "/a/2001/02/day_03.nc", {"date": datetime(2001, 2, 3)}),
    ("{exp}_%Y.nc", "hist_1990.nc", {"exp": "hist", "date": datetime(1990, 1, 1)}),
    ("100%%_{x}.nc", "100%_a.nc", {"x": "a"}),
])
def test_a_pattern_reads_its_fields_typed(pattern, path, expected):
    assert NamePattern.parse(pattern).values(path) == expected


def test_a_pattern_matches_the_end_of_a_path_at_a_segment_boundary():
    pattern = NamePattern.parse("tas_*.nc")
    assert pattern.match("/x/tas_1.nc") is not None
    assert pattern.match("/x/mytas_1.nc") is None  # not inside a name
    assert pattern.match("/x/tas_1.nc.bak") is None
    assert NamePattern.parse("{member}/*.nc").values("r1/sub/a.nc") == {"member": "sub"}


@pytest.mark.parametrize(("pattern", "message"), [
    ("", "non-empty"), ("a_%Q.nc", "%Q is not one of"), ("{a}_{a}.nc", "appears twice"),
    ("x_{.nc", "a lone '{'"), ("%m%d.nc", "need a year"),
])
def test_bad_patterns_are_refused_with_where(pattern, message):
    with pytest.raises(ArgumentError, match=message):
        NamePattern.parse(pattern)


def test_a_name_without_a_valid_date_is_refused_naming_it():
    with pytest.raises(ArgumentError, match=r"sst_20030230\.nc: its name holds no valid date"):
        NamePattern.parse("sst_%Y%m%d.nc").values("sst_20030230.nc")
    with pytest.raises(ArgumentError, match="does not match the file-name pattern"):
        NamePattern.parse("sst_%Y%m%d.nc").values("ice_20030101.nc")


@pytest.mark.parametrize(("pattern", "name", "calendar", "expected"), [
    ("%Y%j.nc", "2004061.nc", "standard", datetime(2004, 3, 1)),
    ("%Y%j.nc", "2004061.nc", "noleap", cftime.datetime(2004, 3, 2, calendar="noleap")),
    ("%Y%j_%H.nc", "2000045_06.nc", "360_day",
     cftime.datetime(2000, 2, 15, 6, calendar="360_day")),
    ("%Y%m%d.nc", "20000230.nc", "360_day", cftime.datetime(2000, 2, 30, calendar="360_day")),
    ("%y%m.nc", "0402.nc", "all_leap", cftime.datetime(2004, 2, 1, calendar="all_leap")),
])
def test_a_name_s_date_is_its_calendar_s(pattern, name, calendar, expected):
    """The numbers a name holds are a date of the calendar asked for: day 61 of a noleap
    year is 2 March, a 360-day year's day 45 is 15 February and it has a 30 February."""
    assert date_of(NamePattern.parse(pattern).date_parts(name), name, calendar) == expected


@pytest.mark.parametrize(("name", "calendar", "message"), [
    ("20010229.nc", "noleap", r"20010229\.nc: its name holds no valid date in the noleap "
                              r"calendar"),
    ("20000231.nc", "360_day", "no valid date in the 360_day calendar"),
    ("20030230.nc", "standard", r"no valid date \("),
])
def test_a_date_the_calendar_lacks_is_refused_naming_the_file(name, calendar, message):
    with pytest.raises(ArgumentError, match=message):
        date_of(NamePattern.parse("%Y%m%d.nc").date_parts(name), name, calendar)
    with pytest.raises(ArgumentError, match="day of year 361 is outside the year"):
        date_of(NamePattern.parse("%Y%j.nc").date_parts("2000361.nc"), "x", "360_day")
    with pytest.raises(ArgumentError, match="does not match the file-name pattern"):
        NamePattern.parse("%Y%j.nc").date_parts("x.nc")


@pytest.mark.parametrize("value", ["r1", 7, datetime(2001, 2, 3, 4, 5, 6)])
def test_recorded_values_read_back_with_their_type(value):
    assert from_json(to_json(value)) == value


@given(st.text(max_size=30), st.text(max_size=40))
def test_any_pattern_and_path_either_read_or_are_an_argument_error(pattern, path):
    try:
        parsed = NamePattern.parse(pattern)
    except ArgumentError:
        return
    with contextlib.suppress(ArgumentError):  # (an impossible date in a matching name)
        parsed.match(path)

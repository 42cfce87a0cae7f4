"""``CombineSpec``: checked once when made, recorded with an archive and made again from the
record exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refgrid.combining import CombineSpec
from refgrid.errors import ArgumentError

NAMES = st.lists(st.sampled_from(["tas", "pr", "/lat_bnds", "time_bnds", "huss"]),
                 min_size=1, max_size=3, unique=True)


@st.composite
def specs(draw: st.DrawFn) -> CombineSpec:
    times = draw(st.sampled_from([None, "tas_%Y%m.nc", "sst_%Y%m%d_%H%M.nc"]))
    stack = draw(st.sampled_from([None, ("member", "{member}/tas_*.nc"),
                                  ("run", "attribute:run_id")]))
    return CombineSpec.of(
        draw(st.sampled_from(["time", "t", "record"])),
        overlap=draw(st.sampled_from(["error", "allow"])),
        others=draw(st.sampled_from(["identical", "stack"])),
        codecs=draw(st.sampled_from(["error", "recode"])),
        missing=draw(st.sampled_from(["error", "fill"])),
        merge=draw(st.booleans()),
        variables=draw(st.none() | NAMES), drop_variables=draw(st.none() | NAMES),
        time_from=times,
        time_units=draw(st.sampled_from([None, "hours since 1850-01-01"])) if times else None,
        calendar=draw(st.sampled_from([None, "noleap", "360_day"])) if times else None,
        stack_dim=stack and stack[0], stack_by=stack and stack[1])


@given(specs())
def test_a_spec_is_made_again_from_its_record(spec):
    recorded = spec.to_dict()
    assert all(isinstance(v, str) for v in recorded.values())
    assert CombineSpec.from_dict(recorded) == spec
    assert CombineSpec.from_dict({**recorded, "format": "parquet"}) == spec  # (others kept)


def test_the_default_record_is_what_batch_reports_held():
    assert CombineSpec().to_dict() == {
        "concat_dim": "time", "overlap": "error", "codecs": "segments", "missing": "error",
        "merge": "false", "variables": "", "drop_variables": ""}


def test_times_from_names_record_their_units_and_rule():
    days = CombineSpec.of(time_from="sst_%Y%m%d.nc").to_dict()
    assert days["time_units"] == "days since 1970-01-01" and days["calendar"] == "standard"
    assert days["time_rule"] == "2"
    clock = CombineSpec.of(time_from="sst_%Y%m%d_%H%M.nc", calendar="noleap")
    assert clock.shape.time_units == "seconds since 1970-01-01"
    assert clock.to_dict()["calendar"] == "noleap"


@pytest.mark.parametrize("kwargs, says", [
    ({"concat_dim": ""}, "concat_dim must be a dimension's name"),
    ({"overlap": "maybe"}, "overlap must be one of 'error', 'allow', not 'maybe'"),
    ({"others": "minimal"}, "others must be one of 'identical', 'stack'"),
    ({"codecs": "copy"}, "codecs must be one of 'segments', 'recode', 'error'"),
    ({"missing": "drop"}, "missing must be one of 'error', 'fill'"),
    ({"merge": "yes"}, "merge must be True or False"),
    ({"variables": []}, "variables=[] keeps no variable"),
    ({"variables": ["tas", ""]}, "variables must be variable names"),
    ({"drop_variables": [3]}, "drop_variables must be variable names"),
    ({"variables": 3}, "variables must be variable names, not 3"),
    ({"variables": b"tas"}, "variables must be variable names"),
    ({"stack_dim": "member", "stack_by": 3}, "stack_by must be text, not 3"),
    ({"time_from": ["tas_%Y.nc"]}, "time_from must be text"),
    ({"time_from": "tas.nc"}, "holds no date directive"),
    ({"time_from": "tas_%Y.nc", "time_units": "fortnights"}, "are not CF time units"),
    ({"calendar": "noleap"}, "pass time_from= too"),
    ({"stack_dim": "member"}, "stacking needs both stack_dim="),
    ({"stack_dim": "member", "stack_by": "{a}_{b}.nc"}, "name the field that holds"),
])
def test_a_spec_is_checked_when_made(kwargs, says):
    with pytest.raises(ArgumentError) as caught:
        CombineSpec.of(**kwargs)
    assert says in str(caught.value)


@pytest.mark.parametrize("record, says", [
    ({"overlap": "error"}, "combine settings without 'concat_dim'"),
    ({"concat_dim": "time", "merge": "yes"}, "merge is 'true' or 'false', not 'yes'"),
    ({"concat_dim": "time", "overlap": 1}, "combine settings hold text: overlap=1"),
    ({"concat_dim": 7}, "concat_dim must be a dimension's name, not 7"),
])
def test_a_record_that_is_not_a_spec_is_refused_by_name(record, says):
    with pytest.raises(ArgumentError) as caught:
        CombineSpec.from_dict(record)
    assert says in str(caught.value)


def test_scan_refuses_an_empty_choice_as_combine_does():
    """``variables=[]`` kept nothing: an empty group without a word."""
    import refgrid
    from helpers import FIXTURES

    for call in (lambda f: refgrid.scan(f, variables=[]),
                 lambda f: refgrid.combine([f], variables=[])):
        with pytest.raises(ArgumentError, match=r"variables=\[\] keeps no variable"):
            call(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc")


@pytest.mark.parametrize("spec, whole", [
    (CombineSpec(), False),
    (CombineSpec.of(overlap="allow", codecs="recode", missing="fill"), False),
    (CombineSpec.of(merge=True), True),
    (CombineSpec.of(others="stack"), True),
    (CombineSpec.of(stack_dim="member", stack_by="{member}/*.nc"), True),
])
def test_what_an_archive_combined_so_does_when_it_grows(spec, whole):
    assert (spec.whole is not None) == whole

"""Merged, stacked and drifting archives through every way in and out: the engine, the store,
the service, zarr's own reader of the references (rectilinear flag), Icechunk, the CLI and
batch (resume, growth, append) — each equal to xarray's reading of the same files
(:mod:`shaped_archives`)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import xarray as xr
import zarr
from click.testing import CliRunner
from zarr.storage import FsspecStore

import refgrid
from helpers import RECTILINEAR, closed
from servers import start_refgrid_serve
from shaped_archives import (
    cmip_expected,
    cmip_like,
    dated,
    dated_expected,
    drifting,
    drifting_expected,
)

STACKED = {"merge": True, "stack_dim": "member", "stack_by": "{member}/*.nc"}
DRIFT = {"time_from": "sst_%Y%m%d.nc", "missing": "fill"}


def _written(factory, name: str, make, options: dict):
    """The files ``make`` writes, combined with ``options`` into JSON references."""
    root = factory.mktemp(name)
    files = make(root / "src")
    refs = root / f"{name}.json"
    refgrid.write(refgrid.combine([str(f) for f in files], "time", **options), refs)
    return root, files, refs


@pytest.fixture(scope="module")
def cmip(tmp_path_factory):
    return _written(tmp_path_factory, "cmip", cmip_like, STACKED)


@pytest.fixture(scope="module")
def drift(tmp_path_factory):
    return _written(tmp_path_factory, "sst", drifting, DRIFT)


def _engine(path, **options) -> xr.Dataset:
    return closed(xr.open_dataset(path, engine="refgrid", decode_coords="all", **options))


def test_the_engine_and_the_store_read_a_merged_stacked_archive_as_xarray(cmip):
    _, files, refs = cmip
    expected = cmip_expected(files)
    with _engine(refs) as ours:
        xr.testing.assert_identical(ours.load(), expected)
    chunks = "native" if RECTILINEAR else "auto"  # zarr 3.1 reads no rectilinear grid
    store = refgrid.open_store(refs, chunks=chunks)
    try:
        with zarr.config.set({"array.rectilinear_chunks": True}) if RECTILINEAR else \
                zarr.config.set({}):
            ours = closed(xr.open_zarr(store, consolidated=False, decode_coords="all"))
        xr.testing.assert_equal(ours, expected)
    finally:
        store.close()


def test_each_variable_keeps_its_own_irregular_chunks_along_time(cmip):
    _, _, refs = cmip
    documents = json.loads(refs.read_text())["refs"]
    tas = json.loads(documents["tas/zarr.json"])["chunk_grid"]
    pr = json.loads(documents["pr/zarr.json"])["chunk_grid"]
    assert tas != pr  # one-month files against two-month ones
    group = refgrid.scan(refs)
    assert group["tas"].dims == ("member", "time", "lat", "lon")
    assert group["tas"].grid.lengths(1).tolist() == [10, 10, 10, 1, 10, 10, 8, 10, 10, 10, 1,
                                                    10, 10, 10]
    assert group["pr"].grid.lengths(1).tolist() == [10, 10, 10, 10, 10, 9, 10, 10, 10, 10,
                                                   10, 10, 1]


@pytest.mark.skipif(not RECTILINEAR, reason="zarr >= 3.2 reads rectilinear grids")
@pytest.mark.parametrize("which", ["cmip", "drift"])
def test_zarr_reads_the_references_through_fsspec(which, request):
    _, files, refs = request.getfixturevalue(which)
    expected = cmip_expected(files) if which == "cmip" else drifting_expected(files)
    store = FsspecStore.from_url("reference://", storage_options={"fo": str(refs)},
                                 read_only=True)
    with zarr.config.set({"array.rectilinear_chunks": True}), \
            closed(xr.open_zarr(store, consolidated=False, decode_coords="all")) as ours:
        xr.testing.assert_equal(ours.load(), expected)


def test_the_service_serves_them_as_the_files(cmip, drift, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(cmip[2], served / "cmip.json")
    shutil.copy(drift[2], served / "sst.json")
    sources = (str(cmip[0] / "src"), str(drift[0] / "src"))
    from refgrid.read.fetch import _Kept

    kept = _Kept.count
    for server in start_refgrid_serve(served, allow_sources=sources, recheck=0.0):
        with _engine(f"{server.url}/cmip/native") as ours:
            xr.testing.assert_equal(ours.load(), cmip_expected(cmip[1]))
        with _engine(f"{server.url}/sst/native") as ours:
            xr.testing.assert_identical(ours.load(), drifting_expected(drift[1]))
    assert _Kept.count == kept  # the service, ended, gave back the files it kept open


def test_icechunk_commits_a_stacked_archive_that_reads_as_the_files(cmip, tmp_path):
    icechunk = pytest.importorskip("icechunk")
    if int(icechunk.__version__.split(".")[0]) < 2 or not RECTILINEAR:
        pytest.skip("Icechunk >= 2 and zarr >= 3.2 store and read rectilinear grids")
    from refgrid.writers.icechunk import local_repository

    _, files, _ = cmip
    repo = local_repository(tmp_path / "repo", [str(f) for f in files])
    snapshot = refgrid.write(refgrid.combine([str(f) for f in files], "time", **STACKED),
                             repo, message="cmip")
    with zarr.config.set({"array.rectilinear_chunks": True}), closed(xr.open_zarr(
            repo.readonly_session(snapshot_id=snapshot).store, consolidated=False,
            decode_coords="all")) as ours:
        xr.testing.assert_equal(ours.load(), cmip_expected(files))


def _batch(sources, out, **options):
    return refgrid.batch(sources, out, progress=False, scheduler="synchronous", **options)


def test_batch_builds_resumes_and_grows_a_merged_stacked_archive(tmp_path):
    files = cmip_like(tmp_path / "src", months=2)
    pattern = str(tmp_path / "src" / "*" / "*.nc")
    out = tmp_path / "cmip.parq"
    first = _batch(pattern, out, **STACKED)
    assert first.update.startswith("new"), first.update
    with _engine(out) as ours:
        xr.testing.assert_identical(ours.load(), cmip_expected(files))
    again = _batch(pattern, out, **STACKED)
    assert (again.scanned, again.reused) == (0, len(files))  # resumed: nothing scanned
    added = cmip_like(tmp_path / "src", months=2, start="2001-03-01")
    grown = sorted(files + added)
    later = _batch(pattern, out, **STACKED)
    assert later.scanned == len(added)
    assert later.update.startswith("rebuild: a merged or stacked archive"), later.update
    with _engine(out) as ours:
        xr.testing.assert_identical(ours.load(), cmip_expected(grown))
    with pytest.raises(refgrid.BatchError, match="merged or stacked archive"):
        _batch([str(grown[0])], out, append=True, **STACKED)


def test_batch_appends_files_whose_time_is_in_their_name_as_cheaply_as_others(tmp_path):
    files = drifting(tmp_path / "src", days=10, added=2)
    out = tmp_path / "sst.parq"
    _batch([str(f) for f in files[:6]], out, **DRIFT)
    grown = _batch([str(f) for f in files[:8]], out, **DRIFT)
    assert grown.update.startswith("append"), grown.update  # the same variables: appended
    named = _batch([str(f) for f in files[8:]], out, append=True, **DRIFT)
    assert named.update.startswith("append"), named.update
    with _engine(out) as ours:
        xr.testing.assert_identical(ours.load(), drifting_expected(files))


def test_batch_rebuilds_where_new_files_bring_a_variable(tmp_path):
    files = drifting(tmp_path / "src", days=8, added=5)
    out = tmp_path / "sst.parq"
    _batch([str(f) for f in files[:4]], out, **DRIFT)
    grown = _batch([str(f) for f in files], out, **DRIFT)
    assert grown.update.startswith("rebuild"), grown.update
    assert any("ice" in note and "filled" in note for note in grown.notes)
    with _engine(out) as ours:
        xr.testing.assert_identical(ours.load(), drifting_expected(files))


def test_the_cli_merges_stacks_chooses_and_says_so(cmip, drift, tmp_path):
    from refgrid.cli import main

    runner = CliRunner()
    help_text = runner.invoke(main, ["combine", "--help"]).output
    for option in ("--merge", "--stack-dim", "--stack-by", "--missing", "--variables",
                   "--drop-variables", "--time-from", "--time-units", "--calendar"):
        assert option in help_text
    _, files, _ = cmip
    out = tmp_path / "tas.json"
    result = runner.invoke(main, ["combine", *map(str, files), "-o", str(out), "--merge",
                                  "--stack-dim", "member", "--stack-by", "{member}/*.nc",
                                  "--variables", "tas"])
    assert result.exit_code == 0, result.output
    with _engine(out) as ours:
        xr.testing.assert_identical(ours.load(), cmip_expected(files).drop_vars("pr"))
    out = tmp_path / "sst.json"
    result = runner.invoke(main, ["combine", *map(str, drift[1]), "-o", str(out),
                                  "--time-from", "sst_%Y%m%d.nc", "--missing", "fill",
                                  "--report"])
    assert result.exit_code == 0, result.output
    assert "filled" in result.output
    result = runner.invoke(main, ["combine", *map(str, drift[1]), "-o", str(out),
                                  "--time-from", "sst_%Y%m%d.nc"])
    assert result.exit_code != 0 and "missing='fill'" in result.output
    assert "Traceback" not in result.output


# -- what a review found: each once silently wrong or a bare error ---------------------------

def _nc(path, variables, time=None, units="days since 2001-01-01", groups=None, **attrs):
    """A small NetCDF4 file: ``variables`` {name: (dims, values, attributes)}, a time
    coordinate where ``time`` is given, subgroups {name: variables}."""
    import netCDF4

    path.parent.mkdir(parents=True, exist_ok=True)
    with netCDF4.Dataset(path, "w") as ds:
        ds.setncatts(attrs)
        if time is not None:
            ds.createDimension("time", len(time))
            t = ds.createVariable("time", "f8", ("time",))
            t.units, t[:] = units, time
        for where, found in [(ds, variables), *((ds.createGroup(n), v)
                                               for n, v in (groups or {}).items())]:
            for name, (dims, values, attributes) in found.items():
                for d, n in zip(dims, values.shape, strict=True):
                    if d not in ds.dimensions and d not in where.dimensions:
                        where.createDimension(d, n)
                attributes = dict(attributes)
                v = where.createVariable(name, values.dtype, dims,
                                         fill_value=attributes.pop("_FillValue", None))
                v.setncatts(attributes)
                v[...] = values
    return path


def test_a_batch_shaped_otherwise_scans_its_files_again(tmp_path):
    files = drifting(tmp_path / "src", days=3, added=1)
    out = tmp_path / "sst.parq"
    _batch([str(f) for f in files], out, time_from="sst_%Y%d%m.nc", missing="fill")  # a typo
    fixed = _batch([str(f) for f in files], out, **DRIFT)
    assert fixed.scanned == len(files) and len(fixed.changed) == len(files)
    with _engine(out) as ours:
        xr.testing.assert_identical(ours.load(), drifting_expected(files))
    with pytest.raises(refgrid.ArgumentError, match="'sts'"):
        _batch([str(f) for f in files], out, variables=["sts"], **DRIFT)


def test_a_member_without_a_variable_is_one_step_of_fill(tmp_path):
    fill = {"_FillValue": np.float32(-999)}
    for m in (1, 2, 3):
        variables = {"tas": (("time", "x"), np.full((2, 2), m, "f4"), fill)}
        if m != 2:
            variables["pr"] = (("time", "x"), np.full((2, 2), -m, "f4"), fill)
        _nc(tmp_path / f"r{m}" / "a.nc", variables, time=np.arange(2.0))
    group = refgrid.combine(sorted(map(str, tmp_path.glob("r*/a.nc"))), missing="fill",
                            stack_dim="member", stack_by="r{member:d}/*.nc")
    refgrid.write(group, tmp_path / "out.json")
    with _engine(tmp_path / "out.json") as ours:
        np.testing.assert_array_equal(ours["pr"].values[:, 0, 0], [-1, np.nan, -3])
        assert ours["member"].values.tolist() == [1, 2, 3]


def test_merged_times_are_compared_as_dates_and_packed_ones_refused(tmp_path):
    packed = _nc(tmp_path / "tas.nc", {"tas": (("time",), np.ones(3, "f4"), {})},
                 time=np.arange(3.0))
    with netCDF4_dataset(packed) as ds:
        ds["time"].scale_factor = 0.5
    hours = _nc(tmp_path / "pr.nc", {"pr": (("time",), np.ones(3, "f4"), {})},
                time=np.arange(3.0) * 24, units="hours since 2001-01-01")
    with pytest.raises(refgrid.CombineError, match="packed times in other units"):
        refgrid.combine([str(packed), str(hours)], merge=True)


def test_bounds_taken_from_another_set_keep_their_meaning(tmp_path):
    days = _nc(tmp_path / "tas.nc", {"tas": (("time",), np.ones(3, "f4"), {})},
               time=np.arange(3.0))
    hours = _nc(tmp_path / "pr.nc", {
        "pr": (("time",), np.ones(3, "f4"), {}),
        "time_bnds": (("time", "nb"), np.stack([np.arange(3) * 24.0, np.arange(3) * 24 + 24],
                                               axis=1), {})},
        time=np.arange(3.0) * 24, units="hours since 2001-01-01")
    with netCDF4_dataset(hours) as ds:
        ds["time"].bounds = "time_bnds"
    refgrid.write(refgrid.combine([str(days), str(hours)], merge=True), tmp_path / "m.json")
    with closed(xr.open_dataset(tmp_path / "m.json", engine="refgrid")) as ours, \
            closed(xr.open_dataset(days)) as a, \
            closed(xr.open_dataset(hours)) as b:
        xr.testing.assert_equal(ours.load(), xr.merge([a, b], join="exact"))


def test_a_subgroup_variable_keeps_the_time_it_is_read_along(tmp_path):
    files = [_nc(tmp_path / f"{name}.nc", {}, time=start + np.arange(3.0), groups={
        "sub": {"w": (("time",), start + np.arange(3.0), {})}}) for name, start in
        (("a", 100.0), ("b", 0.0))]
    group = refgrid.combine([str(f) for f in files], variables=["sub/w"])
    assert sorted(p for p, _ in group.walk()) == ["sub", "sub/w", "time"]
    refgrid.write(group, tmp_path / "w.json")
    with closed(xr.open_dataset(tmp_path / "w.json", engine="refgrid", group="sub")) as w:
        assert w["w"].values.tolist() == [0, 1, 2, 100, 101, 102]  # ordered by time


def test_a_scalar_time_keeps_its_bounds(tmp_path):
    """A scalar time with bounds, at noon in units of its own day: both are the file's and
    are kept — the bounds gain the dimension, both re-encoded to the first file's units — as
    ``open_mfdataset`` keeps them (once refused: the name's date could not keep them)."""
    files = [_nc(tmp_path / f"sst_2003010{d}.nc", {
        "sst": (("x",), np.full(2, d, "f4"), {"coordinates": "time"}),
        "time": ((), np.array(0.5), {"units": f"days since 2003-01-0{d}",
                                     "bounds": "time_bnds"}),
        "time_bnds": (("nv",), np.array([0.0, 1.0]), {})}) for d in (1, 2)]
    group = refgrid.combine([str(f) for f in files], time_from="sst_%Y%m%d.nc")
    assert group["time_bnds"].dims == ("time", "nv")
    refgrid.write(group, tmp_path / "b.json")
    expected = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                        data_vars="all", coords="different", compat="equals",
                                        join="exact", decode_coords="all"))
    with _engine(tmp_path / "b.json") as ours:
        xr.testing.assert_identical(ours.load(), expected)
    group = refgrid.combine([str(f) for f in files], time_from="sst_%Y%m%d.nc",
                            drop_variables=["time_bnds"])
    assert group["sst"].dims == ("time", "x") and "time_bnds" not in group.arrays


NOON = {"time_from": "sst_%Y%m%d.nc"}
NOON_DAYS = [f"2003-01-{d:02d}" for d in range(1, 9)]


def test_the_cli_batch_and_appends_keep_each_file_s_own_time(tmp_path):
    """The issue's archive — daily files whose scalar time is noon, each in units of its
    own day — through ``refgrid combine --time-from --report``, ``refgrid batch
    --time-from`` (on a worker process), a batch that grows and a batch told its new files
    (an append): each keeps the files' noon as ``open_mfdataset`` does (the name's midnight
    once replaced it), and says once what it did."""
    from refgrid.cli import main

    files = dated(tmp_path / "src", "scalar", NOON_DAYS)
    out = tmp_path / "sst.json"
    result = CliRunner().invoke(main, ["combine", *map(str, files), "-o", str(out),
                                       "--time-from", "sst_%Y%m%d.nc", "--report"])
    assert result.exit_code == 0, result.output
    with _engine(out) as ours:
        xr.testing.assert_identical(ours.load(), dated_expected(files))
    said = [line.split(": ")[2] for line in result.output.splitlines() if ": time: " in line]
    assert said == ["own-time", "re-encoded"], result.output
    assert "from-name" not in result.output
    workers = tmp_path / "workers.parq"  # shaped in a worker process
    result = CliRunner().invoke(main, ["batch", *map(str, files), "-o", str(workers),
                                       "--time-from", "sst_%Y%m%d.nc", "--workers", "1", "-q"])
    assert result.exit_code == 0, result.output
    with _engine(workers) as ours:
        xr.testing.assert_identical(ours.load(), dated_expected(files))
    parq = tmp_path / "sst.parq"
    first = _batch([str(f) for f in files[:4]], parq, **NOON)
    assert [n.split(": ")[2] for n in first.notes] == ["own-time", "re-encoded"], first.notes
    grown = _batch([str(f) for f in files[:6]], parq, **NOON)
    assert grown.update.startswith("append"), grown.update
    named = _batch([str(f) for f in files[6:]], parq, append=True, **NOON)
    assert named.update.startswith("append"), named.update
    with _engine(parq) as ours:
        xr.testing.assert_identical(ours.load(), dated_expected(files))


def test_a_file_whose_own_time_disagrees_with_its_name_is_refused_everywhere(tmp_path):
    """A file named for the 3rd holding noon of the 4th: ``refgrid combine`` fails naming
    it and both dates (no traceback); a batch lists it as failed with that message and
    combines the others; an append of it leaves the archive as it was."""
    from refgrid.cli import main

    files = dated(tmp_path / "src", "scalar", NOON_DAYS[:4])
    with netCDF4_dataset(files[2]) as nc:
        nc["time"][...] = 36.0
    reason = (r"sst_20030103\.nc: its own 'time' \(2003-01-04 12:00:00\) disagrees with its "
              r"name, which gives year 2003, month 1, day 3")
    result = CliRunner().invoke(main, ["combine", *map(str, files), "-o",
                                       str(tmp_path / "x.json"), "--time-from",
                                       "sst_%Y%m%d.nc"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert re.search(reason, " ".join(result.output.split())), result.output
    parq = tmp_path / "sst.parq"
    done = _batch([str(f) for f in files], parq, **NOON)
    assert [f.url for f in done.failed] == [str(files[2])]
    assert re.search(reason, done.failed[0].message), done.failed[0].message
    with _engine(parq) as ours:
        xr.testing.assert_identical(ours.load(), dated_expected([files[k] for k in (0, 1, 3)]))
    later = dated(tmp_path / "src", "scalar", ["2003-01-05"])
    with netCDF4_dataset(later[0]) as nc:
        nc["time"][...] = -12.0
    with pytest.raises(refgrid.BatchError, match=r"sst_20030105\.nc: its own 'time' "
                                                 r"\(2003-01-04 12:00:00\) disagrees"):
        _batch([str(later[0])], parq, append=True, **NOON)


def test_an_archive_shaped_by_the_earlier_time_rule_is_made_again(tmp_path, monkeypatch):
    """A batch output whose files an earlier ``time_from`` rule shaped (a scalar time
    replaced by the name's date) is neither reused nor appended to: its files are scanned
    again and the output written whole (the rule is in the settings a batch records)."""
    from refgrid.combining import shaping

    files = [str(f) for f in dated(tmp_path / "src", "scalar", NOON_DAYS[:3])]
    parq = tmp_path / "sst.parq"
    with monkeypatch.context() as earlier:
        earlier.setattr(shaping, "TIME_RULE", 1)
        _batch(files[:2], parq, **NOON)
    with pytest.raises(refgrid.BatchError, match="other settings"):
        _batch(files[2:], parq, append=True, **NOON)
    again = _batch(files, parq, **NOON)
    assert again.scanned == 3 and again.update.startswith("rebuild"), again.update
    assert json.loads(again.report_path.read_text())["settings"]["time_rule"] == "2"


def netCDF4_dataset(path):
    import netCDF4

    return netCDF4.Dataset(path, "a")

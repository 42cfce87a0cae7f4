"""``refgrid batch``: whole archives on dask, resumable, appendable, with a failure report.

Every output is read with the engine and compared with what xarray reads from the good
source files (``xr.open_mfdataset``); the kill test SIGKILLs a real batch process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import xarray as xr
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refgrid
from archive_files import CHUNK, lengths, write_archive, write_corrupt
from helpers import FIXTURES, QUIET_CLUSTER, killed
from refgrid.archive.journal import RECORDS, Journal, read_entries
from refgrid.cli import main
from refgrid.refs.source_pages import StoredSources

GOOD = 200


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, list[Path], list[Path]]:
    """200 files of irregular lengths and 3 corrupt ones, all matching tas_*.nc."""
    root = tmp_path_factory.mktemp("archive")
    good = write_archive(root, range(GOOD))
    return root, good, write_corrupt(root, good[0])


@pytest.fixture(scope="module")
def expected(archive) -> xr.Dataset:
    """What xarray reads from the good files."""
    _, good, _ = archive
    with xr.open_mfdataset(good, combine="nested", concat_dim="time", data_vars="minimal",
                           coords="minimal", compat="override") as ds:
        return ds.load()


def opened(output: Path) -> xr.Dataset:
    with xr.open_dataset(output, engine="refgrid") as ds:
        return ds.load()


def copied(root: Path, count: int, directory: Path) -> Path:
    """A copy of the first ``count`` files of the archive, to grow or change."""
    directory.mkdir()
    for k in range(count):
        shutil.copy2(root / f"tas_{k:05d}.nc", directory)
    return directory


def steps(paths: list[Path]) -> int:
    """The number of time steps in the files, as netCDF4 reads them."""
    import netCDF4

    total = 0
    for path in paths:
        with netCDF4.Dataset(path) as ds:
            total += len(ds.dimensions["time"])
    return total


def tree_bytes(path: Path) -> dict[str, bytes]:
    """Every file of an output (a JSON file or a parquet directory), by relative name."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_a_batch_equals_open_mfdataset_of_the_good_files_and_reports_the_corrupt(
        archive, expected, tmp_path):
    root, _good, corrupt = archive
    result = refgrid.batch(str(root / "tas_*.nc"), tmp_path / "tas.parq", progress=False)
    assert (result.files, result.scanned, result.reused) == (GOOD + 3, GOOD, 0)
    assert sorted(f.url for f in result.failed) == sorted(str(p) for p in corrupt)
    assert all(str(p) in f.message for f, p in zip(
        sorted(result.failed, key=lambda f: f.url), sorted(corrupt), strict=True))
    xr.testing.assert_identical(opened(tmp_path / "tas.parq"), expected)
    grid = json.loads((tmp_path / "tas.parq" / ".zmetadata").read_text())["metadata"][
        "tas/zarr.json"]["chunk_grid"]
    assert grid["name"] == "rectilinear"  # files of 28-31 steps in chunks of 10
    report = json.loads(result.report_path.read_text())
    assert sorted(f["url"] for f in report["failed"]) == sorted(str(p) for p in corrupt)
    assert report["scanned"] == GOOD and report["output"] == str(tmp_path / "tas.parq")


def test_json_output_for_a_json_name_and_the_same_values(archive, expected, tmp_path):
    _, good, _ = archive
    result = refgrid.batch([str(p) for p in good[:40]], tmp_path / "tas.json",
                           scheduler="synchronous", progress=False)
    assert result.ok and (tmp_path / "tas.json").is_file()
    first = steps(good[:40])
    xr.testing.assert_identical(opened(tmp_path / "tas.json"), expected.isel(time=slice(first)))


def test_on_a_distributed_cluster_by_address(archive, expected, tmp_path):
    distributed = pytest.importorskip("distributed")
    root, _, corrupt = archive
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", **QUIET_CLUSTER) as cluster:
        result = refgrid.batch(str(root / "tas_*.nc"), tmp_path / "tas.parq",
                               scheduler=cluster.scheduler_address, progress=False)
        with distributed.Client(cluster) as client:  # a Client object works too
            again = refgrid.batch(str(root / "tas_*.nc"), tmp_path / "again.parq",
                                  scheduler=client, progress=False)
    assert sorted(f.url for f in result.failed) == sorted(str(p) for p in corrupt)
    xr.testing.assert_identical(opened(tmp_path / "tas.parq"), expected)
    assert again.scanned == GOOD and len(again.failed) == 3
    assert tree_bytes(tmp_path / "again.parq") == tree_bytes(tmp_path / "tas.parq")


def test_the_same_command_again_scans_nothing_and_writes_the_same_bytes(archive, tmp_path):
    root, _, _ = archive
    sources = str(root / "tas_000[0-4]*.nc")
    first = refgrid.batch(sources, tmp_path / "tas.parq", progress=False)
    before = tree_bytes(tmp_path / "tas.parq")
    second = refgrid.batch(sources, tmp_path / "tas.parq", progress=False)
    assert (first.scanned, second.scanned, second.reused) == (50, 0, 50)
    assert tree_bytes(tmp_path / "tas.parq") == before


def test_append_scans_only_the_new_files_and_equals_a_fresh_run(archive, tmp_path):
    grown = copied(archive[0], 60, tmp_path / "archive")
    refgrid.batch(str(grown / "tas_*.nc"), tmp_path / "tas.parq", progress=False)
    write_archive(grown, range(60, 70))  # ten more days... months arrive
    appended = refgrid.batch(str(grown / "tas_*.nc"), tmp_path / "tas.parq", progress=False)
    fresh = refgrid.batch(str(grown / "tas_*.nc"), tmp_path / "fresh.parq", progress=False)
    assert (appended.scanned, appended.reused, fresh.scanned) == (10, 60, 70)
    assert appended.update.startswith("append: 10 file(s)"), appended.update
    assert fresh.update.startswith("new")
    assert tree_bytes(tmp_path / "tas.parq") == tree_bytes(tmp_path / "fresh.parq")
    with xr.open_mfdataset(sorted(grown.glob("*.nc")), combine="nested", concat_dim="time",
                           data_vars="minimal", coords="minimal", compat="override") as ds:
        xr.testing.assert_identical(opened(tmp_path / "tas.parq"), ds.load())


def test_an_archive_written_before_the_sources_had_record_files_is_appended_to(
        archive, tmp_path):
    """Parquet archives of before kept every source's identity in ``.zmetadata``: one opens
    as it did, and its first append moves the table into record files — the result equals a
    fresh run of all the files, byte for byte."""
    grown = copied(archive[0], 30, tmp_path / "archive")
    out = tmp_path / "tas.parq"
    refgrid.batch(str(grown / "tas_*.nc"), out, progress=False)
    before = opened(out)
    sources = refgrid.scan(out).sources
    assert isinstance(sources, StoredSources) and len(sources) == 30
    meta = json.loads((out / ".zmetadata").read_text())
    section = meta["refgrid"]
    assert section.pop("source_table")["rows"] == 30
    section["records"] = {k: v for k, v in section["records"].items()
                          if not k.startswith(".sources/")}
    meta["refgrid"] = {"sources": dict(sources.items()), **section}
    shutil.rmtree(out / ".sources")
    (out / ".zmetadata").write_text(json.dumps(meta))
    assert dict(refgrid.scan(out).sources) == dict(sources)
    xr.testing.assert_identical(opened(out), before)
    write_archive(grown, range(30, 33))
    appended = refgrid.batch(str(grown / "tas_*.nc"), out, progress=False)
    refgrid.batch(str(grown / "tas_*.nc"), tmp_path / "fresh.parq", progress=False)
    assert appended.update.startswith("append: 3 file(s)"), appended.update
    assert tree_bytes(out) == tree_bytes(tmp_path / "fresh.parq")


def test_files_whose_names_do_not_sort_in_time_are_appended_to(archive, tmp_path,
                                                                 monkeypatch):
    """The sources' record files are sorted by URL (a file's identity is one record file
    away), and ``.zmetadata`` says which files come first and last in time: an archive whose
    names sort backwards is appended to as any other, and equals a fresh run."""
    monkeypatch.setitem(refgrid.writers.save.__kwdefaults__, "record_size", 20)
    grown = tmp_path / "archive"
    grown.mkdir()

    def landed(days: range) -> None:
        write_archive(tmp_path / "written", days)
        for k in days:
            (tmp_path / "written" / f"tas_{k:05d}.nc").rename(grown / f"{99999 - k}_tas.nc")

    landed(range(30))
    out = tmp_path / "tas.parq"
    refgrid.batch(str(grown / "*_tas.nc"), out, progress=False)
    table = json.loads((out / ".zmetadata").read_text())["refgrid"]["source_table"]
    assert (table["first"], table["last"]) == (str(grown / "99999_tas.nc"),
                                               str(grown / "99970_tas.nc"))
    assert table["pages"][0] == str(grown / "99970_tas.nc")  # (sorted by URL)
    landed(range(30, 33))
    appended = refgrid.batch(str(grown / "*_tas.nc"), out, progress=False)
    assert appended.update.startswith("append: 3 file(s)"), appended.update
    refgrid.batch(str(grown / "*_tas.nc"), tmp_path / "fresh.parq", progress=False)
    assert tree_bytes(out) == tree_bytes(tmp_path / "fresh.parq")
    files = [grown / f"{99999 - k}_tas.nc" for k in range(33)]
    with xr.open_mfdataset(files, combine="nested", concat_dim="time", data_vars="minimal",
                           coords="minimal", compat="override") as ds:
        xr.testing.assert_identical(opened(out), ds.load())


def test_an_append_writes_only_the_last_record_file_and_those_after_it(archive, tmp_path,
                                                                        monkeypatch):
    """Record files of 20 chunks: growing a 40-file archive (3 chunks a file) by 5 files
    rewrites the record file holding the last file's chunks and writes the new ones; every
    earlier record file is left as it was (same inode, same bytes); appending twice equals a
    fresh run of all the files, byte for byte, and a third run with nothing new writes
    nothing."""
    monkeypatch.setitem(refgrid.writers.save.__kwdefaults__, "record_size", 20)
    grown = copied(archive[0], 40, tmp_path / "archive")
    out = tmp_path / "tas.parq"
    refgrid.batch(str(grown / "tas_*.nc"), out, progress=False)
    before = {p.name: (p.stat().st_ino, p.read_bytes()) for p in (out / "tas").iterdir()}
    write_archive(grown, range(40, 45))
    appended = refgrid.batch(str(grown / "tas_*.nc"), out, progress=False)
    after = {p.name: (p.stat().st_ino, p.read_bytes()) for p in (out / "tas").iterdir()}
    untouched = {name for name in before if after[name] == before[name]}
    chunks = [-(-n // CHUNK) for n in lengths(range(45))]  # 3 or 4 a file
    assert len(before) == -(-sum(chunks[:40]) // 20) and len(after) == -(-sum(chunks) // 20)
    assert untouched == {f"refs.{n}.parq" for n in range(sum(chunks[:39]) // 20)}
    assert appended.update.startswith("append: 5 file(s)")
    assert sorted(p.name for p in (out / ".sources").iterdir()) == \
        ["refs.0.parq", "refs.1.parq", "refs.2.parq"]  # the sources: 20 a record file
    write_archive(grown, range(45, 47))
    refgrid.batch(str(grown / "tas_*.nc"), out, progress=False)
    fresh = refgrid.batch(str(grown / "tas_*.nc"), tmp_path / "fresh.parq", progress=False)
    assert tree_bytes(out) == tree_bytes(tmp_path / "fresh.parq")
    again = refgrid.batch(str(grown / "tas_*.nc"), out, progress=False)
    assert again.update.startswith("unchanged") and again.scanned == 0
    assert tree_bytes(out) == tree_bytes(tmp_path / "fresh.parq")
    assert fresh.update.startswith("new")


@pytest.mark.parametrize("first", [1, 4])
def test_an_append_whose_padded_chunks_are_files_reads_as_the_files(tmp_path, first):
    """Padded chunks too large to inline: the append rewrites the last file's (now interior)
    chunk and the new files' into a new sidecar directory (the first one, for an archive of
    one file) beside any earlier one; the output reads as xarray reads the files."""
    grown = tmp_path / "archive"
    write_archive(grown, range(first), lat=30, lon=40)
    out = tmp_path / "tas.parq"
    refgrid.batch(str(grown / "tas_*.nc"), out, progress=False)
    write_archive(grown, range(first, first + 3), lat=30, lon=40)
    appended = refgrid.batch(str(grown / "tas_*.nc"), out, progress=False)
    assert appended.update.startswith("append: 3 file(s)"), appended.update
    assert len(list((tmp_path / "tas.parq.chunks").iterdir())) == (2 if first > 1 else 1)
    with xr.open_mfdataset(sorted(grown.glob("*.nc")), combine="nested", concat_dim="time",
                           data_vars="minimal", coords="minimal", compat="override") as ds:
        xr.testing.assert_identical(opened(out), ds.load())


@pytest.mark.parametrize("change", ["backfill", "removed", "json", "settings", "changed"])
def test_what_an_append_cannot_take_rebuilds_the_output_and_says_why(archive, tmp_path,
                                                                     change):
    """A file inside the archive's range, a file gone, JSON output, other settings: the
    whole output is written again (the report says why) and equals a fresh run."""
    grown = copied(archive[0], 12, tmp_path / "archive")
    if change == "backfill":
        (grown / "tas_00005.nc").unlink()
    name = "tas.json" if change == "json" else "tas.parq"
    refgrid.batch(str(grown / "tas_*.nc"), tmp_path / name, progress=False)
    if change == "backfill":
        write_archive(grown, [5])
    elif change == "removed":
        (grown / "tas_00011.nc").unlink()
    else:
        write_archive(grown, [12])
    if change == "changed":  # the archive's last file rewritten (as it is while it grows)
        time.sleep(0.01)
        write_archive(grown, [11])
    padded = "encoded" if change == "settings" else "rewrite"
    second = refgrid.batch(str(grown / "tas_*.nc"), tmp_path / name, padded=padded,
                           progress=False)
    why = {"backfill": "tas_00005.nc lies inside the archive's range (backfill)",
           "removed": "1 file(s) of the output are gone", "json": "json references are "
           "written whole", "settings": "written with other settings (padded 'rewrite' then, "
           "'encoded' now)",
           "changed": "1 file(s) of the output changed since it was written"}[change]
    assert second.update.startswith("rebuild: ") and why in second.update, second.update
    refgrid.batch(str(grown / "tas_*.nc"), tmp_path / f"fresh.{name.split('.')[1]}",
                  padded=padded, progress=False)
    assert tree_bytes(tmp_path / name).popitem()[1] == \
        tree_bytes(tmp_path / f"fresh.{name.split('.')[1]}").popitem()[1] if change == "json" \
        else tree_bytes(tmp_path / name) == tree_bytes(tmp_path / "fresh.parq")
    with xr.open_mfdataset(sorted(grown.glob("*.nc")), combine="nested", concat_dim="time",
                           data_vars="minimal", coords="minimal", compat="override") as ds:
        xr.testing.assert_identical(opened(tmp_path / name), ds.load())


@pytest.mark.parametrize("damage", ['{"metadata": [], "record_size": 10}', "[1, 2]",
                                    '{"metadata": {}, "record_size": "ten"}', "{"])
def test_a_damaged_earlier_output_is_rebuilt_and_the_report_says_why(archive, tmp_path,
                                                                     damage):
    """``.zmetadata`` of the earlier output that is no kerchunk parquet metadata (its
    ``metadata`` a list: an ``AttributeError`` in parsing, which a batch raised bare): the
    output is written again, the report naming the file, and equals a fresh run."""
    grown = copied(archive[0], 6, tmp_path / "archive")
    refgrid.batch(str(grown / "tas_*.nc"), tmp_path / "tas.parq", progress=False)
    write_archive(grown, [6])
    (tmp_path / "tas.parq" / ".zmetadata").write_text(damage)
    second = refgrid.batch(str(grown / "tas_*.nc"), tmp_path / "tas.parq", progress=False)
    assert second.update.startswith("rebuild: the earlier output cannot be read (FormatError")
    assert ".zmetadata" in second.update, second.update
    refgrid.batch(str(grown / "tas_*.nc"), tmp_path / "fresh.parq", progress=False)
    assert tree_bytes(tmp_path / "tas.parq") == tree_bytes(tmp_path / "fresh.parq")


def test_an_archive_keeping_other_variables_per_file_is_rebuilt_when_it_grows(archive,
                                                                              tmp_path):
    """``convert`` takes any :class:`CombineSpec`; one that keeps the other variables per
    file (``others="stack"``) grows a dimension an append does not write: the archive is
    written whole, the report says why, and equals a fresh run."""
    from refgrid.archive import BatchRun, convert
    from refgrid.combining.spec import CombineSpec

    grown = copied(archive[0], 6, tmp_path / "archive")
    spec, how = CombineSpec(others="stack"), BatchRun(progress=False)
    convert(str(grown / "tas_*.nc"), tmp_path / "tas.parq", spec, how)
    write_archive(grown, [6])
    second = convert(str(grown / "tas_*.nc"), tmp_path / "tas.parq", spec, how)
    assert second.update.startswith("rebuild: an archive whose other variables are kept per "
                                    "file"), second.update
    convert(str(grown / "tas_*.nc"), tmp_path / "fresh.parq", spec, how)
    assert tree_bytes(tmp_path / "tas.parq") == tree_bytes(tmp_path / "fresh.parq")


def test_a_changed_file_is_rescanned_and_the_report_says_what_changed(archive, tmp_path):
    copy = copied(archive[0], 8, tmp_path / "archive")
    refgrid.batch(str(copy / "*.nc"), tmp_path / "tas.json", progress=False)
    target = copy / "tas_00003.nc"
    import netCDF4

    with netCDF4.Dataset(target, "a") as ds:
        ds["tas"][0, 0, 0] = 1.5  # same size, new data: the mtime tells
    os.utime(target, (time.time() + 5, time.time() + 5))
    result = refgrid.batch(str(copy / "*.nc"), tmp_path / "tas.json", progress=False)
    assert result.scanned == 1 and result.reused == 7
    assert len(result.changed) == 1 and str(target) in result.changed[0]
    assert re.search(r"modified 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{3})? UTC, now 20\d\d-",
                     result.changed[0]), result.changed[0]
    start = steps([copy / f"tas_{k:05d}.nc" for k in range(3)])
    assert float(opened(tmp_path / "tas.json").tas.isel(time=start)[0, 0]) == 1.5


def test_files_gone_from_the_sources_are_left_out(archive, tmp_path):
    _, good, _ = archive
    refgrid.batch([str(p) for p in good[:6]], tmp_path / "tas.json", progress=False)
    result = refgrid.batch([str(p) for p in good[:4]], tmp_path / "tas.json", progress=False)
    assert (result.scanned, result.reused, result.dropped) == (0, 4, 2)
    ds = opened(tmp_path / "tas.json")
    assert ds.sizes["time"] == steps(good[:4])


@pytest.mark.parametrize("scheduler", ["synchronous", None])
def test_on_error_raise_stops_at_a_corrupt_file_and_keeps_the_records(archive, tmp_path,
                                                                     scheduler):
    _, good, corrupt = archive
    with pytest.raises(refgrid.ScanError, match=r"tas_90002\.nc"):
        refgrid.batch([str(good[0]), str(corrupt[1]), str(good[1])], tmp_path / "t.json",
                      scheduler=scheduler, on_error="raise", progress=False, workers=1)
    assert not (tmp_path / "t.json").exists()
    with Journal(tmp_path / "t.json.parts") as journal:
        recorded = set(journal.entries)
    assert recorded <= {str(good[0]), str(good[1])}
    rerun = refgrid.batch([str(good[0]), str(good[1])], tmp_path / "t.json",
                          scheduler=scheduler, progress=False)
    assert (rerun.scanned, rerun.reused) == (2 - len(recorded), len(recorded))


def test_only_corrupt_files_is_an_error_with_the_report_written(archive, tmp_path):
    _, _, corrupt = archive
    with pytest.raises(refgrid.BatchError, match="no file could be scanned"):
        refgrid.batch([str(p) for p in corrupt], tmp_path / "t.parq", progress=False,
                      scheduler="synchronous")
    report = json.loads((tmp_path / "t.parq.report.json").read_text())
    assert len(report["failed"]) == 3 and not (tmp_path / "t.parq").exists()


def test_incompatible_files_name_the_files(archive, tmp_path):
    _, good, _ = archive
    odd = tmp_path / "odd.nc"
    with xr.open_dataset(good[1]) as ds:
        ds.load().rename({"tas": "pr"}).to_netcdf(odd)
    with pytest.raises(refgrid.CombineError, match=r"odd\.nc") as info:
        refgrid.batch([str(good[0]), str(odd)], tmp_path / "t.json", progress=False,
                      scheduler="synchronous")
    assert "tas" in str(info.value)
    report = json.loads((tmp_path / "t.json.report.json").read_text())
    assert report["error"] == str(info.value) and not (tmp_path / "t.json").exists()


def test_combining_a_slice_at_a_time_writes_what_one_combine_writes(archive, monkeypatch,
                                                                   tmp_path):
    """Slices of 7 files (hourly and daily units among them), then the slices combined:
    the same bytes as the 200 files in one combine."""
    root, _, _ = archive
    pattern = str(root / "tas_00*.nc")
    refgrid.batch(pattern, tmp_path / "one.json", progress=False)
    monkeypatch.setattr("refgrid.archive.assemble.SLICE_FILES", 7)
    refgrid.batch(pattern, tmp_path / "sliced.json", progress=False)
    assert (tmp_path / "sliced.json").read_bytes() == (tmp_path / "one.json").read_bytes()


@pytest.mark.parametrize("kind", ["netcdf3/classic", "netcdf3/offset64", "monthly/contiguous"])
def test_other_formats_and_layouts_read_as_xarray_reads_the_files(kind, tmp_path):
    files = sorted((FIXTURES / kind).glob("*.nc"))
    refgrid.batch(str(FIXTURES / kind / "*.nc"), tmp_path / "b.json", progress=False,
                  scheduler="synchronous")
    with xr.open_mfdataset(files, combine="nested", concat_dim="time", data_vars="minimal",
                           coords="minimal", compat="override") as expected:
        xr.testing.assert_identical(opened(tmp_path / "b.json"), expected.load())


def test_nested_groups_and_several_variables_as_combine_does(tmp_path):
    files = sorted((FIXTURES / "groups").glob("*.nc"))
    refgrid.batch([str(f) for f in files], tmp_path / "b.json", progress=False,
                  scheduler="synchronous", padded="encoded")  # the combine's model as it is
    combined = refgrid.combine([refgrid.scan(f) for f in files], "time")
    assert refgrid.to_kerchunk(refgrid.scan(tmp_path / "b.json")) == refgrid.to_kerchunk(
        combined)
    for group in (None, "surface", "surface/upper"):
        with xr.open_mfdataset(files, group=group, combine="nested", concat_dim="time",
                               data_vars="minimal", compat="equals") as expected, \
                xr.open_dataset(tmp_path / "b.json", engine="refgrid", group=group) as ours:
            xr.testing.assert_equal(ours.load(), expected.load())


def test_a_list_file_names_the_sources(archive, expected, tmp_path):
    _, good, _ = archive
    listing = tmp_path / "files.txt"
    listing.write_text("# the first three\n" + "\n".join(str(p) for p in good[:3]) + "\n\n")
    result = refgrid.batch(f"@{listing}", tmp_path / "t.json", progress=False,
                           scheduler="synchronous")
    assert result.files == 3 and result.ok


def test_a_pattern_matching_nothing_and_a_missing_list_are_argument_errors(tmp_path):
    with pytest.raises(refgrid.ArgumentError, match="no file matches"):
        refgrid.batch(str(tmp_path / "*.nc"), tmp_path / "t.json")
    with pytest.raises(refgrid.ArgumentError, match="list of sources"):
        refgrid.batch(f"@{tmp_path / 'absent.txt'}", tmp_path / "t.json")
    with pytest.raises(refgrid.ArgumentError, match="scheduler"):
        refgrid.batch(str(__file__), tmp_path / "t.json", scheduler=42)
    with pytest.raises(refgrid.ArgumentError, match="must be a local path"):
        refgrid.batch(str(__file__), "s3://bucket/out.parq")
    with pytest.raises(refgrid.ArgumentError, match="format"):
        refgrid.batch(str(__file__), tmp_path / "t.json", format="zarr")  # type: ignore


def test_a_work_directory_is_used_by_one_batch_at_a_time(tmp_path):
    with Journal(tmp_path / "w"), pytest.raises(refgrid.BatchError, match="another batch"):
        Journal(tmp_path / "w")


def test_a_torn_last_record_is_dropped_and_that_file_scanned_again(archive, tmp_path):
    _, good, _ = archive
    refgrid.batch([str(p) for p in good[:3]], tmp_path / "t.json", scheduler="synchronous",
                  progress=False)
    records = tmp_path / "t.json.parts" / RECORDS
    data = records.read_bytes()
    records.write_bytes(data[: len(data) - 100])  # the last record cut, as by a kill
    assert len(read_entries(records)[0]) == 2
    result = refgrid.batch([str(p) for p in good[:3]], tmp_path / "t.json",
                           scheduler="synchronous", progress=False)
    assert (result.scanned, result.reused) == (1, 2)
    assert read_entries(records) == (read_entries(records)[0], True)
    assert len(read_entries(records)[0]) == 3


def test_a_damaged_record_is_dropped_and_its_file_scanned_again(archive, tmp_path):
    _, good, _ = archive
    refgrid.batch([str(p) for p in good[:3]], tmp_path / "t.json", scheduler="synchronous",
                  progress=False)
    records = tmp_path / "t.json.parts" / RECORDS
    entries, _ = read_entries(records)
    data = bytearray(records.read_bytes())
    data[entries[str(good[1])].offset + 40] ^= 0xFF  # one bit pattern changed on disk
    records.write_bytes(bytes(data))
    result = refgrid.batch([str(p) for p in good[:3]], tmp_path / "t.json",
                           scheduler="synchronous", progress=False)
    assert (result.scanned, result.reused) == (1, 2)


def test_the_index_of_records_spares_a_batch_reading_them_and_damage_is_still_named(
        archive, tmp_path):
    """A batch reads the records' headers from the index the last one wrote (not every
    record) while the records file is as that batch left it; a record damaged behind its
    back (the file's modification time put back) is named when it is read, never used."""
    _, good, _ = archive
    sources = [str(p) for p in good[:3]]
    refgrid.batch(sources, tmp_path / "t.json", scheduler="synchronous", progress=False)
    work = tmp_path / "t.json.parts"
    assert (work / "index.bin").is_file()
    records = work / RECORDS
    entries, _ = read_entries(records)
    stat = records.stat()
    data = bytearray(records.read_bytes())
    data[entries[str(good[1])].offset + 40] ^= 0xFF
    records.write_bytes(bytes(data))
    os.utime(records, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (tmp_path / "t.json").unlink()
    with pytest.raises(refgrid.BatchError, match=f"record of {good[1]} is damaged"):
        refgrid.batch(sources, tmp_path / "t.json", scheduler="synchronous", progress=False)


def test_an_append_adds_a_frame_to_the_index_and_a_torn_frame_costs_a_reread(archive,
                                                                           tmp_path):
    """A batch that records one more file appends its header to the index (the earlier
    bytes untouched); a frame torn by a kill makes the next batch read the records whole,
    with the same result, and write the index as one frame again."""
    _, good, _ = archive
    output, index = tmp_path / "t.parq", tmp_path / "t.parq.parts" / "index.bin"
    refgrid.batch([str(p) for p in good[:3]], output, scheduler="synchronous",
                  progress=False)
    first = index.read_bytes()
    refgrid.batch([str(p) for p in good[:4]], output, scheduler="synchronous",
                  progress=False)
    grown = index.read_bytes()
    assert grown.startswith(first) and len(first) < len(grown) < 2 * len(first)
    with Journal(tmp_path / "t.parq.parts") as journal:
        assert list(journal.entries) == [str(p) for p in good[:4]]
        assert journal._frames == 2
    index.write_bytes(grown[:-3])  # the last frame's CRC cut short
    result = refgrid.batch([str(p) for p in good[:5]], output, scheduler="synchronous",
                           progress=False)
    assert (result.scanned, result.reused) == (1, 4)
    with Journal(tmp_path / "t.parq.parts") as journal:
        assert journal._frames == 1 and len(journal.entries) == 5
    with xr.open_mfdataset(good[:5], combine="nested", concat_dim="time",
                           data_vars="minimal", coords="minimal", compat="override") as ds:
        xr.testing.assert_identical(opened(output), ds.load())


def test_a_record_naming_code_to_run_is_refused(tmp_path):
    """Records are pickles of plain data: one that names any other global never loads."""
    import pickle

    from refgrid.archive.record import loads

    class Boom:
        def __reduce__(self):
            return (os.system, ("echo hacked > " + str(tmp_path / "hacked"),))

    with pytest.raises(refgrid.BatchError, match="not plain data"):
        loads(pickle.dumps({"group": Boom(), "digests": {}}), "test record")
    assert not (tmp_path / "hacked").exists()


def test_kill_minus_nine_then_rerun_scans_only_the_rest_and_writes_the_same(archive,
                                                                           tmp_path):
    root, _, _ = archive
    pattern = str(root / "tas_00*.nc")  # the 200 good files
    reference = refgrid.batch(pattern, tmp_path / "reference.parq", progress=False)
    assert reference.scanned == GOOD
    output, work = tmp_path / "killed.parq", tmp_path / "killed.parq.parts"
    command = [sys.executable, "-m", "refgrid.cli", "batch", pattern, "-o", str(output),
               "--quiet", "--workers", "2"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    records, deadline = work / RECORDS, time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if len(read_entries(records)[0]) >= 0.3 * GOOD:
            break
        time.sleep(0.002)
    assert process.poll() is None, "the batch ended before it could be killed"
    workers = psutil.Process(process.pid).children(recursive=True)
    assert workers
    killed(process)
    assert not output.exists()
    _, alive = psutil.wait_procs(workers, timeout=10)  # they follow their parent
    assert not alive, alive
    with Journal(work) as journal:  # also what the rerun sees: torn lines dropped
        recorded = len(journal.entries)
    assert 0.3 * GOOD <= recorded < GOOD
    rerun = refgrid.batch(pattern, output, progress=False)
    assert (rerun.scanned, rerun.reused) == (GOOD - recorded, recorded)
    assert tree_bytes(output) == tree_bytes(tmp_path / "reference.parq")


def test_cli_exit_status_report_and_allow_failures(archive, tmp_path):
    root, _, corrupt = archive
    sources = [str(root / "tas_0000[0-3].nc"), *(str(p) for p in corrupt)]
    runner = CliRunner()
    failed = runner.invoke(main, ["batch", *sources, "-o", str(tmp_path / "t.parq"), "-q"])
    assert failed.exit_code == 1, failed.output
    assert "3 of 7 files could not be scanned" in failed.output
    assert "Traceback" not in failed.output and (tmp_path / "t.parq").is_dir()
    allowed = runner.invoke(main, ["batch", *sources, "-o", str(tmp_path / "t.parq"), "-q",
                                   "--allow-failures"])
    assert allowed.exit_code == 0, allowed.output
    assert "7 files: 0 scanned, 4 reused, 3 failed" in allowed.output


def test_without_dask_the_batch_extra_is_named(monkeypatch, archive, tmp_path):
    _, good, _ = archive
    monkeypatch.setitem(sys.modules, "dask", None)
    with pytest.raises(refgrid.MissingExtraError, match="'batch' extra"):
        refgrid.batch([str(good[0])], tmp_path / "t.json", progress=False)


def test_progress_bar_counts_files_and_failures(archive, tmp_path, capsys):
    _, good, corrupt = archive
    refgrid.batch([str(good[0]), str(corrupt[2])], tmp_path / "t.json", progress=True,
                  scheduler="synchronous")
    err = capsys.readouterr().err
    assert "scanning" in err and "2/2" in err and "failed=1" in err


def test_stored_values_match_netcdf4_everywhere(archive, tmp_path):
    """Differential, below xarray: every element against netCDF4 on the source."""
    import netCDF4

    _, good, _ = archive
    refgrid.batch([str(p) for p in good[:25]], tmp_path / "t.parq", progress=False,
                  scheduler="synchronous")
    values = xr.open_dataset(tmp_path / "t.parq", engine="refgrid", mask_and_scale=False,
                             decode_times=False)
    parts = []
    for p in good[:25]:
        with netCDF4.Dataset(p) as ds:
            ds.set_auto_mask(False)
            parts.append(ds["tas"][:])
    np.testing.assert_array_equal(values.tas.values, np.concatenate(parts))


def _s3_filesystems() -> int:
    import s3fs

    return len(s3fs.S3FileSystem._cache)


def test_an_s3_glob_is_scanned_by_the_workers_in_few_requests_with_one_pool_each(
        archive, expected, s3_server, tmp_path, monkeypatch):
    """200 files on moto's S3, scanned on a LocalCluster: at most 4 requests per file (one
    here: a listed file is fetched whole, once), the client only lists, and each worker
    holds one filesystem — one connection pool — for all its files."""
    distributed = pytest.importorskip("distributed")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    _, good, _ = archive
    for path in good:
        s3_server.upload(path, f"batch/{path.name}")
    s3_server.counter.reset()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                                  host="127.0.0.1", **QUIET_CLUSTER) as cluster, \
            distributed.Client(cluster) as client:
        result = refgrid.batch(f"s3://{s3_server.bucket}/batch/tas_*.nc", tmp_path / "s3.parq",
                               storage_options=s3_server.storage_options, scheduler=client,
                               progress=False, padded="encoded")  # the scans' requests only
        pools = client.run(_s3_filesystems)
    assert result.ok and result.scanned == GOOD
    per_file: dict[str, int] = {}
    others = []
    for request in s3_server.counter.requests:
        _method, path, _ = request.split(" ", 2)
        if path.startswith(f"/{s3_server.bucket}/batch/tas_"):
            per_file[path] = per_file.get(path, 0) + 1
        else:
            others.append(request)
    assert len(per_file) == GOOD and set(per_file.values()) == {1}, sorted(
        per_file.items(), key=lambda kv: -kv[1])[:3]
    assert others == [f"GET /{s3_server.bucket} "], others  # the client's one listing
    assert sorted(pools.values()) == [1, 1], pools
    with xr.open_dataset(tmp_path / "s3.parq", engine="refgrid",
                         storage_options=s3_server.storage_options) as ds:
        xr.testing.assert_identical(ds.load(), expected)


@pytest.fixture(scope="module")
def records(archive, tmp_path_factory) -> tuple[bytes, dict[str, bytes]]:
    """A records file of three files, and each file's record."""
    _, good, _ = archive
    out = tmp_path_factory.mktemp("records") / "t.json"
    refgrid.batch([str(p) for p in good[:3]], out, scheduler="synchronous", progress=False)
    path = out.with_name("t.json.parts") / RECORDS
    with open(path, "rb") as f:
        originals = {url: (f.seek(e.offset), f.read(e.length))[1]
                     for url, e in read_entries(path)[0].items()}
    return path.read_bytes(), originals


@settings(max_examples=int(os.environ.get("REFGRID_FUZZ_EXAMPLES", "250")), deadline=None,
          database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_damaged_records_are_dropped_never_misattributed(records, tmp_path_factory, data):
    """Fuzz: cuts, flipped and inserted bytes in a records file. Every record a batch would
    use is exactly one that was written, under its own URL; the rest are dropped (and
    scanned again); loading never fails with anything but a refgrid error."""
    from refgrid.archive.record import loads

    original, originals = records
    damaged = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["cut", "flip", "insert"]))
        at = data.draw(st.integers(0, max(0, len(damaged) - 1)))
        if kind == "cut":
            del damaged[at:]
        elif kind == "flip" and damaged:
            damaged[at] ^= data.draw(st.integers(1, 255))
        else:
            damaged[at:at] = data.draw(st.binary(min_size=1, max_size=64))
    work = tmp_path_factory.mktemp("damaged")
    (work / RECORDS).write_bytes(bytes(damaged))
    with Journal(work) as journal:  # also rewrites the file to its usable records
        for url in journal.entries:
            record = journal.record(url)
            assert originals.get(url) == record, url
            group, _ = loads(record, url)
            assert isinstance(group, refgrid.VirtualGroup)
    assert read_entries(work / RECORDS)[1]  # what is left is clean


def test_sources_may_be_path_objects_and_anything_else_is_refused_by_name(tmp_path):
    """A ``Path`` (or a list of them, mixed with text) names sources as its text does; what
    is neither is an ArgumentError naming it (they were a bare TypeError and AttributeError)."""
    months = sorted((FIXTURES / "monthly" / "chunk10").glob("tas_20010[12].nc"))
    as_text = refgrid.batch([str(p) for p in months], tmp_path / "text.json",
                            scheduler="synchronous", progress=False)
    as_paths = refgrid.batch([months[0], str(months[1])], tmp_path / "paths.json",
                             scheduler="synchronous", progress=False)
    one = refgrid.batch(months[0], tmp_path / "one.json", scheduler="synchronous",
                        progress=False)
    assert as_text.scanned == as_paths.scanned == 2 and one.scanned == 1
    assert (tmp_path / "text.json").read_bytes() == (tmp_path / "paths.json").read_bytes()
    for bad, says in ((3, "not 3"), ([months[0], 3], "a source is a path, URL or glob "
                                                     "pattern, not 3")):
        with pytest.raises(refgrid.ArgumentError, match=says):
            refgrid.batch(bad, tmp_path / "bad.json", scheduler="synchronous",
                          progress=False)

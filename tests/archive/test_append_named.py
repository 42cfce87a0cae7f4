"""A batch told which files are new (``append=True``, ``refgrid batch --append``): it lists
and checks only those, scans them and the archive's first and last files, and appends — the
output equal, byte for byte, to a batch over every file. What only a whole batch can do is
refused with the output left as it was."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

import refgrid
from archive_files import write_archive
from helpers import closed
from refgrid.archive.journal import INDEX, RECORDS, Journal, _read_index


def tree_bytes(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def batch(sources, out, **kwargs):
    return refgrid.batch(sources, out, progress=False, scheduler="synchronous", **kwargs)


def as_a_whole_batch_writes(out, files, tmp_path):
    """Check that ``out`` holds what a batch over ``files`` writes, byte for byte, and reads
    as xarray reads the files; returns that batch's output."""
    fresh = tmp_path / "fresh.parq"
    batch([str(f) for f in files], fresh)
    assert tree_bytes(out) == tree_bytes(fresh)
    with xr.open_dataset(out, engine="refgrid") as ds:
        xr.testing.assert_identical(ds.load(), closed(xr.open_mfdataset(files,
                                                                        combine="by_coords")))
    return fresh


@pytest.fixture
def grown(tmp_path, monkeypatch):
    """An archive of 24 files (sources in record files of 2: 12 pages, read a page at a
    time) and 3 files landed after it."""
    monkeypatch.setitem(refgrid.writers.save.__kwdefaults__, "record_size", 2)
    files = write_archive(tmp_path / "files", range(27))
    out = tmp_path / "tas.parq"
    batch([str(f) for f in files[:24]], out)
    return files, out


def test_the_named_files_are_appended_as_a_whole_batch_would(grown, tmp_path):
    files, out = grown
    one = batch(str(files[24]), out, append=True)
    assert one.update.startswith("append: 1 file(s) named as new"), one.update
    assert (one.files, one.scanned, one.reused) == (1, 1, 0)
    two = batch([str(f) for f in files[25:]], out, append=True)
    assert two.update.startswith("append: 2 file(s)"), two.update
    fresh = as_a_whole_batch_writes(out, files, tmp_path)
    # the work directory's index still describes its records: a whole batch reads no record
    work = out.with_name(out.name + ".parts")
    assert _read_index(work / INDEX, work / RECORDS) is not None
    again = batch([str(f) for f in files], out)
    assert (again.scanned, again.reused) == (0, 27) and again.update.startswith("unchanged")
    assert tree_bytes(out) == tree_bytes(fresh)


def test_files_already_in_the_archive_are_left_as_they_are(grown):
    files, out = grown
    before = tree_bytes(out)
    result = batch([str(files[3]), str(files[23])], out, append=True)
    assert result.update == "unchanged: every file named is in the archive"
    assert tree_bytes(out) == before


@pytest.mark.parametrize("case", ["no output", "backfill", "changed", "first changed",
                                  "other settings"])
def test_what_only_a_whole_batch_can_do_is_refused_and_the_output_kept(grown, tmp_path,
                                                                        case):
    files, out = grown
    before = tree_bytes(out)
    named, target, kwargs = [str(files[24])], out, {}
    if case == "no output":
        target = tmp_path / "none.parq"
        match = "work directory .* is absent"
    elif case == "backfill":
        (files[10]).rename(tmp_path / "gone.nc")  # the archive misses a file, named back
        named = [str(tmp_path / "elsewhere.nc")]
        (tmp_path / "gone.nc").rename(tmp_path / "elsewhere.nc")
        match = r"elsewhere\.nc lies inside the archive's range \(backfill\)"
    elif case == "changed":
        named = [str(files[5])]
        os.utime(files[5], (1, 1))
        match = r"tas_00005\.nc is in the archive .* and changed since it was written"
    elif case == "first changed":
        os.utime(files[0], (1, 1))
        match = r"the archive's file .*tas_00000\.nc changed since it was written"
    else:
        kwargs = {"overlap": "allow"}
        match = r"written with other settings \(overlap 'error' then, 'allow' now\)"
    with pytest.raises(refgrid.BatchError, match=match) as raised:
        batch(named, target, append=True, **kwargs)
    assert "without append" in str(raised.value)
    assert tree_bytes(out) == before
    assert not target.exists() or target == out


def test_the_command_line_appends_and_says_how(grown):
    files, out = grown
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "refgrid.cli", "batch", str(files[24]), "-o",
                           str(out), "--append", "--scheduler", "synchronous", "-q"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "append: 1 file(s) named as new" in done.stdout
    refused = subprocess.run([sys.executable, "-m", "refgrid.cli", "batch", str(files[3]),
                              "-o", str(out.with_name("none.parq")), "--append", "-q"],
                             capture_output=True, text=True, env=env, timeout=300)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "without append" in refused.stderr


def header(url: str, k: int) -> dict:
    return {"url": url, "identity": {"size": k, "mtime": float(k)},
            "first": [float(k), "days since 2000-01-01", "standard"]}


URLS = ['/data/a "quoted", [{"url":x}].nc', "/data/ünï.nc", "s3://b/c.nc?v=1&w=2",
        '/data/back\\slash.nc']
"""URLs whose JSON holds escapes, and the very bytes a row begins with."""


def test_a_lazy_journal_finds_entries_in_the_index_alone(tmp_path):
    work = tmp_path / "w"
    with Journal(work) as journal:
        for k, url in enumerate(URLS):
            journal.append(header(url, k), f"record {k}".encode())
    with Journal(work) as journal:  # a second frame, superseding one entry
        journal.append(header(URLS[1], 9), b"record 9")
    with Journal(work, lazy=True) as lazy:
        assert [lazy.record(u) for u in URLS] == [b"record 0", b"record 9", b"record 2",
                                                  b"record 3"]
        assert lazy.header(URLS[1])["identity"]["size"] == 9
        assert lazy._entries is None  # (nothing indexed whole)
        lazy.append(header("/data/new.nc", 5), b"record 5")
        assert lazy.record("/data/new.nc") == b"record 5"
    with Journal(work) as journal:  # (the lazy journal's records: one more frame)
        assert journal._frames == 3 and journal.record("/data/new.nc") == b"record 5"
        assert set(journal.entries) == {*URLS, "/data/new.nc"}
    with Journal(work, lazy=True) as lazy, pytest.raises(KeyError):
        lazy.header("/data/absent.nc")  # (not in the index: the records read whole)


@pytest.mark.parametrize("damage", ["records changed", "index torn", "index absent"])
def test_a_lazy_journal_whose_index_does_not_describe_its_records_reads_them(tmp_path,
                                                                              damage):
    work = tmp_path / "w"
    with Journal(work) as journal:
        for k, url in enumerate(URLS):
            journal.append(header(url, k), f"record {k}".encode())
    if damage == "records changed":  # a killed batch's record, not indexed
        index = (work / INDEX).read_bytes()
        with Journal(work) as journal:
            journal.append(header("/data/late.nc", 7), b"record 7")
        (work / INDEX).write_bytes(index)  # (its frame never written)
    elif damage == "index torn":
        (work / INDEX).write_bytes((work / INDEX).read_bytes()[:-3])
    else:
        (work / INDEX).unlink()
    with Journal(work, lazy=True) as lazy:
        assert lazy.record(URLS[2]) == b"record 2"
        assert lazy._entries is not None  # (the index could not be trusted: read whole)
        lazy.append(header("/data/new.nc", 5), b"record 5")
    with Journal(work) as journal:
        assert journal.record("/data/new.nc") == b"record 5"
        assert journal.record(URLS[0]) == b"record 0"
        if damage == "records changed":
            assert journal.record("/data/late.nc") == b"record 7"


def test_a_damaged_record_file_is_refused_before_anything_is_written(grown):
    """Everything the append reads is read and checked before its first write: a damaged
    record file of the last array it extends leaves the earlier ones as they were."""
    import math

    from archive_files import CHUNK, lengths

    files, out = grown
    row = sum(math.ceil(n / CHUNK) for n in lengths(range(23)))  # the last file's first chunk
    assert row % 2  # (inside a record file of 2: the append reads its first row)
    record = out / "tas" / f"refs.{row // 2}.parq"
    data = bytearray(record.read_bytes())
    data[len(data) // 2] ^= 0xFF
    record.write_bytes(bytes(data))
    before = tree_bytes(out)
    with pytest.raises(refgrid.BatchError, match=r"does not match its digest.*without append"):
        batch(str(files[24]), out, append=True)
    assert tree_bytes(out) == before


def test_a_last_file_recorded_otherwise_than_the_archive_says_is_refused(grown):
    """The work directory holds another scan of the archive's last file than the one the
    archive was made of (a shared work directory): its length and references could differ."""
    files, out = grown
    work = out.with_name(out.name + ".parts")
    with Journal(work) as journal:
        entry = journal.entries[str(files[23])]
        journal.append({**entry.header, "identity": {"size": 1, "mtime": 1.0}},
                       journal.record(str(files[23])))
    before = tree_bytes(out)
    with pytest.raises(refgrid.BatchError, match=r"tas_00023\.nc changed since it was "
                       r"written or recorded .*without append"):
        batch(str(files[24]), out, append=True)
    assert tree_bytes(out) == before


def test_a_lazy_journal_after_a_killed_batch_compacts_first_and_keeps_its_records(tmp_path):
    work = tmp_path / "w"
    with Journal(work) as journal:
        for k, url in enumerate(URLS):
            journal.append(header(url, k), f"record {k}".encode())
    with open(work / RECORDS, "ab") as f:
        f.write(b'{"url": "/torn.nc", "ident')  # a batch killed mid-record
    with Journal(work, lazy=True) as lazy:
        lazy.append(header("/data/new.nc", 5), b"record 5")
    with Journal(work) as journal:
        assert set(journal.entries) == {*URLS, "/data/new.nc"}
        assert journal.record("/data/new.nc") == b"record 5"
    assert b"/torn.nc" not in (work / RECORDS).read_bytes()


PIECE = 40
"""The concat coordinate's pieces in the tests below (4,096 steps by default)."""


def stat_of(path):
    return {str(p.relative_to(path)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("named", [True, False], ids=["named", "listed"])
def test_an_append_rewrites_the_last_piece_of_the_time_coordinate_only(grown, tmp_path,
                                                                       monkeypatch, named):
    """The concat coordinate in pieces (each a row of its record files, here 2 a file): an
    append keeps the pieces before the last one's record file, and the result is the whole
    batch's."""
    files, _ = grown
    monkeypatch.setattr("refgrid.model.virtual.INLINE_PIECE", PIECE)
    monkeypatch.setattr("refgrid.refs.parquet.PIECE_ROWS", 2)
    out = tmp_path / "pieces.parq"
    batch([str(f) for f in files[:24]], out)
    stored = refgrid.scan(out)["time"]
    assert stored.grid.chunk_counts[0] == -(-stored.shape[0] // PIECE) > 8
    assert stored.inline_pieces
    before = stat_of(out)
    batch([str(files[24])] if named else [str(f) for f in files[:25]], out, append=named)
    after = stat_of(out)
    rows = sorted(k for k in before if k.startswith("time/"))
    last = (stored.grid.chunk_counts[0] - 1) // 2  # the record file of the last piece
    assert [k for k in rows if before[k] == after[k]] == \
        [f"time/pieces.{n}.parq" for n in range(last)]
    batch([str(f) for f in files[25:]] if named else [str(f) for f in files], out,
          append=named)
    as_a_whole_batch_writes(out, files, tmp_path)


def test_an_archive_whose_coordinate_is_one_chunk_is_appended_to_in_pieces(grown, tmp_path,
                                                                          monkeypatch):
    """An archive written before coordinates were pieced — its coordinate one chunk (here:
    pieces longer than it) in a record file of ``record_size`` rows — is appended to as a
    whole batch writes it now: its coordinate written again in pieces, in record files of
    pieces, the earlier record file removed."""
    import json

    files, out = grown
    meta = json.loads((out / ".zmetadata").read_bytes())
    section = meta["refgrid"]
    assert section.pop("pieces") == {"time": 64}
    section["records"] = {k.replace("time/pieces.", "time/refs."): v
                          for k, v in section["records"].items()}
    (out / "time" / "pieces.0.parq").rename(out / "time" / "refs.0.parq")
    (out / ".zmetadata").write_text(json.dumps(meta))  # (as written before)
    old = files[:24]
    with xr.open_dataset(out, engine="refgrid") as ds:
        xr.testing.assert_identical(ds.load(), closed(xr.open_mfdataset(old,
                                                                        combine="by_coords")))
    monkeypatch.setattr("refgrid.model.virtual.INLINE_PIECE", PIECE)
    batch(str(files[24]), out, append=True)
    as_a_whole_batch_writes(out, files[:25], tmp_path)
    assert refgrid.scan(out)["time"].grid.chunk_counts[0] > 1
    assert not (out / "time" / "refs.0.parq").exists()


def write_bounded(directory, lengths: list[int]) -> list:
    """Files of ``lengths`` days each, one after another, with time bounds in the time's
    units."""
    import netCDF4

    directory.mkdir()
    out = []
    for k, steps in enumerate(lengths):
        path = directory / f"b_{k:03d}.nc"
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("time", None)
            ds.createDimension("nv", 2)
            time = ds.createVariable("time", "f8", ("time",))
            time.units, time.calendar, time.bounds = "days since 2000-01-01", "standard", \
                "time_bnds"
            bounds = ds.createVariable("time_bnds", "f8", ("time", "nv"))
            start = sum(lengths[:k])
            days = np.arange(start, start + steps, dtype="f8")
            time[:], bounds[:] = days + 0.5, np.stack([days, days + 1], axis=1)
            ds.createVariable("v", "f4", ("time",))[:] = days
        out.append(path)
    return out


def test_time_bounds_of_equal_files_are_appended_as_the_files_chunks(tmp_path):
    """Files of equal length: each one's time bounds (inlined by the batch, one chunk a
    file) make a regular grid of inline chunks — which is not an array stored in pieces:
    appended as the files' chunks, as a whole batch writes them."""
    files = write_bounded(tmp_path / "files", [10] * 5)
    out = tmp_path / "b.parq"
    batch([str(f) for f in files[:3]], out)
    bounds = refgrid.scan(out)["time_bnds"]
    assert bounds.grid.chunk_shape == (10, 2) and not bounds.inline_pieces
    for new in files[3:]:
        assert batch(str(new), out, append=True).update.startswith("append")
    as_a_whole_batch_writes(out, files, tmp_path)


def test_files_one_piece_long_after_a_shorter_one_are_not_taken_for_pieces(tmp_path,
                                                                           monkeypatch):
    """Files exactly one piece long (here 40 steps) each make one chunk of time bounds, as a
    piece would be — after a shorter file the archive's chunks are not pieces: appended as
    the files' chunks or refused, never read as pieces (which placed later bounds wrongly)."""
    monkeypatch.setattr("refgrid.model.virtual.INLINE_PIECE", PIECE)
    files = write_bounded(tmp_path / "files", [PIECE, PIECE, 10, PIECE, PIECE, PIECE])
    out = tmp_path / "b.parq"
    batch([str(f) for f in files[:2]], out)
    for n in range(3, len(files) + 1):
        try:
            batch(str(files[n - 1]), out, append=True)
        except refgrid.BatchError as e:
            assert "without append" in str(e)
            batch([str(f) for f in files[:n]], out)
        want = closed(xr.open_mfdataset(files[:n], combine="by_coords"))
        with xr.open_dataset(out, engine="refgrid") as ds:
            xr.testing.assert_identical(ds.load(), want)
            np.testing.assert_array_equal(ds["time_bnds"][-15:-5].values,
                                          want["time_bnds"][-15:-5].values)


def test_an_archive_of_one_file_grows_as_a_whole_batch_writes_it(tmp_path):
    """One file's time bounds are one inline chunk — stored as a piece would be (record
    files of pieces); once a second file follows they are the files' chunks, and move to
    record files of ``record_size`` rows, as a whole batch writes them."""
    files = write_bounded(tmp_path / "files", [10, 10, 12])
    out = tmp_path / "b.parq"
    batch(str(files[0]), out)
    assert (out / "time_bnds" / "pieces.0.parq").exists()
    for new in files[1:]:
        assert batch(str(new), out, append=True).update.startswith("append")
    assert not (out / "time_bnds" / "pieces.0.parq").exists()
    as_a_whole_batch_writes(out, files, tmp_path)


@pytest.mark.parametrize("report, why", [
    ({"settings": {"concat_dim": "time", "overlap": "error"}}, None),
    ({"settings": {"concat_dim": "time", "overlap": "error"}, "error": "killed"},
     "the earlier run failed"),
    ({"settings": {"concat_dim": "time"}},
     "other settings (overlap None then, 'error' now)"),
    ({"settings": {"concat_dim": "t", "overlap": "allow"}},
     "other settings (concat_dim 't' then, 'time' now; overlap 'allow' then, 'error' now)"),
    ({"settings": "time"}, "the earlier run's report records no settings"),
    ([1, 2], "the earlier run's report records no settings"),
])
def test_an_earlier_run_is_grown_only_under_its_own_settings_each_difference_named(report,
                                                                                   why):
    from refgrid.archive.extend import _unlike

    found = _unlike(report, {"concat_dim": "time", "overlap": "error"})
    assert found is None if why is None else (found is not None and found.endswith(why))

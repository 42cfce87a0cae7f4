"""A parquet archive of more record files than :data:`EAGER_RECORDS` opens without reading
its references: readers load the record files holding the chunks they read (a time series
of a 10^8-chunk archive reads a few). Here small record files (``record_size=2``) make a
year of monthly files span 21 of them; every read is compared with ``open_mfdataset``."""

from __future__ import annotations

import pickle
import shutil
import zlib
from dataclasses import replace

import numpy as np
import pytest
import xarray as xr
from numcodecs import Shuffle

import refgrid
from helpers import FIXTURES, RECTILINEAR, closed
from refgrid.model.manifest import INLINE, PagedManifest
from refgrid.model.virtual import VirtualGroup
from refgrid.read.array import read
from refgrid.read.view import contents
from refgrid.refs import parquet
from refgrid.refs.parquet import EAGER_RECORDS
from refgrid.refs.source_pages import StoredSources
from refgrid.scanners.allowed import check_sources

FILES = sorted((FIXTURES / "monthly" / "chunk10").glob("tas_2001*.nc"))


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    out = tmp_path_factory.mktemp("paged") / "year.parq"
    group = refgrid.combine([refgrid.scan(f) for f in FILES], "time")
    refgrid.write(group, out, format="parquet", record_size=2)
    assert len(list((out / "tas").glob("refs.*.parq"))) > EAGER_RECORDS
    return out


def loaded(manifest: PagedManifest) -> set[int]:
    return set(manifest._loaded)


LAST = {21}
"""The last record file of ``tas`` (43 chunks, 2 a record file), read as the archive opens:
the one an append rewrites."""


def test_opening_reads_the_last_record_file_and_a_selection_reads_its_own(archive):
    group = refgrid.scan(archive)
    tas = group["tas"].manifest
    assert isinstance(tas, PagedManifest) and loaded(tas) == LAST
    truth = closed(xr.open_mfdataset(FILES, combine="by_coords"))
    with xr.open_dataset(archive, engine="refgrid") as ds:
        xr.testing.assert_identical(ds.isel(time=slice(40, 52)).load(),
                                    truth.isel(time=slice(40, 52)))
        xr.testing.assert_identical(ds.load(), truth)
    store = refgrid.open_store(archive)
    paged = store.view.arrays["tas"].manifest
    assert isinstance(paged, PagedManifest) and loaded(paged) == LAST
    data = contents(store.view, [store.view.parse("tas/c/4/0/0")])[0]
    assert loaded(paged) == {2} | LAST  # chunk (4, 0, 0) is row 4: record file 2
    start = int(group["tas"].grid.bounds(0)[4])  # (February's first ten days)
    decoded = np.frombuffer(Shuffle(4).decode(zlib.decompress(data)), "<f4")
    np.testing.assert_array_equal(decoded.reshape(10, 6, 8),
                                  truth["tas"].values[start:start + 10])


def test_every_key_and_value_match_an_eager_archive(archive, tmp_path):
    eager = tmp_path / "eager.parq"
    refgrid.write(refgrid.combine([refgrid.scan(f) for f in FILES], "time"), eager,
                  format="parquet")
    paged, whole = refgrid.open_store(archive).view, refgrid.open_store(eager).view
    keys = sorted(paged.all_keys())
    assert keys == sorted(whole.all_keys()) and "tas/c/36/0/0" in keys
    assert contents(paged, [paged.parse(k) for k in keys]) == \
        contents(whole, [whole.parse(k) for k in keys])
    manifest = refgrid.scan(archive)["tas"].manifest
    assert manifest == refgrid.scan(eager)["tas"].manifest  # (every page loaded for this)


def test_a_paged_manifest_pickles_and_reads_the_same(archive):
    manifest = refgrid.scan(archive)["tas"].manifest
    manifest.locate([0, 30])
    copy = pickle.loads(pickle.dumps(manifest))
    assert isinstance(copy, PagedManifest) and loaded(copy) == LAST  # (pinned: travels)
    flats = [3, 41, 17, 4]
    a, b = manifest.locate(flats), copy.locate(flats)
    assert a.path_id.tolist() != b.path_id.tolist()  # (another load order: other numbers)
    for k, flat in enumerate(flats):
        if a.path_id[k] >= 0:
            assert manifest.table[a.path_id[k]] == copy.table[b.path_id[k]]
        else:
            assert a.path_id[k] == b.path_id[k] == INLINE
            assert manifest.inline_chunk(flat) == copy.inline_chunk(flat)
    assert a.offset.tolist() == b.offset.tolist() and a.length.tolist() == b.length.tolist()
    assert manifest == copy and manifest.paths == copy.paths  # (numbered by first use)


def test_a_damaged_record_file_is_an_error_when_its_chunks_are_read(archive, tmp_path):
    copy = tmp_path / "copy.parq"
    shutil.copytree(archive, copy)
    record = copy / "tas" / "refs.5.parq"
    data = bytearray(record.read_bytes())
    data[len(data) // 2] ^= 0xFF
    record.write_bytes(bytes(data))
    with xr.open_dataset(copy, engine="refgrid") as ds:
        ds["tas"][:20].load()  # record files 0-3: as they were
        with pytest.raises(refgrid.FormatError, match=r"tas/refs\.5\.parq does not match its "
                           "digest"):
            ds["tas"].load()
    (copy / "tas" / "refs.5.parq").unlink()
    with xr.open_dataset(copy, engine="refgrid") as ds, \
            pytest.raises(refgrid.FormatError, match=r"record file .*refs\.5\.parq is missing"):
        ds["tas"].load()


def test_the_allow_list_is_checked_as_each_record_file_loads(archive):
    """Checking every URL as the archive opens would read every record file: each page's
    URLs are checked as it loads, before any of its chunks is read."""
    allowed = refgrid.scan(archive, allowed_sources=[str(FIXTURES)])
    assert loaded(allowed["tas"].manifest) == LAST
    with pytest.raises(refgrid.AccessError, match="'lat'"):  # (read whole: checked now)
        refgrid.scan(archive, allowed_sources=["/elsewhere"])
    tas = refgrid.scan(archive)["tas"]
    with pytest.raises(refgrid.AccessError, match=r"tas_200112\.nc"):  # (its last page: loaded)
        check_sources(VirtualGroup(arrays={"tas": tas}), ["/elsewhere"], "here")
    tas = replace(tas, manifest=PagedManifest(tas.manifest.shape, tas.manifest.pages))
    elsewhere = check_sources(VirtualGroup(arrays={"tas": tas}), ["/elsewhere"], "here")
    assert not loaded(elsewhere["tas"].manifest)
    with pytest.raises(refgrid.AccessError, match=r"'tas'.*tas_20010\d\.nc.*outside the "
                       r"allowed sources \['/elsewhere'\]"):
        read(elsewhere["tas"], (slice(40, 41),))
    truth = closed(xr.open_mfdataset(FILES, combine="by_coords"))
    np.testing.assert_array_equal(read(allowed["tas"], (slice(40, 52),)),
                                  truth["tas"].values[40:52])


def test_pickling_a_paged_manifest_reads_neither_pages_nor_sources(archive, monkeypatch):
    monkeypatch.setattr(parquet, "EAGER_RECORDS", 4)  # (its 6 source record files: paged)
    group = refgrid.scan(archive)
    data = pickle.dumps(group["tas"].manifest)
    assert set(group.sources._pages) == {5} and len(data) < 10_000  # (the last: as opened)
    assert loaded(pickle.loads(data)) == LAST  # (pinned: what an append may rewrite)
    assert isinstance(group.sources, StoredSources) and len(group.sources) == len(FILES)


def test_a_paged_archive_may_hold_more_chunks_than_are_held_whole(tmp_path):
    """``max_chunks`` bounds what is allocated a chunk at a time: references read whole
    (JSON) beyond it are refused, a parquet archive read page by page is not — until
    something needs all its chunks at once."""
    import netCDF4

    with netCDF4.Dataset(tmp_path / "grid.nc", "w") as ds:
        ds.createDimension("y", 40)
        ds.createDimension("x", 40)
        v = ds.createVariable("v", "f4", ("y", "x"), chunksizes=(1, 1))
        v[:] = np.arange(1600, dtype="f4").reshape(40, 40)
    group = refgrid.scan(tmp_path / "grid.nc")
    refs = refgrid.write(group, tmp_path / "grid.json")
    paged = refgrid.write(group, tmp_path / "grid.parq", record_size=100)
    with refgrid.limits(max_chunks=1000):
        with pytest.raises(refgrid.FormatError, match=r"1600 chunks .* exceeds the limit"):
            refgrid.scan(refs)
        array = refgrid.scan(paged)["v"]
        assert read(array, (slice(30, 32), slice(5, 7))).tolist() == [[1205, 1206],
                                                                     [1245, 1246]]
        with xr.open_dataset(paged, engine="refgrid") as ds:
            assert ds["v"][39, 39].item() == 1599
        with pytest.raises(refgrid.GridError, match=r"1600 chunks .* exceeds the limit"):
            array.manifest.path_id  # noqa: B018 (every chunk at once)


def test_a_reader_of_one_version_reads_it_while_the_next_is_appended(tmp_path,
                                                                     monkeypatch):
    """An append rewrites the last record file of each manifest and of the sources: a
    reader that opened the version before reads them as the archive opens, so it keeps
    reading its version (not a digest error) while the next one lands."""
    import functools

    import refgrid.archive
    from archive_files import write_archive

    monkeypatch.setattr(refgrid.archive, "save",
                        functools.partial(refgrid.archive.save, record_size=2))
    files = write_archive(tmp_path / "landing", range(21))
    out = tmp_path / "tas.parq"
    refgrid.batch([str(f) for f in files[:20]], out, progress=False, scheduler="synchronous")
    # (10 source record files, 33 of tas)
    before = (out / "tas" / "refs.32.parq").read_bytes()
    truth = closed(xr.open_mfdataset(files[:20], combine="by_coords"))
    with xr.open_dataset(out, engine="refgrid") as ds:
        group = refgrid.scan(out)
        assert isinstance(group["tas"].manifest, PagedManifest)
        pickled = pickle.dumps(group["tas"].manifest)
        assert isinstance(group.sources, StoredSources) and len(group.sources.firsts) == 10
        result = refgrid.batch([str(f) for f in files], out, progress=False,
                               scheduler="synchronous")
        assert result.update.startswith("append"), result.update
        assert (out / "tas" / "refs.32.parq").read_bytes() != before  # (rewritten)
        xr.testing.assert_identical(ds.load(), truth)
    np.testing.assert_array_equal(read(group["tas"]), truth["tas"].values)
    copy = pickle.loads(pickled)  # (a dask worker's copy, made before the append)
    np.testing.assert_array_equal(read(replace(group["tas"], manifest=copy)),
                                  truth["tas"].values)


def test_a_reader_keeps_the_last_step_whose_record_files_an_append_rewrites(tmp_path,
                                                                           monkeypatch):
    """The last file's padded last chunks become interior when a file follows, and are
    rewritten: every record file holding the array's last step along time changes — here
    two, a step being 4 chunks in record files of 2. A reader of the version before keeps
    them all (and a pickled copy of its manifest too)."""
    import functools

    import netCDF4

    import refgrid.archive

    def landed(k: int, days: int, start: int):
        path = tmp_path / "files" / f"tile_{k:02d}.nc"
        path.parent.mkdir(exist_ok=True)
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("time", None)
            ds.createDimension("y", 4)
            ds.createDimension("x", 4)
            t = ds.createVariable("time", "f8", ("time",))
            t.units = "days since 2000-01-01"
            t[:] = np.arange(start, start + days)
            v = ds.createVariable("v", "f4", ("time", "y", "x"), chunksizes=(5, 2, 2),
                                  zlib=True)
            v[:] = np.random.default_rng(k).random((days, 4, 4), dtype="f4")
        return path

    monkeypatch.setattr(refgrid.archive, "save",
                        functools.partial(refgrid.archive.save, record_size=2))
    monkeypatch.setattr(parquet, "EAGER_RECORDS", 1)  # (its 2 source record files: paged)
    days = [12, 9, 11, 13, 7]
    files = [landed(k, n, sum(days[:k])) for k, n in enumerate(days)]
    out = tmp_path / "v.parq"
    refgrid.batch([str(f) for f in files[:4]], out, progress=False, scheduler="synchronous")
    truth = closed(xr.open_mfdataset(files[:4], combine="by_coords"))
    group = refgrid.scan(out)
    manifest = group["v"].manifest
    assert isinstance(manifest, PagedManifest) and loaded(manifest) == {20, 21}
    assert set(group.sources._pages) == {1}  # (from where the last file sorts: all after)
    pickled = pickle.dumps(manifest)
    before = {n: (out / "v" / f"refs.{n}.parq").read_bytes() for n in (19, 20, 21)}
    refgrid.batch([str(f) for f in files], out, progress=False, scheduler="synchronous")
    changed = {n for n, data in before.items()
               if (out / "v" / f"refs.{n}.parq").read_bytes() != data}
    assert changed == {20, 21}  # (the last step's; the one before kept its bytes)
    np.testing.assert_array_equal(read(group["v"]), truth["v"].values)
    copy = pickle.loads(pickled)
    np.testing.assert_array_equal(read(replace(group["v"], manifest=copy)), truth["v"].values)
    assert dict(group.sources) == {str(f): refgrid.scan(f).sources[str(f)] for f in files[:4]}
    if RECTILINEAR:  # its padded chunks kept (served cropped), beyond max_chunks as a whole
        import zarr

        encoded = refgrid.write(refgrid.combine([refgrid.scan(f) for f in files], "time"),
                                tmp_path / "encoded.parq", padded="encoded", record_size=2)
        with refgrid.limits(max_chunks=40), zarr.config.set({"array.rectilinear_chunks": True}):
            store = refgrid.open_store(encoded)
            assert isinstance(store.view.arrays["v"].manifest, PagedManifest)
            np.testing.assert_array_equal(
                zarr.open_group(store, mode="r")["v"][...],
                closed(xr.open_mfdataset(files, combine="by_coords"))["v"].values)

"""``refgrid.open_store``: a zarr Store over refgrid's inputs, read by stock zarr and xarray —
every fixture file and every combined archive equal to what netCDF4/h5py/xarray read from the
sources, native grids on zarr >= 3.2 (flag on), the regular view on any zarr; chunk fetches
coalesced; errors named, never a fill value; pickled to dask workers."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest
import xarray as xr
import zarr

import refgrid
from ground_truth import assert_like_source, ground_truth, restore, same
from helpers import FIXTURES, QUIET_CLUSTER, RECTILINEAR, closed, data_files, zarr_at_least
from tests.combining.test_combine import ARCHIVES, _files

FILES = data_files(FIXTURES)
RAW = {"mask_and_scale": False, "decode_times": False}

PIPELINE = zarr_at_least("3.4")


@pytest.fixture(autouse=True, params=["zarr's pipeline", "refgrid's pipeline"])
def config(request):
    """Every test twice: zarr's own codec pipeline (with the rectilinear flag where zarr has
    it), and everything refgrid.zarr_config() recommends (its pipeline on zarr >= 3.4)."""
    if request.param == "refgrid's pipeline" and not PIPELINE:
        pytest.skip(f"refgrid's codec pipeline is for zarr >= 3.4 (here {zarr.__version__})")
    settings = refgrid.zarr_config() if request.param == "refgrid's pipeline" else (
        {"array.rectilinear_chunks": True} if RECTILINEAR else {})
    with zarr.config.set(settings):
        yield request.param


def _archive(archive: str, tmp_path, padded: str = "encoded"):
    group = refgrid.combine(_files(archive), "time")
    return refgrid.write(group, tmp_path / "refs.json", padded=padded)


def _expected(archive: str, **kwargs) -> xr.Dataset:
    return closed(xr.open_mfdataset(_files(archive), combine="nested", concat_dim="time",
                             data_vars="minimal", compat="equals", **kwargs))


# -- every fixture file, every archive -----------------------------------------------------

@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(FIXTURES)) for p in FILES])
def test_every_fixture_file_through_zarr_equals_the_c_libraries(path):
    """A file scanned on the fly: each array zarr reads (raw) equals netCDF4/h5py's read;
    on zarr 3.1, through the regular view."""
    store = refgrid.open_store(path, **({} if RECTILINEAR else {"chunks": "native"}))
    if not RECTILINEAR and any(not a.grid.is_regular for _, a in _arrays(store)):
        store = refgrid.open_store(path, chunks="auto")
    group = zarr.open_group(store, mode="r")
    truth = ground_truth(path)
    compared = 0
    for name, array in _arrays(store):
        expected = truth.get(name)
        if expected is None or isinstance(expected, Exception):
            continue
        ours = restore(np.asarray(group[name][...]), dict(array.attrs))
        assert same(ours, expected), name
        compared += 1
    assert compared or not truth


def _arrays(store):
    from refgrid.model.virtual import VirtualArray

    served = getattr(store.view, "served", None)  # the regular view: the arrays it serves
    if served is not None:
        return [(p, v.array) for p, v in served.items()]
    return [(p, a) for p, a in store.view.arrays.items() if isinstance(a, VirtualArray)]


@pytest.mark.parametrize("archive", ARCHIVES)
def test_every_archive_through_xarray_equals_open_mfdataset(archive, tmp_path):
    refs = _archive(archive, tmp_path)
    expected = _expected(archive, **RAW)
    if RECTILINEAR:
        store = refgrid.open_store(refs)
        ours = xr.open_zarr(store, chunks={}, **RAW)
        native = refgrid.scan(refs)["tas"].grid.lengths(0).tolist()
        assert list(ours["tas"].chunks[0]) == native  # dask chunks: the native ones
    else:
        ours = xr.open_zarr(refgrid.open_store(refs, chunks="auto"), **RAW)
    if ARCHIVES[archive][2]:  # the same encoding in every file: raw values compare
        for key, want in expected.variables.items():
            assert ours[key].dtype == want.dtype, key
            np.testing.assert_array_equal(ours[key].values, want.values, err_msg=key)
    np.testing.assert_array_equal(ours["tas"].values, expected["tas"].values)


@pytest.mark.parametrize("archive", ["monthly/chunk10", "yearly/chunk73"])
def test_the_regular_view_through_the_store_reads_decoded_like_the_sources(archive,
                                                                            tmp_path):
    refs = _archive(archive, tmp_path)
    for chunks in ("auto", {"time": 30}):
        store = refgrid.open_store(refs, chunks=chunks, unpack=True)
        assert_like_source(xr.open_zarr(store), _expected(archive))


def test_groups_are_read_as_a_tree(tmp_path):
    files = sorted((FIXTURES / "groups").glob("*.nc"))
    refs = refgrid.write(refgrid.combine(files, "time"), tmp_path / "groups.json")
    store = refgrid.open_store(refs) if RECTILINEAR else refgrid.open_store(refs,
                                                                             chunks="auto")
    tree = xr.open_datatree(store, engine="zarr", **RAW)
    expected = closed(xr.open_datatree(files[0], engine="netcdf4", **RAW))
    assert sorted(tree.groups) == sorted(expected.groups)
    for path in expected.groups:
        for name in expected[path].dataset.data_vars:
            want = np.concatenate([closed(xr.open_datatree(f, engine="netcdf4", **RAW))[path]
                                   .dataset[name].values for f in files]) \
                if "time" in expected[path].dataset[name].dims else \
                expected[path].dataset[name].values
            np.testing.assert_array_equal(tree[path].dataset[name].values, want)


def test_inputs_of_every_kind(tmp_path):
    """References as JSON, parquet or a dict, a Zarr v3 store, a file: the same arrays."""
    source = FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"
    group = refgrid.scan(source)
    inputs = [source, refgrid.write(group, tmp_path / "r.json"),
              refgrid.write(group, tmp_path / "r.parq"), refgrid.to_kerchunk(group)]
    closed(xr.open_dataset(source)).to_zarr(tmp_path / "s.zarr", zarr_format=3, consolidated=False)
    inputs.append(tmp_path / "s.zarr")
    with xr.open_dataset(source) as truth:
        for given in inputs:
            ours = xr.open_zarr(refgrid.open_store(given))
            np.testing.assert_array_equal(ours.tas.values, truth.tas.values, err_msg=str(given))


# -- coalesced, named, pickled ------------------------------------------------------------

def test_remote_chunks_of_a_selection_are_fetched_together(config, http_server, tmp_path):
    """Over HTTP the chunks of a selection are fetched together, their ranges coalesced per
    file: with refgrid's pipeline in one round — at most 2 requests per run of neighbouring
    chunks and 1 per file (its identity); with zarr's, as its concurrent gets arrive (zarr
    holds ten at a time), far fewer requests than chunks all the same."""
    if not RECTILINEAR:
        pytest.skip("the native view of an irregular archive needs zarr >= 3.2; the regular "
                    "view assembles chunks in refgrid (tests/read/test_mapper.py)")
    urls = [f"{http_server.url}/fixtures/yearly/chunk73/{p.name}"
            for p in _files("yearly/chunk73")]
    refs = refgrid.write(refgrid.combine(urls, "time"), tmp_path / "refs.json")
    store = refgrid.open_store(refs)
    tas = zarr.open_group(store, mode="r")["tas"]
    http_server.counter.reset()
    series = tas[:, 1, 2]
    chunks = refgrid.scan(refs)["tas"].grid.chunk_counts[0]
    requests = len(http_server.counter)
    bound = 2 * len(urls) + len(urls) if config == "refgrid's pipeline" else \
        3 * chunks // 4  # (zarr's gets batch as they arrive: fewer under load, not none)
    assert requests <= bound < chunks, (requests, chunks)
    np.testing.assert_array_equal(series, _expected("yearly/chunk73", **RAW)["tas"]
                                  .values[:, 1, 2])


def test_read_errors_are_named_never_a_fill_value(tmp_path):
    folder = tmp_path / "sources"
    shutil.copytree(FIXTURES / "monthly" / "chunkfile", folder)
    files = sorted(folder.glob("*.nc"))[:3]
    refs = refgrid.write(refgrid.combine(files, "time"), tmp_path / "refs.json")
    chunks = "native" if RECTILINEAR else {"time": 31}  # (auto: the small array is one chunk)
    store = refgrid.open_store(refs, chunks=chunks)
    tas = zarr.open_group(store, mode="r")["tas"]
    later = files[1].stat().st_mtime + 5
    os.utime(files[1], (later, later))
    with pytest.raises(refgrid.ReadError, match=r"array 'tas', chunk tas/c/1/0/0 \(.*\): .*"
                                                 r"tas_200102\.nc: the source changed"):
        tas[...]
    store = refgrid.open_store(refs, chunks=chunks)
    files[2].unlink()
    with pytest.raises(refgrid.ReadError) as caught:
        zarr.open_group(store, mode="r")["tas"][65:70]
    said = str(caught.value)
    assert "array 'tas'" in said and "tas/c/2/0/0" in said and "tas_200103.nc" in said, said


def test_the_store_pickles_and_reads_on_a_local_cluster(tmp_path, monkeypatch):
    distributed = pytest.importorskip("distributed")
    if RECTILINEAR:  # the workers need the flag too: they read zarr's config anew
        monkeypatch.setenv("ZARR_ARRAY__RECTILINEAR_CHUNKS", "True")
    refs = _archive("monthly/chunk10", tmp_path)
    store = refgrid.open_store(refs, chunks="native" if RECTILINEAR else "auto")
    assert pickle.loads(pickle.dumps(store)) == store
    expected = _expected("monthly/chunk10", **RAW)["tas"].values
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", **QUIET_CLUSTER) as cluster, \
            distributed.Client(cluster):
        ds = xr.open_zarr(store, chunks={}, **RAW)
        np.testing.assert_allclose(ds["tas"].mean("time").compute().values,
                                   expected.mean(axis=0), rtol=1e-6)  # summed in chunks
        np.testing.assert_array_equal(ds["tas"].values, expected)


@pytest.mark.parametrize("chunks, match", [
    ({"time": 10**12}, "would be 8,000,000,000,000 bytes, more than the limit"),
    ({"time": "abc"}, "lengths are integers >= 1"), ({"time": None}, "lengths are integers"),
    ({"time": 0}, "lengths are integers"), ({"time": 2.7}, "lengths are integers"),
    ({"time": True}, "lengths are integers"), ({"tiem": 10}, "no dimension 'tiem'")])
def test_view_chunks_that_cannot_be_served_are_refused_when_the_store_is_opened(chunks, match):
    """A chunk larger than the limits allowed was allocated at the first read (MemoryError)."""
    with pytest.raises(refgrid.ArgumentError, match=match):
        refgrid.open_store(FIXTURES / "yearly" / "chunk73" / "tas_2000.nc", chunks=chunks)


def test_the_size_under_a_node_adds_its_documents_and_chunks():
    from zarr.core.sync import sync

    store = refgrid.open_store(FIXTURES / "yearly" / "chunk73" / "tas_2000.nc",
                               chunks={"time": 100})
    keys = [k for k in store.view.all_keys() if k.startswith("tas/")]
    assert sync(store.getsize_prefix("tas")) == sum(sync(store.getsize(k)) for k in keys)
    assert len(keys) > 2


def test_a_bad_input_is_an_error_when_the_store_is_opened(tmp_path):
    with pytest.raises(refgrid.ScanError, match=r"none\.nc: No such file or directory"):
        refgrid.open_store(tmp_path / "none.nc")
    with pytest.raises(refgrid.ArgumentError, match="chunks must be"):
        refgrid.open_store(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc", chunks=[3])
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    store = refgrid.open_store(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc")
    assert store.read_only and not store.supports_writes
    with pytest.raises(refgrid.ArgumentError, match="read-only"):
        sync(store.set("x/zarr.json", default_buffer_prototype().buffer.from_bytes(b"{}")))


def test_refgrid_s_pipeline_reads_refgrid_stores_and_leaves_others_to_zarr(config, tmp_path,
                                                                           monkeypatch):
    if config != "refgrid's pipeline":
        pytest.skip("about refgrid's pipeline")
    from refgrid.read import pipeline

    parts = []
    real = pipeline._decode_part
    monkeypatch.setattr(pipeline, "_decode_part", lambda *a: parts.append(len(a[2])) or real(*a))
    refs = _archive("monthly/chunk10", tmp_path)
    tas = zarr.open_group(refgrid.open_store(refs), mode="r")["tas"]
    assert type(tas._async_array.codec_pipeline).__name__ == "RefgridCodecPipeline"
    values = tas[...]
    assert sum(parts) == refgrid.scan(refs)["tas"].grid.nchunks  # every chunk, by refgrid
    np.testing.assert_array_equal(values, _expected("monthly/chunk10", **RAW)["tas"].values)
    parts.clear()
    plain = zarr.create_array(str(tmp_path / "plain.zarr"), shape=(10, 4), chunks=(3, 4),
                              dtype="f4")
    plain[...] = np.arange(40, dtype="f4").reshape(10, 4)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "plain.zarr"))[...],
                                  np.arange(40, dtype="f4").reshape(10, 4))
    assert parts == []  # not a refgrid store: zarr's own pipeline, writes included


def test_an_undecodable_chunk_is_a_named_error(config, tmp_path):
    """A damaged chunk is an error, never a fill value; with refgrid's pipeline a ReadError
    naming array, chunk and source (zarr's own pipeline decodes it, and says what zlib
    says)."""
    folder = tmp_path / "sources"
    shutil.copytree(FIXTURES / "monthly" / "chunk10", folder)
    files = sorted(folder.glob("*.nc"))[:2]
    group = refgrid.combine(files, "time")
    refs = refgrid.write(group, tmp_path / "refs.json", padded="encoded")
    manifest = group["tas"].manifest
    offset = int(manifest.offset[1, 0, 0])
    stat = files[0].stat()
    with open(files[0], "r+b") as f:  # the second chunk's bytes, same length: not zlib
        f.seek(offset)
        f.write(bytes(int(manifest.length[1, 0, 0])))
    os.utime(files[0], ns=(stat.st_atime_ns, stat.st_mtime_ns))  # its identity unchanged
    store = refgrid.open_store(refs, chunks="native" if RECTILINEAR else "auto")
    tas = zarr.open_group(store, mode="r")["tas"]
    with pytest.raises(Exception) as caught:
        tas[10:20]
    said = str(caught.value)
    if config == "refgrid's pipeline" or not RECTILINEAR:  # (the regular view: refgrid's)
        assert isinstance(caught.value, refgrid.ReadError)
        assert "tas/c/1/0/0" in said and "tas_200101.nc" in said, said
    else:
        assert "decompress" in said, said


# -- local sources: kept open between zarr's gets -------------------------------------------

def test_local_sources_stay_open_between_reads_and_close_with_the_store(config, tmp_path):
    """zarr asks for one chunk at a time: each local source is opened once and read with
    ``pread`` until the store is closed; a closed store opens its files per read."""
    if not RECTILINEAR:
        pytest.skip("the native view of an irregular archive needs zarr >= 3.2")
    refs = _archive("monthly/chunk10", tmp_path, padded="rewrite")
    expected = _expected("monthly/chunk10", **RAW)["tas"].values
    store = refgrid.open_store(refs)
    np.testing.assert_array_equal(zarr.open_group(store, mode="r")["tas"][...], expected)
    kept = dict(store.view.files._fds)
    if config == "zarr's pipeline":  # (refgrid's pipeline reads a selection in one fetch)
        assert sorted(kept) == sorted(refgrid.scan(refs).sources), kept
    store.close()
    assert store.view.files._fds == {}
    for fd in kept.values():
        with pytest.raises(OSError):
            os.fstat(fd)
    reopened = zarr.open_group(store, mode="r")["tas"]
    np.testing.assert_array_equal(reopened[40:80], expected[40:80])
    assert store.view.files._fds == {}


def test_more_sources_than_are_kept_open_read_the_same(tmp_path):
    from refgrid.read.fetch import OpenFiles

    if not RECTILINEAR:
        pytest.skip("the native view of an irregular archive needs zarr >= 3.2")
    refs = _archive("monthly/chunk10", tmp_path, padded="rewrite")
    store = refgrid.open_store(refs)
    store.view.files = OpenFiles(keep=2)
    np.testing.assert_array_equal(zarr.open_group(store, mode="r")["tas"][...],
                                  _expected("monthly/chunk10", **RAW)["tas"].values)
    assert len(store.view.files._fds) <= 2


def test_closing_while_a_read_is_under_way_waits_for_it(tmp_path, monkeypatch):
    """close() during a pread leaves the descriptor open until the read ends: the read
    never meets it closed, nor reused by the next file opened."""
    import threading

    from refgrid.read import fetch

    path = tmp_path / "a.bin"
    path.write_bytes(b"abcdef")
    files = fetch.OpenFiles()
    assert files.pread(str(path), 0, 2) == b"ab"  # kept open
    fd = files._fds[str(path)]
    inside, release = threading.Event(), threading.Event()
    real = os.pread

    def slow(fd_, length, offset):
        inside.set()
        release.wait(10)
        return real(fd_, length, offset)

    monkeypatch.setattr(fetch.os, "pread", slow)
    got = []
    reader = threading.Thread(target=lambda: got.append(files.pread(str(path), 2, 2)))
    reader.start()
    assert inside.wait(10)
    files.close()
    os.fstat(fd)  # still open: the read holds it
    release.set()
    reader.join(10)
    assert got == [b"cd"]
    with pytest.raises(OSError):
        os.fstat(fd)
    monkeypatch.setattr(fetch.os, "pread", real)
    assert files.pread(str(path), 4, 2) == b"ef" and not files._fds  # opened per read now


def test_a_read_that_starts_as_close_closes_the_files_uses_its_own_descriptor(tmp_path):
    """A read arriving between close() deciding to close the kept files and closing them
    must not take a kept descriptor: closed under it and reused for the next file opened, it
    would read that file's bytes (a torn chunk seen once in 19,580 reads of a followed
    archive, whose catalog closes a version's files as the next is published)."""
    import threading

    from refgrid.read import fetch

    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"abcdef")
    b.write_bytes(b"ghijkl")
    files = fetch.OpenFiles()
    assert files.pread(str(a), 0, 2) == b"ab"  # kept open
    kept = files._fds[str(a)]
    real = files._finalizer
    got: list[bytes | None] = []

    def interleaved() -> None:  # close() has decided; another thread reads before it acts
        files._finalizer = real  # type: ignore[assignment]  # (once)
        inside, release = threading.Event(), threading.Event()
        real_pread = os.pread

        def paused(fd: int, length: int, offset: int) -> bytes:
            inside.set()
            release.wait(10)
            return real_pread(fd, length, offset)

        fetch.os.pread = paused  # type: ignore[assignment]  # (this thread's read only)
        try:
            reader = threading.Thread(target=lambda: got.append(files.pread(str(a), 2, 2)))
            reader.start()
            assert inside.wait(10)
            fetch.os.pread = real_pread  # type: ignore[assignment]
            real()  # the kept descriptor closed ...
            reused = os.open(b, os.O_RDONLY)  # ... and its number taken by the next file
            release.set()
            reader.join(10)
            os.close(reused)
        finally:
            fetch.os.pread = real_pread  # type: ignore[assignment]
        assert kept == reused  # (the scenario: a number reused at once, as POSIX does)

    files._finalizer = interleaved  # type: ignore[assignment]
    files.close()
    assert got == [b"cd"]


def test_the_files_kept_open_are_bounded_in_the_process(config, tmp_path, monkeypatch):
    """However many stores are open, the process keeps at most KEEP_OPEN files open; a
    store closed (or collected) gives its share back. (refgrid's pipeline reads a selection
    in one fetch, which keeps no file open.)"""
    import gc

    from refgrid.read import fetch

    monkeypatch.setattr(fetch, "KEEP_OPEN", fetch._Kept.count + 2)
    sources = sorted((FIXTURES / "monthly" / "chunk10").glob("*.nc"))[:4]
    stores = [refgrid.open_store(path) for path in sources]
    for store, path in zip(stores, sources, strict=True):
        with xr.open_dataset(path, **RAW) as truth:
            np.testing.assert_array_equal(
                zarr.open_group(store, mode="r")["tas"][...], truth["tas"].values)
    kept = int(config == "zarr's pipeline")
    assert [len(s.view.files._fds) for s in stores] == [kept, kept, 0, 0]
    stores[0].close()
    del stores[1]
    gc.collect()
    zarr.open_group(stores[-1], mode="r")["tas"][...]
    zarr.open_group(stores[-2], mode="r")["tas"][...]
    assert [len(s.view.files._fds) for s in stores] == [0, kept, kept]


def test_a_short_read_of_a_kept_file_is_a_named_error(tmp_path):
    """A source cut short after the scan, its identity unchecked: the read that comes back
    short is an error naming array, chunk, file and bytes, never a fill value or a chunk
    of other bytes."""
    folder = tmp_path / "sources"
    shutil.copytree(FIXTURES / "monthly" / "chunk10", folder)
    files = sorted(folder.glob("*.nc"))[:2]
    group = refgrid.combine(files, "time")
    refs = refgrid.write(group, tmp_path / "refs.json")
    store = refgrid.open_store(refs, verify_sources=False,
                               chunks="native" if RECTILINEAR else "auto")
    tas = zarr.open_group(store, mode="r")["tas"]
    first = closed(xr.open_dataset(files[0], **RAW))["tas"].values
    np.testing.assert_array_equal(tas[:3], first[:3])
    manifest = group["tas"].manifest
    with open(files[1], "r+b") as f:
        f.truncate(int(manifest.offset[4, 0, 0]) + 1)
    with pytest.raises(refgrid.ReadError, match=r"tas_200102\.nc bytes \d+-\d+\): short read"):
        tas[...]
    copy = pickle.loads(pickle.dumps(store))
    assert copy == store and copy.verify_sources is False

"""Sources rewritten, replaced or removed under a reader: never bytes of a version other
than the one the references describe.

Each read of a local source asks the descriptor it read through (``fstat``) whether it still
holds the recorded version and is the file first seen, so a rewrite while a store keeps the
file open, a file renamed over the source, or a change in the middle of a DAP response fails
the read (a :class:`refgrid.ReadError`, a 502, a DAP response cut short or ended with an error
chunk) instead of mixing versions; a followed archive's sources are checked again like any
other dataset's; a file still being written while it is scanned is refused."""

from __future__ import annotations

import http.client
import json
import os
import struct
import time
import urllib.request
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pytest
import xarray as xr
import zarr

import refgrid
from archive_files import write_archive
from servers import http_get, start_refgrid_serve

pytest.importorskip("aiohttp")

from refgrid.scanners.source import Source
from refgrid.serve.follow import Follow

N = 4096


def _write(path: Path, values: np.ndarray, chunk: int = 512) -> Path:
    """One chunked float32 variable ``v``: files of equal length share their layout, so a
    rewrite with other values keeps the file's size and every chunk's place."""
    with h5py.File(path, "w", libver="latest") as f:
        f.create_dataset("v", data=values.astype("f4"), chunks=(chunk,))
    return path


def _versions(directory: Path, n: int = N) -> tuple[Path, bytes, bytes]:
    """The source (version A) and the bytes of A and B, of the same size."""
    directory.mkdir(parents=True, exist_ok=True)
    source = _write(directory / "v.h5", np.arange(n))
    b = _write(directory / "b.h5", -np.arange(n) - 1).read_bytes()
    (directory / "b.h5").unlink()
    a = source.read_bytes()
    assert len(a) == len(b) and a != b
    return source, a, b


def _in_place(path: Path, data: bytes, keep_mtime: bool = False) -> None:
    """``data`` written over the file (the same inode); its modification time put back."""
    before = os.stat(path)
    with open(path, "r+b") as f:
        f.write(data)
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _renamed_over(path: Path, data: bytes, mtime_ns: int | None = None) -> None:
    """Another file of the same size renamed over ``path``, with its modification time
    (or ``mtime_ns``)."""
    before = os.stat(path)
    other = path.with_name(".replacement")
    other.write_bytes(data)
    os.utime(other, ns=(before.st_atime_ns, mtime_ns or before.st_mtime_ns))
    os.replace(other, path)


@pytest.fixture
def refs(tmp_path):
    source, _, b = _versions(tmp_path / "data")
    return refgrid.write(refgrid.scan(source), tmp_path / "refs.json"), source, b


def test_a_store_keeping_the_file_open_fails_on_a_rewrite_in_place(refs):
    """The store reads a local chunk with one ``pread`` on the file kept open: once the file
    is rewritten, that descriptor reads the new bytes — checked, they are an error."""
    out, source, b = refs
    array = zarr.open_array(refgrid.open_store(out), path="v", mode="r")
    np.testing.assert_array_equal(array[:512], np.arange(512))
    _in_place(source, b)
    with pytest.raises(refgrid.ReadError, match="changed while it was read") as raised:
        array[:512]
    assert str(source) in str(raised.value) and "v/c/0" in str(raised.value)


def test_a_file_renamed_over_the_source_with_its_size_and_mtime_is_another_file(refs):
    """A reader that checked the source once, then meets a file of the same size and
    modification time renamed over it: another inode, refused (the engine, the mapper)."""
    out, source, b = refs
    with xr.open_dataset(out, engine="refgrid") as ds:
        np.testing.assert_array_equal(ds["v"][:10].values, np.arange(10))
        mapper = zarr.open_group(refgrid.get_mapper(out), mode="r")["v"]
        np.testing.assert_array_equal(mapper[:10], np.arange(10))
        _renamed_over(source, b)
        with pytest.raises(refgrid.ReadError, match="another file was put in its place"):
            ds["v"].load()
        with pytest.raises(refgrid.ReadError, match="another file was put in its place"):
            mapper[:]


@pytest.mark.parametrize("how", ["removed", "renamed over"])
def test_a_descriptor_kept_open_on_a_file_no_longer_there_reads_nothing(refs, how):
    """The store keeps the file open: once it is removed, or another renamed over it, that
    descriptor still reads the old file — never served as the source any more."""
    out, source, _ = refs
    array = zarr.open_array(refgrid.open_store(out), path="v", mode="r")
    np.testing.assert_array_equal(array[:512], np.arange(512))
    source.unlink() if how == "removed" else _renamed_over(source, source.read_bytes())
    with pytest.raises(refgrid.ReadError, match="removed, or another file put in its place"):
        array[:512]


def test_what_the_identity_cannot_see_and_the_strict_check_does(refs):
    """A rewrite in place of the same size with the modification time put back keeps size,
    mtime and inode: invisible to the default check (documented), refused by
    ``verify_sources="strict"``, which also asks the change time nobody can put back."""
    out, source, b = refs
    strict = zarr.open_array(refgrid.open_store(out, verify_sources="strict"), path="v",
                             mode="r")
    default = zarr.open_array(refgrid.open_store(out), path="v", mode="r")
    np.testing.assert_array_equal(strict[:512], np.arange(512))
    np.testing.assert_array_equal(default[:512], np.arange(512))
    time.sleep(0.01)  # (a change time the file's first one cannot equal)
    _in_place(source, b, keep_mtime=True)
    with pytest.raises(refgrid.ReadError, match="its status changed"):
        strict[:512]
    np.testing.assert_array_equal(default[:512], -np.arange(512) - 1)  # the blind spot
    with pytest.raises(refgrid.ArgumentError, match="verify_sources"):
        refgrid.open_store(out, verify_sources="sometimes")


def test_a_file_still_being_written_while_it_is_scanned_is_refused(tmp_path):
    source = Source.of(_write(tmp_path / "v.h5", np.arange(N)), {})
    identity = source.identity
    with open(source.url, "ab") as f:  # the writer goes on
        f.write(b"\0" * 4096)
    with pytest.raises(refgrid.ScanError, match="changed while it was scanned") as raised:
        source.settled(identity)
    assert source.url in str(raised.value)


# -- the service --------------------------------------------------------------------------------

def test_a_served_chunk_of_a_rewritten_source_is_a_502_never_its_new_bytes(tmp_path):
    source, a, b = _versions(tmp_path / "data")
    refgrid.write(refgrid.scan(source), tmp_path / "root" / "v.json")
    for served in start_refgrid_serve(tmp_path / "root", allow_sources=(str(tmp_path),),
                                      recheck=0.0):
        chunk = f"{served.url}/v/native/v/c/1"
        status, _, _ = http_get(chunk)
        assert status == 200
        recorded = os.stat(source).st_mtime_ns
        _in_place(source, b)
        status, _, body = http_get(chunk)
        assert status == 502 and str(source).encode() in body, body
        assert b"changed" in body
        _renamed_over(source, a, recorded)  # the recorded size and mtime, but a new file
        status, _, body = http_get(chunk)
        assert status == 502 and b"another file was put in its place" in body, body


def _follow_service(tmp_path, landing, **options):
    follow = Follow("tas", str(landing / "tas_*.nc"), every=3600, older_than=0,
                    scheduler="synchronous")
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return start_refgrid_serve(root, follow=[follow], refresh_token="t", recheck=0.0,
                               state=tmp_path / "state", **options)


def _status(url: str, test, seconds: float = 60) -> dict:
    deadline = time.time() + seconds
    while True:
        _, _, body = http_get(f"{url}/tas/status")
        status = json.loads(body)
        if test(status) or time.time() > deadline:
            return status
        time.sleep(0.1)


def test_a_followed_archive_checks_its_sources_like_any_dataset(tmp_path):
    """A followed archive's file rewritten in place (the same size: the references' padded
    last chunk would be served beside the new bytes) or removed is a 502 until a round
    serves the archive as it now is; never the new bytes under the old metadata, never a
    removed file read through the descriptor kept open."""
    landing = tmp_path / "landing"
    files = write_archive(landing, range(3))
    for served in _follow_service(tmp_path, landing):
        assert _status(served.url, lambda s: s["files"] == 3)["files"] == 3
        chunk = f"{served.url}/tas/native/tas/c/3/0/0"  # (the second file's first chunk)
        status, _, _ = http_get(chunk)
        assert status == 200
        with netCDF4.Dataset(files[1], "r+") as ds:  # rewritten in place: other values
            ds["tas"][:] = ds["tas"][:] + 1
        status, _, body = http_get(chunk)
        assert status == 502 and str(files[1]).encode() in body, (status, body[:300])
        status, _, _ = http_get(f"{served.url}/tas/native/tas/c/8/0/0")  # the last file
        assert status == 200
        files[2].unlink()
        status, _, body = http_get(f"{served.url}/tas/native/tas/c/8/0/0")
        assert status == 502 and str(files[2]).encode() in body, (status, body[:300])


def _dods_values(body: bytes, n: int) -> np.ndarray:
    data = body[body.index(b"Data:\n") + 6:]
    assert struct.unpack(">II", data[:8]) == (n, n)
    return np.frombuffer(data[8:8 + 4 * n], ">f4")


@pytest.mark.parametrize("replace", ["in place", "renamed over"])
@pytest.mark.parametrize("suffix", [".dods?v", ".dap?dap4.ce=/v"])
def test_a_dap_response_that_meets_a_rewrite_fails_and_never_mixes_versions(
        tmp_path, monkeypatch, suffix, replace):
    """A ``.dods`` and a ``.dap`` streamed while their source is replaced (52 MB of which 7.2
    of 13.1 M values came from the new file, ``Content-Length`` met): cut short (DAP2) or
    ended with an error chunk (DAP4), never values of both versions."""
    from refgrid.serve.dap import blocks, responses

    n = 6 * 2**20  # 24 MB of values: more than the sockets' buffers hold
    source, _, b = _versions(tmp_path / "data", n)
    refgrid.write(refgrid.scan(source), tmp_path / "root" / "v.json")
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 2**16)
    monkeypatch.setattr(responses, "OPENING_BYTES", 2**16)
    for served in start_refgrid_serve(tmp_path / "root", allow_sources=(str(tmp_path),),
                                      recheck=0.0):
        response = urllib.request.urlopen(f"{served.url}/dap/v{suffix}", timeout=60)
        head = response.read(2**20)
        _in_place(source, b) if replace == "in place" else _renamed_over(source, b)
        try:
            body, cut = head + response.read(), False
        except http.client.IncompleteRead as e:
            body, cut = head + e.partial, True
        response.close()
        if suffix.startswith(".dods"):
            assert cut or (_dods_values(body, n) == np.arange(n)).all(), "versions mixed"
            assert cut, "the change was met mid-response: it must be cut short"
        else:
            flags, at, last = 0, 0, b""
            while at < len(body):
                header = struct.unpack(">I", body[at:at + 4])[0]
                flags, last = header >> 24, body[at + 4: at + 4 + (header & 0xFFFFFF)]
                at += 4 + (header & 0xFFFFFF)
            assert flags == 0x07 and b"changed" in last, (flags, last[:200])


def test_two_services_following_one_state_agree_with_what_they_serve(tmp_path):
    """Two ``serve --follow`` on one state directory: one writes the archive, the other
    serves the versions it writes, and each one's status counts the files of the version it
    serves (one kept serving 18 steps while its status said 20 files, "unchanged")."""
    landing = tmp_path / "landing"
    write_archive(landing, range(2))
    first = _follow_service(tmp_path, landing)
    one = next(first)
    try:
        _status(one.url, lambda s: s["files"] == 2)
        second = _follow_service(tmp_path, landing)
        two = next(second)
        try:
            status = _status(two.url, lambda s: s["files"] == 2)
            assert "followed by another service" in status["update"], status
            write_archive(landing, range(2, 4))
            assert http_get(f"{one.url}/tas/refresh", {"Authorization": "Bearer t"},
                            "POST")[0] == 202
            _status(one.url, lambda s: s["files"] == 4)
            assert http_get(f"{two.url}/tas/refresh", {"Authorization": "Bearer t"},
                            "POST")[0] == 202
            status = _status(two.url, lambda s: s["files"] == 4)
            with xr.open_dataset(f"{two.url}/tas/native", engine="refgrid") as ds:
                steps = ds.sizes["time"]
            with xr.open_dataset(f"{one.url}/tas/native", engine="refgrid") as ds:
                assert steps == ds.sizes["time"]
            assert status["files"] == 4, status
        finally:
            next(second, None)
    finally:
        next(first, None)

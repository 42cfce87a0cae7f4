"""``refgrid serve --follow``: a growing archive kept current and served as it grows.

A real service (aiohttp on 127.0.0.1) follows a directory where real NetCDF files land; its
``/NAME/`` dataset is read through the engine over HTTP and compared with what
``xr.open_mfdataset`` reads from the files present, after each arrival.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.error import HTTPError

import pytest
import xarray as xr

from archive_files import write_archive, write_corrupt
from servers import start_refgrid_serve

pytest.importorskip("aiohttp")

from refgrid import VirtualGroup
from refgrid.errors import ArgumentError
from refgrid.serve.follow import Follow, seconds

TOKEN = "s3cret-token"


def request(url: str, method: str = "GET", token: str | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method,
                                                           headers=headers), timeout=30) as r:
            return r.status, json.loads(r.read())
    except HTTPError as e:
        return e.code, json.loads(e.read())


def wait_for(url: str, test, seconds: float = 60) -> dict:
    """The status document once ``test(status)`` holds."""
    deadline = time.time() + seconds
    while True:
        _, status = request(url)
        if test(status) or time.time() > deadline:
            return status
        time.sleep(0.1)


def expected(files: list[Path]) -> xr.Dataset:
    with xr.open_mfdataset(sorted(files), combine="nested", concat_dim="time",
                           data_vars="minimal", coords="minimal", compat="override") as ds:
        return ds.load()


def served(url: str) -> xr.Dataset:
    with xr.open_dataset(url, engine="refgrid", cache=False) as ds:
        return ds.load()


@pytest.fixture
def archive(tmp_path) -> Path:
    directory = tmp_path / "landing"
    write_archive(directory, range(3))
    return directory


@pytest.fixture
def service(tmp_path, archive):
    root = tmp_path / "root"
    root.mkdir()
    follow = Follow("tas", str(archive / "tas_*.nc"), every=0.3, older_than=0,
                    scheduler="synchronous")
    yield from start_refgrid_serve(root, follow=[follow], refresh_token=TOKEN, recheck=0.0)


def test_files_that_land_are_served_within_a_round_and_read_as_the_files(service, archive):
    status_url = f"{service.url}/tas/status"
    status = wait_for(status_url, lambda s: s["files"] == 3)
    assert status["files"] == 3 and status["update"].startswith("new"), status
    xr.testing.assert_identical(served(f"{service.url}/tas/native"),
                                expected(list(archive.glob("*.nc"))))
    landed = time.time()
    write_archive(archive, range(3, 5))
    status = wait_for(status_url, lambda s: s["files"] == 5)
    readable = time.time() - landed
    assert status["update"].startswith("append: 2 file(s)"), status
    assert readable <= 0.3 + 5, readable  # --every + 5 s
    xr.testing.assert_identical(served(f"{service.url}/tas/native"),
                                expected(list(archive.glob("*.nc"))))
    assert status["lag_seconds"] is not None and status["last_update"] is not None


def head(url: str, etag: str | None = None) -> tuple[int, dict]:
    headers = {"If-None-Match": etag} if etag else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=30) as r:
            return r.status, dict(r.headers)
    except HTTPError as e:
        return e.code, dict(e.headers)


def test_chunks_keep_their_etags_across_appends_and_caches_revalidate(service, archive):
    wait_for(f"{service.url}/tas/status", lambda s: s["files"] == 3)
    chunk = f"{service.url}/tas/native/tas/c/0/0/0"
    status, headers = head(chunk)
    assert status == 200 and headers["Cache-Control"] == "public, no-cache", headers
    write_archive(archive, [3])
    wait_for(f"{service.url}/tas/status", lambda s: s["files"] == 4)
    assert head(chunk, headers["ETag"])[0] == 304  # the same bytes: the same tag
    assert head(f"{service.url}/tas/native/zarr.json", headers["ETag"])[0] == 200


def test_a_version_that_cannot_be_served_is_said_and_published_again(tmp_path, archive):
    from refgrid.errors import FormatError
    from refgrid.serve.catalog import stamp_of
    from refgrid.serve.follow import Follower

    follower = Follower(Follow("tas", str(archive / "tas_*.nc"), older_than=0,
                               scheduler="synchronous"), tmp_path / "state")
    calls: list[int] = []

    def publish() -> SimpleNamespace:  # (a version the catalog would serve, as it says it)
        calls.append(len(calls))
        if len(calls) == 1:
            raise FormatError("tas", None, "cannot be opened (a test's)")
        return SimpleNamespace(stamp=stamp_of(follower.output), group=VirtualGroup())

    follower.on_version = publish
    first = follower.round()
    assert "cannot be served" in (first.error or ""), first
    second = follower.round()  # nothing new: published again all the same
    assert second.error is None and len(calls) == 2 and second.update.startswith("unchanged")
    follower.round()
    assert len(calls) == 2  # served: not again


def test_a_file_that_fails_is_reported_and_does_not_hold_back_the_others(service, archive):
    wait_for(f"{service.url}/tas/status", lambda s: s["files"] == 3)
    broken = write_corrupt(archive, archive / "tas_00000.nc")  # three files, all bad
    write_archive(archive, [3])
    status = wait_for(f"{service.url}/tas/status", lambda s: s["files"] == 4 and s["failed"])
    assert sorted(f["url"] for f in status["failed"]) == sorted(map(str, broken)), status
    good = [p for p in archive.glob("*.nc") if p not in broken]
    xr.testing.assert_identical(served(f"{service.url}/tas/native"), expected(good))
    broken[0].write_bytes(b"still not NetCDF")  # changed, still bad: scanned again, reported
    rounds = status["rounds"]
    status = wait_for(f"{service.url}/tas/status", lambda s: s["rounds"] > rounds + 1)
    assert sorted(f["url"] for f in status["failed"]) == sorted(map(str, broken))
    assert status["files"] == 4 and status["error"] is None


def test_refresh_needs_the_token_and_other_names_are_not_followed(service):
    url = f"{service.url}/tas/refresh"
    assert request(url, "POST")[0] == 401
    assert request(url, "POST", token="wrong")[0] == 401
    assert request(url, "POST", token=TOKEN) == (202, {"status": 202, "refresh": "tas"})
    assert request(f"{service.url}/other/refresh", "POST", token=TOKEN)[0] == 404
    assert request(f"{service.url}/other/status")[0] == 404


def test_without_a_token_refresh_is_disabled(tmp_path, archive):
    root = tmp_path / "root"
    root.mkdir()
    follow = Follow("tas", str(archive / "tas_*.nc"), every=60, older_than=0,
                    scheduler="synchronous")
    for server in start_refgrid_serve(root, follow=[follow]):
        assert request(f"{server.url}/tas/refresh", "POST", token=TOKEN)[0] == 403


def test_files_still_being_written_wait_and_a_restart_scans_nothing_again(tmp_path, archive):
    root = tmp_path / "root"
    root.mkdir()
    state = tmp_path / "state"
    follow = Follow("tas", str(archive / "tas_*.nc"), every=0.3, older_than=3600,
                    scheduler="synchronous")
    old = time.time() - 7200
    for path in archive.glob("*.nc"):
        os.utime(path, (old, old))
    young = write_archive(archive, [3])[0]
    for server in start_refgrid_serve(root, follow=[follow], state=state, recheck=0.0):
        status = wait_for(f"{server.url}/tas/status", lambda s: s["files"] == 3)
        assert (status["files"], status["waiting"]) == (3, 1), status
        os.utime(young, (old + 3600, old + 3600))  # written an hour ago now
        status = wait_for(f"{server.url}/tas/status", lambda s: s["files"] == 4)
        assert (status["files"], status["waiting"]) == (4, 0), status
    for server in start_refgrid_serve(root, follow=[follow], state=state, recheck=0.0):
        status = wait_for(f"{server.url}/tas/status", lambda s: s["rounds"] >= 1)
        assert status["update"].startswith("unchanged") and status["files"] == 4, status
        xr.testing.assert_identical(served(f"{server.url}/tas/native"),
                                    expected(list(archive.glob("*.nc"))))


def test_follow_options_are_checked():
    assert seconds("30s", "--every") == 30 and seconds("5m", "x") == 300
    assert seconds("1h", "x") == 3600 and seconds("2.5", "x") == 2.5
    with pytest.raises(ArgumentError, match="duration"):
        seconds("soon", "--every")
    with pytest.raises(ArgumentError, match="NAME=PATTERN"):
        Follow.parse("/data/*.nc")
    with pytest.raises(ArgumentError, match="a name is"):
        Follow.parse("../x=/data/*.nc")
    with pytest.raises(ArgumentError, match="not healthz"):
        Follow.parse("healthz=/data/*.nc")
    assert Follow.parse("sst=/data/sst/*.nc", every=5.0).source_prefix == "/data/sst/"


def test_an_empty_refresh_token_is_refused(tmp_path):
    from refgrid.serve import make_app

    with pytest.raises(ArgumentError, match="token is empty"):
        make_app(str(tmp_path), refresh_token=" ")


# -- remote archives ---------------------------------------------------------------------------

def follow_remote(tmp_path, pattern: str, storage_options: dict | None, land) -> None:
    """A service following ``pattern``: the files there are served; two more land
    (``land(indices)`` puts them there) and are appended and served, read as the files."""
    local = tmp_path / "files"
    root = tmp_path / "root"
    root.mkdir()
    land(write_archive(local, range(3)))
    follow = Follow("tas", pattern, every=0.2, older_than=0, scheduler="synchronous")
    for server in start_refgrid_serve(root, follow=[follow], recheck=0.0,
                                      storage_options=storage_options):
        status = wait_for(f"{server.url}/tas/status", lambda s: s["files"] == 3)
        assert status["files"] == 3 and status["error"] is None, status
        land(write_archive(local, range(3, 5)))
        status = wait_for(f"{server.url}/tas/status", lambda s: s["files"] == 5)
        assert status["update"].startswith("append"), status  # (in one round or two)
        xr.testing.assert_identical(served(f"{server.url}/tas/native"),
                                    expected(list(local.glob("*.nc"))))


def test_an_archive_growing_on_s3_is_followed(s3_server, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    prefix = f"follow-{tmp_path.name}"

    def land(files: list[Path]) -> None:
        for path in files:
            s3_server.upload(path, f"{prefix}/{path.name}")

    follow_remote(tmp_path, f"s3://{s3_server.bucket}/{prefix}/tas_*.nc",
                  s3_server.storage_options, land)


def test_an_archive_growing_on_a_web_server_is_followed(tmp_path):
    from servers import start_http

    site = tmp_path / "site"
    (site / "landing").mkdir(parents=True)

    def land(files: list[Path]) -> None:
        for path in files:  # complete under their names (a listing has no times)
            partial = site / f".{path.name}"
            partial.write_bytes(path.read_bytes())
            partial.rename(site / "landing" / path.name)

    for http in start_http(site, listings=True):
        follow_remote(tmp_path, f"{http.url}/landing/tas_*.nc", None, land)


@pytest.mark.parametrize("option", [["--merge"], ["--data-url", "http://127.0.0.1:9/x.h5"],
                                    ["--time-from", "tas_%Y.nc"], ["--allow-overlap"]])
def test_combine_options_without_a_followed_archive_are_refused(tmp_path, monkeypatch,
                                                                option):
    """``serve`` takes the combine and format options for its followed archives; given
    without ``--follow`` they would be ignored, so they are refused before it starts."""
    from click.testing import CliRunner

    import refgrid.serve
    from refgrid.cli import main

    def started(*args: object, **kwargs: object) -> None:  # (not a server that never ends)
        raise AssertionError("serve started")

    monkeypatch.setattr(refgrid.serve, "run", started)

    result = CliRunner().invoke(main, ["serve", str(tmp_path), *option])
    assert result.exit_code == 2, result.output
    assert "are for followed archives: pass --follow NAME=PATTERN too" in result.output

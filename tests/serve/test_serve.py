"""``refgrid serve``: every fixture dataset read over a real socket by stock clients, HTTP's
caching and range rules, and the security model."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.error import HTTPError

import fsspec
import numpy as np
import pytest
import xarray as xr
import zarr
from zarr.storage import FsspecStore

import refgrid
from ground_truth import assert_like_source
from helpers import FIXTURES, closed
from refgrid.serve.app import CATALOG
from servers import http_get as _get
from servers import start_http, start_refgrid_serve
from tests.combining.test_combine import ARCHIVES, _files

NC_FILES = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.nc"))


def _name(relative: str) -> str:
    return "files/" + relative.removesuffix(".nc")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    for relative in NC_FILES:
        refgrid.write(refgrid.scan(FIXTURES / relative), root / f"{_name(relative)}.json")
    for archive in ARCHIVES:  # copy-free: the native view crops padded chunks as it serves
        group = refgrid.combine([refgrid.scan(f) for f in _files(archive)], "time")
        refgrid.write(group, root / "archives" / f"{archive.replace('/', '_')}.json",
                      padded="encoded")
    chunk10 = refgrid.combine([refgrid.scan(f) for f in _files("monthly/chunk10")], "time")
    refgrid.write(chunk10, root / "parquet" / "monthly.parq", format="parquet")
    closed(xr.open_dataset(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc")).to_zarr(
        root / "stores" / "january.zarr", zarr_format=3, consolidated=False)
    return root


@pytest.fixture(scope="module")
def server(root):
    yield from start_refgrid_serve(root, allow_sources=(str(FIXTURES),), recheck=0.0)


def _mfdataset(archive: str) -> xr.Dataset:
    return closed(xr.open_mfdataset(_files(archive), combine="nested", concat_dim="time",
                             data_vars="minimal", compat="equals"))


# -- stock clients read every fixture dataset ------------------------------------------------

@pytest.mark.parametrize("relative", NC_FILES)
def test_every_fixture_file_through_the_regular_view_with_stock_xarray(server, relative):
    url = f"{server.url}/{_name(relative)}/regular;unpack=true"
    ours = xr.open_dataset(fsspec.get_mapper(url), engine="zarr")
    assert_like_source(ours, closed(xr.open_dataset(FIXTURES / relative)))


@pytest.mark.parametrize("archive", ARCHIVES)
def test_every_archive_through_stock_zarr_and_xarray(server, archive):
    expected = _mfdataset(archive)
    url = f"{server.url}/archives/{archive.replace('/', '_')}/regular;unpack=true"
    assert_like_source(xr.open_dataset(fsspec.get_mapper(url), engine="zarr"), expected)
    group = zarr.open_group(FsspecStore.from_url(url, read_only=True), mode="r")
    np.testing.assert_array_equal(group["tas"][...], expected["tas"].values)
    time4 = xr.open_dataset(fsspec.get_mapper(url.replace(";unpack", ";chunks=time:4;unpack")),
                            engine="zarr")
    assert time4["tas"].encoding["chunks"][0] == 4
    np.testing.assert_array_equal(time4["tas"].values, expected["tas"].values)


@pytest.mark.parametrize("archive", ARCHIVES)
def test_the_native_view_reads_with_refgrids_engine_pointed_at_the_url(server, archive):
    expected = _mfdataset(archive)
    url = f"{server.url}/archives/{archive.replace('/', '_')}/native"
    ours = xr.open_dataset(url, engine="refgrid")
    for key, want in expected.variables.items():
        assert ours[key].dtype == want.dtype, key
        np.testing.assert_array_equal(ours[key].values, want.values, err_msg=key)


@pytest.mark.parametrize("relative", NC_FILES)
def test_every_fixture_file_through_the_native_view(server, relative):
    ours = xr.open_dataset(f"{server.url}/{_name(relative)}/native", engine="refgrid")
    assert_like_source(ours, closed(xr.open_dataset(FIXTURES / relative)))


def _stored(refs: dict, key: str) -> bytes:
    url, offset, length = refs["refs"][key]
    url = refs.get("templates", {}).get(url.strip("{}"), url) if url.startswith("{{") else url
    with open(url, "rb") as f:
        f.seek(offset)
        return f.read(length)


def test_native_documents_and_chunks_pass_through_byte_for_byte(server, root):
    """Chunks pass through as stored, but those padded inside the array: those are served
    cropped to their extent, which the documents declare (no ``encoded_chunk_shapes``), so
    zarr >= 3.2 reads them."""
    from refgrid.codecs.pipeline import ChunkCodec

    refs = json.loads((root / "archives" / "monthly_chunk10.json").read_text())
    stored_doc = json.loads(refs["refs"]["tas/zarr.json"])
    assert "encoded_chunk_shapes" in stored_doc["chunk_grid"]["configuration"]
    status, _, body = _get(f"{server.url}/archives/monthly_chunk10/native/tas/zarr.json")
    doc = json.loads(body)
    assert status == 200 and "encoded_chunk_shapes" not in doc["chunk_grid"]["configuration"]
    assert {k: v for k, v in doc.items() if k != "chunk_grid"} == {
        k: v for k, v in stored_doc.items() if k != "chunk_grid"}
    status, _, body = _get(f"{server.url}/archives/monthly_chunk10/native/tas/c/4/0/0")
    assert status == 200 and body == _stored(refs, "tas/c/4/0/0")  # a whole chunk
    status, _, body = _get(f"{server.url}/archives/monthly_chunk10/native/tas/c/3/0/0")
    tas = refgrid.scan(root / "archives" / "monthly_chunk10.json")["tas"]
    codec = ChunkCodec(tas.codecs, tas.dtype)
    padded = codec.decode(_stored(refs, "tas/c/3/0/0"), (10, 6, 8))  # January's 31st day
    assert status == 200 and body != _stored(refs, "tas/c/3/0/0")
    np.testing.assert_array_equal(codec.decode(body, (1, 6, 8)), padded[:1])


def test_parquet_references_and_zarr_stores_are_served(server):
    expected = closed(xr.open_mfdataset(_files("monthly/chunk10"), combine="nested",
                                 concat_dim="time", data_vars="minimal"))
    ours = xr.open_dataset(fsspec.get_mapper(f"{server.url}/parquet/monthly/regular"),
                           engine="zarr")
    np.testing.assert_array_equal(ours["tas"].values, expected["tas"].values)
    january = xr.open_dataset(fsspec.get_mapper(f"{server.url}/stores/january/regular"),
                              engine="zarr")
    source = closed(xr.open_dataset(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"))
    np.testing.assert_array_equal(january["tas"].values, source["tas"].values)


# -- HTTP ------------------------------------------------------------------------------------

def test_absent_chunks_are_404_and_read_as_the_fill_value(server):
    status, _, body = _get(f"{server.url}/files/features/netcdf4_features/native/unwritten/c/0")
    assert status == 404 and json.loads(body)["status"] == 404
    ours = xr.open_dataset(fsspec.get_mapper(f"{server.url}/files/features/netcdf4_features/"
                                             "regular"), engine="zarr", mask_and_scale=False)
    with xr.open_dataset(FIXTURES / "features" / "netcdf4_features.nc",
                         mask_and_scale=False) as source:
        np.testing.assert_array_equal(ours["unwritten"].values, source["unwritten"].values)


def test_etags_last_modified_and_conditional_gets(server):
    url = f"{server.url}/archives/monthly_chunk10/native/tas/c/0/0/0"
    status, headers, _ = _get(url)
    assert status == 200 and headers["Accept-Ranges"] == "bytes"
    etag, modified = headers["ETag"], headers["Last-Modified"]
    assert "max-age=" in headers["Cache-Control"]
    assert _get(url, {"If-None-Match": etag})[0] == 304
    assert _get(url, {"If-None-Match": '"other", ' + etag})[0] == 304
    assert _get(url, {"If-None-Match": '"other"'})[0] == 200
    assert _get(url, {"If-Modified-Since": modified})[0] == 304
    assert _get(url, {"If-Modified-Since": "Mon, 01 Jan 1990 00:00:00 GMT"})[0] == 200
    other = _get(url.replace("c/0/0/0", "c/1/0/0"))[1]["ETag"]
    assert other != etag
    meta = f"{server.url}/archives/monthly_chunk10/native/zarr.json"
    tag = _get(meta)[1]["ETag"]
    assert _get(meta, {"If-None-Match": tag})[0] == 304


def test_range_requests_on_chunks(server):
    url = f"{server.url}/archives/monthly_chunk10/native/tas/c/0/0/0"
    whole = _get(url)[2]
    status, headers, body = _get(url, {"Range": "bytes=10-19"})
    assert status == 206 and body == whole[10:20]
    assert headers["Content-Range"] == f"bytes 10-19/{len(whole)}"
    assert _get(url, {"Range": "bytes=-7"})[2] == whole[-7:]
    assert _get(url, {"Range": f"bytes={len(whole) - 3}-"})[2] == whole[-3:]
    status, headers, _ = _get(url, {"Range": f"bytes={len(whole) + 5}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(whole)}"
    assert _get(url, {"Range": "bytes=0-1,5-6"})[0] == 416
    stale = _get(url, {"Range": "bytes=0-3", "If-Range": '"stale"'})
    assert stale[0] == 200 and stale[2] == whole
    fs = fsspec.filesystem("http")
    assert fs.cat_file(url, start=4, end=12) == whole[4:12]


def test_head_gzip_cors_health_and_methods(server):
    url = f"{server.url}/archives/monthly_chunk10/native/tas/c/0/0/0"
    status, headers, body = _get(url, method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) == len(_get(url)[2])
    meta = f"{server.url}/archives/monthly_chunk10/regular/zarr.json"
    _, headers, body = _get(meta, {"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert json.loads(gzip.decompress(body))["consolidated_metadata"]["metadata"]["tas"]
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert "ETag" in headers["Access-Control-Expose-Headers"]
    status, headers, _ = _get(meta, {"Origin": "http://example.test",
                                     "Access-Control-Request-Method": "GET",
                                     "Access-Control-Request-Headers": "range"},
                              method="OPTIONS")
    assert status == 204 and "Range" in headers["Access-Control-Allow-Headers"]
    assert headers["Access-Control-Allow-Origin"] == "*"
    status, _, body = _get(f"{server.url}/healthz")
    assert status == 200 and json.loads(body)["datasets"] >= len(NC_FILES) + len(ARCHIVES)
    assert _get(meta, method="POST")[0] == 405
    assert _get(meta, method="DELETE")[0] == 405


def test_bad_view_parameters_and_limits_are_400(server):
    base = f"{server.url}/archives/monthly_chunk10"
    for view in ("regular;chunks=time:0", "regular;chunks=nosuchdim:3", "regular;colour=red",
                 "regular;unpack=perhaps"):
        status, _, body = _get(f"{base}/{view}/zarr.json")
        assert status == 400, (view, body)
        assert json.loads(body)["error"]
    assert _get(f"{base}/sideways/zarr.json")[0] == 404
    assert _get(f"{base}/regular/zarr.json?chunks=time:30")[0] == 200


def test_one_request_may_assemble_only_so_many_native_chunks(root):
    from refgrid.serve.catalog import ViewLimits

    for served in start_refgrid_serve(root, allow_sources=(str(FIXTURES),),
                                      limits=ViewLimits(max_native_chunks=8)):
        base = f"{served.url}/archives/monthly_chunk10"
        status, _, body = _get(f"{base}/regular;chunks=time:365/zarr.json")
        assert status == 400 and "native chunks" in json.loads(body)["error"]
        assert _get(f"{base}/regular;chunks=time:20/zarr.json")[0] == 200


def test_index_pages_list_datasets_arrays_and_chunk_pictures(server):
    status, headers, body = _get(f"{server.url}/")
    page = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert 'href="/archives/monthly_chunk10/"' in page and "tas" in page
    status, _, body = _get(f"{server.url}/archives/monthly_chunk10/")
    page = body.decode()
    assert page.count("<svg") == 4  # time, lat, lon, tas
    assert "padded" in page and "rectilinear" in page
    assert f"{server.url}/archives/monthly_chunk10/regular" in page
    assert 'engine="refgrid"' in page.replace("&quot;", '"')
    assert _get(f"{server.url}/archives/monthly_chunk10", method="GET")[0] == 200  # redirect


def test_the_service_is_stateless_across_instances(root, server):
    url = "/archives/yearly_chunk73/native/tas/c/2/0/0"
    for other in start_refgrid_serve(root, allow_sources=(str(FIXTURES),)):
        first, second = _get(server.url + url), _get(other.url + url)
        assert first[2] == second[2] and first[1]["ETag"] == second[1]["ETag"]


def test_a_rewritten_reference_set_is_reopened(root, server):
    target = root / "changing.json"
    refgrid.write(refgrid.scan(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"), target)
    first = _get(f"{server.url}/changing/native/tas/zarr.json")
    assert json.loads(first[2])["shape"][0] == 31
    time.sleep(0.05)
    refgrid.write(refgrid.scan(FIXTURES / "monthly" / "chunk10" / "tas_200102.nc"), target)
    second = _get(f"{server.url}/changing/native/tas/zarr.json")
    assert json.loads(second[2])["shape"][0] == 28
    assert first[1]["ETag"] != second[1]["ETag"]
    target.unlink()
    assert _get(f"{server.url}/changing/native/tas/zarr.json")[0] in (403, 404)


def test_a_changed_source_is_an_error_naming_it_not_other_data(tmp_path):
    source = tmp_path / "data" / "tas.nc"
    source.parent.mkdir()
    source.write_bytes((FIXTURES / "monthly" / "chunk10" / "tas_200101.nc").read_bytes())
    refgrid.write(refgrid.scan(source), tmp_path / "refs" / "tas.json")
    for served in start_refgrid_serve(tmp_path / "refs", allow_sources=(str(source.parent),),
                                      recheck=0.0):
        url = f"{served.url}/tas/native/tas/c/1/0/0"
        whole = f"{served.url}/tas/regular/tas/c/0/0/0"  # a small array: one view chunk
        assert _get(url)[0] == 200
        assert _get(whole)[0] == 200
        source.write_bytes(source.read_bytes() + b"\0")  # changed while being served
        for asked in (url, whole):
            status, _, body = _get(asked)
            assert status == 502, (asked, body)
            assert "changed since it was scanned" in json.loads(body)["error"]


def test_concurrent_neighbouring_chunk_requests_share_batched_fetches(http_server, tmp_path):
    """Remote sources (50 ms away): the chunks of concurrent requests are fetched together
    (local ones are one ``pread`` each, cheaper than a batch)."""
    from faults import start_proxy
    from refgrid.read.native import NativeView

    proxies = start_proxy(http_server.url)
    proxy = next(proxies)
    urls = [f"{proxy.url}/fixtures/yearly/chunk73/{p.name}" for p in _files("yearly/chunk73")]
    refgrid.write(refgrid.combine(urls, "time"), tmp_path / "remote.json")
    proxy.reset(lambda n, method, path: "latency")
    calls: list[int] = []
    fetch = NativeView.fetch

    def counting(self, path, flats):
        calls.append(len(flats))
        return fetch(self, path, flats)

    NativeView.fetch = counting
    try:
        for served in start_refgrid_serve(tmp_path, allow_sources=(proxy.url,)):
            url = f"{served.url}/remote/native/tas/c/{{}}/0/0"

            async def all_at_once(url=url):
                fs = fsspec.filesystem("http", asynchronous=True, skip_instance_cache=True)
                session = await fs.set_session()
                try:
                    return await asyncio.gather(*(fs._cat_file(url.format(i % 3))
                                                  for i in range(60)))
                finally:
                    await session.close()

            bodies = asyncio.run(all_at_once())
            concurrent = list(calls)
            for i, body in enumerate(bodies):
                assert body == _get(url.format(i % 3))[2]
    finally:
        NativeView.fetch = fetch
        next(proxies, None)
    assert 0 < len(concurrent) < 10 and sum(concurrent) < 20, concurrent


def test_access_log_is_one_json_object_a_request(server, caplog):
    with caplog.at_level(logging.INFO, logger="refgrid.serve.access"):
        _get(f"{server.url}/healthz")
        deadline = time.time() + 5
        while not caplog.records and time.time() < deadline:
            time.sleep(0.01)
    entry = json.loads(caplog.records[-1].getMessage())
    assert entry["path"] == "/healthz" and entry["status"] == 200 and entry["ms"] >= 0


# -- security --------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/archives/../files/netcdf3/cdf5/", "/archives/%2e%2e/files/",
                                  "/%2E%2E/%2E%2E/etc/passwd", "/files/..%2f..%2fetc/passwd",
                                  "//etc/passwd", "/etc/passwd", "/files/%00/native/zarr.json",
                                  "/files\\..\\etc/passwd"])
def test_paths_out_of_the_root_are_refused(server, path):
    request = urllib.request.Request(server.url + path)
    request.selector = path  # as sent: urllib would not normalise, nor would an attacker
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status = answer.status
    except HTTPError as e:
        status = e.code
    assert status in (400, 404)


def test_a_symlink_out_of_the_root_is_not_a_dataset(tmp_path, root):
    served_root = tmp_path / "root"
    served_root.mkdir()
    outside = tmp_path / "outside.json"
    refgrid.write(refgrid.scan(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"), outside)
    (served_root / "escape.json").symlink_to(outside)
    (served_root / "escape_dir").symlink_to(tmp_path)
    for served in start_refgrid_serve(served_root, allow_sources=(str(FIXTURES),)):
        assert _get(f"{served.url}/escape/native/zarr.json")[0] == 404
        assert _get(f"{served.url}/escape_dir/outside/native/zarr.json")[0] == 404
        assert "escape" not in _get(f"{served.url}/")[2].decode()


def _hostile(refs_dir: Path, name: str, url: str) -> None:
    group = refgrid.scan(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc")
    refs = refgrid.to_kerchunk(group)
    refs["refs"] = {k: ([url, 0, 16] if isinstance(v, list) else v)
                    for k, v in refs["refs"].items()}
    refs.pop("templates", None)
    refs.pop("refgrid", None)
    (refs_dir / f"{name}.json").write_text(json.dumps(refs))


def test_references_to_files_outside_the_allowed_sources_are_403_and_nothing_is_read(
        tmp_path, monkeypatch):
    import refgrid.read.array as array

    read: list[str] = []
    real = array.read_ranges

    def recording(paths, *args, **kwargs):
        read.extend(paths)
        return real(paths, *args, **kwargs)

    monkeypatch.setattr(array, "read_ranges", recording)
    for other in start_http(tmp_path, host="127.0.0.2"):
        refs_dir = tmp_path / "refs"
        refs_dir.mkdir()
        (tmp_path / "secret.bin").write_bytes(b"s" * 64)
        _hostile(refs_dir, "passwd", "/etc/passwd")
        _hostile(refs_dir, "internal", f"{other.url}/secret.bin")
        _hostile(refs_dir, "sibling", str(tmp_path / "secret.bin"))
        refgrid.write(refgrid.scan(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"),
                      refs_dir / "fine.json")
        for served in start_refgrid_serve(refs_dir, allow_sources=(str(FIXTURES),)):
            for name, named in (("passwd", "/etc/passwd"), ("internal", other.url),
                                ("sibling", "secret.bin")):
                for path in ("native/tas/c/0/0/0", "regular/tas/c/0/0/0", "native/zarr.json"):
                    status, _, body = _get(f"{served.url}/{name}/{path}")
                    assert status == 403, (name, path, body)
                    assert named in json.loads(body)["error"]
            assert "outside the allowed sources" in _get(f"{served.url}/")[2].decode()
            assert _get(f"{served.url}/fine/native/tas/c/0/0/0")[0] == 200
            assert _get(f"{served.url}/fine/regular/tas/c/0/0/0")[0] == 200  # assembled
        assert read and all(url.startswith(str(FIXTURES)) for url in read)  # the fine one
        assert len(other.counter) == 0


# -- datasets that cannot be served -----------------------------------------------------------

BUGGED = """
import refgrid.serve.catalog as catalog
from refgrid.cli import main

real = catalog.scan


def scan(path, **options):
    if path.name == "broken.json":
        return 1 / 0  # a bug opening it: no RefgridError
    return real(path, **options)


catalog.scan = scan
main()
"""
"""``refgrid serve`` with a bug opening ``broken.json``, put where the catalog scans: how the
service answers a bug must not wait for one in refgrid's code."""


def _with_a_bug(real):
    def scan(path, **options):
        if path.name == "broken.json":
            return 1 / 0  # (as BUGGED)
        return real(path, **options)
    return scan


def _tas_refs(path: Path) -> Path:
    return refgrid.write(refgrid.scan(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"),
                         path)


def test_a_dataset_that_fails_to_open_on_a_bug_is_unavailable_the_rest_served(
        tmp_path, caplog, monkeypatch):
    """Whatever fails while a dataset is opened — here a bare ``ZeroDivisionError`` — makes
    that dataset unavailable: the index and its page say why, its endpoints answer 500 naming
    the error, its traceback is logged once (not once a request), and every other dataset is
    served as before."""
    import refgrid.serve.catalog as catalog

    monkeypatch.setattr(catalog, "scan", _with_a_bug(catalog.scan))
    root = tmp_path / "refs"
    _tas_refs(root / "fine.json")
    shutil.copy(root / "fine.json", root / "broken.json")
    caplog.set_level(logging.INFO, logger="refgrid.serve")
    for served in start_refgrid_serve(root, allow_sources=(str(FIXTURES),)):
        status, _, body = _get(f"{served.url}/")
        index = body.decode()
        assert status == 200, index
        assert "unavailable (500)" in index and "ZeroDivisionError" in index
        assert index.count("arrays (") == 1  # fine, described
        status, headers, body = _get(f"{served.url}/broken/")
        assert status == 500 and headers["Content-Type"].startswith("text/html")
        assert "internal error (ZeroDivisionError: division by zero)" in body.decode()
        for path in ("native/zarr.json", "regular/zarr.json", "native/tas/c/0/0/0"):
            status, _, body = _get(f"{served.url}/broken/{path}")
            assert status == 500, (path, body)
            assert json.loads(body)["error"] == (
                "cannot serve it: broken: cannot be opened: internal error "
                "(ZeroDivisionError: division by zero)")
        status, _, body = _get(f"{served.url}/dap/broken.dds")
        assert status == 500 and b"ZeroDivisionError" in body
        assert _get(f"{served.url}/fine/native/tas/c/0/0/0")[0] == 200
        assert _get(f"{served.url}/fine/")[0] == 200
    bugs = [r for r in caplog.records if r.exc_info is not None]
    assert len(bugs) == 1 and "broken" in bugs[0].getMessage(), bugs
    assert isinstance(bugs[0].exc_info[1], ZeroDivisionError)


def test_a_dataset_whose_source_is_missing_answers_502(tmp_path):
    """A DMR++ document whose granule is gone: a source missing (``NotFoundError``) is a
    502, as a chunk whose source is missing is — not a 500, which says the service failed."""
    from dmrpp_docs import write_dmrpp

    root = tmp_path / "refs"
    root.mkdir()
    granule = root / "lost.nc"
    shutil.copy(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc", granule)
    write_dmrpp(granule)
    granule.unlink()
    for served in start_refgrid_serve(root):
        for path in ("lost.nc/native/zarr.json", "lost.nc/", "dap/lost.nc.dds"):
            status, _, body = _get(f"{served.url}/{path}")
            assert status == 502 and str(granule).encode() in body, (path, body)
        assert "unavailable (502)" in _get(f"{served.url}/")[2].decode()


def test_a_batchs_report_beside_its_output_is_not_a_dataset(tmp_path):
    """``refgrid batch`` writes ``OUTPUT.report.json`` beside its output: JSON, but no
    references (it was listed, and answered with an IndexError scanning it)."""
    root = tmp_path / "refs"
    result = refgrid.batch([str(f) for f in _files("monthly/chunk10")[:2]], root / "tas.json",
                           scheduler="synchronous", progress=False)
    assert result.report_path == root / "tas.json.report.json"
    for served in start_refgrid_serve(root, allow_sources=(str(FIXTURES),)):
        assert json.loads(_get(f"{served.url}/healthz")[2])["datasets"] == 1
        index = _get(f"{served.url}/")[2].decode()
        assert 'href="/tas/"' in index and "report" not in index
        assert _get(f"{served.url}/tas.json.report/native/zarr.json")[0] == 404


def _serving(root: Path, *args: str, cli: tuple[str, ...] = ("-m", "refgrid.cli")
             ) -> tuple[subprocess.Popen[str], str]:
    """``refgrid serve ROOT`` in a process of its own, once it answers (or has ended): the
    process and its URL."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, *cli, "serve", str(root), "--port", str(port), *args],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline and process.poll() is None:
        try:
            if _get(f"{url}/healthz")[0] == 200:
                break
        except OSError:
            time.sleep(0.1)
    if process.poll() is not None:
        pytest.fail(f"refgrid serve ended ({process.returncode}): {process.communicate()[1]}")
    return process, url


def _stopped(process: subprocess.Popen[str]) -> str:
    """What the service wrote to stderr, once it stopped (SIGTERM)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=30)[1]
    finally:
        process.kill()


def test_the_cli_keeps_serving_when_datasets_fail_and_says_what_each_answers(tmp_path):
    """Start-up opens every dataset to tell which cannot be served: a bug opening one (here
    a bare ``ZeroDivisionError``) ended the service there. It keeps serving, and the
    start-up log names each refused dataset with the status it answers — 500 for a bug, 502
    for a missing source, 403 for a source outside the allowed ones (all were said to answer
    403) — the bug's traceback logged once."""
    from dmrpp_docs import write_dmrpp

    root = tmp_path / "refs"
    _tas_refs(root / "fine.json")
    shutil.copy(root / "fine.json", root / "broken.json")
    _hostile(root, "outside", "/etc/passwd")
    shutil.copy(FIXTURES / "monthly" / "chunk10" / "tas_200102.nc", root / "lost.nc")
    write_dmrpp(root / "lost.nc")
    (root / "lost.nc").unlink()
    (tmp_path / "bugged.py").write_text(BUGGED)
    process, url = _serving(root, "--allow-source", str(FIXTURES),
                            cli=(str(tmp_path / "bugged.py"),))
    try:
        statuses = {name: _get(f"{url}/{name}/native/zarr.json")[0]
                    for name in ("fine", "broken", "lost.nc", "outside")}
    finally:
        err = _stopped(process)
    assert process.returncode == 0, err
    assert statuses == {"fine": 200, "broken": 500, "lost.nc": 502, "outside": 403}, err
    assert "3 of the first 200 checked cannot be served" in err
    for name, status in (("broken", 500), ("lost.nc", 502), ("outside", 403)):
        assert f"{name} answers {status}: " in err, err
    assert err.count("Traceback") == 1 and "ZeroDivisionError" in err


def test_the_cli_keeps_serving_beside_a_dmrpp_whose_fill_value_has_two_values(tmp_path):
    """The corpus's ``fileout__multi_fvalue.h5`` has a two-valued ``_FillValue``, which
    opening its DMR++ document once failed on with a bare ``TypeError`` — and ``refgrid
    serve`` exited at start-up. Whether that dataset opens or not, the service serves the
    others, and lists it (with why, where it cannot be opened)."""
    from dmrpp_docs import CORPUS

    if not CORPUS.is_dir():
        pytest.skip(f"the DMR++ corpus is absent ({CORPUS}); it ships beside the repo")
    root = tmp_path / "refs"
    _tas_refs(root / "fine.json")
    for name in ("fileout__multi_fvalue.h5", "fileout__multi_fvalue.h5.dmrpp"):
        shutil.copy(CORPUS / name, root / name)
    process, url = _serving(root, "--allow-source", str(FIXTURES))
    try:
        fine = _get(f"{url}/fine/native/tas/c/0/0/0")[0]
        status, _, body = _get(f"{url}/fileout__multi_fvalue.h5/native/zarr.json")
        index = _get(f"{url}/")[2].decode()
    finally:
        err = _stopped(process)
    assert process.returncode == 0 and fine == 200, err
    assert 'href="/fileout__multi_fvalue.h5/"' in index
    if status != 200:  # (the scanner's own fix may make it open)
        assert status == 500 and "fileout__multi_fvalue.h5" in json.loads(body)["error"]
        assert "unavailable (500)" in index
        assert "fileout__multi_fvalue.h5 answers 500: " in err


# -- the command line ------------------------------------------------------------------------

def test_cli_serves_until_sigterm_then_exits_cleanly(root, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "refgrid.cli", "serve", str(root), "--port", str(port),
         "--allow-source", str(FIXTURES)], stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                status = _get(f"http://127.0.0.1:{port}/healthz")[0]
                break
            except OSError:
                time.sleep(0.1)
        assert status == 200
        assert _get(f"http://127.0.0.1:{port}/archives/monthly_chunk10/native/tas/c/0/0/0"
                    )[0] == 200
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(e["path"].endswith("tas/c/0/0/0") and e["status"] == 200 for e in logged)


def test_clients_that_send_half_a_request_are_closed_and_healthz_keeps_answering(
        root, tmp_path):
    """A service limited to 128 descriptors, following an archive that grows meanwhile; 60
    new connections a second, each sending half a request line and then nothing, for 8 s
    (480 in all, each held until the server closes it): with a 1 s header timeout the
    server closes them, /healthz answers every time it is asked, and the files that land
    are appended. Without the bound the first ~120 such clients would hold every descriptor
    for good and nothing else would ever be answered."""
    import resource
    import socket
    import threading

    from archive_files import write_archive

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    landing = tmp_path / "landing"
    write_archive(landing, range(2))
    process = subprocess.Popen(
        [sys.executable, "-m", "refgrid.cli", "serve", str(root), "--port", str(port),
         "--header-timeout", "1", "--no-access-log", "--follow", f"tas={landing}/tas_*.nc",
         "--every", "1s", "--older-than", "0s", "--scheduler", "synchronous",
         "--state", str(tmp_path / "state")], stderr=subprocess.PIPE, text=True,
        preexec_fn=limited)
    stop, opened, closed = threading.Event(), [0], [0]

    def slow_clients() -> None:
        held: list[socket.socket] = []
        while not stop.is_set():
            for _ in range(30):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x")  # and nothing more
                s.setblocking(False)
                held.append(s)
                opened[0] += 1
            time.sleep(0.5)
            for s in list(held):  # closed by the server?
                try:
                    gone = s.recv(1) == b""
                except BlockingIOError:
                    gone = False
                except OSError:  # reset
                    gone = True
                if gone:
                    held.remove(s)
                    s.close()
                    closed[0] += 1
        for s in held:
            s.close()

    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
                break
            except OSError:
                time.sleep(0.1)
        attacker = threading.Thread(target=slow_clients, daemon=True)
        attacker.start()
        answers = []
        end = time.time() + 8
        arrivals = iter(range(2, 6))
        while time.time() < end:
            time.sleep(0.5)
            k = next(arrivals, None)
            if k is not None:
                write_archive(landing, [k])
            t0 = time.time()
            try:
                answers.append((_get(f"http://127.0.0.1:{port}/healthz")[0], time.time() - t0))
            except OSError as e:
                answers.append((repr(e), time.time() - t0))
        stop.set()
        attacker.join(10)
        deadline = time.time() + 20
        while time.time() < deadline:
            status = json.loads(_get(f"http://127.0.0.1:{port}/tas/status")[2])
            if status["files"] == 6:
                break
            time.sleep(0.2)
    finally:
        process.kill()
        process.communicate(timeout=10)
    assert status["files"] == 6 and not status["failed"], status  # followed all along
    assert opened[0] >= 400 and closed[0] >= opened[0] - 120  # the server closed them
    # every health check answered (one may wait behind slow clients for a descriptor)
    assert all(status == 200 and seconds < 5 for status, seconds in answers), answers


def test_cli_refuses_a_root_that_is_not_a_directory(tmp_path):
    result = subprocess.run([sys.executable, "-m", "refgrid.cli", "serve",
                             str(tmp_path / "nope")], capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_without_aiohttp_the_serve_extra_is_named(monkeypatch, tmp_path):
    import refgrid.serve

    monkeypatch.setitem(sys.modules, "aiohttp", None)
    with pytest.raises(refgrid.MissingExtraError, match="'serve' extra"):
        refgrid.serve.make_app(str(tmp_path))


def test_chunks_are_read_on_the_services_threads_never_on_its_loop(root, monkeypatch):
    """A chunk read (even one ``pread`` of a kept-open local file) runs on the service's
    worker threads: a slow disk never stalls the loop that answers every other request."""
    from refgrid.read.fetch import OpenFiles

    threads = []
    real = OpenFiles.pread

    def recorded(self, *args):
        threads.append(threading.current_thread().name)
        return real(self, *args)

    monkeypatch.setattr(OpenFiles, "pread", recorded)
    for served in start_refgrid_serve(root, allow_sources=(str(FIXTURES),), workers=2):
        for key in ("tas/c/4/0/0", "tas/c/5/0/0"):
            assert _get(f"{served.url}/archives/monthly_chunk10/native/{key}")[0] == 200
    assert threads and all(t.startswith("refgrid-serve") for t in threads), threads


def test_a_replaced_dataset_gives_back_its_files(tmp_path):
    target = tmp_path / "refs" / "tas.json"
    refgrid.write(refgrid.scan(FIXTURES / "monthly" / "chunk10" / "tas_200101.nc"), target)
    for served in start_refgrid_serve(tmp_path / "refs", allow_sources=(str(FIXTURES),),
                                      recheck=0.0):
        assert _get(f"{served.url}/tas/native/tas/c/1/0/0")[0] == 200
        catalog = served.app[CATALOG]
        first = catalog.opened["tas"]
        assert first.native.files._fds  # the source kept open for the next read
        time.sleep(0.05)
        refgrid.write(refgrid.scan(FIXTURES / "monthly" / "chunk10" / "tas_200102.nc"),
                      target)
        assert _get(f"{served.url}/tas/native/tas/c/1/0/0")[0] == 200
        assert catalog.opened["tas"] is not first and not first.native.files._fds


@pytest.mark.parametrize("sent, closed", [
    (b"GET / HTTP/1.1\r\nHost: x", True),  # half a head
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", False),  # a whole one
    (b"POST /a/refresh HTTP/1.1\r\nContent-Length: 5\r\n\r\n{\r\n\r\n", False),  # a body
    (b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n", False),  # pipelined
    (b"GET /a HTTP/1.1\r\n\r\nGET /b HTT", True),  # a second head, half sent
    (b"POST /a HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}GET /", True),  # then half a head
])
def test_the_head_deadline_closes_only_connections_with_a_head_half_sent(sent, closed):
    """The guard's own rule, on a real socket: a connection is closed when a request head
    has not ended within the deadline; bodies (Content-Length) and complete heads, pipelined
    or not, leave it open."""
    import asyncio
    import socket

    from refgrid.serve.guard import HeadDeadline

    async def main() -> bool:
        server = await asyncio.get_running_loop().create_server(
            lambda: HeadDeadline(asyncio.Protocol(), 0.3), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as s:
            for k in range(0, len(sent), 7):  # in pieces
                s.sendall(sent[k:k + 7])
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.8)
            s.setblocking(False)
            try:
                gone = s.recv(1) == b""
            except BlockingIOError:
                gone = False
            except OSError:
                gone = True
        server.close()
        await server.wait_closed()
        return gone

    assert asyncio.run(main()) is closed

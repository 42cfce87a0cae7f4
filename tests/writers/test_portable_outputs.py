"""Outputs every reader opens: padded chunks rewritten, classic kerchunk (Zarr v2) references,
Icechunk repositories, and every emitted ``zarr.json`` checked by the field's validators."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import pytest
import xarray as xr
import zarr
from zarr_metadata.model import (
    read_array_metadata_v2,
    read_array_metadata_v3,
    read_group_metadata_v3,
)

import refgrid
from ground_truth import ground_truth, restore, same
from helpers import FIXTURES, closed, data_files, killed
from refgrid.combining import combine
from refgrid.errors import ReadError, WriteError
from refgrid.writers import save
from tests.combining.test_combine import ARCHIVES, _files
from zarr32_rule import read_array

PADDED_ARCHIVES = [a for a, (_, encoded, _) in ARCHIVES.items() if encoded]
SINGLE_FILES = data_files(FIXTURES)
RAW = {"mask_and_scale": False, "decode_times": False}
EXTENSION = "chunk_grid.configuration.encoded_chunk_shapes"
"""refgrid's one deliberate extension of the rectilinear grid (zarr-extensions #74/#75)."""


def _group(archive):
    return combine([refgrid.scan(f) for f in _files(archive)], "time")


def _expected(archive, **kwargs):
    return closed(xr.open_mfdataset(_files(archive), combine="nested", concat_dim="time",
                             data_vars="minimal", compat="equals", **kwargs))


def _documents(refs: dict) -> dict[str, dict]:
    return {k: json.loads(v) for k, v in refs["refs"].items() if k.endswith("zarr.json")}


# -- padded="rewrite" ---------------------------------------------------------------------

@pytest.mark.parametrize("inline_limit", [0, 4096], ids=["files", "inline"])
@pytest.mark.parametrize("archive", ARCHIVES)
def test_rewrite_output_reads_like_the_source_everywhere(archive, inline_limit, tmp_path):
    saved = save(_group(archive), tmp_path / "refs.json", padded="rewrite",
                 inline_limit=inline_limit)
    refs = json.loads(saved.path.read_text())
    for doc in _documents(refs).values():
        assert "encoded_chunk_shapes" not in json.dumps(doc)
    raw = _expected(archive, **RAW)
    engine = xr.open_dataset(saved.path, engine="refgrid", **RAW)
    for key, want in raw.variables.items():
        if ARCHIVES[archive][2]:  # same encoding in every file: raw values compare
            np.testing.assert_array_equal(engine[key].values, want.values, err_msg=key)
            np.testing.assert_array_equal(read_array(refs, key), want.values, err_msg=key)
    decoded = _expected(archive)
    for ours in (xr.open_dataset(saved.path, engine="refgrid"),
                 xr.open_dataset(refgrid.get_mapper(saved.path, unpack=True), engine="zarr")):
        for key, want in decoded.variables.items():
            if want.dtype.kind == "f":  # the view unpacks in float64, xarray in float32
                np.testing.assert_allclose(ours[key].values, want.values, rtol=1e-6,
                                           err_msg=key)
            else:
                np.testing.assert_array_equal(ours[key].values, want.values, err_msg=key)
    rewrite = saved.rewrite
    assert rewrite is not None
    padded = archive in PADDED_ARCHIVES
    assert (rewrite.chunks > 0) == padded
    files = sorted(p for p in (tmp_path / "refs.json.chunks").rglob("*") if p.is_file()) \
        if rewrite.directory else []
    assert len(files) == rewrite.chunks - rewrite.inline
    assert sum(p.stat().st_size for p in files) <= rewrite.bytes
    if padded and inline_limit == 0:
        assert rewrite.inline == 0 and files and rewrite.directory.parent == tmp_path / \
            "refs.json.chunks"
        assert str(rewrite).startswith(f"rewrote {rewrite.chunks} padded chunk(s) of tas")


@pytest.mark.parametrize("archive", PADDED_ARCHIVES)
def test_zarr_32_rule_fails_on_encoded_padding_and_reads_the_rewrite(archive, tmp_path):
    """The rule test can fail: on ``padded="encoded"`` it raises as zarr 3.2 does."""
    group = _group(archive)
    encoded = refgrid.to_kerchunk(group)
    with pytest.raises(ValueError, match="cannot reshape"):
        read_array(encoded, "tas")
    rewritten = json.loads(refgrid.write(group, tmp_path / "r.json", padded="rewrite",
                                         inline_limit=0).read_text())
    want = _expected(archive, **RAW)["tas"].values
    if ARCHIVES[archive][2]:
        np.testing.assert_array_equal(read_array(rewritten, "tas"), want)


def test_rewrite_sidecar_is_replaced_whole_and_removed_when_not_needed(tmp_path):
    group = _group("monthly/chunk10")
    target = tmp_path / "refs.json"
    first = save(group, target, padded="rewrite", inline_limit=0).rewrite
    again = save(group, target, padded="rewrite", inline_limit=0).rewrite
    assert first.directory == again.directory  # same chunks, same directory
    assert [p.name for p in (tmp_path / "refs.json.chunks").iterdir()] == [
        first.directory.name]
    save(group, target, padded="encoded")  # the sidecar goes
    assert not (tmp_path / "refs.json.chunks").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["refs.json"]


def test_rewrite_of_parquet_references(tmp_path):
    saved = save(_group("yearly/chunk100"), tmp_path / "refs.parq", padded="rewrite",
                 inline_limit=0)
    assert saved.rewrite.directory.parent == tmp_path / "refs.parq.chunks"
    assert "encoded_chunk_shapes" not in (tmp_path / "refs.parq" / ".zmetadata").read_text()
    ours = xr.open_dataset(saved.path, engine="refgrid", **RAW)
    np.testing.assert_array_equal(ours.tas.values,
                                  _expected("yearly/chunk100", **RAW).tas.values)


def test_a_changed_sidecar_chunk_is_a_read_error(tmp_path):
    saved = save(_group("monthly/chunk10"), tmp_path / "refs.json", padded="rewrite",
                 inline_limit=0)
    chunk = next(p for p in saved.rewrite.directory.rglob("*") if p.is_file())
    chunk.write_bytes(chunk.read_bytes()[:-1])
    with pytest.raises(ReadError, match=str(chunk.name)):
        xr.open_dataset(saved.path, engine="refgrid").tas.values  # noqa: B018


def test_a_failed_rewrite_keeps_the_old_output_and_leaves_nothing(tmp_path):
    sources = tmp_path / "src"
    shutil.copytree(FIXTURES / "monthly" / "chunk10", sources)
    group = combine([refgrid.scan(p) for p in sorted(sources.glob("*.nc"))], "time")
    target = tmp_path / "refs.json"
    first = save(group, target, padded="rewrite", inline_limit=0)
    before = target.read_bytes()
    (sources / "tas_200103.nc").unlink()  # holds a padded chunk
    with pytest.raises(ReadError, match=r"tas_200103\.nc"):
        save(group, target, padded="rewrite", inline_limit=0)
    assert target.read_bytes() == before
    assert [p.name for p in (tmp_path / "refs.json.chunks").iterdir()] == [
        first.rewrite.directory.name]


def test_rewrite_is_an_option_of_combine_and_batch(tmp_path):
    files = [str(p) for p in _files("monthly/chunk10")]
    out = tmp_path / "c.json"
    done = subprocess.run([sys.executable, "-m", "refgrid.cli", "combine", *files, "-o",
                           str(out), "--padded", "rewrite"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "rewrote 7 padded chunk(s) of tas" in done.stdout
    result = refgrid.batch(files, tmp_path / "b.json", padded="rewrite", progress=False,
                           workers=1)
    assert result.rewritten.startswith("rewrote 7 padded chunk(s)")
    for path in (out, tmp_path / "b.json"):
        assert "encoded_chunk_shapes" not in path.read_text()
    with pytest.raises(WriteError, match="padded"):
        refgrid.write(_group("monthly/chunk10"), tmp_path / "x.json", padded="crop")


# -- classic kerchunk (Zarr v2) -----------------------------------------------------------

def _v2_root(path: Path):
    fs = fsspec.filesystem("reference", fo=str(path), remote_protocol="file")
    return zarr.open_group(fs.get_mapper(""), mode="r", zarr_format=2)


@pytest.mark.parametrize("suffix", [".json", ".parq"])
@pytest.mark.parametrize("source", SINGLE_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_classic_kerchunk_reads_like_the_source(source, suffix, tmp_path):
    group = refgrid.scan(source, on_error="report")
    target = tmp_path / f"refs{suffix}"
    irregular = [p for p, n in group.walk()
                 if isinstance(n, refgrid.VirtualArray) and not n.grid.is_regular]
    if irregular:
        with pytest.raises(WriteError, match=f"array {irregular[0]!r}: kerchunk-v2 output "
                                             "needs regular chunk grids"):
            refgrid.write(group, target, format="kerchunk-v2")
        assert not target.exists()
        return
    refgrid.write(group, target, format="kerchunk-v2")
    root = _v2_root(target)
    truth = ground_truth(source)
    expected = [p for p, n in group.walk() if isinstance(n, refgrid.VirtualArray)]
    assert {name for name, _ in root.arrays()} == {p for p in expected if "/" not in p}
    read = {p: root[p] for p in expected}  # (zarr 3.1 lists no nested group of this fs)
    for path, array in read.items():
        if isinstance(truth.get(path), np.ndarray):
            node = group[path]
            assert same(restore(array[...], dict(node.attrs)), truth[path]), path


def test_classic_kerchunk_opens_in_xarray_and_combines_with_multizarrtozarr(tmp_path):
    from kerchunk.combine import MultiZarrToZarr

    files = _files("netcdf3/classic")
    singles = []
    for f in files:
        refgrid.write(refgrid.scan(f), tmp_path / f"{f.stem}.json", format="kerchunk-v2")
        singles.append(json.loads((tmp_path / f"{f.stem}.json").read_text()))
    for f in files:  # kerchunk's own xarray engine: identical, attributes and all
        xr.testing.assert_identical(
            xr.open_dataset(str(tmp_path / f"{f.stem}.json"), engine="kerchunk").load(),
            closed(xr.open_dataset(f)))
    combined = MultiZarrToZarr(singles, concat_dims=["time"],
                               identical_dims=["lat", "lon", "land"]).translate()
    ours = xr.open_dataset(fsspec.filesystem("reference", fo=combined).get_mapper(""),
                           engine="zarr", consolidated=False, zarr_format=2, **RAW)
    expected = _expected("netcdf3/classic", **RAW)
    for key, want in expected.variables.items():
        np.testing.assert_array_equal(ours[key].values, want.values, err_msg=key)


def test_refgrid_reads_its_classic_kerchunk_output(tmp_path):
    source = FIXTURES / "features" / "hdf5_filters.h5"  # lzf, szip, bitshuffle...: v2 ids
    refs = refgrid.write(refgrid.scan(source), tmp_path / "v2.json", format="kerchunk-v2")
    ours = xr.open_dataset(refs, engine="refgrid")
    truth = ground_truth(source)
    assert set(ours.data_vars) == set(truth)
    for name, values in truth.items():
        np.testing.assert_array_equal(ours[name].values, values, err_msg=name)


def test_classic_kerchunk_refuses_a_rectilinear_archive_naming_the_array(tmp_path):
    with pytest.raises(WriteError, match="array 'tas': kerchunk-v2 output needs regular chunk "
                                         "grids, but its chunks along 'time' have lengths"):
        refgrid.write(_group("monthly/chunkfile"), tmp_path / "x.json", format="kerchunk-v2")
    assert list(tmp_path.iterdir()) == []


# -- Icechunk -----------------------------------------------------------------------------

def _local_repo(path, prefix):
    import icechunk

    from refgrid.writers.icechunk import local_access

    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(
        prefix, icechunk.local_filesystem_store(prefix.removeprefix("file://"))))
    return icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)), config,
                                      {prefix: local_access(icechunk)})


@pytest.fixture
def classic_copy(tmp_path):
    sources = tmp_path / "sources"
    shutil.copytree(FIXTURES / "netcdf3" / "classic", sources)
    return sorted(sources.glob("*.nc"))


def _check_icechunk(repo, snapshots, files):
    store = repo.readonly_session("main").store
    assert "tas" in zarr.open_group(store, mode="r")
    latest = xr.open_zarr(store, consolidated=False, **RAW)
    expected = closed(xr.open_mfdataset(files, combine="nested", concat_dim="time",
                                 data_vars="minimal", compat="equals", **RAW))
    for key, want in expected.variables.items():
        np.testing.assert_array_equal(latest[key].values, want.values, err_msg=key)
    first = xr.open_zarr(repo.readonly_session(snapshot_id=snapshots[0]).store,
                         consolidated=False, **RAW)
    assert first.sizes["time"] == sum(closed(xr.open_dataset(f)).sizes["time"] for f in files[:2])
    np.testing.assert_array_equal(first.tas.values, expected.tas.values[:first.sizes["time"]])


def test_icechunk_write_append_as_a_commit_and_time_travel(classic_copy, tmp_path):
    repo = _local_repo(tmp_path / "repo", f"file://{classic_copy[0].parent}/")
    two = combine([refgrid.scan(f) for f in classic_copy[:2]], "time")
    first = refgrid.write(two, repo, message="January and February")
    second = refgrid.write(combine([refgrid.scan(f) for f in classic_copy], "time"), repo,
                           message="March appended")
    messages = [c.message for c in repo.ancestry(branch="main")]
    assert messages[:2] == ["March appended", "January and February"]
    _check_icechunk(repo, [first, second], classic_copy)


def test_icechunk_detects_a_changed_source(classic_copy, tmp_path):
    repo = _local_repo(tmp_path / "repo", f"file://{classic_copy[0].parent}/")
    refgrid.write(combine([refgrid.scan(f) for f in classic_copy], "time"), repo)
    later = classic_copy[1].stat().st_mtime + 5
    os.utime(classic_copy[1], (later, later))
    ds = xr.open_zarr(repo.readonly_session("main").store, consolidated=False)
    with pytest.raises(Exception, match=r"(?i)modified|changed"):
        ds.tas.values  # noqa: B018


def test_icechunk_1_refuses_rectilinear_arrays(tmp_path):
    """Icechunk 1.x (Python 3.11) stores regular grids only; Icechunk 2 stores rectilinear
    ones (tests/acceptance/test_current_stack.py)."""
    import icechunk

    from refgrid.writers.icechunk import rectilinear_supported

    if rectilinear_supported(icechunk):
        pytest.skip(f"Icechunk {icechunk.__version__} stores rectilinear grids")
    repo = _local_repo(tmp_path / "repo", f"file://{FIXTURES}/")
    with pytest.raises(WriteError, match=r"array 'tas': Icechunk 1\.[\d.]+ output \(Icechunk "
                                         r">= 2, on Python >= 3\.12, stores rectilinear grids\) "
                                         "needs regular chunk"):
        refgrid.write(_group("monthly/chunkfile"), repo)


def test_batch_appends_to_an_icechunk_repository(classic_copy, tmp_path):
    import icechunk

    from refgrid.writers.icechunk import local_access

    out = tmp_path / "tas.icechunk"
    cli = [sys.executable, "-m", "refgrid.cli", "batch", "-q", "--workers", "1", "--icechunk",
           "-o", str(out)]
    done = subprocess.run([*cli, *map(str, classic_copy[:2]), "-m", "two months"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([*cli, *map(str, classic_copy), "-m", "a month more"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "committed snapshot" in done.stdout
    shared = f"file://{classic_copy[0].parent.resolve()}/"  # the CLI's container
    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(str(out)),
                                    authorize_virtual_chunk_access={shared: local_access(icechunk)})
    snapshots = [c.id for c in repo.ancestry(branch="main")]
    _check_icechunk(repo, [snapshots[1], snapshots[0]], classic_copy)


def test_icechunk_repository_on_s3(s3_server, classic_copy):
    import icechunk

    endpoint = s3_server.endpoint
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing"
                 ).create_bucket(Bucket="icechunk")
    storage = icechunk.s3_storage(bucket="icechunk", prefix="tas", endpoint_url=endpoint,
                                  allow_http=True, region="us-east-1", force_path_style=True,
                                  access_key_id="testing", secret_access_key="testing")
    prefix = f"file://{classic_copy[0].parent}/"
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(
        prefix, icechunk.local_filesystem_store(str(classic_copy[0].parent))))
    from refgrid.writers.icechunk import local_access

    repo = icechunk.Repository.create(storage, config, {prefix: local_access(icechunk)})
    first = refgrid.write(combine([refgrid.scan(f) for f in classic_copy[:2]], "time"), repo)
    second = refgrid.write(combine([refgrid.scan(f) for f in classic_copy], "time"),
                           repo.writable_session("main"), message="session commit")
    reopened = icechunk.Repository.open(storage, authorize_virtual_chunk_access={
        prefix: local_access(icechunk)})
    _check_icechunk(reopened, [first, second], classic_copy)


# -- validation of every zarr.json --------------------------------------------------------

def _problems(doc: dict) -> list[str]:
    reader = {"array": read_array_metadata_v3, "group": read_group_metadata_v3}[
        doc["node_type"]]
    return [str(p) for p in reader(doc).problems]


def _check_documents(docs: dict[str, dict], rectilinear_schema) -> set[str]:
    """Every document valid but for the documented extension; which extensions were seen."""
    import jsonschema

    seen = set()
    for key, doc in docs.items():
        problems = _problems(doc)
        if doc.get("chunk_grid", {}).get("name") == "rectilinear":
            jsonschema.validate(doc["chunk_grid"], rectilinear_schema)
        if "encoded_chunk_shapes" in doc.get("chunk_grid", {}).get("configuration", {}):
            assert len(problems) == 1 and problems[0].startswith(EXTENSION), (key, problems)
            seen.add(EXTENSION)
        else:
            assert problems == [], (key, problems)
    return seen


def test_every_zarr_json_refgrid_writes_is_valid(tmp_path, rectilinear_schema):
    seen: set[str] = set()
    for source in SINGLE_FILES:
        group = refgrid.scan(source, on_error="report")
        seen |= _check_documents(_documents(refgrid.to_kerchunk(group)), rectilinear_schema)
        mapper = refgrid.get_mapper(refgrid.to_kerchunk(group))
        seen |= _check_documents({k: json.loads(mapper[k]) for k in mapper
                                  if k.endswith("zarr.json")}, rectilinear_schema)
    for archive in ARCHIVES:
        group = _group(archive)
        for padded in ("encoded", "rewrite"):
            target = tmp_path / f"{archive.replace('/', '_')}-{padded}.json"
            refgrid.write(group, target, padded=padded)
            docs = _documents(json.loads(target.read_text()))
            found = _check_documents(docs, rectilinear_schema)
            assert found == ({EXTENSION} if padded == "encoded" and archive in PADDED_ARCHIVES
                             else set())
            seen |= found
        seen |= _check_documents(_documents(refgrid.to_kerchunk(group,
                                                                grid_form="rectilinear")),
                                 rectilinear_schema)
    assert seen == {EXTENSION}  # the one deliberate extension, and only where needed


def test_every_zarr_v2_document_of_classic_kerchunk_is_valid(tmp_path):
    for source in SINGLE_FILES:
        group = refgrid.scan(source, on_error="report")
        try:
            refs = refgrid.write(group, tmp_path / "v2.json", format="kerchunk-v2")
        except WriteError:
            continue  # rectilinear: refused (tested above)
        table = json.loads(refs.read_text())["refs"]
        for key, value in table.items():
            if key.endswith(".zarray"):
                problems = read_array_metadata_v2(json.loads(value)).problems
                assert not problems, (source, key, [str(p) for p in problems])


def test_batch_to_icechunk_refuses_options_it_cannot_honour(tmp_path):
    repo = _local_repo(tmp_path / "repo", f"file://{FIXTURES}/")
    files = [str(p) for p in _files("netcdf3/classic")]
    with pytest.raises(refgrid.ArgumentError, match="needs work_dir"):
        refgrid.batch(files, repo, progress=False)
    with pytest.raises(refgrid.ArgumentError, match="no format= "):
        refgrid.batch(files, repo, work_dir=tmp_path / "w", format="json", progress=False)
    with pytest.raises(refgrid.ArgumentError, match="no padded='encoded': Icechunk decodes"):
        refgrid.batch(files, repo, work_dir=tmp_path / "w", padded="encoded", progress=False)


def test_icechunk_without_its_extra_names_it(monkeypatch, tmp_path):
    from refgrid.writers.icechunk import local_repository

    monkeypatch.setitem(sys.modules, "icechunk", None)
    with pytest.raises(refgrid.MissingExtraError, match="'icechunk' extra"):
        local_repository(tmp_path / "repo", [])


def test_classic_kerchunk_from_the_command_line_and_batch(tmp_path):
    source = FIXTURES / "netcdf3" / "classic" / "tas_200101.nc"
    out = tmp_path / "one.json"
    done = subprocess.run([sys.executable, "-m", "refgrid.cli", "scan", str(source), "-o",
                           str(out), "--format", "kerchunk-v2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "tas/.zarray" in json.loads(out.read_text())["refs"]
    result = refgrid.batch([str(p) for p in _files("netcdf3/classic")], tmp_path / "all.parq",
                           format="kerchunk-v2", progress=False, workers=1)
    ours = xr.open_dataset(fsspec.filesystem("reference", fo=str(result.output),
                                             remote_protocol="file").get_mapper(""),
                           engine="zarr", consolidated=False, zarr_format=2, **RAW)
    expected = _expected("netcdf3/classic", **RAW)
    for key, want in expected.variables.items():
        np.testing.assert_array_equal(ours[key].values, want.values, err_msg=key)


KILLED_REWRITE = """
import sys, time
import refgrid
import refgrid.read.cropped as padded
from refgrid.combining import combine
from refgrid.writers import save

calls = []
crop = padded.Cropper._cropped

def slow(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:  # the first chunk file is written: stop here until killed
        print("writing", flush=True)
        time.sleep(60)
    return crop(*args, **kwargs)

padded.Cropper._cropped = slow
group = combine([refgrid.scan(f) for f in sys.argv[2:]], "time")
save(group, sys.argv[1], padded="rewrite", inline_limit=0)
"""


def test_a_rewrite_killed_midway_leaves_the_old_output_and_no_litter(tmp_path):
    files = _files("monthly/chunk10")
    target = tmp_path / "refs.json"
    first = save(combine([refgrid.scan(f) for f in files[:6]], "time"), target,
                 padded="rewrite", inline_limit=0)
    before = target.read_bytes()
    process = subprocess.Popen([sys.executable, "-c", KILLED_REWRITE, str(target),
                                *map(str, files)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "writing"
    finally:
        killed(process)
    sidecar = tmp_path / "refs.json.chunks"
    staged = [p for p in sidecar.iterdir() if p.name.startswith(".staging")]
    assert staged and any(p.is_file() for p in staged[0].rglob("*"))  # killed mid-write
    assert target.read_bytes() == before  # the old output, whole, with its chunk files
    np.testing.assert_array_equal(
        xr.open_dataset(target, engine="refgrid", **RAW).tas.values,
        closed(xr.open_mfdataset(files[:6], combine="nested", concat_dim="time", **RAW)).tas.values)
    again = save(combine([refgrid.scan(f) for f in files], "time"), target, padded="rewrite",
                 inline_limit=0)
    assert [p.name for p in sidecar.iterdir()] == [again.rewrite.directory.name]
    assert again.rewrite.directory != first.rewrite.directory


def test_icechunk_with_sources_on_s3_checks_their_etags(s3_server, tmp_path):
    """Repository and sources on moto S3; a source overwritten after the commit (new ETag) is
    refused by Icechunk itself."""
    import icechunk

    files = _files("netcdf3/classic")
    urls = [s3_server.upload(f, f"icechunk-sources/{f.name}") for f in files]
    options = s3_server.storage_options
    group = combine([refgrid.scan(u, **options) for u in urls], "time", storage_options=options)
    assert all("etag" in identity for identity in group.sources.values())
    prefix = f"s3://{s3_server.bucket}/icechunk-sources/"
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(prefix, icechunk.s3_store(
        endpoint_url=s3_server.endpoint, allow_http=True, region="us-east-1",
        force_path_style=True)))
    credentials = icechunk.containers_credentials({prefix: icechunk.s3_static_credentials(
        access_key_id="testing", secret_access_key="testing")})
    storage = icechunk.s3_storage(bucket=s3_server.bucket, prefix="icechunk-repo",
                                  endpoint_url=s3_server.endpoint, allow_http=True,
                                  region="us-east-1", force_path_style=True,
                                  access_key_id="testing", secret_access_key="testing")
    repo = icechunk.Repository.create(storage, config, credentials)
    refgrid.write(group, repo, message="three months from S3")
    ds = xr.open_zarr(repo.readonly_session("main").store, consolidated=False, **RAW)
    np.testing.assert_array_equal(ds.tas.values, _expected("netcdf3/classic", **RAW).tas.values)
    s3_server.upload(files[0], "icechunk-sources/" + files[1].name)  # another object now
    stale = xr.open_zarr(repo.readonly_session("main").store, consolidated=False)
    with pytest.raises(Exception, match=r"(?i)modified|changed|etag|match"):
        stale.tas.values  # noqa: B018

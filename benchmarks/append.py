"""Appending to a parquet archive of 10^3, 10^4 and 10^5 files: 1 file, then 10 more.

Each archive is the real thing a batch builds — a work directory of records and parquet
references — made once (cached under ``_data/``) from synthetic records: one real NetCDF
file of 30 daily steps, hard-linked once per archive file (a copy per 50,000 links, so
every reference reads real bytes), whose record carries that file's own times. The
appended files are real NetCDF files with the following days, landing in the archive's
directory; ``refgrid.batch`` (in-process scans) lists every file, scans the new ones and
appends — or is given the new files only (``append=True``) and appends them. Each case is
the median of :data:`REPEATS` appends, after one not timed. Targets on 2 cores (for each
way): the append to 10^5 files within 1.5x the append to 10^3, and one file appended to
10^5 files in <= 1 s. Peers in the same run: the rebuild an append replaces (every record
combined), kerchunk's way (the new file's references, then ``MultiZarrToZarr`` over every
file's again; up to 10^4 files), and VirtualiZarr + Icechunk appending one file along time
(``to_icechunk(append_dim="time")``), its values checked against the files'.

    python benchmarks/append.py [SIZE ...]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("ICECHUNK_LOG", "error")  # (its warnings about local storage)

import numpy as np
import xarray  # noqa: F401 - imported by the batch's time decoding: not part of what is timed

import refgrid
from _common import DATA
from refgrid.archive.journal import Journal
from refgrid.archive.record import dumps
from refgrid.archive.task import values_digest
from refgrid.combining import with_inline_coordinates
from refgrid.core.inputs import expand
from refgrid.model.manifest import ManifestBuilder
from refgrid.model.virtual import VirtualArray
from refgrid.read.array import read

SIZES = [1000, 10_000, 100_000]
STEPS = 30
UNITS = "days since 2000-01-01"
TARGET_RATIO, TARGET_ONE = 1.5, 1.0
LINKS = 50_000


def write_file(path: Path, first_day: int) -> Path:
    import netCDF4

    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("time", None)
        ds.createDimension("lat", 4)
        ds.createDimension("lon", 5)
        time_ = ds.createVariable("time", "f8", ("time",))
        time_.units, time_.calendar = UNITS, "standard"
        time_[:] = np.arange(first_day, first_day + STEPS, dtype="f8")
        ds.createVariable("lat", "f4", ("lat",))[:] = np.arange(4)
        ds.createVariable("lon", "f4", ("lon",))[:] = np.arange(5)
        tas = ds.createVariable("tas", "f4", ("time", "lat", "lon"), zlib=True,
                                chunksizes=(7, 4, 5))
        tas[:] = np.random.default_rng(first_day).random((STEPS, 4, 5), dtype="f4")
    return path


def build(size: int) -> Path:
    """The archive of ``size`` files, its references and work directory (made once)."""
    root = DATA / f"append{size}"
    if (root / "tas.parq.report.json").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    (root / "files").mkdir(parents=True)
    template = write_file(root / "template.nc", 0)
    scanned = with_inline_coordinates(refgrid.scan(template), "time", {})
    digests = {p: values_digest(read(a)) for p, a in scanned.walk()
               if isinstance(a, VirtualArray) and "time" not in a.dims}
    links = [root / "files" / f"tas_{k:06d}.nc" for k in range(size)]
    for k, link in enumerate(links):
        if k % LINKS == 0 and k:  # a file system's limit of links to one file
            template = Path(shutil.copy2(root / "template.nc", root / f"template{k}.nc"))
        os.link(template, link)
    identities = expand([str(root / "files" / "tas_*.nc")], {})
    with Journal(root / "tas.parq.parts") as journal:
        for k, link in enumerate(links):
            url = str(link)
            arrays = {}
            for name, array in scanned.arrays.items():
                if name == "time":
                    built = ManifestBuilder(array.manifest.shape)
                    days = np.arange(k * STEPS, (k + 1) * STEPS, dtype="<f8")
                    built.inlined((0,), days.tobytes())
                    arrays[name] = replace(array, manifest=built.build())
                elif array.manifest.paths:
                    arrays[name] = replace(array, manifest=replace(array.manifest,
                                                                   paths=(url,)))
            group = replace(scanned.with_arrays(arrays), sources={url: identities[url]})
            journal.append({"url": url, "identity": identities[url],  # type: ignore[typeddict-item]
                            "first": [float(k * STEPS), UNITS, "standard"]},
                           dumps(group, digests))
    refgrid.batch(str(root / "files" / "tas_*.nc"), root / "tas.parq", progress=False,
                  scheduler="synchronous")
    return root


def appended(root: Path, size: int, count: int, work: Path,
             rebuild: bool = False, named: bool = False) -> tuple[float, str]:
    """Seconds to append ``count`` real files to a copy of the archive at ``root`` — or,
    with ``rebuild``, to bring it up to date by combining every record again (what an
    append replaces: here an output written anew from the same work directory, so only the
    new files are scanned). ``named``: the batch is given the new files only
    (``append=True``) instead of the archive's pattern, which it lists and checks."""
    shutil.copytree(root / "tas.parq.parts", work / "tas.parq.parts")
    if not rebuild:
        shutil.copytree(root / "tas.parq", work / "tas.parq")
        shutil.copy2(root / "tas.parq.report.json", work)
    new = [write_file(root / "files" / f"tas_{k:06d}.nc", k * STEPS)
           for k in range(size, size + count)]  # (where the archive grows; removed after)
    os.sync()  # (the copy's pages on disk, as an archive's are: an append's fsync is its own)
    try:
        t0 = time.perf_counter()
        result = refgrid.batch([str(p) for p in new] if named else
                               str(root / "files" / "tas_*.nc"), work / "tas.parq",
                               progress=False, scheduler="synchronous", append=named)
        return time.perf_counter() - t0, result.update or ""
    finally:
        for path in new:
            path.unlink()


def kerchunk_appended(root: Path, size: int, count: int, work: Path) -> float:
    """Seconds kerchunk takes to add ``count`` files: their references
    (``SingleHdf5ToZarr``), then ``MultiZarrToZarr`` over every file's references again,
    written as JSON — the earlier files' references made beforehand, as a kerchunk workflow
    keeps them (here the template's, each with its own URL and times). Timing only: with
    30 steps in chunks of 7, kerchunk's combine places the chunks wrongly."""
    import base64
    import json

    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.hdf import SingleHdf5ToZarr

    template = SingleHdf5ToZarr(str(root / "template.nc"), inline_threshold=8192).translate()
    stored = template["refs"]["time/0"]  # a chunk of the file's (unlimited: padded) times
    padded = bytearray(base64.b64decode(stored[len("base64:"):]) if stored.startswith(
        "base64:") else stored.encode())
    earlier = []
    for k in range(size):
        refs = {key: ([str(root / "files" / f"tas_{k:06d}.nc"), *value[1:]]
                      if isinstance(value, list) else value)
                for key, value in template["refs"].items()}
        padded[:STEPS * 8] = np.arange(k * STEPS, (k + 1) * STEPS, dtype="<f8").tobytes()
        refs["time/0"] = "base64:" + base64.b64encode(padded).decode()
        earlier.append({"version": 1, "refs": refs})
    files = work / "new"
    files.mkdir()
    new = [write_file(files / f"tas_{k:06d}.nc", k * STEPS) for k in range(size, size + count)]
    t0 = time.perf_counter()
    added = [SingleHdf5ToZarr(str(f), inline_threshold=8192).translate() for f in new]
    combined = MultiZarrToZarr([*earlier, *added], concat_dims=["time"],
                               identical_dims=["lat", "lon"]).translate()
    (work / "refs.json").write_text(json.dumps(combined))
    return time.perf_counter() - t0


def virtualizarr_appended(root: Path, work: Path) -> str:
    """What VirtualiZarr + Icechunk do with the same files: each opened virtually and
    appended along time (``to_icechunk(append_dim="time")``)."""
    try:
        import icechunk
        from obstore.store import LocalStore
        from virtualizarr import open_virtual_dataset
        from virtualizarr.parsers import HDFParser
        try:
            from obspec_utils.registry import ObjectStoreRegistry
        except ImportError:
            from virtualizarr.registry import ObjectStoreRegistry  # older releases
    except ImportError as e:
        return f"not run ({e})"
    files = work / "vz"
    files.mkdir()
    paths = [write_file(files / f"tas_{k:06d}.nc", k * STEPS) for k in range(2)]
    registry = ObjectStoreRegistry({"file://": LocalStore()})
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(
        f"file://{files}/", icechunk.local_filesystem_store(str(files))))
    access = getattr(icechunk.credentials, "LocalFileSystemAccess", None)
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(work / "repo")),
                                      config, {f"file://{files}/": access})
    seconds = 0.0
    try:
        for k, path in enumerate(paths):
            t0 = time.perf_counter()
            vds = open_virtual_dataset(f"file://{path}", registry=registry, parser=HDFParser())
            session = repo.writable_session("main")
            vds.vz.to_icechunk(session.store, **({"append_dim": "time"} if k else {}))
            session.commit(f"file {k}")
            seconds = time.perf_counter() - t0
    except Exception as e:  # what it says about files whose length is no chunk multiple
        return f"refused: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    import xarray as xr
    import zarr

    with zarr.config.set({"array.rectilinear_chunks": True}), \
            xr.open_zarr(repo.readonly_session("main").store, consolidated=False) as got, \
            xr.open_mfdataset(paths, combine="nested", concat_dim="time") as want:
        wrong = int((got.tas.values != want.tas.values).sum())
    return f"one file appended in {seconds:.3f} s; " + (
        "values as the files'" if not wrong else f"{wrong:,} of {want.tas.size:,} values "
        "differ from the files' (silently: the chunks are placed as if each file's length "
        "were a multiple of its chunks)")


KERCHUNK_MAX = 10_000
"""kerchunk's combine of every file again is run up to this size (10^5: many minutes)."""


REPEATS = 3
"""Appends timed per case (the median is reported), after one not timed: the first append
in a process pays for imports and caches, which no append of a running service does."""


def main(sizes: list[int]) -> None:
    ones: dict[bool, dict[int, float]] = {False: {}, True: {}}
    with tempfile.TemporaryDirectory() as tmp:  # (warm-up: imports, caches)
        appended(build(min(sizes)), min(sizes), 1, Path(tmp), named=True)
    for size in sizes:
        root = build(size)
        for named in (True, False):
            for count in (1, 10):
                times = []
                for _ in range(REPEATS):
                    with tempfile.TemporaryDirectory() as tmp:
                        seconds, how = appended(root, size, count, Path(tmp), named=named)
                    times.append(seconds)
                seconds = float(np.median(times))
                given = "the new files named" if named else "the pattern listed"
                print(f"{size:>7} files: append {count:>2} file(s) {seconds:7.3f} s, median of "
                      f"{REPEATS} ({min(times):.3f}-{max(times):.3f})  ({given}; {how})",
                      flush=True)
                if count == 1:
                    ones[named][size] = seconds
        with tempfile.TemporaryDirectory() as tmp:
            seconds, _ = appended(root, size, 1, Path(tmp), rebuild=True)
        print(f"{'':>7}        the same, rebuilt (every record combined): {seconds:7.3f} s",
              flush=True)
        if size <= KERCHUNK_MAX:
            with tempfile.TemporaryDirectory() as tmp:
                seconds = kerchunk_appended(root, size, 1, Path(tmp))
            print(f"{'':>7}        kerchunk (MultiZarrToZarr over every file): "
                  f"{seconds:7.3f} s", flush=True)
        else:
            print(f"{'':>7}        kerchunk: not run above {KERCHUNK_MAX:,} files", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"VirtualiZarr + Icechunk, appending these files along time: "
              f"{virtualizarr_appended(DATA, Path(tmp))}", flush=True)
    for named, times in ones.items():
        if 1000 in times and 100_000 in times:
            ratio = times[100_000] / times[1000]
            print(f"append 1 file, {'named' if named else 'listed'}: at 10^5 / at 10^3 "
                  f"{ratio:.2f}x (target <= {TARGET_RATIO}x: "
                  f"{'met' if ratio <= TARGET_RATIO else 'MISSED'}); at 10^5: "
                  f"{times[100_000]:.3f} s (target <= {TARGET_ONE} s: "
                  f"{'met' if times[100_000] <= TARGET_ONE else 'MISSED'})")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or SIZES)

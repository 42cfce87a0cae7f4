"""An archive of 10^6 hourly files and 10^8 chunks, opened and read from parquet references.

The archive is what refgrid writes — ``.zmetadata``, record files of references, the
sources' record files — made once (cached under ``_data/``) by the parquet writer's own row
and record-file code from generated references: 1,000 real NetCDF files (one hour of a
100 x 100 field in 10 x 10 chunks, each file its own values), hard-linked 1,000 times each
to make 10^6 files, each hour referencing its own link (so every read checks a real file's
identity and reads real bytes). Measured each in a fresh process: ``refgrid.open_store`` and
``xr.open_dataset(engine="refgrid")`` (targets: <= 0.1 s), then a time series at one point
over 10^4 hours — 10^4 chunks — read through the engine and checked against netCDF4 reading
the files, with the record files it loaded and the process's peak memory (target: a few
record files of the 1,000 and well under 2 GB; the whole manifest would be 2 GB). Then one
file appended to a copy (``refgrid.batch(new, append=True)``, the batch's own append: the
work directory beside the copy holds the records of the archive's first and last files,
all an append named reads), with its time and peak memory (target: <= 2 GB), the new hour
checked against netCDF4.

    python benchmarks/scale.py [FILES]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from _common import DATA

FILES = 1_000_000
TEMPLATES = 1_000
SIDE, CHUNK = 100, 10
SERIES = 10_000
UNITS = "hours since 2000-01-01"
TARGET_OPEN, TARGET_MEMORY = 0.1, 2**31


def write_template(path: Path, k: int) -> None:
    import netCDF4

    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.createDimension("time", None)
        ds.createDimension("lat", SIDE)
        ds.createDimension("lon", SIDE)
        t = ds.createVariable("time", "f8", ("time",))
        t.units, t.calendar = UNITS, "standard"
        t[:] = [0.0]
        ds.createVariable("lat", "f4", ("lat",))[:] = np.linspace(-89.5, 89.5, SIDE)
        ds.createVariable("lon", "f4", ("lon",))[:] = np.linspace(0, 358.2, SIDE)
        tas = ds.createVariable("tas", "f4", ("time", "lat", "lon"), zlib=True, complevel=1,
                                chunksizes=(1, CHUNK, CHUNK))
        tas.units = "K"
        tas[:] = np.random.default_rng(k).random((1, SIDE, SIDE), dtype="f4") + 250


def build(files: int) -> Path:
    """The archive of ``files`` files (made once): its files and ``tas.parq``."""
    import refgrid
    from refgrid.combining import with_inline_coordinates
    from refgrid.core.sources import identity_of
    from refgrid.grid.rectilinear import RectilinearGrid
    from refgrid.model.manifest import PagedManifest
    from refgrid.model.virtual import VirtualArray, in_pieces, piece_length
    from refgrid.model.zarr_json import documents
    from refgrid.refs.parquet import PIECE_ROWS, RECORD_SIZE, ParquetSection, ZMetadata
    from refgrid.refs.records import Rows, record_digest, record_name
    from refgrid.refs.section import Portable, Section
    from refgrid.refs.source_pages import SOURCE_PAGE_ROWS, SourceTable, page_files

    root = DATA / f"scale{files}"
    out = root / "tas.parq"
    if (out / ".zmetadata").exists():
        return root
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    templates = [root / "templates" / f"t{k:04d}.nc" for k in range(TEMPLATES)]
    urls = [str(root / "files" / f"tas_{k:07d}.nc") for k in range(files)]
    if not os.path.exists(urls[-1]):  # (the files are kept when only the references change)
        shutil.rmtree(root, ignore_errors=True)
        (root / "templates").mkdir(parents=True)
        (root / "files").mkdir()
        for k, path in enumerate(templates):
            write_template(path, k)
        for k, url in enumerate(urls):
            os.link(templates[k % TEMPLATES], url)
        print(f"  {TEMPLATES} files written, {files:,} links made: "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    scans = [refgrid.scan(path)["tas"].manifest for path in templates]
    offsets = np.stack([m.offset.reshape(-1) for m in scans]).astype(np.int64)
    sizes = np.stack([m.length.reshape(-1) for m in scans]).astype(np.int64)
    identities = [identity_of(str(path)) for path in templates]

    scanned = with_inline_coordinates(refgrid.scan(urls[0]), "time", {})  # (as a batch)
    per_file = (SIDE // CHUNK) ** 2
    tas = scanned["tas"]
    time_ = scanned["time"]
    assert isinstance(tas, VirtualArray) and isinstance(time_, VirtualArray)
    grid = RectilinearGrid.regular((files, SIDE, SIDE), (1, CHUNK, CHUNK))
    tas = replace(tas, grid=grid, manifest=PagedManifest(grid.chunk_counts, _Nowhere()))
    time_ = in_pieces(time_, np.arange(files, dtype="<f8").tobytes(), (files,),
                      piece_length(files))  # (as combine stores it)
    group = scanned.with_arrays({"tas": tas, "time": time_})
    group = replace(group, sources={})

    t0 = time.perf_counter()
    temporary = out.with_name(out.name + ".partial")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    digests: dict[str, str] = {}

    def put(name: str, data: bytes) -> None:
        (temporary / name).parent.mkdir(parents=True, exist_ok=True)
        (temporary / name).write_bytes(data)
        digests[name] = record_digest(data)

    portable = Portable(None)
    pieces = {}  # (arrays stored inline in pieces: record files of their own length)
    for name in ("lat", "lon", "time"):
        array = group[name]
        assert isinstance(array, VirtualArray)
        if array.inline_pieces:
            pieces[name] = PIECE_ROWS
        for n, data in enumerate(Rows.of(array.manifest, portable).record_files(
                pieces.get(name, RECORD_SIZE))):
            put(record_name(name, n, name in pieces), data)
    pages = -(-files * per_file // RECORD_SIZE)
    for n in range(pages):
        rows = np.arange(n * RECORD_SIZE, min((n + 1) * RECORD_SIZE, files * per_file))
        file, chunk = rows // per_file, rows % per_file
        first = int(file[0])
        template = file % TEMPLATES
        put(record_name("tas", n), Rows((file - first).astype(np.int32),
                                         urls[first:int(file[-1]) + 1],
                                         offsets[template, chunk], sizes[template, chunk],
                                         None).record_file())
    written, firsts = page_files([(url, identities[k % TEMPLATES])
                                  for k, url in enumerate(urls)],
                                 0, SOURCE_PAGE_ROWS, str(out))  # (sorted names)
    for name, data in written:
        put(name, data)
    table = SourceTable(files, SOURCE_PAGE_ROWS, tuple(firsts), urls[0], urls[-1])
    kept = ParquetSection(**vars(Section.of_group(group, portable, sources=False)),
                          records=digests, source_table=table, pieces=pieces)
    (temporary / ".zmetadata").write_bytes(
        ZMetadata(kept, documents(group), RECORD_SIZE).to_bytes())
    temporary.rename(out)
    print(f"  {pages:,} record files of references written: "
          f"{time.perf_counter() - t0:.0f} s, peak memory {_peak() / 2**20:,.0f} MB "
          f"(target <= {TARGET_MEMORY / 2**30:.0f} GB)", flush=True)
    return root


def _peak() -> int:
    """This process's peak resident memory so far (bytes)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status
                    if line.startswith("VmHWM:"))


class _Nowhere:
    """The pages of a manifest that is never read (its documents only are written)."""

    size = 1

    def load(self, n: int, rows: int) -> object:
        raise AssertionError("the generated archive's manifest is written page by page")


MEASURE = r"""
import json, resource, sys, time
import numpy as np
import xarray as xr
import refgrid
from refgrid.model.manifest import PagedManifest

path, step, point, series = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
found = {}
if step == "store":
    refgrid.open_store(path)  # (the first call: imports done and warmed)
    t0 = time.perf_counter(); store = refgrid.open_store(path)
    found["seconds"] = time.perf_counter() - t0
else:
    xr.open_dataset(path, engine="refgrid").close()  # (imports done and warmed)
    t0 = time.perf_counter(); ds = xr.open_dataset(path, engine="refgrid")
    found["seconds"] = time.perf_counter() - t0
    if step == "series":
        t0 = time.perf_counter()
        values = ds["tas"][:series, point, point].values
        found["seconds"] = time.perf_counter() - t0
        found["values"] = values.tolist()
        manifest = refgrid.scan(path)["tas"].manifest  # (a fresh scan: none loaded)
        found["paged"] = isinstance(manifest, PagedManifest)
        found["time"] = " to ".join(str(t)[:16] for t in ds["time"].values[[0, -1]])
    ds.close()
try:  # (ru_maxrss counts the parent's memory at the fork: Linux keeps it across exec)
    with open("/proc/self/status") as status:
        found["peak"] = next(int(line.split()[1]) * 1024 for line in status
                             if line.startswith("VmHWM:"))
except OSError:
    found["peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(found))
"""


def measured(path: Path, step: str, series: int, point: int = 55) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path), step, str(point),
                           str(series)],
                          capture_output=True, text=True, check=False)
    if not done.stdout.strip():
        raise SystemExit(f"{step} failed:\n{done.stderr[-3000:]}")
    if done.returncode:  # (after its measurement: said, not hidden)
        print(f"  ({step}: the process exited with {done.returncode}: "
              f"{done.stderr.strip()[-200:]})")
    return json.loads(done.stdout.strip().splitlines()[-1])


APPEND = r"""
import json, sys, time
import h5py, pyarrow.parquet, xarray  # (imported by the batch: not what is timed)
import refgrid
out, new = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
result = refgrid.batch([new], out, append=True, progress=False, scheduler="synchronous")
found = {"seconds": time.perf_counter() - t0, "update": result.update}
with open("/proc/self/status") as status:
    found["peak"] = next(int(line.split()[1]) * 1024 for line in status
                         if line.startswith("VmHWM:"))
print(json.dumps(found))
"""


def work_directory(root: Path, work: Path, files: int) -> None:
    """What a batch over the archive would have left for an append named: the records of
    its first and last files (made as a batch worker makes them, each hour its own link
    and time) and the report of its settings."""
    import refgrid
    from refgrid.archive.journal import Journal
    from refgrid.archive.record import dumps
    from refgrid.archive.task import values_digest
    from refgrid.combining import with_inline_coordinates
    from refgrid.core.sources import identity_of
    from refgrid.model.manifest import ManifestBuilder
    from refgrid.model.virtual import VirtualArray
    from refgrid.read.array import read

    with Journal(work) as journal:
        for k in (0, files - 1):
            url = str(root / "files" / f"tas_{k:07d}.nc")
            scanned = with_inline_coordinates(refgrid.scan(url), "time", {})
            digests = {p: values_digest(read(a)) for p, a in scanned.walk()
                       if isinstance(a, VirtualArray) and "time" not in a.dims}
            time_ = scanned["time"]
            assert isinstance(time_, VirtualArray)
            built = ManifestBuilder((1,))
            built.inlined((0,), np.array([k], "<f8").tobytes())
            group = replace(scanned.with_arrays({"time": replace(time_,
                                                                 manifest=built.build())}),
                            sources={url: identity_of(url)})
            journal.append({"url": url, "identity": identity_of(url),  # type: ignore[typeddict-item]
                            "first": [float(k), UNITS, "standard"]}, dumps(group, digests))
    settings = {"concat_dim": "time", "format": "parquet", "padded": "rewrite",
                "overlap": "error", "codecs": "error", "missing": "error", "merge": "false",
                "variables": "", "drop_variables": ""}  # (a batch's defaults)
    (work.parent / "tas.parq.report.json").write_text(json.dumps({"settings": settings}))


def appended(root: Path, files: int) -> dict:
    """One file (the next hour) appended to a copy of the archive, in a fresh process."""
    import tempfile

    import netCDF4

    with tempfile.TemporaryDirectory(dir=root) as tmp:
        out = Path(tmp) / "tas.parq"
        shutil.copytree(root / "tas.parq", out)
        work_directory(root, out.with_name("tas.parq.parts"), files)
        new = Path(tmp) / f"tas_{files:07d}.nc"
        write_template(new, files + 1)
        with netCDF4.Dataset(new, "a") as ds:
            ds["time"][:] = [float(files)]
            want = ds["tas"][0].filled()
        os.sync()  # (the copy on disk, as an archive is: the append's fsync its own)
        done = subprocess.run([sys.executable, "-c", APPEND, str(out), str(new)],
                              capture_output=True, text=True, check=False)
        if done.returncode or not done.stdout.strip():
            raise SystemExit(f"append failed:\n{done.stderr[-3000:]}")
        found = json.loads(done.stdout.strip().splitlines()[-1])
        import xarray as xr

        with xr.open_dataset(out, engine="refgrid", decode_times=False) as ds:
            found["exact"] = ds.sizes["time"] == files + 1 and \
                float(ds["time"][-1]) == files and \
                bool(np.array_equal(ds["tas"][-1].values, want)) and \
                bool(np.array_equal(ds["tas"][files - 1, 55, 55].values,
                                    series_truth(root, 55, files)[-1]))
    return found


def series_truth(root: Path, point: int, count: int) -> np.ndarray:
    import netCDF4

    values = []
    for k in range(TEMPLATES):
        with netCDF4.Dataset(root / "templates" / f"t{k:04d}.nc") as ds:
            values.append(ds["tas"][0, point, point])
    return np.array([values[k % TEMPLATES] for k in range(count)], dtype="f4")


def pages_read(path: Path, point: int, count: int) -> int:
    """The tas record files a series read loads (in this process)."""
    import refgrid
    from refgrid.model.manifest import PagedManifest
    from refgrid.read.array import read
    from refgrid.refs.parquet import RECORD_SIZE

    array = refgrid.scan(path)["tas"]
    read(array, (slice(0, count), point, point))
    if not isinstance(array.manifest, PagedManifest):
        return -(-array.grid.nchunks // RECORD_SIZE)  # (few enough: read whole as it opens)
    return len(array.manifest._loaded)


def main() -> None:
    files = int(sys.argv[1]) if len(sys.argv) > 1 else FILES
    print(f"scale: {files:,} files, {files * (SIDE // CHUNK) ** 2:,} chunks")
    root = build(files)
    path = root / "tas.parq"
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    print(f"  references: {size / 2**20:,.0f} MB in {len(list(path.rglob('*.parq'))):,} "
          f"record files, .zmetadata {(path / '.zmetadata').stat().st_size / 1024:.0f} kB")
    count = min(SERIES, files)
    store = min((measured(path, "store", count) for _ in range(3)),
                key=lambda r: r["seconds"])
    engine = min((measured(path, "engine", count) for _ in range(3)),
                 key=lambda r: r["seconds"])
    series = measured(path, "series", count)
    exact = np.array_equal(np.array(series["values"], "f4"), series_truth(root, 55, count))
    loaded = pages_read(path, 55, count)
    print(f"  open_store: {store['seconds']:.3f} s (target <= {TARGET_OPEN} s), peak memory "
          f"{store['peak'] / 2**20:,.0f} MB")
    print(f"  xr.open_dataset(engine='refgrid'): {engine['seconds']:.3f} s (target <= "
          f"{TARGET_OPEN} s), peak memory {engine['peak'] / 2**20:,.0f} MB")
    print(f"  a time series of {count:,} hours at one point ({count:,} chunks): "
          f"{series['seconds']:.2f} s, {loaded} of {-(-files * 100 // 100_000):,} record "
          f"files loaded, peak memory {series['peak'] / 2**20:,.0f} MB (target <= "
          f"{TARGET_MEMORY / 2**30:.0f} GB), values as netCDF4 reads them: {exact} "
          f"(times {series['time']})")
    grown = appended(root, files)
    print(f"  one file appended ({grown['update']}): {grown['seconds']:.2f} s, peak memory "
          f"{grown['peak'] / 2**20:,.0f} MB (target <= {TARGET_MEMORY / 2**30:.0f} GB), the "
          f"new hour and the last one before it as netCDF4 reads them: {grown['exact']}")
    ok = store["seconds"] <= TARGET_OPEN and engine["seconds"] <= TARGET_OPEN and exact and \
        series["peak"] <= TARGET_MEMORY and grown["peak"] <= TARGET_MEMORY and grown["exact"]
    print(f"  targets {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()

"""Batch conversion of an archive: files per second and peak memory, against kerchunk.

In one run on this machine, each contender in a fresh process on the same cores:
- ``refgrid.batch`` (dask's process scheduler, one worker per core) of N small NetCDF4 files
  (daily data, files of 28-31 steps, time chunks of 10) to parquet references;
- kerchunk as ``auto_dask`` runs it: ``SingleHdf5ToZarr`` per file on dask (the same process
  scheduler and worker count), then ``MultiZarrToZarr`` along time, to JSON;
- VirtualiZarr's ``open_virtual_mfdataset(parallel=...)`` where it is installed.
Then the memory of combining a synthetic archive of 10^5 files x 100 chunks (10^7 chunks)
from batch records to parquet, in a fresh process.
Targets: >= 5x kerchunk's files/s; <= 1.5 GB peak for the 10^7-chunk combine.

    python benchmarks/batch.py            # 2,000 and 10,000 files, and the 10^7 combine
    python benchmarks/batch.py --quick    # 2,000 files, and the 10^7 combine
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import DATA

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
WORKERS = os.cpu_count() or 1
SPEED_TARGET, MEMORY_TARGET_GB = 5.0, 1.5
SYNTHETIC_FILES, STEPS = 100_000, 20  # tas (20, 50, 100) in chunks of (10, 10, 10): 100 chunks


def archive(count: int) -> list[Path]:
    """``count`` generated files, built once under benchmarks/_data."""
    from archive_files import write_archive

    directory = DATA / f"batch{count}"
    done = directory / ".complete"
    if not done.exists():
        shutil.rmtree(directory, ignore_errors=True)
        write_archive(directory, range(count))
        done.touch()
    return sorted(directory.glob("tas_*.nc"))


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- contenders, each run in a fresh process: `python batch.py --child NAME DIR OUT` ------

def child_refgrid(files: list[Path], out: Path) -> None:
    import refgrid

    refgrid.batch([str(p) for p in files], out / "refs.parq", workers=WORKERS, progress=False)


def child_kerchunk(files: list[Path], out: Path) -> None:
    import dask
    from kerchunk.combine import auto_dask
    from kerchunk.hdf import SingleHdf5ToZarr

    with dask.config.set(scheduler="processes", num_workers=WORKERS):
        auto_dask([str(p) for p in files], SingleHdf5ToZarr, {},
                  {"concat_dims": ["time"], "identical_dims": ["lat", "lon"]},
                  n_batches=WORKERS, filename=str(out / "refs.json"))


def child_virtualizarr(files: list[Path], out: Path) -> None:
    import dask
    from obstore.store import LocalStore
    from virtualizarr import open_virtual_mfdataset
    from virtualizarr.parsers import HDFParser

    try:
        from obspec_utils.registry import ObjectStoreRegistry
    except ImportError:
        from virtualizarr.registry import ObjectStoreRegistry  # older releases

    registry = ObjectStoreRegistry({"file://": LocalStore()})
    with dask.config.set(scheduler="processes", num_workers=WORKERS):
        ds = open_virtual_mfdataset([f"file://{p}" for p in files], registry=registry,
                                    parser=HDFParser(), concat_dim="time", combine="nested",
                                    data_vars="minimal", coords="minimal", compat="override",
                                    parallel="dask")
    ds.vz.to_kerchunk(str(out / "refs.json"), format="json")


CHILDREN = {"refgrid": child_refgrid, "kerchunk": child_kerchunk,
            "virtualizarr": child_virtualizarr}


def contender(name: str, files_dir: Path) -> dict[str, float] | str:
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, __file__, "--child", name, str(files_dir), out],
                              capture_output=True, text=True, cwd=ROOT / "benchmarks")
    if done.returncode:
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_child(name: str, files_dir: Path, out: Path) -> None:
    files = sorted(files_dir.resolve().glob("tas_*.nc"))
    if name == "virtualizarr":
        import importlib.util

        if importlib.util.find_spec("virtualizarr") is None:
            raise SystemExit("not installed")
    start = time.perf_counter()
    CHILDREN[name](files, out)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "files_per_s": len(files) / seconds,
                      "peak_mb": peak_mb()}))


# -- the synthetic 10^7-chunk combine ----------------------------------------------------

def synthetic_records(work: Path, count: int) -> list[str]:
    """Batch records of ``count`` files as workers write them (each its own URL, inline
    times, lat/lon referenced in the file with their digests), from one template."""
    import numpy as np

    from refgrid.archive.journal import Journal
    from refgrid.archive.record import dumps
    from refgrid.grid.rectilinear import RectilinearGrid
    from refgrid.model.manifest import INLINE, ChunkManifest
    from refgrid.model.virtual import VirtualArray, VirtualGroup

    url = "s3://archive/tas_XXXXXXX.nc"
    le = {"name": "bytes", "configuration": {"endian": "little"}}
    zlib = {"name": "numcodecs.zlib", "configuration": {"level": 4}}

    def referenced(name: str, dims: tuple[str, ...], shape: list[int], chunks: list[int],
                   start: int) -> VirtualArray:
        grid = RectilinearGrid.regular(shape, chunks)
        n = grid.chunk_counts
        offsets = (start + 4000 * np.arange(int(np.prod(n)))).reshape(n)
        return VirtualArray(name, dims, np.dtype("<f4"), grid,
                            ChunkManifest((url,), np.zeros(n, np.int32), offsets,
                                          np.full(n, 3000)), np.float32(np.nan),
                            (le, zlib), {"units": "K"} if name == "tas" else {})

    marker = np.full(STEPS, 12345.0).tobytes()
    time_ = VirtualArray("time", ("time",), np.dtype("<f8"),
                         RectilinearGrid.regular([STEPS], [STEPS]),
                         ChunkManifest((), np.array([INLINE]), np.zeros(1), np.zeros(1),
                                       {(0,): marker}), None, (le,),
                         {"units": "days since 1850-01-01", "calendar": "noleap"})
    group = VirtualGroup({"title": "synthetic"}, {
        "time": time_, "lat": referenced("lat", ("lat",), [50], [50], 1000),
        "lon": referenced("lon", ("lon",), [100], [100], 2000),
        "tas": referenced("tas", ("time", "lat", "lon"), [STEPS, 50, 100], [10, 10, 10],
                          10_000)}, sources={url: {"size": 10**6, "etag": "e"}})
    template = dumps(group, {"lat": "a" * 64, "lon": "b" * 64})
    placeholder = marker
    urls = []
    with Journal(work) as journal:
        for k in range(count):
            name = url.replace("XXXXXXX", f"{k:07d}")  # the same length: the pickle holds
            times = np.arange(k * STEPS, (k + 1) * STEPS, dtype="<f8").tobytes()
            record = template.replace(url.encode(), name.encode()).replace(placeholder, times)
            journal.append({"url": name, "identity": {"size": 10**6, "etag": "e"},
                            "first": [k * STEPS, "days since 1850-01-01", "noleap"]}, record)
            urls.append(name)
    return urls


def memory_child(work: Path, out: Path) -> None:
    from refgrid.archive.assemble import combine_records
    from refgrid.archive.journal import Journal
    from refgrid.combining.spec import CombineSpec
    from refgrid.writers import write

    start = time.perf_counter()
    with Journal(work) as journal:
        urls = sorted(journal.entries)
        group = combine_records(journal, urls, CombineSpec())
    write(group, out, format="parquet")
    chunks = group["tas"].manifest.path_id.size  # type: ignore[union-attr]
    print(json.dumps({"seconds": time.perf_counter() - start, "peak_mb": peak_mb(),
                      "chunks": int(chunks), "files": len(urls)}))


def memory_case() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "out.parq.parts"
        synthetic_records(work, SYNTHETIC_FILES)
        done = subprocess.run([sys.executable, __file__, "--memory-child", str(work),
                               str(Path(tmp) / "out.parq")], capture_output=True, text=True,
                              cwd=ROOT / "benchmarks", check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    quick = "--quick" in sys.argv
    met, total = 0, 0
    for count in (2000,) if quick else (2000, 10_000):
        files = archive(count)
        results = {name: contender(name, files[0].parent) for name in CHILDREN}
        ours = results["refgrid"]
        print(f"{count:,} files on {WORKERS} cores:")
        for name, r in results.items():
            if isinstance(r, str):
                print(f"  {name:13s} {r}")
            else:
                print(f"  {name:13s} {r['seconds']:7.2f} s  {r['files_per_s']:7.1f} files/s  "
                      f"peak {r['peak_mb']:6.0f} MB (client process)")
        peer = results["kerchunk"]
        if isinstance(ours, dict) and isinstance(peer, dict):
            ratio = ours["files_per_s"] / peer["files_per_s"]
            total += 1
            met += ratio >= SPEED_TARGET
            print(f"  refgrid / kerchunk files/s: {ratio:.1f}x (target >= {SPEED_TARGET:g}x: "
                  f"{'met' if ratio >= SPEED_TARGET else 'MISSED'})")
    memory = memory_case()
    total += 1
    ok = memory["peak_mb"] / 1024 <= MEMORY_TARGET_GB
    met += ok
    print(f"synthetic combine of {memory['files']:,} files, {memory['chunks']:,} chunks, from "
          f"batch records to parquet: {memory['seconds']:.0f} s, peak {memory['peak_mb']:.0f} "
          f"MB (target <= {MEMORY_TARGET_GB} GB: {'met' if ok else 'MISSED'})")
    print(f"targets met: {met} of {total}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        run_child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
    elif sys.argv[1:2] == ["--memory-child"]:
        memory_child(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        main()

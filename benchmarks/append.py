"""Appending to a parquet archive of 10^3, 10^4 and 10^5 files: 1 file, then 10 more.

Each archive is the real thing a batch builds — a work directory of records and parquet
references — made once (cached under ``_data/``) from synthetic records: one real NetCDF
file of 30 daily steps, hard-linked once per archive file (a copy per 50,000 links, so
every reference reads real bytes), whose record carries that file's own times. The
appended files are real NetCDF files with the following days; ``refgrid.batch``
(in-process scans) lists every file, scans the new ones and appends. Targets on 2 cores:
the append to 10^5 files within 1.5x the append to 10^3, and one file appended to 10^5
files in <= 1 s. (Peers in the same run — a rebuild, kerchunk's ``MultiZarrToZarr`` over
everything again, VirtualiZarr + Icechunk — are still to come.)

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


def appended(root: Path, size: int, count: int, work: Path) -> tuple[float, str]:
    """Seconds to append ``count`` real files to a copy of the archive at ``root``."""
    shutil.copytree(root / "tas.parq", work / "tas.parq")
    shutil.copytree(root / "tas.parq.parts", work / "tas.parq.parts")
    shutil.copy2(root / "tas.parq.report.json", work)
    files = work / "new"
    files.mkdir()
    for k in range(size, size + count):
        write_file(files / f"tas_{k:06d}.nc", k * STEPS)
    sources = [str(root / "files" / "tas_*.nc"), str(files / "tas_*.nc")]
    t0 = time.perf_counter()
    result = refgrid.batch(sources, work / "tas.parq", progress=False, scheduler="synchronous")
    return time.perf_counter() - t0, result.update or ""


def main(sizes: list[int]) -> None:
    ones = {}
    for size in sizes:
        root = build(size)
        for count in (1, 10):
            with tempfile.TemporaryDirectory() as tmp:
                seconds, how = appended(root, size, count, Path(tmp))
            print(f"{size:>7} files: append {count:>2} file(s) {seconds:7.3f} s  ({how})",
                  flush=True)
            if count == 1:
                ones[size] = seconds
    if 1000 in ones and 100_000 in ones:
        ratio = ones[100_000] / ones[1000]
        print(f"append 1 file at 10^5 / at 10^3: {ratio:.2f}x (target <= {TARGET_RATIO}x: "
              f"{'met' if ratio <= TARGET_RATIO else 'MISSED'}); at 10^5: "
              f"{ones[100_000]:.3f} s (target <= {TARGET_ONE} s: "
              f"{'met' if ones[100_000] <= TARGET_ONE else 'MISSED'})")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or SIZES)

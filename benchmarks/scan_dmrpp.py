"""Scanning remote granules through their DMR++ documents against scanning the granules.

Everything runs on 127.0.0.1: :mod:`read_remote`'s moto S3 server behind its proxy holding
each request 20 ms; requests are counted at the server, and told apart there (method, and
whether they ask a document or a granule). The archive: N NetCDF4 granules of daily data,
a few MiB each (three float32 variables of (days, 90, 180) in zlib chunks of one day, with
time bounds and coordinates), under ``data/``, and each one's DMR++ document, as
``tests/support/dmrpp_docs.py`` writes it (relative ``dmrpp:href``), under ``docs/``. Timed, each
the median of 3 passes over the N granules after an untimed one, requests counted for one pass:

- ``refgrid.scan`` of each document (``data_url`` naming its granule under ``data/``) against
  ``refgrid.scan`` of each granule, one after another;
- ``refgrid.batch`` of the N documents against ``refgrid.batch`` of the N granules
  (synchronous scheduler, a fresh output and work directory each pass).

Printed: requests and seconds per granule, what the requests are, and the ratio granule time /
DMR++ time (above 1: the documents are faster). Checked once: a document's model is its
granule's (variables, dimensions, shapes, types; ``tas`` read through both, equal).
Targets (the DMR++ scanner's own account: one read of the document, one ``HEAD`` of the
granule, which is never read): a document scanned in <= 2 requests, and in less time than
its granule (ratio > 1).

    python benchmarks/scan_dmrpp.py
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter as Tally
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import refgrid
from _common import DATA
from read_remote import BUCKET, LATENCY, Counter, slow_bucket

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
GRANULES = 40
LAT, LON = 90, 180
VARIABLES = ("tas", "pr", "huss")
REPEAT = 3
REQUEST_TARGET, RATIO_TARGET = 2, 1.0
_LINE = re.compile(r'"(?:\x1b\[[\d;]*m)*([A-Z]+) /[^/ ]+/([^/ ]+)/')


class Requests:
    """The requests werkzeug logs for moto's server, as (method, "docs" or "data"), kept
    while :attr:`on` (the log lines are dropped, not printed)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.on = False
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        found = _LINE.search(record.getMessage())
        if self.on and found:
            with self.lock:
                self.seen.append((found[1], found[2]))
        return False

    def install(self) -> None:
        logger = logging.getLogger("werkzeug")
        logger.setLevel(logging.INFO)
        logger.addFilter(self.filter)

    def described(self, per: int) -> str:
        """What the requests kept were, per granule: ``2 GET document + 1 HEAD granule``."""
        names = {"docs": "document", "data": "granule"}
        tally = Tally(self.seen)
        return " + ".join(f"{n / per:g} {method} {names.get(kind, kind)}"
                          for (method, kind), n in sorted(tally.items(),
                                                          key=lambda item: -item[1]))


def granules(count: int) -> list[Path]:
    """``count`` monthly granules of daily data and their DMR++ documents, built once."""
    import netCDF4

    from dmrpp_docs import write_dmrpp

    directory = DATA / f"dmrpp{count}"
    done = directory / ".complete"
    if not done.exists():
        directory.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        lat, lon = np.linspace(-89, 89, LAT), np.linspace(0, 358, LON)
        base = 260 + 30 * np.cos(np.radians(lat))[:, None] + 5 * np.sin(np.radians(lon))
        for k in range(count):
            year, month = 2001 + k // 12, k % 12 + 1
            days = (np.datetime64(f"{year + month // 12}-{month % 12 + 1:02d}-01")
                    - np.datetime64(f"{year}-{month:02d}-01")).astype(int)
            path = directory / f"day_{year}{month:02d}.nc"
            with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
                ds.setncatts({"title": f"daily data, {year}-{month:02d}",
                              "Conventions": "CF-1.8", "institution": "refgrid benchmarks"})
                ds.createDimension("time", None)
                ds.createDimension("bnds", 2)
                ds.createDimension("lat", LAT)
                ds.createDimension("lon", LON)
                time_ = ds.createVariable("time", "f8", ("time",))
                time_.setncatts({"units": f"days since {year}-{month:02d}-01",
                                 "calendar": "standard", "bounds": "time_bnds",
                                 "standard_name": "time"})
                time_[:] = np.arange(days) + 0.5
                ds.createVariable("time_bnds", "f8", ("time", "bnds"))[:] = np.stack(
                    [np.arange(days), np.arange(days) + 1], axis=1)
                for name, values, units in (("lat", lat, "degrees_north"),
                                            ("lon", lon, "degrees_east")):
                    v = ds.createVariable(name, "f8", (name,))
                    v.setncatts({"units": units, "standard_name": name[:3] + "itude"})
                    v[:] = values
                for j, name in enumerate(VARIABLES):
                    v = ds.createVariable(name, "f4", ("time", "lat", "lon"), zlib=True,
                                          shuffle=True, complevel=4,
                                          chunksizes=(1, LAT, LON),
                                          fill_value=np.float32(1e20))
                    v.setncatts({"units": ("K", "kg m-2 s-1", "1")[j],
                                 "cell_methods": "time: mean"})
                    noise = rng.normal(0, 2, (days, LAT, LON))
                    v[:] = np.round(base * 10**-j + noise * 10**-j, 2 + j).astype("f4")
            write_dmrpp(path)
        done.touch()
    return sorted(directory.glob("day_*.nc"))


def timed(counter: Counter, requests: Requests, fn: Callable[[], Any]
          ) -> tuple[float, int, Any]:
    """Median seconds of ``REPEAT`` runs after an untimed one; the last run's requests (kept
    in ``requests``) and result."""
    fn()
    times, n, result = [], 0, None
    for k in range(REPEAT):
        last = k == REPEAT - 1
        if last:
            requests.seen.clear()
            requests.on = True
        before = counter.n
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        n = counter.n - before
        requests.on = False
    return statistics.median(times), n, result


def batched(sources: list[str], options: dict[str, Any], **kwargs: Any) -> Any:
    """``refgrid.batch`` of ``sources`` into a fresh directory (removed after)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = refgrid.batch(sources, Path(tmp) / "out.parq", work_dir=Path(tmp) / "work",
                               scheduler="synchronous", progress=False,
                               storage_options=options, **kwargs)
        assert not result.failed and result.error is None, (result.failed, result.error)
        return result


def same_model(doc: refgrid.VirtualGroup, granule: refgrid.VirtualGroup,
               options: dict[str, Any]) -> list[str]:
    """How the DMR++ model differs from the granule's (nothing: the same)."""
    from refgrid.read.array import read

    def arrays(group: refgrid.VirtualGroup) -> dict[str, tuple[Any, ...]]:
        return {path: (node.dims, node.shape, node.dtype) for path, node in group.walk()
                if isinstance(node, refgrid.VirtualArray)}

    ours, theirs = arrays(doc), arrays(granule)
    differences = [f"{path}: {ours.get(path)} (DMR++) vs {theirs.get(path)} (granule)"
                   for path in sorted(ours.keys() | theirs.keys())
                   if ours.get(path) != theirs.get(path)]
    a, b = doc["tas"], granule["tas"]
    assert isinstance(a, refgrid.VirtualArray) and isinstance(b, refgrid.VirtualArray)
    if not np.array_equal(read(a, storage_options=options), read(b, storage_options=options)):
        differences.append("tas: values differ")
    return differences


def main() -> None:
    import boto3

    warnings.simplefilter("ignore")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    files = granules(GRANULES)
    names = [p.name for p in files]
    counter, requests = Counter(), Requests()
    with slow_bucket([], counter) as options:
        requests.install()
        client = boto3.client("s3", endpoint_url=options["endpoint_url"],
                              region_name="us-east-1")
        for path in files:
            client.upload_file(str(path), BUCKET, f"data/{path.name}")
            client.upload_file(f"{path}.dmrpp", BUCKET, f"docs/{path.name}.dmrpp")
        docs = [f"s3://{BUCKET}/docs/{name}.dmrpp" for name in names]
        data = [f"s3://{BUCKET}/data/{name}" for name in names]
        data_url = f"s3://{BUCKET}/data/{{name}}"

        differences = same_model(refgrid.scan(docs[0], data_url=data_url, **options),
                                 refgrid.scan(data[0], **options), options)

        def scan_docs() -> list[refgrid.VirtualGroup]:
            return [refgrid.scan(url, data_url=data_url, **options) for url in docs]

        def scan_data() -> list[refgrid.VirtualGroup]:
            return [refgrid.scan(url, **options) for url in data]

        cases = [("scan", "DMR++ documents", scan_docs), ("scan", "granules", scan_data),
                 ("batch", "DMR++ documents",
                  lambda: batched(docs, options, data_url=data_url)),
                 ("batch", "granules", lambda: batched(data, options))]
        results = []
        for way, what, fn in cases:
            t, n, _ = timed(counter, requests, fn)
            results.append((way, what, t, n, requests.described(GRANULES)))

    chunks = sum(a.grid.nchunks for a in refgrid.scan(files[0]).arrays.values())
    granule_mb = statistics.mean(p.stat().st_size for p in files) / 2**20
    doc_kb = statistics.mean(Path(f"{p}.dmrpp").stat().st_size for p in files) / 2**10
    print(f"S3 (moto) behind a {LATENCY * 1000:.0f} ms proxy; {GRANULES} NetCDF4 granules of "
          f"{granule_mb:.1f} MiB ({chunks} chunks; {', '.join(VARIABLES)} in zlib chunks of "
          f"(1, {LAT}, {LON})), DMR++ documents of {doc_kb:.0f} KiB; median of {REPEAT} "
          f"passes after a warm-up")
    print(f"model check (first granule, DMR++ vs granule: variables, dims, shapes, types, tas "
          f"values): {'the same' if not differences else 'DIFFERENT: ' + '; '.join(differences)}")
    print(f"{'way':5s} {'of':15s} {'requests/granule':>16s} {'s/granule':>10s} "
          f"{'granule/DMR++':>13s}  requests per granule")
    verdicts = [not differences]
    for k in range(0, len(results), 2):
        (way, what, t_doc, n_doc, told_doc), (_, what_data, t_data, n_data, told_data) = \
            results[k], results[k + 1]
        ratio = t_data / t_doc
        print(f"{way:5s} {what:15s} {n_doc / GRANULES:16.2f} {t_doc / GRANULES:10.4f} "
              f"{'':>13s}  {told_doc}")
        print(f"{way:5s} {what_data:15s} {n_data / GRANULES:16.2f} {t_data / GRANULES:10.4f} "
              f"{ratio:12.2f}x  {told_data}")
        if way == "scan":
            met = [n_doc / GRANULES <= REQUEST_TARGET, ratio > RATIO_TARGET]
            verdicts += met
            print(f"      targets: <= {REQUEST_TARGET} requests per document: "
                  f"{'met' if met[0] else 'MISSED'}; granule/DMR++ > {RATIO_TARGET:g}: "
                  f"{'met' if met[1] else 'MISSED'}")
    print("granule/DMR++ = seconds per granule scanning granules / scanning documents "
          "(above 1: documents faster)")
    print(f"targets met: {sum(verdicts)} of {len(verdicts)} (the model check among them)")


if __name__ == "__main__":
    main()

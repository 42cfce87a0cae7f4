"""Clients that read a served archive as Zarr readers do, and check every value they get.

Each client loops: it reads a view's consolidated metadata (one version of the archive), then
a few random chunks of ``tas`` and ``time`` named by that metadata, decodes each as the
metadata says and compares the values inside that version's extent with the ground truth (the
files' own values). A response that is an error, does not decode or holds other values is
recorded — a torn read is a chunk of another version that the metadata in hand cannot read
right. Used by the suite's load test and by ``benchmarks/follow.py``.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from archive_files import lengths
from refgrid.codecs.pipeline import ChunkCodec
from refgrid.grid.json_forms import parse_chunk_grid


@dataclass
class Truth:
    """The values of files ``0 .. count-1`` written by ``archive_files.write_archive``."""

    count: int
    lat: int
    lon: int
    tas: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.tas = np.concatenate([
            250 + 50 * np.random.default_rng(k).random((n, self.lat, self.lon), dtype="f4")
            for k, n in enumerate(lengths(range(self.count)))])

    def time(self, start: int, stop: int) -> np.ndarray:
        return np.arange(start, stop, dtype="f8")  # days since the first file's start


@dataclass
class Tally:
    """What the clients saw."""

    requests: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)
    versions: set[int] = field(default_factory=set)
    """The extents along time of the versions read."""
    etags: dict[tuple[str, int], set[str]] = field(default_factory=dict)
    """ETags seen per (view, chunk along time) of ``tas`` that no append touched."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def p99(self) -> float:
        return float(np.percentile(self.latencies, 99)) if self.latencies else float("nan")


class Client:
    def __init__(self, port: int, name: str, truth: Truth, tally: Tally, seed: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.name, self.truth, self.tally = name, truth, tally
        self.rng = random.Random(seed)

    def get(self, path: str) -> tuple[int, bytes, str | None]:
        started = time.perf_counter()
        try:
            self.connection.request("GET", path)
            response = self.connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            self.connection.close()  # reconnect, once
            self.connection.request("GET", path)
            response = self.connection.getresponse()
            body = response.read()
        with self.tally.lock:
            self.tally.requests += 1
            self.tally.latencies.append(time.perf_counter() - started)
        return response.status, body, response.getheader("ETag")

    def round(self, view: str) -> None:
        base = f"/{self.name}/{view}"
        status, body, _ = self.get(f"{base}/zarr.json")
        if status != 200:
            return self.fail(f"{base}/zarr.json: {status} {body[:200]!r}")
        docs = json.loads(body)["consolidated_metadata"]["metadata"]
        extent = docs["tas"]["shape"][0]
        with self.tally.lock:
            self.tally.versions.add(extent)
        for _ in range(4):
            self.chunk(base, view, "tas" if self.rng.random() < 0.8 else "time",
                       docs, extent)

    def chunk(self, base: str, view: str, name: str, docs: dict, extent: int) -> None:
        doc = docs[name]
        grid = parse_chunk_grid(doc["chunk_grid"], doc["shape"])
        coords = tuple(self.rng.randrange(n) for n in grid.chunk_counts)
        encoding = doc["chunk_key_encoding"]
        separator = encoding.get("configuration", {}).get("separator", "/")
        key = separator.join(map(str, coords))
        key = f"{name}/" + (f"c{separator}{key}" if encoding["name"] == "default" else key)
        status, body, etag = self.get(f"{base}/{key}")
        if status != 200:
            return self.fail(f"{base}/{key} (extent {extent}): {status} {body[:200]!r}")
        shape = grid.encoded_chunk_shape(coords)
        try:
            values = ChunkCodec(doc["codecs"], np.dtype(doc["data_type"])).decode(body, shape)
        except Exception as e:  # another version's chunk that this metadata cannot decode
            return self.tear(f"{base}/{key} (extent {extent}): {type(e).__name__}: {e}")
        region = [slice(int(a.bounds[c]), int(a.bounds[c]) + n)
                  for a, c, n in zip(grid.axes, coords, shape, strict=True)]
        region[0] = slice(region[0].start, min(region[0].stop, extent))
        inside = values[tuple(slice(0, r.stop - r.start) for r in region)]
        want = self.truth.tas[tuple(region)] if name == "tas" else \
            self.truth.time(region[0].start, region[0].stop)
        if not np.array_equal(inside, want):
            return self.tear(f"{base}/{key} (extent {extent}): other values")
        if name == "tas" and region[0].stop < extent - 40:  # no append touches it
            with self.tally.lock:
                self.tally.etags.setdefault((view, coords[0]), set()).add(str(etag))
        return None

    def fail(self, what: str) -> None:
        with self.tally.lock:
            self.tally.errors.append(what)

    def tear(self, what: str) -> None:
        with self.tally.lock:
            self.tally.torn.append(what)


def run_clients(port: int, name: str, truth: Truth, clients: int, views: list[str],
                until: Callable[[], bool]) -> Tally:
    """``clients`` threads reading until ``until()`` holds; what they saw."""
    tally = Tally()

    def loop(k: int) -> None:
        client = Client(port, name, truth, tally, k)
        try:
            while not until():
                client.round(views[k % len(views)])
        except Exception as e:
            client.fail(f"client {k}: {type(e).__name__}: {e}")
        finally:
            client.connection.close()

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tally

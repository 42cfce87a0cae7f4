"""A followed archive under load: from a file landing to its data readable, and readers'
latency while files are appended against the same archive static.

``refgrid serve ROOT --follow tas=LANDING/tas_*.nc --every 1s --older-than 0s`` runs as users
run it (its own process; scans in worker processes, batch's default). Files of 28-31 daily
steps (the suite's archive, ``tests/support/archive_files.py``) land one at a time.

1. *Landing to readable*: for each of 20 files, the time from its write finishing to the
   service's native view answering its last day with the file's values (its metadata's
   extent covers it and the chunk holds them). Target: <= ``--every`` + 5 s for every file.
2. *Readers while it grows*: 16 clients (``tests/support/load_clients.py``) read the native and
   regular views' metadata and random chunks, checking every value against the version the
   metadata in hand came from, while 20 files are appended one at a time; then for as long
   again (at most 30 s) with nothing landing. Printed: requests, errors, torn reads, p50/p99
   latency of each phase. Targets: 0 errors, 0 torn reads, p99 while growing <= 2x p99 static.

    python benchmarks/follow.py
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from archive_files import CHUNK, LAT, LON, lengths, write_archive
from load_clients import Truth, run_clients
from refgrid.codecs.pipeline import ChunkCodec
from refgrid.grid.json_forms import parse_chunk_grid

EVERY = 1.0
LANDINGS, APPENDS, CLIENTS = 20, 20, 16
LAG_TARGET, P99_TARGET = EVERY + 5, 2.0


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def readable(base: str, truth: Truth, day: int) -> bool:
    """Whether the native view answers ``day`` of ``tas`` with the file's values."""
    status, body = get(f"{base}/native/tas/zarr.json")
    if status != 200:
        return False
    doc = json.loads(body)
    if doc["shape"][0] <= day:
        return False
    grid = parse_chunk_grid(doc["chunk_grid"], doc["shape"])
    along = grid.axes[0]
    index = int(np.searchsorted(along.bounds, day, side="right")) - 1
    status, body = get(f"{base}/native/tas/c/{index}/0/0")
    if status != 200:
        return False
    shape = grid.encoded_chunk_shape((index, 0, 0))
    values = ChunkCodec(doc["codecs"], np.dtype(doc["data_type"])).decode(body, shape)
    return bool(np.array_equal(values[day - int(along.bounds[index])], truth.tas[day]))


def main() -> int:
    first = 2
    total = first + LANDINGS + APPENDS
    truth = Truth(total, LAT, LON)
    with tempfile.TemporaryDirectory() as tmp:
        landing, root = Path(tmp) / "landing", Path(tmp) / "root"
        root.mkdir()
        write_archive(landing, range(first))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        process = subprocess.Popen(
            [sys.executable, "-m", "refgrid.cli", "serve", str(root), "--port", str(port),
             "--no-access-log", "--follow", f"tas={landing}/tas_*.nc", "--every", f"{EVERY}s",
             "--older-than", "0s", "--state", str(Path(tmp) / "state")],
            stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}/tas"
        try:
            while not readable(base, truth, sum(lengths(range(first))) - 1):
                time.sleep(0.05)
            lags = []
            for k in range(first, first + LANDINGS):
                write_archive(landing, [k])
                landed = time.perf_counter()
                last_day = sum(lengths(range(k + 1))) - 1
                while not readable(base, truth, last_day):
                    time.sleep(0.02)
                lags.append(time.perf_counter() - landed)
            print(f"landing to readable, {LANDINGS} files (--every {EVERY:g}s, chunks of "
                  f"{CHUNK} days): median {np.median(lags):.2f} s, max {max(lags):.2f} s "
                  f"(target <= {LAG_TARGET:g} s: {'met' if max(lags) <= LAG_TARGET else 'MISSED'})")

            served = [first + LANDINGS]

            def lander() -> None:
                for k in range(served[0], first + LANDINGS + APPENDS):
                    write_archive(landing, [k])
                    while not readable(base, truth, sum(lengths(range(k + 1))) - 1):
                        time.sleep(0.02)
                    served[0] = k + 1

            thread = threading.Thread(target=lander)
            started = time.perf_counter()
            thread.start()
            growing = run_clients(port, "tas", truth, CLIENTS, ["native", "regular"],
                                  lambda: served[0] >= total)
            thread.join()
            took = time.perf_counter() - started
            calm = min(took, 30)
            stop_at = time.perf_counter() + calm
            static = run_clients(port, "tas", truth, CLIENTS, ["native", "regular"],
                                 lambda: time.perf_counter() > stop_at)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    ratio = growing.p99() / static.p99()
    for name, tally, seconds in (("while growing", growing, took), ("static", static, calm)):
        print(f"{name:>14}: {tally.requests:,} requests in {seconds:.0f} s, "
              f"{len(tally.errors)} errors, {len(tally.torn)} torn, "
              f"{len(tally.versions)} versions read, p50 "
              f"{np.percentile(tally.latencies, 50) * 1e3:.1f} ms, p99 {tally.p99() * 1e3:.1f} ms")
    ok = not (growing.errors or growing.torn or static.errors or static.torn)
    print(f"p99 while growing / static: {ratio:.2f}x (target <= {P99_TARGET:g}x: "
          f"{'met' if ratio <= P99_TARGET else 'MISSED'}); errors and torn reads: "
          f"{'none' if ok else 'SOME'}")
    for line in (growing.errors + growing.torn)[:5]:
        print("  ", line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

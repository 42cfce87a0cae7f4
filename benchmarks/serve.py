"""A load test of ``refgrid serve`` on loopback: native-view chunk requests against the same
chunk bytes served as static files.

A NetCDF4 file of 4,000 zlib chunks (~10 KB each) is scanned; its references are served by
``refgrid serve`` (a process of its own, access log off). The same chunk bytes, copied out
to one file per Zarr key, are served by aiohttp's static file handler (sendfile) in another
process, and, where it installs, the source file by xpublish with xpublish-zarr (Zarr v3 at
``/zarr``, each chunk encoded on request). A client process sends N requests for random chunk keys
over C concurrent connections and records each latency; every answer is checked (status,
length, and the bytes of the first 500 against the file's).

Printed per server: requests/s, p50 and p99 latency, errors, and for refgrid its RSS after
warm-up and at the end. Targets: native-view throughput >= 0.7x the static server's;
0 errors over >= 20,000 requests; RSS at the end <= 1.2x RSS after warm-up.

    python benchmarks/serve.py [--requests 20000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import refgrid
from _common import DATA

SHAPE, CHUNKS = (4000, 50, 50), (1, 50, 50)
THROUGHPUT_TARGET, RSS_TARGET = 0.7, 1.2
WARMUP = 2000


def source_file() -> Path:
    import netCDF4

    path = DATA / "serve_4000_chunks.nc"
    if path.exists():
        return path
    DATA.mkdir(exist_ok=True)
    rng = np.random.default_rng(7)
    with netCDF4.Dataset(path.with_suffix(".tmp"), "w") as nc:
        for dim, n in zip(("time", "lat", "lon"), SHAPE, strict=True):
            nc.createDimension(dim, n)
        v = nc.createVariable("tas", "f4", ("time", "lat", "lon"), zlib=True, complevel=1,
                              chunksizes=CHUNKS)
        v[:] = (rng.normal(280, 10, SHAPE)).astype("f4")
    path.with_suffix(".tmp").rename(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(url: str, process: subprocess.Popen[Any], seconds: float = 60) -> None:
    import urllib.request

    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited: {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url}: no answer")


def static_server(directory: str, port: int) -> None:
    """aiohttp's static file handler: the baseline."""
    from aiohttp import web

    app = web.Application()
    app.router.add_static("/", directory)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def xpublish_server(path: str, port: int) -> None:
    import xarray as xr
    import xpublish  # noqa: F401  (registers the .rest accessor; xpublish-zarr its Zarr v3)

    ds = xr.open_dataset(path, chunks={})
    ds.rest.serve(host="127.0.0.1", port=port, log_level="error")


async def load(urls: list[str], sizes: list[int], expected: dict[int, bytes], concurrency: int,
               warmup_done: Any) -> dict[str, Any]:
    import aiohttp

    latencies = np.zeros(len(urls))
    errors: list[str] = []
    position = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker() -> None:
            nonlocal position
            while position < len(urls):
                i = position
                position += 1
                if i == WARMUP:
                    warmup_done()
                t0 = time.perf_counter()
                try:
                    async with session.get(urls[i]) as answer:
                        body = await answer.read()
                        if answer.status != 200 or len(body) != sizes[i] or (
                                i in expected and body != expected[i]):
                            errors.append(f"{urls[i]}: {answer.status}, {len(body)} bytes")
                except aiohttp.ClientError as e:
                    errors.append(f"{urls[i]}: {e}")
                latencies[i] = time.perf_counter() - t0

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {"rps": len(urls) / elapsed, "p50": float(np.percentile(latencies, 50)) * 1e3,
            "p99": float(np.percentile(latencies, 99)) * 1e3, "errors": errors}


def run_load(base: str, keys: list[str], sizes: list[int], truth: dict[int, bytes],
             concurrency: int, pid: int | None = None) -> dict[str, Any]:
    import psutil

    rss: dict[str, float] = {}
    process = psutil.Process(pid) if pid else None

    def warmup_done() -> None:
        if process is not None:
            rss["warm"] = process.memory_info().rss

    result = asyncio.run(load([f"{base}/{k}" for k in keys], sizes, truth, concurrency,
                              warmup_done))
    if process is not None:
        rss["end"] = process.memory_info().rss
    return {**result, **rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    source = source_file()
    group = refgrid.scan(source)
    tas = group["tas"]
    work = Path(tempfile.mkdtemp(prefix="refgrid-serve-bench-"))
    refgrid.write(group, work / "refs" / "archive.json")
    static = work / "static"
    data = source.read_bytes()
    count = tas.manifest.shape[0]
    for i in range(count):
        offset, length = int(tas.manifest.offset[i, 0, 0]), int(tas.manifest.length[i, 0, 0])
        (static / "tas" / "c" / str(i) / "0").mkdir(parents=True, exist_ok=True)
        (static / "tas" / "c" / str(i) / "0" / "0").write_bytes(data[offset:offset + length])
    rng = random.Random(11)
    picks = [rng.randrange(count) for _ in range(args.requests)]
    keys = [f"tas/c/{i}/0/0" for i in picks]
    sizes = [int(tas.manifest.length[i, 0, 0]) for i in picks]
    truth = {j: (static / keys[j]).read_bytes() for j in range(min(500, len(keys)))}

    results: dict[str, dict[str, Any]] = {}
    servers: dict[str, tuple[list[str], str, list[str] | None]] = {}
    port = free_port()
    servers["refgrid serve (native)"] = (
        [sys.executable, "-m", "refgrid.cli", "serve", str(work / "refs"), "--port", str(port),
         "--allow-source", str(source.parent), "--no-access-log"],
        f"http://127.0.0.1:{port}/archive/native", None)
    port = free_port()
    servers["aiohttp static files"] = (
        [sys.executable, __file__, "--static", str(static), str(port)],
        f"http://127.0.0.1:{port}", None)
    try:
        import xpublish  # noqa: F401
        port = free_port()
        servers["xpublish + xpublish-zarr"] = (
            [sys.executable, __file__, "--xpublish", str(source), str(port)],
            f"http://127.0.0.1:{port}/zarr", keys)
    except ImportError:
        print("xpublish: not installed (pip install xpublish xpublish-zarr): not measured")

    for name, (command, base, own_keys) in servers.items():
        process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        try:
            probe = f"{base}/{(own_keys or keys)[0]}"
            wait_for(probe, process)
            if own_keys is None:
                results[name] = run_load(base, keys, sizes, truth, args.concurrency, process.pid)
            else:  # another encoding: sizes unknown in advance, check the status only
                own = run_sizes(base, own_keys)
                results[name] = run_load(base, own_keys, own, {}, args.concurrency, process.pid)
        finally:
            process.terminate()
            process.wait(30)

    print(f"{args.requests:,} requests for random chunks of {count:,} (~{np.mean(sizes) / 1e3:.0f}"
          f" KB), {args.concurrency} concurrent connections, loopback, client and server in "
          "separate processes")
    print(f"{'server':26s} {'req/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'errors':>7s} "
          f"{'RSS warm':>9s} {'RSS end':>8s}")
    for name, r in results.items():
        print(f"{name:26s} {r['rps']:9,.0f} {r['p50']:8.2f} {r['p99']:8.2f} "
              f"{len(r['errors']):7d} {r.get('warm', 0) / 2**20:8.1f}M "
              f"{r.get('end', 0) / 2**20:7.1f}M")
        for e in r["errors"][:3]:
            print("   ", e)
    ours, static_result = results["refgrid serve (native)"], results["aiohttp static files"]
    ratio = ours["rps"] / static_result["rps"]
    growth = ours["end"] / ours["warm"]
    print(f"native view / static: {ratio:.2f}x throughput (target >= {THROUGHPUT_TARGET}x); "
          f"errors {len(ours['errors'])} (target 0); RSS end / warm {growth:.2f} (target <= "
          f"{RSS_TARGET})")
    print(json.dumps({"throughput_ratio": round(ratio, 3), "errors": len(ours["errors"]),
                      "rss_growth": round(growth, 3)}))


def run_sizes(base: str, keys: list[str]) -> list[int]:
    """The body length of each distinct key (one GET each), for servers that encode anew."""
    import urllib.request

    sizes: dict[str, int] = {}
    for key in dict.fromkeys(keys):
        with urllib.request.urlopen(f"{base}/{key}") as answer:
            sizes[key] = len(answer.read())
    return [sizes[k] for k in keys]


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--static":
        static_server(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "--xpublish":
        xpublish_server(sys.argv[2], int(sys.argv[3]))
    else:
        os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
        main()

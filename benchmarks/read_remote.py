"""Reads over the network: S3 (moto's server) behind a proxy adding 20 ms to every request.

Everything runs on 127.0.0.1: moto's S3 server, and a TCP proxy in front of it that holds
each request 20 ms before passing it on (a round trip to a nearby region); requests are
counted at the server. For a NetCDF4 file of 400 zlib chunks of 100 KB, each selection — the
full variable, a time series at one point, one map — is read four ways, each from a fresh
open: refgrid's engine on refgrid references (sources on S3); refgrid's zarr store on them,
read by stock zarr through xarray with ``refgrid.zarr_config()`` (its own targets are in
``store.py``); kerchunk's references through fsspec's reference filesystem, stock zarr and
s3fs; h5py on an s3fs file object. Printed: the
time, the requests, and the fewest requests the selection needs (one per run of chunks
adjacent in the file). Then the requests of a remote scan of a NetCDF4 file written record by
record, as netCDF-C appends records, so its chunk index is spread through the file.

Targets: the engine >= 3x faster than kerchunk + zarr on every selection; its requests
<= 1.2x the fewest needed; a remote scan in <= 4 requests.

    python benchmarks/read_remote.py
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

import refgrid
from _common import DATA

LATENCY = 0.020
"""Seconds each request is held by the proxy."""
SHAPE, CHUNKS = (1000, 100, 100), (10, 50, 50)
SELECTIONS = {"full": (slice(None),) * 3, "series": (slice(None), 37, 58),
              "map": (100, slice(None), slice(None))}
SPEEDUP_TARGET, REQUEST_TARGET, SCAN_TARGET = 3.0, 1.2, 4
BUCKET = "bench"
REPEAT = 3


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def add(self) -> None:
        with self.lock:
            self.n += 1


@contextmanager
def s3_server(counter: Counter) -> Iterator[str]:
    """moto's S3 on a free port of 127.0.0.1, counting requests; yields its endpoint."""
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)

    def counting(environ: dict[str, Any], start_response: Any) -> Any:
        counter.add()
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, counting, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def latency_proxy(upstream: str, delay: float) -> Iterator[str]:
    """A TCP proxy on 127.0.0.1 holding every request ``delay`` seconds before passing it
    on (answers pass at once); yields its endpoint."""
    host, port = upstream.removeprefix("http://").split(":")
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   state: dict[str, bool], upstream: bool) -> None:
        """Copy one direction; a request (the client's first bytes since the last answer)
        is held ``delay`` first, however many segments it comes in."""
        try:
            while data := await reader.read(2**16):
                if upstream and state["answered"]:
                    state["answered"] = False
                    await asyncio.sleep(delay)
                elif not upstream:
                    state["answered"] = True
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(host, int(port))
        state = {"answered": True}
        await asyncio.gather(pipe(client_r, server_w, state, True),
                             pipe(server_r, client_w, state, False))

    async def start() -> None:
        holder["server"] = await asyncio.start_server(handle, "127.0.0.1", 0)
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()),
                                              loop.run_forever()), daemon=True)
    thread.start()
    ready.wait()
    port_used = holder["server"].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port_used}"
    finally:
        asyncio.run_coroutine_threadsafe(_shut(holder["server"]), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def _shut(server: asyncio.Server) -> None:
    """Close the proxy and end its connections while its loop still runs (a connection
    left to the garbage collector after the loop is closed prints a traceback)."""
    server.close()
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextmanager
def slow_bucket(paths: list[Path], counter: Counter) -> Iterator[dict[str, Any]]:
    """moto's S3 behind the latency proxy, holding ``paths``; yields the storage options
    that reach it through the proxy (requests counted at the server)."""
    import boto3

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with s3_server(counter) as endpoint, latency_proxy(endpoint, LATENCY) as proxy:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        for path in paths:
            client.upload_file(str(path), BUCKET, path.name)
        yield {"endpoint_url": proxy, "key": "testing", "secret": "testing",
               "client_kwargs": {"region_name": "us-east-1"}}


def source_file() -> Path:
    """The read benchmark's file: float32 ``v`` of ``SHAPE`` in zlib ``CHUNKS``."""
    import netCDF4

    path = DATA / "remote_read.nc"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        with netCDF4.Dataset(path.with_suffix(".partial"), "w") as nc:
            for k, n in enumerate(SHAPE):
                nc.createDimension(f"d{k}", n)
            v = nc.createVariable("v", "f4", ("d0", "d1", "d2"), zlib=True, complevel=1,
                                  chunksizes=CHUNKS)
            v[...] = np.random.default_rng(0).random(SHAPE, dtype="f4")
        path.with_suffix(".partial").rename(path)
    return path


def appended_file() -> Path:
    """Three variables along an unlimited time, written one record at a time (netCDF-C
    grows each chunk index as records arrive, between the data): 48 MB."""
    import netCDF4

    path = DATA / "remote_appended.nc"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(1)
        with netCDF4.Dataset(path.with_suffix(".partial"), "w") as nc:
            nc.createDimension("time", None)
            nc.createDimension("y", 200)
            nc.createDimension("x", 200)
            names = ("a", "b", "c")
            for name in names:
                nc.createVariable(name, "f4", ("time", "y", "x"), chunksizes=(1, 200, 200))
            for t in range(100):
                for name in names:
                    nc[name][t] = rng.random((200, 200), dtype="f4")
                nc.sync()
        path.with_suffix(".partial").rename(path)
    return path


def fewest_requests(group: refgrid.VirtualGroup, selection: tuple[Any, ...],
                    gap: int = 0) -> int:
    """Runs of the chunks ``selection`` touches, each run's chunks at most ``gap`` bytes
    apart in the file (0: adjacent)."""
    array = group["v"]
    assert isinstance(array, refgrid.VirtualArray)
    index = tuple(np.atleast_1d(np.arange(n)[s]) for n, s in zip(array.shape, selection,
                                                                    strict=True))
    chunks = np.ix_(*(np.unique(np.searchsorted(axis.bounds, i, side="right") - 1)
                      for i, axis in zip(index, array.grid.axes, strict=True)))
    order = np.argsort(array.manifest.offset[chunks].reshape(-1))
    offset = array.manifest.offset[chunks].reshape(-1)[order].astype(np.int64)
    length = array.manifest.length[chunks].reshape(-1)[order].astype(np.int64)
    return 1 + int(np.count_nonzero(offset[1:] - (offset[:-1] + length[:-1]) > gap))


def measure(counter: Counter, fn: Callable[[], np.ndarray],
            repeat: int = REPEAT) -> tuple[float, int, np.ndarray]:
    """Best time of ``repeat`` runs, the requests of the last one, its values."""
    best, values, requests = float("inf"), np.zeros(0), 0
    for _ in range(repeat):
        before = counter.n
        t0 = time.perf_counter()
        values = fn()
        best = min(best, time.perf_counter() - t0)
        requests = counter.n - before
    return best, requests, values


def main() -> None:
    import fsspec
    import h5py
    import s3fs
    import xarray as xr
    import zarr
    from kerchunk.hdf import SingleHdf5ToZarr

    warnings.simplefilter("ignore")
    local, appended = source_file(), appended_file()
    counter = Counter()
    with slow_bucket([local, appended], counter) as options:
        url = f"s3://{BUCKET}/{local.name}"
        group = refgrid.scan(url, **options)
        refs = refgrid.write(group, Path(tempfile.mkdtemp()) / "refs.json")
        kerchunk_refs = SingleHdf5ToZarr(url, storage_options=options,
                                         inline_threshold=0).translate()
        truth = xr.open_dataset(local)["v"].values

        def engine(sel: tuple[Any, ...]) -> np.ndarray:
            ds = xr.open_dataset(refs, engine="refgrid", storage_options=options, cache=False)
            return np.asarray(ds["v"][sel].values)

        def store(sel: tuple[Any, ...]) -> np.ndarray:
            with zarr.config.set(refgrid.zarr_config()):
                ds = xr.open_dataset(refgrid.open_store(refs, **options), engine="zarr",
                                     cache=False)
                return np.asarray(ds["v"][sel].values)

        def kerchunk(sel: tuple[Any, ...]) -> np.ndarray:
            fs = fsspec.filesystem("reference", fo=kerchunk_refs, remote_protocol="s3",
                                   remote_options={**options, "asynchronous": True},
                                   asynchronous=True, skip_instance_cache=True)
            store = zarr.storage.FsspecStore(fs, read_only=True, path="")
            return np.asarray(zarr.open_group(store, mode="r", zarr_format=2)["v"][sel])

        def h5py_s3fs(sel: tuple[Any, ...]) -> np.ndarray:
            fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
            with fs.open(url, "rb") as f, h5py.File(f, "r") as h5:
                return np.asarray(h5["v"][sel])

        readers = {"engine": engine, "store": store, "kerchunk+zarr": kerchunk,
                   "h5py+s3fs": h5py_s3fs}
        print(f"S3 (moto) behind a {LATENCY * 1000:.0f} ms proxy; {local.name}: {SHAPE} float32 "
              f"in {CHUNKS} zlib chunks; best of {REPEAT}, each from a fresh open")
        print(f"{'selection':9s} {'fewest':>6s} " + " ".join(f"{n:>22s}" for n in readers)
              + "  targets: speed-up, requests")
        verdicts = []
        for label, sel in SELECTIONS.items():
            fewest = fewest_requests(group, sel)
            cells, results = [], {}
            for name, reader in readers.items():
                t, n, values = measure(counter, lambda r=reader, s=sel: r(s))
                assert np.array_equal(values, truth[sel]), (label, name)
                results[name] = (t, n)
                cells.append(f"{t:7.3f}s {n:5d} requests")
            speedup = results["kerchunk+zarr"][0] / results["engine"][0]
            ratio = results["engine"][1] / fewest
            met = [speedup >= SPEEDUP_TARGET, ratio <= REQUEST_TARGET]
            verdicts += met
            print(f"{label:9s} {fewest:6d} " + " ".join(f"{c:>22s}" for c in cells)
                  + f"  {speedup:.1f}x faster (>= {SPEEDUP_TARGET}x: "
                    f"{'met' if met[0] else 'MISSED'}), {ratio:.2f}x fewest (<= "
                    f"{REQUEST_TARGET}x: {'met' if met[1] else 'MISSED'})")
        fs = s3fs.S3FileSystem(**options)
        array = group["v"]
        assert isinstance(array, refgrid.VirtualArray)
        start = int(array.manifest.offset[10].min())
        end = int((array.manifest.offset[10] + array.manifest.length[10]).max())
        bare, _, _ = measure(counter, lambda: np.frombuffer(fs.cat_file(
            f"{BUCKET}/{local.name}", start=start, end=end), np.uint8))
        print(f"floor: one bare s3fs request for the map's {end - start:,d} bytes takes "
              f"{bare:.3f} s (3x faster than kerchunk on the map would need "
              f"{results['kerchunk+zarr'][0] / 3:.3f} s in all)")
        before = counter.n
        t0 = time.perf_counter()
        scanned = refgrid.scan(f"s3://{BUCKET}/{appended.name}", **options)
        elapsed, requests = time.perf_counter() - t0, counter.n - before
        verdicts.append(requests <= SCAN_TARGET)
        print(f"remote scan of {appended.name} ({appended.stat().st_size / 2**20:.0f} MiB, "
              f"{sum(a.grid.nchunks for _, a in scanned.walk() if hasattr(a, 'grid'))} "
              f"chunks, records appended one by one): {requests} requests, {elapsed:.2f} s "
              f"(target <= {SCAN_TARGET}: {'met' if verdicts[-1] else 'MISSED'})")
    print(f"targets met: {sum(verdicts)} of {len(verdicts)}")


if __name__ == "__main__":
    main()

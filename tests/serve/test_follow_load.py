"""Readers never see a torn archive: 16 clients read a followed archive while 100 files are
appended to it one at a time.

The service runs as users run it (``refgrid serve --follow``, its own process). Clients read
the native and the regular views' metadata and random chunks of it (:mod:`load_clients`), each
chunk decoded as the metadata in hand says and compared with the files' values; meanwhile a
file lands, the service appends it and publishes the new version, and the next lands. Then the
same clients read the archive, now static, for comparison.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor

import pytest

from archive_files import LAT, LON, write_archive
from load_clients import Truth, run_clients

pytest.importorskip("aiohttp")

CLIENTS, APPENDS, FIRST = 16, 100, 2
VIEWS = ["native", "regular"]


def status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/tas/status", timeout=30) as r:
        return json.loads(r.read())


def wait_files(port: int, count: int, seconds: float = 60) -> dict:
    deadline = time.time() + seconds
    while True:
        try:
            found = status(port)
            if found["files"] >= count:
                return found
        except OSError:
            pass
        if time.time() > deadline:
            raise AssertionError(f"{count} files not served within {seconds} s")
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def following(tmp_path):
    landing, root = tmp_path / "landing", tmp_path / "root"
    root.mkdir()
    write_archive(landing, range(FIRST))
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "refgrid.cli", "serve", str(root), "--port", str(port),
         "--no-access-log", "--follow", f"tas={landing}/tas_*.nc", "--every", "0.05s",
         "--older-than", "0s", "--scheduler", "synchronous", "--state", str(tmp_path / "s")],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_files(port, FIRST)
        yield port, landing
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        assert "Traceback" not in err, err[-3000:]
    finally:
        process.kill()
        process.wait()
        if process.stderr is not None:
            process.stderr.close()


def test_readers_never_see_a_torn_archive_while_files_are_appended(following):
    """The files land from a process of their own: netCDF-C is not thread-safe, and this
    process holds two HDF5 libraries (h5py's and netCDF4's) and objects of earlier tests the
    collector may finalise in any thread — a netCDF4 write in a thread here aborted the
    interpreter once on a loaded 2-core machine (Python 3.11, the whole suite)."""
    port, landing = following
    truth = Truth(FIRST + APPENDS, LAT, LON)
    appended, updates = [FIRST], []
    gc.collect()  # (what earlier tests left is finalised here, before any thread starts)
    writer = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

    failed: list[BaseException] = []

    def lander() -> None:
        """Lands the next file once the last is served."""
        try:
            for k in range(FIRST, FIRST + APPENDS):
                writer.submit(write_archive, landing, [k]).result()
                updates.append(wait_files(port, k + 1)["update"])
                appended[0] = k + 1
        except BaseException as e:  # (said below; the clients stop with it)
            failed.append(e)

    writer.submit(int).result()  # (started: its imports are not the first landing's cost)
    landing_thread = threading.Thread(target=lander)
    started = time.perf_counter()
    landing_thread.start()
    try:
        growing = run_clients(port, "tas", truth, CLIENTS, VIEWS,
                              lambda: appended[0] >= FIRST + APPENDS or bool(failed))
    finally:
        landing_thread.join()
        writer.shutdown()
    if failed:
        raise failed[0]
    took = time.perf_counter() - started
    final = status(port)
    assert final["files"] == FIRST + APPENDS, final
    assert not [u for u in updates if not u.startswith(("append", "unchanged"))], updates
    assert final["failed"] == [] and final["error"] is None, final

    stop_at = time.perf_counter() + min(took, 10)
    static = run_clients(port, "tas", truth, CLIENTS, VIEWS,
                         lambda: time.perf_counter() > stop_at)

    print(f"\n{APPENDS} appends in {took:.1f} s; while growing: {growing.requests} requests, "
          f"{len(growing.versions)} versions read, p99 {growing.p99() * 1e3:.1f} ms; static: "
          f"{static.requests} requests, p99 {static.p99() * 1e3:.1f} ms "
          f"({growing.p99() / static.p99():.2f}x)")
    for tally in (growing, static):
        assert not tally.errors, (len(tally.errors), tally.errors[:5])
        assert not tally.torn, (len(tally.torn), tally.torn[:5])
    assert len(growing.versions) > APPENDS // 4  # the clients did read while it grew
    assert growing.requests > 5 * APPENDS
    changed = {key: tags for key, tags in growing.etags.items() if len(tags) > 1}
    assert growing.etags and not changed  # a chunk no append touched kept its ETag

"""The memory ``refgrid serve`` holds for many large OPeNDAP responses at once.

One NetCDF4 file (365 x 180 x 200 float32, zlib chunks of 30 x 45 x 100: 52.6 MB of values,
a 52.6 MB ``.dods``) is scanned and served by ``refgrid serve`` (a process of its own, access
log off). Fifty clients ask at once for the whole variable (``.dods?v``), each streaming the
answer (64 KiB reads: the clients hold little) and checking it against one full fetch made
before. Printed: the server's resident memory before and at its peak (``VmHWM`` of
``/proc/PID/status``), the growth, how many clients were answered (200) and refused (503,
with ``Retry-After``), and the wall time. Target: the growth stays within the memory budget
(``--memory-budget``, 512 MiB by default), where without a budget the 50 responses held
about 24 MB each (1.2 GB).

    python benchmarks/serve_dap_memory.py [--clients 50] [--memory-budget 512MiB]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import refgrid
from _common import netcdf4_file
from serve import free_port, wait_for

SHAPE, CHUNKS = (365, 180, 200), (30, 45, 100)


def memory(pid: int) -> tuple[int, int]:
    """A process's resident bytes now and at its peak (Linux)."""
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return (int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024)


def fetch(url: str, barrier: threading.Barrier) -> tuple[int, str | None, int]:
    """One client's status, ``Retry-After`` and the CRC-32 of what it read (streamed)."""
    barrier.wait(120)
    try:
        with urllib.request.urlopen(url, timeout=600) as answer:
            digest = zlib.crc32(b"")
            while piece := answer.read(2**16):
                digest = zlib.crc32(piece, digest)
            return answer.status, None, digest
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, e.headers.get("Retry-After"), 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--memory-budget", default=None, metavar="SIZE",
                        help="passed to refgrid serve (default: its own)")
    args = parser.parse_args()
    source = netcdf4_file("serve_dap_memory.nc", SHAPE, CHUNKS)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        refgrid.write(refgrid.scan(source), root / "data.json")
        port = free_port()
        budget = ["--memory-budget", args.memory_budget] if args.memory_budget else []
        server = subprocess.Popen(
            [sys.executable, "-m", "refgrid.cli", "serve", str(root), "--port", str(port),
             "--no-access-log", "--allow-source", str(source.parent), *budget],
            stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/dap/data.dods?v"
            wait_for(f"http://127.0.0.1:{port}/healthz", server)
            with urllib.request.urlopen(url, timeout=600) as answer:  # (opens the dataset)
                body = answer.read()
            whole, size = zlib.crc32(body), len(body)
            del body
            Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # (peak := now)
            before, _ = memory(server.pid)
            barrier = threading.Barrier(args.clients)
            start = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                answers = list(pool.map(lambda _: fetch(url, barrier), range(args.clients)))
            took = time.perf_counter() - start
            _, peak = memory(server.pid)
        finally:
            server.terminate()
            server.wait(30)
    served = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 503]
    if any(digest != whole for _, _, digest in served):
        raise SystemExit("a client read other bytes than the full fetch")
    print(f"{args.clients} clients x {size / 1e6:.1f} MB .dods, memory budget "
          f"{args.memory_budget or 'the default'}: {len(served)} answered, {len(refused)} "
          f"refused (503, Retry-After {sorted({a[1] for a in refused})}), "
          f"{len(answers) - len(served) - len(refused)} other; {took:.1f} s")
    print(f"server RSS before {before / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB: grew "
          f"{(peak - before) / 2**20:.0f} MiB ({(peak - before) / max(len(served), 1) / 1e6:.1f}"
          " MB per answered client)")


if __name__ == "__main__":
    main()

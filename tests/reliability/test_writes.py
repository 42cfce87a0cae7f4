"""Reliability, writes: killed, concurrent and repeated writes never leave a broken output.

Writers run in child processes and are killed with SIGKILL at random moments; the target
must hold one whole output (the old or the new), and the next write leaves no litter.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import refgrid
from helpers import FIXTURES, ROOT, killed

MONTHS = [FIXTURES / "monthly" / "chunk10" / f"tas_2001{m:02d}.nc" for m in (1, 2)]
WRITER = textwrap.dedent("""
    import sys, refgrid
    from refgrid.cli import main
    target, fmt, sources = sys.argv[1], sys.argv[2], sys.argv[3:]
    groups = [refgrid.scan(p) for p in sources]
    import contextlib, io, tempfile  # one quiet write elsewhere first: imports are lazy
    with tempfile.TemporaryDirectory() as warm, contextlib.redirect_stdout(io.StringIO()):
        main(["scan", sources[0], "-o", f"{warm}/{fmt}.parq"], standalone_mode=False)
    print("ready", flush=True)
    k = 0
    while True:
        if fmt == "cli":  # the command line, scanning and writing each time
            main(["scan", sources[k % len(sources)], "-o", target], standalone_mode=False)
        else:
            refgrid.write(groups[k % len(groups)], target, format=fmt, record_size=2)
        k += 1
""")


def _litter(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}."))


def _state(target: Path, fmt: str) -> str | None:
    """Which month the output at ``target`` holds (None: no output yet); fails on anything
    that is not one whole output."""
    if not target.exists():
        return None
    group = refgrid.scan(target)
    urls = {u for _, a in group.walk() if isinstance(a, refgrid.VirtualArray)
            for u in a.manifest.paths}
    assert len(urls) == 1, urls
    name = Path(urls.pop()).name
    assert name in {m.name for m in MONTHS}
    return name


def _writer(target: Path, fmt: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target), fmt, *map(str, MONTHS)],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if line != b"ready":  # no runaway writer left behind a failed test
        killed(process)
        raise AssertionError(f"the writer said {line!r}")
    return process


@pytest.mark.slow
@pytest.mark.parametrize("fmt, name", [("json", "refs.json"), ("parquet", "refs.parq"),
                                       ("cli", "refs.parq")])
def test_kill_9_at_random_moments(tmp_path, fmt, name):
    target = tmp_path / name
    rng = random.Random(12)
    seen = set()
    for _ in range(8):
        process = _writer(target, fmt)
        time.sleep(rng.uniform(0.0, 0.4))
        killed(process)
        seen.add(_state(target, fmt))
    assert seen - {None}, "no write ever completed"
    refgrid.write(refgrid.scan(MONTHS[0]), target)
    assert _state(target, fmt) == MONTHS[0].name
    assert _litter(target) == []


@pytest.mark.slow
@pytest.mark.parametrize("fmt, name", [("json", "refs.json"), ("parquet", "refs.parq")])
def test_the_path_holds_an_output_at_every_instant(tmp_path, fmt, name):
    """The directory swap had a window in which the target did not exist."""
    target = tmp_path / name
    refgrid.write(refgrid.scan(MONTHS[0]), target, format=fmt)
    marker = target / ".zmetadata" if fmt == "parquet" else target
    gaps = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if not marker.exists():
                gaps.append(time.perf_counter())

    watcher = threading.Thread(target=watch)
    watcher.start()
    process = _writer(target, fmt)
    time.sleep(1.5)
    killed(process)
    stop.set()
    watcher.join()
    assert not gaps, f"the output was missing {len(gaps)} times"
    _state(target, fmt)


@pytest.mark.slow
def test_concurrent_parquet_writers_both_succeed(tmp_path):
    """Two concurrent writers gave a spurious WriteError (ENOENT)."""
    target = tmp_path / "refs.parq"
    script = textwrap.dedent("""
        import sys, refgrid
        group = refgrid.scan(sys.argv[2])
        for _ in range(15):
            refgrid.write(group, sys.argv[1], record_size=2)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    writers = [subprocess.Popen([sys.executable, "-c", script, str(target), str(m)], env=env,
                                stderr=subprocess.PIPE) for m in MONTHS]
    for w in writers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err.decode()
    _state(target, "parquet")
    assert _litter(target) == []


def test_leftovers_of_a_dead_writer_are_removed_by_the_next_write(tmp_path):
    target = tmp_path / "refs.json"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / f".refs.json.tmp-{dead}-0a1b2c3d").write_text("half a write")
    (tmp_path / f".refs.json.tmp-{dead}-0a1b2c3e").mkdir()
    alive = tmp_path / f".refs.json.tmp-{os.getppid()}-0a1b2c3f"  # a live writer's: kept
    alive.write_text("in progress")
    unrelated = tmp_path / f".other.json.tmp-{dead}-0a1b2c3d"
    unrelated.write_text("not ours")
    refgrid.write(refgrid.scan(MONTHS[0]), target)
    assert _litter(target) == [alive.name]
    assert unrelated.exists()
    assert json.loads(target.read_text())["version"] == 1


def test_json_replaces_a_parquet_directory_and_back(tmp_path):
    target = tmp_path / "refs"
    group = refgrid.scan(MONTHS[0])
    refgrid.write(group, target, format="parquet")
    refgrid.write(group, target, format="json")
    assert target.is_file()
    refgrid.write(group, target, format="parquet")
    assert (target / ".zmetadata").is_file()
    assert _litter(target) == []

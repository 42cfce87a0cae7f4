"""Merging and stacking cost: 10^4 files of two variables x 10 members against today's
single-variable combine of 10^4 files, per chunk, in the same run.

Both archives are synthetic scans (:mod:`combine`'s monthly files of 28-31 daily steps, in
memory): the single-variable one is 10^4 files of ``tas`` along time; the shaped one is 10
members (``r<k>/``) x two file sets (``tas_*``, ``pr_*``, ``pr`` chunked otherwise) x 500
files, combined with ``merge=True, stack_dim="member", stack_by="r{member:d}/*"``. Each is
timed (median of 3) and traced (peak) in runs of its own. Target: the shaped combine within
1.25x of the single-variable one per chunk, in time and in memory.

    python benchmarks/combine_shapes.py
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from dataclasses import replace

import numpy as np

import refgrid
from combine import synthetic_file
from refgrid.model.virtual import VirtualGroup

FILES = 10_000
MEMBERS = 10
TARGET = 1.25


def single() -> tuple[list[VirtualGroup], list[str]]:
    rng = np.random.default_rng(0)
    groups, labels, start = [], [], 0
    for k in range(FILES):
        days = int(rng.integers(28, 32))
        groups.append(synthetic_file(k, start, days))
        labels.append(f"tas_{k:05d}.nc")
        start += days
    return groups, labels


def shaped() -> tuple[list[VirtualGroup], list[str]]:
    """10 members x (tas, pr) x 500 files: every member's files have the same lengths."""
    per = FILES // (2 * MEMBERS)
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(28, 32, per)]
    groups, labels = [], []
    for member in range(MEMBERS):
        for variable in ("tas", "pr"):
            start = 0
            for k, days in enumerate(lengths):
                g = synthetic_file(k, start, days)
                array = g.arrays["tas"]
                if variable == "pr":
                    array = replace(array, name="pr")
                arrays = {n: a for n, a in g.arrays.items() if n != "tas"}
                groups.append(replace(g, arrays={**arrays, variable: array}))
                labels.append(f"r{member}/{variable}_{k:05d}.nc")
                start += days
    return groups, labels


def measure(groups: list[VirtualGroup], labels: list[str],
            **options: object) -> tuple[float, int, int]:
    """Median seconds, traced peak bytes and data chunks of one combine."""
    chunks = sum(a.grid.nchunks for g in groups for n, a in g.arrays.items()
                 if n in ("tas", "pr"))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        refgrid.combine(groups, "time", sources=labels, **options)  # type: ignore[arg-type]
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    refgrid.combine(groups, "time", sources=labels, **options)  # type: ignore[arg-type]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times), peak, chunks


def main() -> None:
    groups, labels = shaped()
    refgrid.combine(groups[:4], "time", sources=labels[:4])  # warm: lazy imports
    base = measure(*single())
    ours = measure(groups, labels, merge=True, stack_dim="member", stack_by="r{member:d}/*")
    result = refgrid.combine(groups, "time", sources=labels, merge=True, stack_dim="member",
                             stack_by="r{member:d}/*")
    print(f"merged and stacked: {dict(zip(result['tas'].dims, result['tas'].shape, strict=True))}"
          f" tas, pr: {result['pr'].grid.nchunks:,} chunks each")
    for name, (seconds, peak, chunks) in (("one variable", base), ("2 variables x 10 members",
                                                                    ours)):
        print(f"{name:>26}: {FILES:,} files, {chunks:,} chunks: {seconds:.2f} s "
              f"({seconds / chunks * 1e6:.2f} us per chunk), traced peak {peak / 2**20:.0f} MB "
              f"({peak / chunks:.0f} B per chunk)")
    time_ratio = (ours[0] / ours[2]) / (base[0] / base[2])
    memory_ratio = (ours[1] / ours[2]) / (base[1] / base[2])
    for what, ratio in (("time", time_ratio), ("memory", memory_ratio)):
        print(f"per chunk, merged+stacked / single-variable {what}: {ratio:.2f}x (target <= "
              f"{TARGET}x: {'met' if ratio <= TARGET else 'MISSED'})")


if __name__ == "__main__":
    main()

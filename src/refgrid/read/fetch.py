"""Byte ranges through fsspec: neighbours in one file coalesced, files fetched concurrently.

Local files are read with ``os.pread`` from a thread pool; remote ones with the filesystem's
``cat_ranges`` (concurrent for async filesystems such as s3fs and HTTP). Ranges closer than
``GAP`` bytes are merged into one request, so a full read of contiguous chunks costs about one
request per file.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fsspec.core import url_to_fs

GAP = 256 * 2**10
"""Ranges separated by less than this are fetched as one."""
MAX_REQUEST = 64 * 2**20
"""No merged request grows beyond this."""


@dataclass(frozen=True)
class Range:
    url: str
    offset: int
    length: int


def coalesce(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int, list[int]]]:
    """Merge (offset, length) ranges of one file: [(start, end, [indices served])]."""
    order = sorted(range(len(ranges)), key=lambda k: ranges[k][0])
    merged: list[tuple[int, int, list[int]]] = []
    for k in order:
        start, length = ranges[k]
        end = start + length
        if merged and start - merged[-1][1] <= GAP and end - merged[-1][0] <= MAX_REQUEST:
            first, last, members = merged[-1]
            merged[-1] = (first, max(last, end), [*members, k])
        else:
            merged.append((start, end, [k]))
    return merged


def fetch(ranges: Sequence[Range], storage_options: dict[str, Any] | None = None,
          workers: int = 8) -> list[bytes]:
    """The bytes of every range, in order (short reads come back short: callers check)."""
    by_url: dict[str, list[int]] = defaultdict(list)
    for k, r in enumerate(ranges):
        by_url[r.url].append(k)
    out: list[bytes] = [b""] * len(ranges)
    remote = {u: ks for u, ks in by_url.items() if "://" in u and not u.startswith("file://")}
    local = {u: ks for u, ks in by_url.items() if u not in remote}

    def read_local(url: str, members: list[int]) -> None:
        spans = coalesce([(ranges[k].offset, ranges[k].length) for k in members])
        fd = os.open(url.removeprefix("file://"), os.O_RDONLY)
        try:
            for start, end, served in spans:
                block = os.pread(fd, end - start, start)
                for j in served:
                    r = ranges[members[j]]
                    out[members[j]] = block[r.offset - start: r.offset - start + r.length]
        finally:
            os.close(fd)

    if local:
        with ThreadPoolExecutor(min(workers, len(local))) as pool:
            list(pool.map(lambda item: read_local(*item), local.items()))
    if remote:
        _fetch_remote(ranges, remote, storage_options or {}, out)
    return out


def _fetch_remote(ranges: Sequence[Range], by_url: dict[str, list[int]],
                  storage_options: dict[str, Any], out: list[bytes]) -> None:
    fs, _ = url_to_fs(next(iter(by_url)), **storage_options)
    paths, starts, ends, served = [], [], [], []
    for url, members in by_url.items():
        path = fs._strip_protocol(url)
        for start, end, group in coalesce([(ranges[k].offset, ranges[k].length)
                                           for k in members]):
            paths.append(path)
            starts.append(start)
            ends.append(end)
            served.append([members[j] for j in group])
    blocks = fs.cat_ranges(paths, starts, ends, on_error="return")
    for block, start, members in zip(blocks, starts, served, strict=True):
        if isinstance(block, BaseException):
            if isinstance(block, FileNotFoundError):
                raise block
            raise OSError(f"{block}") from block
        for k in members:
            r = ranges[k]
            out[k] = block[r.offset - start: r.offset - start + r.length]

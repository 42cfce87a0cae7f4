"""The files a batch or a combine names: paths, URLs, glob patterns and ``@list`` files.

Patterns are expanded through fsspec, locally and remotely alike, with one listing per
pattern whose details give every file's identity (size, and mtime or ETag) — so deciding
which files a resumed batch must scan again costs no request per file.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from collections.abc import Callable, Iterable
from functools import partial
from operator import itemgetter
from stat import S_ISDIR

from refgrid.core.formats import data_suffixes, directory_format
from refgrid.core.sources import (
    SourceIdentity,
    filesystem,
    identity_from_info,
    is_local,
    stat_identity,
)
from refgrid.core.typed import StorageOptions
from refgrid.core.util import gc_paused
from refgrid.errors import ArgumentError, DirectoryError, RefgridError

GLOB_CHARACTERS = "*?["


Named = str | os.PathLike[str]
"""A source as a user names it: text, or a path object."""


def source_names(sources: Named | Iterable[Named]) -> list[str]:
    """``sources`` — one source or many, each text or a path object — as text; anything
    else is refused by name (not left to fail in a string method)."""
    if isinstance(sources, str | os.PathLike):
        return [os.fspath(sources)]
    if not isinstance(sources, Iterable):
        raise ArgumentError(f"sources are paths, URLs and glob patterns (one, or a list), "
                            f"not {sources!r}")
    listed = list(sources)
    for source in listed:
        if not isinstance(source, str | os.PathLike):
            raise ArgumentError(f"a source is a path, URL or glob pattern, not {source!r}")
    return [os.fspath(source) for source in listed]


def is_pattern(source: str) -> bool:
    return any(ch in source for ch in GLOB_CHARACTERS)


def expand(sources: Iterable[str], storage_options: StorageOptions | None = None
           ) -> dict[str, SourceIdentity | None]:
    """Every file the sources name, in order (each pattern's matches sorted, duplicates
    dropped), with its identity where a listing gave it without a request (``None``: ask
    the file, through :attr:`refgrid.scanners.source.Source.identity`). ``@FILE`` names a text
    file of sources, one per line (blank lines and lines starting with ``#`` are skipped).
    Local paths become absolute."""
    return expand_counting(sources, storage_options)[0]


def expand_counting(sources: Iterable[str], storage_options: StorageOptions | None = None
                    ) -> tuple[dict[str, SourceIdentity | None], dict[str, int]]:
    """:func:`expand`, and the files named more than once with how many times (a user who
    gives the same file twice is told it was used once)."""
    options = dict(storage_options or {})
    found: dict[str, SourceIdentity | None] = {}
    times: dict[str, int] = {}
    for source in _with_lists(sources):
        if is_pattern(source):
            named = _glob(source, options)
        elif is_local(source):
            path = os.path.abspath(source.removeprefix("file://"))
            _not_a_data_directory(source, path)
            named = {path: None}
        else:
            named = {source: None}
        if not found:  # (the first source: 10^5 files of a grown archive's pattern)
            found, times = dict(named), dict.fromkeys(named, 1)
            continue
        for url, identity in named.items():
            times[url] = times.get(url, 0) + 1
            if url not in found or found[url] is None:
                found[url] = identity
    return found, {url: n for url, n in times.items() if n > 1}


def _with_lists(sources: Iterable[str]) -> Iterable[str]:
    for source in sources:
        if not source.startswith("@"):
            yield source
            continue
        try:
            with open(source[1:], encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ArgumentError(f"cannot read the list of sources {source[1:]}: {e}") from e
        yield from (line.strip() for line in lines
                    if line.strip() and not line.lstrip().startswith("#"))


def _glob(pattern: str, options: StorageOptions) -> dict[str, SourceIdentity | None]:
    local = is_local(pattern)
    target = os.path.abspath(pattern.removeprefix("file://")) if local else pattern
    if local:
        return _local_glob(pattern, target)
    try:
        fs, _ = filesystem(target, options)
        listing = fs.glob(target, detail=True)
    except RefgridError:
        raise
    except Exception as e:
        raise ArgumentError(f"cannot expand {pattern!r}: {type(e).__name__}: {e}") from e
    prefix = pattern.split("://", 1)[0] + "://"
    files = {(p if p.startswith(prefix) else prefix + p): info
             for p, info in listing.items() if info.get("type") != "directory"}
    if not files:
        raise ArgumentError(f"no file matches {pattern}")
    # (a web server's listing gives names, not sizes: those identities are taken at scan)
    return {url: identity_from_info(files[url]) if files[url].get("size") is not None
            else None for url in sorted(files)}


def _local_glob(pattern: str, target: str) -> dict[str, SourceIdentity | None]:
    """Local matches by the standard library (hidden files too, as fsspec lists them): a
    directory read and a ``stat`` a file, as the scanner records identities — 10^5 files
    listed in a fraction of a second, where fsspec's listing takes seconds, and a growing
    archive is listed on every append."""
    found: dict[str, SourceIdentity | None] = {}
    with gc_paused():  # 10^5 identities
        for path, stat in _matches(target):
            try:
                status = stat()
            except OSError:  # gone since the listing
                continue
            if not S_ISDIR(status.st_mode):
                found[path] = stat_identity(status)
    if not found:
        raise ArgumentError(f"no file matches {pattern}")
    return found


def _matches(target: str) -> list[tuple[str, Callable[[], os.stat_result]]]:
    """The paths ``target`` matches, sorted, each with how to ``stat`` it. A pattern in the
    file name only (``/data/tas_*.nc``, the usual archive) is one directory read, its names
    matched as :mod:`glob` matches them (hidden ones too): :func:`glob.glob` joins and
    filters 10^5 names in Python, a third of a grown archive's listing."""
    directory, name = os.path.split(target)
    if is_pattern(directory) or "**" in name:
        return [(path, partial(os.stat, path)) for path in
                sorted(glob.glob(target, recursive=True, include_hidden=True))]
    match = re.compile(fnmatch.translate(name)).fullmatch
    found: list[tuple[str, Callable[[], os.stat_result]]]
    try:
        with os.scandir(directory) as entries:
            found = [(entry.path, entry.stat) for entry in entries if match(entry.name)]
    except OSError:  # no such directory: no match
        return []
    found.sort(key=itemgetter(0))
    return found


def _not_a_data_directory(source: str, path: str) -> None:
    """Refuse a local directory that is not an input itself, suggesting the pattern that
    names its data files (by the most common suffix among them)."""
    if not os.path.isdir(path) or directory_format(
            lambda member: os.path.exists(os.path.join(path, member))) is not None:
        return
    data = data_suffixes()
    suffixes = [os.path.splitext(n)[1] for n in os.listdir(path) if n.endswith(data)]
    common = max(set(suffixes), key=suffixes.count) if suffixes else data[0]
    what = f"{len(suffixes)} data files" if suffixes else "no data files refgrid knows"
    raise DirectoryError(source, os.path.join(source.rstrip("/"), "*" + common), what)

"""The datasets under a served root: found by walking it, opened on demand, kept in an LRU,
reopened when their files change.

A dataset is an input of a format the table serves (:func:`refgrid.core.formats.served`: JSON
and parquet references, Zarr v3 stores, DMR++ documents read with their granules beside
them) anywhere under the root — a file named with one of its suffixes (but a store's
``zarr.json`` or a batch's report beside its output, ``*.report.json``), or a directory
holding one of its members; its name is its path
below the root without the suffix (``monthly/tas.json`` → ``monthly/tas``). URLs are only
ever looked up among these names, never joined onto the root, so no URL can name a file
outside it; files and directories whose real path (symlinks resolved) leaves the root are not
datasets at all. Every source file a dataset's chunks name must lie under the allowed
prefixes (the root, and those given): a dataset that names another file is refused whole,
before anything of it is read.

A dataset that cannot be opened, whatever failed, is unavailable — refused with a
:class:`~refgrid.errors.RefgridError` saying why, until its file changes — and every other
dataset is served as before: a failure that is no ``RefgridError`` is a bug, logged once with
its traceback and named in the error (the service never stops for one dataset).

A followed archive is never opened by the catalog: its follower, which alone writes its
references, publishes each version when a round has written it (:meth:`Catalog.publish`).
A request holds the version it started on until it is answered, however many are published
meanwhile, and the views of a growing archive are made so that what a reader learnt from one
version stays true in the next (``growing`` in :mod:`refgrid.read.native` and
:mod:`refgrid.read.regular`).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from refgrid.core import formats
from refgrid.core.formats import InputFormat
from refgrid.core.keys import METADATA, REPORT_SUFFIX
from refgrid.core.sources import SourceCheck, Verify
from refgrid.core.typed import StorageOptions
from refgrid.errors import AccessError, ArgumentError, RefgridError
from refgrid.model.virtual import VirtualGroup
from refgrid.read.native import NativeView
from refgrid.read.regular import RegularView, ViewLimits, ViewSpec
from refgrid.scanners import scan
from refgrid.scanners.allowed import check_sources, normalized
from refgrid.serve.dap.model import DapDataset

Kind = str
"""A served format's name (:data:`refgrid.core.formats.FORMATS`)."""
log = logging.getLogger("refgrid.serve")


@dataclass(frozen=True)
class Entry:
    """A dataset found under the root."""

    name: str
    path: Path
    kind: Kind

    @property
    def format(self) -> InputFormat:
        """Its format's row of the table."""
        return formats.input_format(self.kind)


def _holds(directory: Path, member: str) -> bool:
    return (directory / member).is_file()


def stamp_of(path: Path) -> tuple[int, int, int]:
    """What changes when a dataset's file is rewritten (atomically or in place): its own
    stamp, or a directory's member that makes it an input."""
    target = path
    if path.is_dir():
        found = formats.directory_format(partial(_holds, path))
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "no input's member in it", str(path))
        target = path / found[1]
    st = target.stat()
    return st.st_mtime_ns, st.st_size, st.st_ino


def discover(root: Path) -> dict[str, Entry]:
    """The datasets under ``root`` (already resolved), by name: a file's path without its
    suffix, or with it where two datasets would share a name (``api.json`` beside
    ``api.parq``: both served, each under its full name)."""
    found: dict[str, list[Entry]] = {}
    for top, dirs, files in os.walk(root, followlinks=False):
        here = Path(top)
        for d in list(dirs):
            path = here / d
            store = formats.directory_format(partial(_holds, path), formats.served())
            if store is not None:
                dirs.remove(d)  # a dataset's insides are not datasets
                _add(found, root, path, store[0].name)
            elif d.startswith("."):
                dirs.remove(d)
        for f in files:
            served = formats.served_file(f)
            if served is not None and f != METADATA and not f.startswith(".") and \
                    not f.endswith(REPORT_SUFFIX):  # a batch's report beside its output
                _add(found, root, here / f, served.name)
    out: dict[str, Entry] = {}
    for name, entries in found.items():
        if len(entries) == 1:
            out[name] = entries[0]
            continue
        for entry in entries:
            full = entry.path.relative_to(root).as_posix()
            out[full] = Entry(full, entry.path, entry.kind)
    return out


def collisions(entries: dict[str, Entry]) -> list[str]:
    """The datasets served under their full file names (their names without the suffix
    would be the same): the only names that end in a suffix."""
    return sorted(name for name in entries
                  if name.endswith(formats.suffixes(formats.served())))


def _add(found: dict[str, list[Entry]], root: Path, path: Path, kind: Kind) -> None:
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(root):
        log.warning("skipping %s: it leads out of the served root (%s)", path, real)
        return
    relative = path.relative_to(root).as_posix()
    name = formats.stem(relative, formats.served())
    if _usable_name(name):
        found.setdefault(name, []).append(Entry(name, path, kind))


def _usable_name(name: str) -> bool:
    parts = name.split("/")
    return all(p and p not in (".", "..") and not p.startswith("_") for p in parts)


@dataclass(frozen=True)
class Followed:
    """A followed archive as the catalog knows it: where its references are written, and
    the dimension it grows along."""

    path: Path
    concat_dim: str


V = TypeVar("V", NativeView, RegularView)


@dataclass
class Dataset:
    """One opened dataset: its model and the views made of it so far."""

    entry: Entry
    stamp: tuple[int, int, int]
    group: VirtualGroup
    storage_options: StorageOptions
    modified: float
    """Seconds since the epoch: the newest of the file's and its sources' modification times."""
    executor: Executor | None = None
    """The service's threads, which read chunks for its views (its loop never does)."""
    verify: Verify = True
    """How its views check the sources (``"strict"``: their change time too)."""
    growing: str | None = None
    """A followed archive's concat dimension: its views keep what an append leaves alone."""
    native: NativeView = field(init=False)
    unpacked: NativeView | None = None
    """The native view with packed variables served unpacked (made when first asked for)."""
    regular: dict[ViewSpec, RegularView] = field(default_factory=dict)
    dap: DapDataset | None = None
    """The dataset as OPeNDAP describes it (made when first asked for)."""
    checked: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    checks: list[SourceCheck] = field(default_factory=list)
    """Its views' source checks (read without :attr:`lock`, which a view's making holds:
    the event loop asks them to check again)."""

    def __post_init__(self) -> None:
        self.native = self._made(NativeView(self.group, self.storage_options, self.verify,
                                            executor=self.executor, inline_reads=False,
                                            growing=self.growing))

    def _made(self, view: V) -> V:
        if view.check is not None:
            self.checks.append(view.check)
        return view

    def close(self) -> None:
        """Give back the files its views hold open (reads under way finish first)."""
        for view in self._views():
            view.close()

    def recheck_sources(self) -> None:
        """Check each source's identity again at its next read: a long-running service must
        notice a source rewritten, replaced or removed since its first read (no system call,
        no lock a view's making holds: the event loop asks)."""
        for check in tuple(self.checks):
            check.forget()

    def _views(self) -> list[NativeView | RegularView]:
        """The views made so far (a request may be making another: hence the lock)."""
        with self.lock:
            return [self.native, *([self.unpacked] if self.unpacked else []),
                    *self.regular.values()]

    def unpacked_view(self) -> NativeView:
        with self.lock:
            if self.unpacked is None:
                self.unpacked = self._made(NativeView(
                    self.group, self.storage_options, self.verify, unpack=True,
                    executor=self.executor, inline_reads=False, growing=self.growing))
            return self.unpacked

    def dap_dataset(self) -> DapDataset:
        """The dataset in OPeNDAP's terms, made once (its values are read through the
        native view)."""
        with self.lock:
            if self.dap is None:
                self.dap = DapDataset.of(self.entry.name, self.group)
            return self.dap

    def regular_view(self, spec: ViewSpec, limits: ViewLimits) -> RegularView:
        with self.lock:
            view = self.regular.get(spec)
            if view is None:
                view = self.regular[spec] = self._made(RegularView(
                    self.group, spec, self.storage_options, self.verify, limits=limits,
                    executor=self.executor, inline_reads=False, growing=self.growing))
            return view


@dataclass(frozen=True)
class Refused:
    """A dataset that cannot be served, and why (kept, so it is not rescanned every request)."""

    entry: Entry
    stamp: tuple[int, int, int]
    error: RefgridError


class Catalog:
    """The served root's datasets: found, opened on demand, kept (LRU), reopened on change."""

    def __init__(self, root: str | os.PathLike[str], allowed_sources: tuple[str, ...] = (),
                 capacity: int = 32, recheck: float = 1.0,
                 storage_options: StorageOptions | None = None,
                 limits: ViewLimits | None = None, executor: Executor | None = None,
                 followed: Mapping[str, Followed] | None = None,
                 verify: Verify = True) -> None:
        self.root = Path(os.path.realpath(root))
        self.verify = verify
        self.followed = dict(followed or {})
        """Followed archives by name (served once a version is published)."""
        self.versions: dict[str, Dataset] = {}
        """The published version of each followed archive (never evicted, never reopened
        by the catalog)."""
        self.executor = executor
        """The threads the datasets' views read chunks on (None: refgrid's own)."""
        if not self.root.is_dir():
            raise ArgumentError(f"{root}: not a directory to serve")
        self.allowed = (str(self.root), *(normalized(os.path.abspath(a) if "://" not in a else a)
                                          for a in allowed_sources))
        self.capacity = capacity
        self.recheck = recheck
        self.storage_options: StorageOptions = storage_options or {}
        self.limits = limits or ViewLimits()
        self.entries = self._discover()
        self.found_at = time.monotonic()
        self.opened: OrderedDict[str, Dataset | Refused] = OrderedDict()
        self.lock = threading.Lock()
        self.opening: dict[str, threading.Lock] = {}
        """One lock per dataset name, held while it is opened."""

    def names(self) -> list[str]:
        self._rediscover(force=False)
        return sorted(self.entries)

    def _rediscover(self, force: bool) -> bool:
        """Walk the root again: at most once per ``recheck`` seconds when a name is not
        found (``force``), else every ten."""
        since = time.monotonic() - self.found_at
        if since < self.recheck * (1 if force else 10):
            return False
        self.entries = self._discover()
        self.found_at = time.monotonic()
        return True

    def _discover(self) -> dict[str, Entry]:
        """The root's datasets and the followed archives published yet (a followed name
        hides a dataset of the same name under the root)."""
        found = discover(self.root)
        for name, followed in self.followed.items():
            found.pop(name, None)
            if name in self.versions:
                found[name] = Entry(name, followed.path, "parquet")
        return found

    def close(self) -> None:
        """Every opened dataset gives back its files (the service ends)."""
        with self.lock:
            opened = list(self.opened.values())
            self.opened.clear()
        for known in opened:
            _close(known)

    def publish(self, name: str) -> Dataset:
        """Serve the followed archive ``name`` as its references now are (blocking: its
        follower calls it when a round has written a version), and return it. Requests
        under way finish on the version they started on. A version that cannot be served
        raises the :class:`RefgridError` saying why, and the one before it stays served."""
        followed = self.followed[name]
        entry = Entry(name, followed.path, "parquet")
        opened = self._open(entry, stamp_of(followed.path))
        if isinstance(opened, Refused):
            raise opened.error
        with self.lock:
            before = self.versions.get(name)
            self.versions[name] = opened
            self.entries[name] = entry
        _close(before)
        return opened

    def split(self, parts: list[str]) -> tuple[Entry, list[str]] | None:
        """The dataset a URL path (split at ``/``) starts with, and the rest of the path."""
        for attempt in range(2):
            for i in range(len(parts), 0, -1):
                entry = self.entries.get("/".join(parts[:i]))
                if entry is not None:
                    return entry, parts[i:]
            if attempt or not self._rediscover(force=True):
                return None
        return None

    def fresh(self, name: str) -> Dataset | None:
        """The opened dataset ``name`` if its file was checked less than ``recheck`` seconds
        ago, or a followed archive's published version (no system call: the event loop may
        ask)."""
        if name in self.followed:
            version = self.versions.get(name)
            if version is not None and time.monotonic() - version.checked >= self.recheck:
                version.checked = time.monotonic()  # (its references change only when a
                version.recheck_sources()  # round publishes, but its sources at any time)
            return version
        known = self.opened.get(name)
        if isinstance(known, Dataset) and time.monotonic() - known.checked < self.recheck:
            return known
        return None

    def dataset(self, entry: Entry) -> Dataset:
        """The opened dataset (blocking: call it on a worker thread). Raises the
        :class:`RefgridError` that made it unservable (whatever failed). Concurrent first
        requests open it once: the others wait for that open (one scan, one set of views)."""
        fresh = self.fresh(entry.name)
        if fresh is not None:
            return fresh
        if entry.name in self.followed:
            raise AccessError(entry.name, None, "no version of it is published yet")
        with self.lock:
            opening = self.opening.setdefault(entry.name, threading.Lock())
        with opening:
            return self._dataset(entry)

    def _dataset(self, entry: Entry) -> Dataset:
        with self.lock:
            known = self.opened.get(entry.name)
            if known is not None:
                self.opened.move_to_end(entry.name)
        fresh = self.fresh(entry.name)
        if fresh is not None:
            return fresh
        try:
            stamp = stamp_of(entry.path)
        except OSError:
            with self.lock:
                _close(self.opened.pop(entry.name, None))
            self.entries.pop(entry.name, None)
            raise AccessError(entry.name, None, "the dataset is gone") from None
        if known is not None and known.stamp == stamp:
            if isinstance(known, Dataset):
                known.checked = time.monotonic()
                known.recheck_sources()
            return _served(known)
        opened = self._open(entry, stamp)
        with self.lock:
            _close(self.opened.get(entry.name))  # replaced: its file changed
            self.opened[entry.name] = opened
            self.opened.move_to_end(entry.name)
            while len(self.opened) > self.capacity:
                _close(self.opened.popitem(last=False)[1])
        return _served(opened)

    def _open(self, entry: Entry, stamp: tuple[int, int, int]) -> Dataset | Refused:
        real = Path(os.path.realpath(entry.path))
        followed = self.followed.get(entry.name)
        if followed is None and not real.is_relative_to(self.root):  # a symlink since it was found
            return Refused(entry, stamp, AccessError(entry.name, None, "leads out of the "
                                                     "served root"))
        try:
            options: Mapping[str, Any] = self.storage_options  # scan's **storage_options: untyped
            if entry.format.asks_sources:  # (DMR++: the data file's identity, as it is read)
                options = {**options, "allowed_sources": self.allowed}
            group = scan(real, **options)
            group = check_sources(group, self.allowed, entry.name, REMEDY)  # every format:
            # reference sets, and Zarr stores whose chunk files may be symlinks; before
            # anything is read
            mtimes = [stamp[0] / 1e9] + [float(i["mtime"]) for i in group.sources.values()
                                         if isinstance(i.get("mtime"), int | float)]
            opened = Dataset(entry, stamp, group, self.storage_options, max(mtimes),
                             self.executor, self.verify,
                             followed.concat_dim if followed is not None else None)
            # (its native view: the documents made now)
        except RefgridError as e:
            log.warning("cannot serve %s: %s", entry.name, e)
            return Refused(entry, stamp, e)
        except Exception as e:  # a bug, not the input's fault: this dataset alone is refused
            log.error("cannot serve %s: internal error", entry.name, exc_info=e)  # (once)
            return Refused(entry, stamp, _internal_error(entry.name, e))
        log.info("opened %s (%s)", entry.name, entry.kind)
        return opened

    def survey(self, limit: int) -> list[tuple[str, RefgridError]]:
        """Open the first ``limit`` datasets (by name), as a start-up check: the ones that
        cannot be served, with why."""
        refused = []
        for name in sorted(self.entries)[:limit]:
            try:
                self.dataset(self.entries[name])
            except RefgridError as e:
                refused.append((name, e))
        return refused


REMEDY = ("start refgrid serve with --allow-source PREFIX to allow it; in Python, "
          "make_app(root, allow_sources=[...])")


def _internal_error(name: str, error: Exception) -> RefgridError:
    """What a dataset that failed to open on a bug answers with, every time (its traceback
    was logged once, when it happened), naming the bug's type and message."""
    refused = RefgridError(f"{name}: cannot be opened: internal error "
                           f"({type(error).__name__}: {error})")
    refused.__cause__ = error.with_traceback(None)  # (logged: its frames go)
    return refused


def _close(known: Dataset | Refused | None) -> None:
    """A dataset no longer served gives back its files (requests still reading it finish:
    its views close their files after the last read)."""
    if isinstance(known, Dataset):
        known.close()


def _served(known: Dataset | Refused) -> Dataset:
    if isinstance(known, Refused):  # (each raise would add its frames to one traceback)
        raise known.error.with_traceback(None)
    return known

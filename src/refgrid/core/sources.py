"""The source files behind references: the fsspec filesystem of a URL, each file's identity
(checked before reading it), and remote files held in memory while a batch worker uses them.

Source identity: which file a reference set was made from, checked before reading it.

References are byte ranges. If a source is rewritten in place, replaced by another file or
its S3 object overwritten, the same ranges decode silently to other data. Scanners record
each source's identity — its size always, its modification time locally, its ETag (and
version) where the store gives one — and writers keep the table beside the references. A
reader checks a file's identity once per open, the first time it reads from it, and raises a
:class:`~refgrid.errors.ReadError` naming the file and what changed (``verify_sources=False``
skips the check). Remote files are checked concurrently with each other and with the data
requests of that first read, whose bytes are handed out only once the check has passed: the
check costs no round trip of its own.

Held files: a batch worker scans a small remote file and then reads its concat coordinate and
the variables it digests. Fetched once with :func:`held_file`, the file serves the scan's
metadata reads (:class:`~refgrid.scanners.source.Source`) and those chunk reads
(:mod:`refgrid.read.fetch`) from memory: one request per file instead of one per step.
"""

from __future__ import annotations

import hashlib
import os
import threading
from bisect import bisect_right
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Literal, NotRequired, TypedDict, cast

import fsspec
from fsspec.core import url_to_fs

from refgrid.core.typed import StorageOptions, Untyped
from refgrid.core.util import gc_paused, thread_pool
from refgrid.errors import (
    NO_SUCH_FILE,
    ArgumentError,
    MissingExtraError,
    NotFoundError,
    ReadError,
    ScanError,
)

SOURCES_KEY = "refgrid"
"""Top-level key of JSON references (and of parquet's ``.zmetadata``) holding refgrid's own
section: ``{"sources": {url: identity}, "attributes": {node: {name: value}}, "sidecar":
"refs.json.chunks"}`` — the sources' identities, the ``_refgrid_*`` bookkeeping that stays out
of the Zarr documents, and the directory of rewritten chunks beside the references."""
ATTRIBUTES_KEY = "attributes"
SIDECAR_KEY = "sidecar"
SIDECAR_TEMPLATE = "{{sidecar}}"
"""How references name a file in their sidecar directory: ``{{sidecar}}/<hash>/tas/c/3/0``, a
kerchunk template (``templates["sidecar"]``, the directory where it was written, for fsspec)
that refgrid's readers resolve beside the references wherever they now lie, so references
and sidecar copied or moved together still read."""


def section(container: object) -> Mapping[str, object]:
    """refgrid's section of a reference set (or ``.zmetadata``), empty if it has none."""
    found = container.get(SOURCES_KEY) if isinstance(container, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def sidecar_directory(container: object, url: str) -> str | None:
    """Where the sidecar the section names lies now: beside ``url``, the references."""
    name = section(container).get(SIDECAR_KEY)
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or \
            url.startswith("<"):  # a dict of references lies nowhere
        return None
    parent = url.rstrip("/").rsplit("/", 1)[0] if "/" in url.rstrip("/") else "."
    return f"{parent}/{name}"


def in_sidecar(url: str, directory: str | None) -> str:
    """``url`` with the sidecar template resolved to ``directory`` (unchanged if none)."""
    if directory is None or not url.startswith(SIDECAR_TEMPLATE):
        return url
    return directory + url[len(SIDECAR_TEMPLATE):]


SOURCE_TABLE_KEY = "source_table"
"""Key, in parquet's ``.zmetadata`` section, of ``{"rows": n, "pages": [URL, ...], "first":
URL, "last": URL}``: the sources' identities are not in ``.zmetadata`` but in record files
of their own (``.sources/refs.<n>.parq``), sorted by URL, ``pages`` holding each one's first
URL (a file's identity is one record file away), ``first`` and ``last`` the archive's first
and last files along its concat dimension."""
RECORDS_KEY = "records"
"""Key, beside ``sources`` in parquet's ``.zmetadata`` section, of each record file's digest
(relative name → :func:`record_digest`)."""
PIECES_KEY = "pieces"
"""Key, beside ``sources`` in parquet's ``.zmetadata`` section, of the arrays stored inline in
pieces (the concat coordinate) → the rows of each of their record files
(:func:`refgrid.scanners.parquet.record_name`)."""


def record_digest(data: bytes) -> str:
    """The digest of a parquet record file's bytes, written beside it and checked by the
    reader: parquet's page checksums leave page headers and the footer uncovered, where
    damaged bytes can decode to other references."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class SourceIdentity(TypedDict):
    size: int
    mtime: NotRequired[float]
    etag: NotRequired[str]
    version: NotRequired[str]
    rewritten: NotRequired[bool]
    """A chunk file refgrid wrote (the sidecar of rewritten padded chunks), not a source."""


def source_count(sources: Mapping[str, SourceIdentity]) -> int:
    """How many source files a table names (the chunk files refgrid wrote left out)."""
    return sum(1 for identity in sources.values() if not identity.get("rewritten"))


def filesystem(url: str, storage_options: StorageOptions | None = None
               ) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem serving ``url`` and the path within it, with refgrid's timeouts and
    retries for remote protocols (:mod:`refgrid.core.network`). Local files need nothing
    beyond fsspec; ``s3://`` needs s3fs and ``http(s)://`` aiohttp (the ``remote`` extra),
    which fsspec's own message for a missing protocol package does not name."""
    options = dict(storage_options or {})
    try:
        if not is_local(url):
            from refgrid.core.network import with_defaults

            options = with_defaults(url, options)
        return url_to_fs(url, **options)
    except ImportError as e:
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        raise MissingExtraError("remote", f"reading {protocol}:// URLs ({url})",
                                e.name or str(e)) from e


def not_found(error: FileNotFoundError) -> str:
    """:data:`~refgrid.errors.NO_SUCH_FILE`, or what really failed: fsspec reports any
    failure of an HTTP ``info`` (a 503 after every retry, a timeout) as a missing file, the
    cause chained."""
    cause = error.__cause__
    if _failed(cause):
        return f"cannot read: {cause}"
    return NO_SUCH_FILE


def _failed(cause: BaseException | None) -> bool:
    """Whether the cause fsspec chained to a ``FileNotFoundError`` is a failure rather than
    an absence: a timeout or connection error, or an HTTP status other than 404/410 (an
    absence is a 404, S3's ``NoSuchKey``, a memory filesystem's ``KeyError``, ...)."""
    if cause is None or isinstance(cause, FileNotFoundError | KeyError):
        return False
    if isinstance(cause, OSError | TimeoutError):  # aiohttp's connection errors are OSErrors
        return True
    status = getattr(cause, "status", None)
    if status is None:  # botocore: response["ResponseMetadata"]["HTTPStatusCode"]
        meta = getattr(cause, "response", None)
        status = meta.get("ResponseMetadata", {}).get("HTTPStatusCode") \
            if isinstance(meta, dict) else None
    return isinstance(status, int) and status not in (404, 410)


def absent(url: str, error: FileNotFoundError) -> ScanError:
    """The error for ``url`` that fsspec or the OS reported missing: a
    :class:`~refgrid.errors.NotFoundError` when it is, else what really failed."""
    reason = not_found(error)
    return NotFoundError(url, None, reason) if reason == NO_SUCH_FILE else \
        ScanError(url, None, reason)


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def identity_of(url: str, storage_options: StorageOptions | None = None) -> SourceIdentity:
    """The identity of the file at ``url`` now (one ``stat`` or ``HEAD``)."""
    if is_local(url):
        return stat_identity(os.stat(url.removeprefix("file://")))
    fs, path = filesystem(url, dict(storage_options or {}))
    from refgrid.core.network import remote_info

    return identity_from_info(remote_info(fs, path))


def stat_identity(stat: os.stat_result) -> SourceIdentity:
    """A local file's identity from its ``stat``."""
    return {"size": stat.st_size, "mtime": stat.st_mtime}


def identity_from_info(info: Mapping[str, Untyped]) -> SourceIdentity:
    """The identity of a remote file from fsspec's ``info`` (or a ``glob``/``find`` listing
    with ``detail=True``, which gives the same fields without a request per file)."""
    out: SourceIdentity = {"size": int(info["size"])}
    etag = info.get("ETag") or info.get("etag")
    if etag:
        out["etag"] = str(etag).strip('"')
    version = info.get("VersionId") or info.get("version_id")
    if version:
        out["version"] = str(version)
    return out


IDENTITY_FIELDS = tuple(SourceIdentity.__annotations__)
"""What a stored identity may hold (anything else is dropped as it is read)."""
_TYPES: dict[str, type | tuple[type, ...]] = {"size": int, "mtime": (int, float), "etag": str,
                                              "version": str, "rewritten": bool}
_USUAL = frozenset({"size", "mtime"})


def stored_identities(container: object, sidecar: str | None = None
                      ) -> dict[str, SourceIdentity]:
    """The table stored in a reference set's top level (or ``.zmetadata``), kept only where
    it has the expected shape (:func:`valid_identity`); files of the sidecar named where it
    lies now (``sidecar``). A table of 10^5 entries is read in one pass: the usual entry —
    a dict, just parsed, of a size and a modification time — is copied as it is."""
    value = section(container).get("sources")
    if not isinstance(value, Mapping):
        return {}
    out: dict[str, SourceIdentity] = {}
    with gc_paused():  # 10^5 small dicts: the collector would walk them again and again
        for url, entry in value.items():
            if type(entry) is dict and entry.keys() <= _USUAL and type(url) is str and \
                    type(entry.get("size")) is int and 0 <= entry["size"] < 2**63 and \
                    type(entry.get("mtime", 0.0)) is float:
                kept: SourceIdentity | None = cast(SourceIdentity, entry.copy())
            else:
                kept = valid_identity(entry) if isinstance(url, str) else None
            if kept is not None:
                out[in_sidecar(url, sidecar) if sidecar is not None else url] = kept
    return out


def valid_identity(entry: object) -> SourceIdentity | None:
    """``entry`` as an identity — its fields of the expected types, a size of a file — or
    None when it has no such size (a table from elsewhere may hold anything)."""
    if not isinstance(entry, Mapping):
        return None
    size = entry.get("size")
    if type(size) is not int or not 0 <= size < 2**63:
        return None
    return cast(SourceIdentity, {k: v for k, v in entry.items() if k in _TYPES and isinstance(
        v, _TYPES[k]) and (k == "rewritten" or not isinstance(v, bool))})


def identity_difference(was: SourceIdentity, now: SourceIdentity) -> str:
    """What differs between two identities of a file, in words (``""``: nothing they both
    record): ``modified 2026-11-24 10:15:42 UTC, now 2026-11-24 10:15:47 UTC``."""
    if was == now:  # (the usual case, 10^5 times for a grown archive's listing)
        return ""
    before, after = dict(was), dict(now)
    words = {"size": "size", "etag": "ETag", "version": "version", "mtime": "modified"}
    return "; ".join(f"{words[key]} {_shown(key, before[key])}, now {_shown(key, after[key])}"
                     for key in ("size", "etag", "version", "mtime")
                     if key in before and key in after and before[key] != after[key])


def _shown(key: str, value: object) -> str:
    if key == "mtime" and isinstance(value, int | float):
        when = datetime.fromtimestamp(value, UTC)
        return when.strftime("%Y-%m-%d %H:%M:%S") + (f".{when.microsecond // 1000:03d}"
                                                      if when.microsecond else "") + " UTC"
    if key == "size" and isinstance(value, int):
        return f"{value:,} bytes"
    return repr(value)


CHECK_WORKERS = 16
"""Identity requests in flight at once."""


def _nothing() -> None:
    pass


class _CheckState(TypedDict):
    """A :class:`SourceCheck` as pickled: what it checks, not what it has checked."""

    recorded: Mapping[str, SourceIdentity]
    storage_options: StorageOptions
    strict: bool


class StoredSources(Mapping[str, SourceIdentity]):
    """A parquet archive's sources, sorted by URL into pages read as they are asked for:
    ``firsts`` holds each page's first URL, so a file's identity is one page away (a read
    of an archive of 10^6 files checks the files it touches by reading one or two pages of
    10^5), and how many there are is known beforehand. Iterated in URL order. Pickled as
    the dict they are."""

    def __init__(self, rows: int, firsts: Sequence[str],
                 load: Callable[[int], Mapping[str, SourceIdentity]],
                 sidecar: str | None = None) -> None:
        self.rows = rows
        self.firsts = list(firsts)
        self._load = load
        self.sidecar = sidecar
        """Where the sidecar lies now: the pages name its files by the template."""
        self._pages: dict[int, Mapping[str, SourceIdentity]] = {}
        self._lock = threading.Lock()

    def load(self, pages: Iterable[int]) -> None:
        """Read ``pages`` now."""
        for n in pages:
            self._page(n)

    def _page(self, n: int) -> Mapping[str, SourceIdentity]:
        found = self._pages.get(n)
        if found is None:
            with self._lock:
                found = self._pages.get(n)
                if found is None:
                    found = self._pages[n] = self._load(n)
        return found

    def _stored(self, url: object) -> tuple[str, Mapping[str, SourceIdentity]]:
        """``url`` as the pages name it, and the page that would hold it."""
        if not isinstance(url, str):
            return "", {}
        if self.sidecar is not None and url.startswith(self.sidecar + "/"):
            url = SIDECAR_TEMPLATE + url[len(self.sidecar):]
        n = bisect_right(self.firsts, url) - 1
        return url, self._page(n) if n >= 0 else {}

    def __getitem__(self, url: str) -> SourceIdentity:
        stored, page = self._stored(url)
        return page[stored]

    def __contains__(self, url: object) -> bool:
        stored, page = self._stored(url)
        return stored in page

    def __iter__(self) -> Iterator[str]:
        for n in range(len(self.firsts)):
            for url in self._page(n):
                yield in_sidecar(url, self.sidecar)

    def __len__(self) -> int:
        return self.rows

    def items(self) -> ItemsView[str, SourceIdentity]:
        """Every identity, page by page (an append's plan compares them all)."""
        pages = [self._page(n) for n in range(len(self.firsts))]
        with gc_paused():
            return {in_sidecar(url, self.sidecar): identity for page in pages
                    for url, identity in page.items()}.items()

    def __reduce__(self) -> tuple[type[dict[str, SourceIdentity]],
                                  tuple[dict[str, SourceIdentity]]]:
        return dict, (dict(self.items()),)


Verify = bool | Literal["strict"]
"""How readers check sources (``verify_sources=``): not at all, by their recorded identity
(and, locally, as the same file), or ``"strict"``: their change time too (SourceCheck)."""


def source_check(sources: Mapping[str, SourceIdentity], storage_options: StorageOptions | None,
                 verify: Verify) -> SourceCheck | None:
    """The check a reader makes of ``sources`` (None: nothing to check, or not asked)."""
    if verify not in (True, False, "strict"):
        raise ArgumentError(f"verify_sources takes True, False or 'strict', not {verify!r}")
    if not verify or not sources:
        return None
    return SourceCheck(sources, storage_options, strict=verify == "strict")


Stamp = tuple[int, ...]
"""Which local file a check saw: its device and inode (and change time, ``strict``)."""


class SourceCheck:
    """Checks each recorded source the first time a read touches it, and every local read
    after that: the descriptor a read used is asked (``fstat``) whether it still holds the
    recorded version (size, modification time) and the file the first check saw (device and
    inode: a file renamed over it is another file), so a rewrite while a read is under way
    fails that read instead of handing out bytes of two versions. What this cannot see: a
    rewrite of the same size whose modification time is put back, before the first read in
    this process (``strict`` also asks the change time, which nobody can put back, from the
    first read on: a ``chmod`` or a new hard link then counts as a change too)."""

    def __init__(self, recorded: Mapping[str, SourceIdentity],
                 storage_options: StorageOptions | None = None, strict: bool = False) -> None:
        self.recorded = recorded if isinstance(recorded, StoredSources) else dict(recorded)
        self.storage_options = dict(storage_options or {})
        self.strict = strict
        self.checked: set[str] = set()
        self.stamps: dict[str, Stamp] = {}
        """Each local source as the first check in this process saw it (kept when checks
        are forgotten: a file put in its place later is another file)."""
        self.confirmed: dict[str, tuple[object, ...]] = {}
        """Each local source's ``stat`` as last found to be the recorded version (a read's
        ``fstat`` that equals it needs no other question)."""
        self.lock = threading.Lock()

    def __getstate__(self) -> _CheckState:
        return {"recorded": self.recorded, "storage_options": self.storage_options,
                "strict": self.strict}

    def __setstate__(self, state: _CheckState) -> None:
        self.__init__(state["recorded"], state["storage_options"],  # type: ignore[misc]
                      state["strict"])

    def forget(self) -> None:
        """Check every source again at its next read (a long-running reader's sources may
        be rewritten, replaced or removed after their first check)."""
        with self.lock:
            self.checked.clear()

    def start(self, urls: Iterable[str]) -> Callable[[], None]:
        """Begin checking those of ``urls`` not checked yet: local files now, remote ones
        concurrently in the background. Returns the function that waits for them (and
        raises for a changed source)."""
        todo = [u for u in dict.fromkeys(urls) if u in self.recorded and u not in self.checked]
        remote = [u for u in todo if not is_local(u)]
        for url in todo:
            if is_local(url):
                self._check(url)
                self._done(url)
        if not remote:
            return _nothing
        pool = thread_pool("refgrid-check", CHECK_WORKERS)
        futures = [pool.submit(self._check, url) for url in remote]

        def wait() -> None:
            for url, future in zip(remote, futures, strict=True):
                future.result()
                self._done(url)

        return wait

    def confirm(self, url: str, fd: int) -> None:
        """After a read of local ``url`` through ``fd``: the bytes read are the recorded
        version's, or a :class:`ReadError` says what changed."""
        stat = os.fstat(fd)
        if self.confirmed.get(url) == self._key(stat) or url not in self.recorded:
            return  # (every read after the first: one tuple compared)
        changed = self._difference(url, stat)
        if changed:
            raise ReadError(f"{url}: the source changed while it was read ({changed}); scan "
                            "it again, or pass verify_sources=False to read it anyway")

    def _done(self, url: str) -> None:
        with self.lock:
            self.checked.add(url)

    def _check(self, url: str) -> None:
        expected = self.recorded[url]
        try:
            if is_local(url):
                changed = self._difference(url, os.stat(url.removeprefix("file://")))
            else:
                changed = identity_difference(expected,
                                              identity_of(url, self.storage_options))
        except FileNotFoundError as e:
            reason = not_found(e)
            if reason == NO_SUCH_FILE and url not in self.stamps:
                return  # the read that follows names the missing file and the chunk
            raise ReadError(f"{url}: cannot check the source: {reason}") from e
        except OSError as e:
            raise ReadError(f"{url}: cannot check the source: {e}") from e
        if changed:
            raise ReadError(f"{url}: the source changed since it was scanned ({changed}); "
                            "scan it again, or pass verify_sources=False to read it anyway")

    def _key(self, stat: os.stat_result) -> tuple[object, ...]:
        return (stat.st_size, stat.st_mtime, stat.st_dev, stat.st_ino, stat.st_nlink > 0,
                *((stat.st_ctime_ns,) if self.strict else ()))

    def _difference(self, url: str, stat: os.stat_result) -> str:
        """How the local file ``stat`` describes differs from the recorded version and
        from the file first seen (``""``: it is the same)."""
        changed = identity_difference(self.recorded[url], stat_identity(stat))
        if changed:
            return changed
        if not stat.st_nlink:  # (a descriptor kept open on a file no longer there)
            return "it was removed, or another file put in its place, since it was opened"
        stamp = (stat.st_dev, stat.st_ino, *((stat.st_ctime_ns,) if self.strict else ()))
        with self.lock:
            first = self.stamps.setdefault(url, stamp)
        if first[:2] != stamp[:2]:
            return "another file was put in its place"
        if first != stamp:
            return "its status changed (ctime: written to, its modification time set " \
                "back, or its permissions or links changed)"
        self.confirmed[url] = self._key(stat)
        return ""


_held: dict[str, tuple[bytes, SourceIdentity]] = {}
_held_lock = threading.Lock()


@contextmanager
def held_file(url: str, data: bytes, identity: SourceIdentity) -> Iterator[None]:
    """Within the block, reads of ``url`` (in this process) are served from ``data``."""
    with _held_lock:
        _held[url] = (data, identity)
    try:
        yield
    finally:
        with _held_lock:
            _held.pop(url, None)


def held(url: str) -> tuple[bytes, SourceIdentity] | None:
    """The bytes and identity of ``url`` if it is held, else ``None``."""
    return _held.get(url)

"""The source files behind references: the fsspec filesystem of a URL, each file's identity
(checked before reading it) and size, and remote files held in memory while a batch worker
uses them. (How references store the identities is theirs: :mod:`refgrid.refs`.)

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

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Literal, NotRequired, TypedDict, cast

import fsspec
from fsspec.core import url_to_fs

from refgrid.core.typed import StorageOptions, Untyped
from refgrid.core.util import thread_pool
from refgrid.errors import (
    NO_SUCH_FILE,
    ArgumentError,
    MissingExtraError,
    NotFoundError,
    ReadError,
    ScanError,
)


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


def file_sizes(urls: Sequence[str], storage_options: StorageOptions,
               where: str) -> dict[str, int]:
    """Sizes of many files (concurrently for remote filesystems): kerchunk's whole-file
    references (``[url]``) become byte ranges ``[url, 0, size]``."""
    by_protocol: dict[str, list[str]] = {}
    for url in urls:
        by_protocol.setdefault(url.split("://")[0] if "://" in url else "file", []).append(url)
    sizes: dict[str, int] = {}
    for group in by_protocol.values():
        fs, _ = filesystem(group[0], storage_options)
        try:
            found = fs.sizes([fs._strip_protocol(u) for u in group])
        except FileNotFoundError as e:
            raise ScanError(where, None, f"a whole-file reference names a missing file: "
                            f"{e}") from e
        sizes.update(zip(group, (int(n) for n in found), strict=True))
    return sizes


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


class PagedSources(Mapping[str, SourceIdentity]):
    """A table of sources read page by page as it is asked for (a parquet archive's,
    :class:`refgrid.refs.source_pages.StoredSources`): a group and a check keep it as it is,
    where a copy would read every page."""


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
        self.recorded = recorded if isinstance(recorded, PagedSources) else dict(recorded)
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

"""Byte ranges through fsspec: neighbours in one file coalesced, requests run concurrently.

Local files are read with ``os.pread``; remote ones with the filesystem's ``cat_ranges``
(concurrent for async filesystems such as s3fs and HTTP). Ranges of one file closer than a gap
are merged into one request — 256 KiB apart for remote files, where a request costs a round
trip, 16 KiB locally, where it costs a system call — so a full read costs about one request
per file. Ranges arrive as numpy columns (a read may cover 10^5 chunks) and come back as
memoryviews into the fetched blocks, in the order asked.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections.abc import Sequence

import numpy as np

from refgrid.core.sources import SourceCheck, filesystem, held, is_local, not_found
from refgrid.core.typed import Bytes, StorageOptions
from refgrid.errors import NO_SUCH_FILE
from refgrid.model.manifest import UNSIZED

LOCAL_GAP = 16 * 2**10
REMOTE_GAP = 256 * 2**10
MAX_REQUEST = 64 * 2**20
"""Requests are cut where a range starts on a new multiple of this many bytes."""


class FetchError(OSError):
    """A request failed. ``index`` is the first of the ranges asked for that it served."""

    def __init__(self, index: int, url: str, reason: str, missing: bool) -> None:
        super().__init__(f"{url}: {reason}")
        self.index = index
        self.url = url
        self.reason = reason
        self.missing = missing


def coalesce(offset: np.ndarray, length: np.ndarray,
             gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Requests for ranges of one file: ``(order, starts, ends, firsts)`` — the ranges sorted
    by offset, each request's byte span, and where each request begins in ``order``."""
    order = np.argsort(offset, kind="stable")
    start = offset[order].astype(np.int64)
    end = start + length[order].astype(np.int64)
    reach = np.maximum.accumulate(end)
    new = np.ones(len(start), dtype=bool)
    new[1:] = (start[1:] - reach[:-1] > gap) | (start[1:] // MAX_REQUEST
                                                 != start[:-1] // MAX_REQUEST)
    firsts = np.flatnonzero(new)
    return order, start[firsts], np.maximum.reduceat(end, firsts), firsts


class _Requests:
    """The coalesced requests for some ranges of one file, and how to hand out their bytes."""

    def __init__(self, members: np.ndarray, offset: np.ndarray, length: np.ndarray,
                 gap: int) -> None:
        order, starts, ends, firsts = coalesce(offset[members], length[members], gap)
        ranged = members[order]
        self.members = ranged.tolist()
        self.starts = starts.tolist()
        self.ends = ends.tolist()
        self.bounds = [*firsts.tolist(), len(order)]
        within = offset[ranged].astype(np.int64) - np.repeat(starts, np.diff(self.bounds))
        self.within = within.tolist()
        """Each range's first byte in its request's block."""
        self.past = (within + length[ranged].astype(np.int64)).tolist()

    def __len__(self) -> int:
        return len(self.starts)

    def first_member(self, r: int) -> int:
        return self.members[self.bounds[r]]

    def serve(self, r: int, block: Bytes, out: list[Bytes | None]) -> None:
        """Hand out request ``r``'s bytes to the ranges it covers (short if ``block`` is)."""
        view, first, last = memoryview(block), self.bounds[r], self.bounds[r + 1]
        for j, a, b in zip(self.members[first:last], self.within[first:last],
                           self.past[first:last], strict=True):
            out[j] = view[a:b]


def read_ranges(paths: Sequence[str], path_id: np.ndarray, offset: np.ndarray,
                length: np.ndarray, storage_options: StorageOptions | None = None,
                check: SourceCheck | None = None) -> list[Bytes | None]:
    """The bytes of range ``k``: ``paths[path_id[k]]`` from ``offset[k]``, ``length[k]`` long
    — or, for a length of :data:`~refgrid.model.manifest.UNSIZED`, the whole file, None if
    there is none.

    A range past the end of its file comes back short (callers check); a missing file or a
    failed request raises :class:`FetchError`. With ``check``, each local file's descriptor
    is asked after its reads whether it still holds the recorded version
    (:meth:`SourceCheck.confirm`: a :class:`~refgrid.errors.ReadError` if not).
    """
    out: list[Bytes | None] = [b""] * len(path_id)
    whole = np.flatnonzero(length == UNSIZED)
    if len(whole):
        _read_whole(paths, path_id, whole, storage_options or {}, out, check)
        ranged = np.ones(len(path_id), bool)
        ranged[whole] = False
        path_id = np.where(ranged, path_id, -1)  # those are done
    order = np.argsort(path_id, kind="stable")
    order = order[path_id[order] >= 0] if len(whole) else order
    cuts = np.flatnonzero(np.diff(path_id[order])) + 1
    remote: dict[str, list[tuple[str, np.ndarray]]] = {}
    for members in np.split(order, cuts) if len(order) else ():
        url = paths[int(path_id[members[0]])]
        kept = held(url)
        if kept is not None:
            for k in members.tolist():
                out[k] = memoryview(kept[0])[int(offset[k]):int(offset[k] + length[k])]
        elif is_local(url):
            _read_local(url, members, offset, length, out, check)
        else:
            remote.setdefault(url.split("://", 1)[0], []).append((url, members))
    for files in remote.values():  # one filesystem per protocol
        _read_remote(files, offset, length, storage_options or {}, out)
    return out


def _read_whole(paths: Sequence[str], path_id: np.ndarray, members: np.ndarray,
                storage_options: StorageOptions, out: list[Bytes | None],
                check: SourceCheck | None) -> None:
    """Whole files (a Zarr store's chunk files): each read once, concurrently where remote;
    an absent one is None (a chunk never written)."""
    remote: dict[str, list[int]] = {}
    for k in members.tolist():
        url = paths[int(path_id[k])]
        kept = held(url)
        if kept is not None:
            out[k] = kept[0]
        elif is_local(url):
            try:
                with open(url.removeprefix("file://"), "rb") as f:
                    out[k] = f.read()
                    if check is not None:
                        check.confirm(url, f.fileno())
            except FileNotFoundError:
                out[k] = None
            except (OSError, ValueError) as e:
                raise FetchError(k, url, f"cannot read: {e}", False) from e
        else:
            remote.setdefault(url, []).append(k)
    if not remote:
        return
    urls = list(remote)
    fs, _ = filesystem(urls[0], storage_options)
    found = fs.cat([fs._strip_protocol(u) for u in urls], on_error="return")
    for url, path in zip(urls, (fs._strip_protocol(u) for u in urls), strict=True):
        block = found.get(path) if isinstance(found, dict) else found
        if isinstance(block, FileNotFoundError) and not_found(block) == NO_SUCH_FILE:
            block = None
        elif isinstance(block, BaseException):
            raise FetchError(remote[url][0], url, f"request failed: {block}", False)
        for k in remote[url]:
            out[k] = block


def _read_local(url: str, members: np.ndarray, offset: np.ndarray, length: np.ndarray,
                out: list[Bytes | None], check: SourceCheck | None) -> None:
    requests = _Requests(members, offset, length, LOCAL_GAP)
    try:
        fd = os.open(url.removeprefix("file://"), os.O_RDONLY)
    except FileNotFoundError:
        raise FetchError(int(members[0]), url, "source file not found", True) from None
    except (OSError, ValueError) as e:  # ValueError: a NUL inside the path
        raise FetchError(int(members[0]), url, f"cannot open: {e}", False) from e
    try:
        for r, (start, end) in enumerate(zip(requests.starts, requests.ends, strict=True)):
            try:
                block = os.pread(fd, end - start, start)
            except OSError as e:
                raise FetchError(requests.first_member(r), url,
                                 f"cannot read bytes {start}-{end}: {e}", False) from e
            requests.serve(r, block, out)
        if check is not None:  # (after the reads: a change while they ran is seen)
            check.confirm(url, fd)
    finally:
        os.close(fd)


def _read_remote(files: list[tuple[str, np.ndarray]], offset: np.ndarray, length: np.ndarray,
                 storage_options: StorageOptions, out: list[Bytes | None]) -> None:
    fs, _ = filesystem(files[0][0], storage_options)
    paths, starts, ends, served = [], [], [], []
    for url, members in files:
        requests = _Requests(members, offset, length, REMOTE_GAP)
        path = fs._strip_protocol(url)
        for r in range(len(requests)):
            paths.append(path)
            starts.append(requests.starts[r])
            ends.append(requests.ends[r])
            served.append((url, requests, r))
    blocks = fs.cat_ranges(paths, starts, ends, on_error="return")
    for block, (url, requests, r) in zip(blocks, served, strict=True):
        if isinstance(block, BaseException):
            missing = isinstance(block, FileNotFoundError) and not_found(block) == NO_SUCH_FILE
            reason = "source file not found" if missing else f"request failed: {block}" \
                if not isinstance(block, FileNotFoundError) else not_found(block)
            raise FetchError(requests.first_member(r), url, reason, missing)
        requests.serve(r, _the_range(block, requests.starts[r], requests.ends[r], url,
                                     requests.first_member(r)), out)


def _the_range(block: Bytes, start: int, end: int, url: str, member: int) -> Bytes:
    """The bytes ``[start, end)`` of an answer: a server that ignores ``Range`` (as
    ``python -m http.server`` does) answers with the whole file, which is cut here; any other
    answer longer than asked is an error, never bytes taken for the range."""
    if len(block) <= end - start:
        return block  # exact, or short past the end of the file (callers check)
    if len(block) >= end:  # the whole file, from its first byte
        if url not in _WHOLE_FILE_SERVERS:
            _WHOLE_FILE_SERVERS.add(url)
            warnings.warn(f"{url}: the server ignores Range requests and sends the whole "
                          "file for every chunk (correct, but slow)", RangeIgnoredWarning,
                          stacklevel=4)
        return memoryview(block)[start:end]
    raise FetchError(member, url, f"asked for bytes {start}-{end}, the server answered "
                     f"{len(block)} bytes", False)


KEEP_OPEN = 128
"""Local files kept open at once by all the stores of a process: far below the usual limit
of 1,024 descriptors, however many stores a notebook holds."""


class _Kept:
    """How many files every :class:`OpenFiles` of the process keeps open."""

    lock = threading.Lock()
    count = 0


class OpenFiles:
    """Local files kept open for reads of one chunk at a time (a store answering zarr's gets,
    where an ``open`` costs more than the ``pread``): the first files read stay open until
    :meth:`close` — at most ``keep`` here, :data:`KEEP_OPEN` in the process — and others are
    opened per read. :meth:`close` while reads are under way closes the files when the last
    of them ends: no read meets a descriptor closed, or reused for another file, under it."""

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._busy = 0
        """Reads under way on kept descriptors."""
        self._closing = False
        self._finalizer = weakref.finalize(self, _close_all, self._fds)

    def pread(self, url: str, offset: int, length: int,
              check: SourceCheck | None = None) -> bytes | None:
        """``length`` bytes of local ``url`` from ``offset`` (short past its end), or None if
        the file cannot be opened or read (the caller's general path names why); with
        ``check``, confirmed to be the recorded version's (a kept descriptor may outlive
        the file it was opened on)."""
        with self._lock:  # (closing: the kept descriptors may be closing under us)
            fd = None if self._closing else self._fds.get(url)
            if fd is not None:
                self._busy += 1
        if fd is not None:
            try:
                return _pread(fd, url, length, offset, check)
            finally:
                self._release()
        try:
            fd = os.open(url.removeprefix("file://"), os.O_RDONLY)
        except (OSError, ValueError):  # ValueError: a NUL inside the path
            return None
        with self._lock, _Kept.lock:
            kept = not self._closing and url not in self._fds and \
                len(self._fds) < self.keep and _Kept.count < KEEP_OPEN
            if kept:
                self._fds[url] = fd
                self._busy += 1
                _Kept.count += 1
        try:
            return _pread(fd, url, length, offset, check)
        finally:
            if kept:
                self._release()
            else:
                os.close(fd)

    def _release(self) -> None:
        with self._lock:
            self._busy -= 1
            last = self._closing and not self._busy
        if last:
            self._finalizer()

    def close(self) -> None:
        """Close the files kept open (once the reads under way end); later reads open and
        close their file each time."""
        with self._lock:
            self._closing = True
            idle = not self._busy
        if idle:
            self._finalizer()


def _pread(fd: int, url: str, length: int, offset: int,
           check: SourceCheck | None) -> bytes | None:
    try:
        data = os.pread(fd, length, offset)
    except OSError:
        return None
    if check is not None:
        check.confirm(url, fd)
    return data


def _close_all(fds: dict[str, int]) -> None:
    with _Kept.lock:
        for fd in fds.values():
            os.close(fd)
        _Kept.count -= len(fds)
        fds.clear()


class RangeIgnoredWarning(UserWarning):
    """The server answered a range request with the whole file."""


_WHOLE_FILE_SERVERS: set[str] = set()

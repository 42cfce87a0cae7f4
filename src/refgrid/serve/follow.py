"""Followed archives: the service keeps a growing archive's references current.

``refgrid serve ROOT --follow NAME=PATTERN`` lists PATTERN every ``every`` seconds (local,
``s3://`` and ``http(s)://`` listings, as ``refgrid batch`` lists sources), leaves alone the
files modified less than ``older_than`` seconds ago (still being written), and runs a batch over
the rest into parquet references kept in the service's state directory: new and changed files
are scanned in worker processes with batch's per-file deadline, and files after the archive's
end are appended at the cost of what they add (:mod:`refgrid.archive.extend`). When a round has
written a new version, the follower publishes it (``on_version``: the catalog opens it, on the
round's thread, and serves NAME from it from then on); this service reads no references while
its round writes them. A file that fails is reported in the status and tried again on the next
round; it never holds back the others. A restarted service finds its state (the references and
the batch's work directory) and scans nothing it had scanned. ``POST /NAME/refresh`` (with the
token given at start-up) runs a round now; ``GET /NAME/status`` tells how the archive stands:
its ``files`` are those of the version served, never the round's own count.

One process follows an archive's state at a time (an exclusive lock on ``NAME.lock`` in the
state directory): another service started on the same state serves the versions the first
one writes, publishing each as it appears (it may open one while the first writes the next:
record files an append writes again keep their bytes, and a version caught half written is a
digest error, published at its next round), and says so in its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from refgrid.combining.spec import CombineSpec
from refgrid.core.inputs import expand, is_pattern
from refgrid.core.sources import source_count
from refgrid.core.typed import JSON, JSONObject, StorageOptions
from refgrid.errors import ArgumentError, RefgridError
from refgrid.serve.catalog import Dataset, stamp_of

log = logging.getLogger("refgrid.serve")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*")


UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
RESERVED = ("healthz",)
"""Paths of the service itself, which no followed archive may be named."""


def seconds(text: str, what: str) -> float:
    """A duration as the CLI takes it: ``30``, ``30s``, ``5m``, ``1h``."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smh]?)\s*", text)
    if found is None:
        raise ArgumentError(f"{what} takes a duration such as 30s, 5m or 1h, not {text!r}")
    return float(found[1]) * UNITS[found[2]]


@dataclass(frozen=True)
class Follow:
    """One followed archive: served as ``name``, its files named by ``pattern``, combined as
    ``spec`` says (a batch's every setting: the dimension, merging, stacking, the variables
    chosen, times from names...)."""

    name: str
    pattern: str
    spec: CombineSpec = field(default_factory=CombineSpec)
    every: float = 30.0
    """Seconds between two listings of the pattern."""
    older_than: float = 60.0
    """Files modified more recently than this many seconds are left for a later round."""
    file_timeout: float | None = None
    """Seconds one file's scan may take (batch's default: 10 minutes)."""
    scheduler: str | None = None
    """Where scans run, as batch's ``scheduler`` (default: worker processes here)."""
    data_url: str | None = None
    """DMR++ documents: where their granules are (as batch's ``data_url``)."""

    @classmethod
    def parse(cls, text: str, *, spec: CombineSpec | None = None, every: float = 30.0,
              older_than: float = 60.0, file_timeout: float | None = None,
              scheduler: str | None = None, data_url: str | None = None) -> Follow:
        """``NAME=PATTERN`` (the CLI's ``--follow``), with the other fields given."""
        name, sep, pattern = text.partition("=")
        if not sep:
            raise ArgumentError(f"--follow takes NAME=PATTERN (e.g. sst=/data/sst/*.nc), not "
                                f"{text!r}")
        return cls(name.strip("/"), pattern, spec or CombineSpec(), every, older_than,
                   file_timeout, scheduler, data_url).checked()

    @property
    def concat_dim(self) -> str:
        return self.spec.concat_dim

    def checked(self) -> Follow:
        if not NAME.fullmatch(self.name) or self.name in RESERVED:
            raise ArgumentError(f"cannot follow as {self.name!r}: a name is letters, digits, "
                                f"'.', '_', '-' and '/', and not {' or '.join(RESERVED)}")
        if not self.pattern:
            raise ArgumentError(f"{self.name}: no file pattern to follow")
        if not self.every > 0 or not self.older_than >= 0:
            raise ArgumentError(f"{self.name}: every must be > 0 and older_than >= 0 seconds")
        return self

    @property
    def source_prefix(self) -> str:
        """Where the pattern's files lie (its part before the first wildcard): the sources a
        followed archive's references may name."""
        if not is_pattern(self.pattern):
            return self.pattern
        head = re.split(r"[*?\[]", self.pattern, maxsplit=1)[0]
        return head.rsplit("/", 1)[0] + "/" if "/" in head else head


@dataclass
class Status:
    """How a followed archive stands (``GET /NAME/status``)."""

    name: str
    pattern: str
    files: int = 0
    """Files in the served version."""
    waiting: int = 0
    """Files younger than ``older_than`` at the last listing (left for a later round)."""
    failed: list[JSON] = field(default_factory=list)
    """Files that could not be scanned at the last round (tried again on the next)."""
    rounds: int = 0
    last_round: float = 0.0
    last_update: float | None = None
    """When a new version was last published (seconds since the epoch)."""
    lag: float | None = None
    """Seconds from the newest file's modification to the version that serves it."""
    update: str | None = None
    """What the last round did (``append: ...``, ``unchanged: ...``, ``rebuild: <why>``)."""
    error: str | None = None
    """Why the last round could not publish (its files do not combine...)."""

    def to_dict(self) -> JSONObject:
        def when(t: float | None) -> str | None:
            return None if t is None else datetime.fromtimestamp(t, UTC).isoformat()
        return {"name": self.name, "pattern": self.pattern, "files": self.files,
                "waiting": self.waiting, "failed": self.failed, "rounds": self.rounds,
                "last_round": when(self.last_round or None), "last_update": when(self.last_update),
                "lag_seconds": self.lag, "update": self.update, "error": self.error}


class Follower:
    """Keeps one followed archive's references (``state/NAME.parq``) current."""

    def __init__(self, follow: Follow, state: Path,
                 storage_options: StorageOptions | None = None) -> None:
        self.follow = follow
        self.output = state / f"{follow.name}.parq"
        self.storage_options = dict(storage_options or {})
        self.status = Status(follow.name, follow.pattern)
        self.wake = asyncio.Event()
        self.lock = threading.Lock()
        """Held by a round (a refresh during one waits for the next)."""
        self.on_version: Callable[[], Dataset] | None = None
        """Called on the round's thread when the references hold a version not yet served
        (a new one, or the one a restarted service finds): the version now served; raises
        if it cannot be served."""
        self.served: tuple[int, int, int] | None = None
        """The stamp of the references served (:func:`~refgrid.serve.catalog.stamp_of`)."""
        self.lock_file: int | None = None
        """This process's lock on the archive's state, once it holds it."""
        self.owner: str | None = None
        """Who else follows it (another process holds the lock), if anyone."""
        self.closing = False
        """The service ends: no round starts, and the lock goes once the one under way ends."""

    def round(self) -> Status:
        """List, scan what is new or changed, publish (blocking: run it on a thread). The
        status is replaced whole when the round ends: ``GET /NAME/status`` never shows a
        round half done."""
        with self.lock:
            if self.closing:
                return self.status
            status = replace(self.status, rounds=self.status.rounds + 1,
                             last_round=time.time())
            try:
                if not self._locked(status):  # another service writes them: serve its versions
                    if self._stamp() != self.served:
                        self._publish(status)
                else:
                    if self.served is None:  # a restarted service serves its state first
                        self._publish(status)
                    files = self._round(status)
                    if files is not None or self._stamp() != self.served:
                        self._publish(status, files)
            except Exception as e:  # a bug, not the archive's: said, and the next round tries
                log.exception("following %s: the round failed", self.follow.name)
                status.error = f"the round failed: {type(e).__name__}: {e}"
            finally:
                if self.closing:  # (closed while this round wrote: the lock goes now)
                    self._unlock()
            self.status = status
            return status

    def _locked(self, status: Status) -> bool:
        """Whether this process writes the archive's references: it holds (or now takes)
        the lock on its state; otherwise the status says who does."""
        if self.lock_file is not None:
            return True
        self.output.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.output.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            self.owner = f"process {holder}"
            status.update = f"followed by another service ({self.owner}, the same state " \
                            f"directory): serving the versions it writes"
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.lock_file, self.owner = fd, None
        return True

    def close(self) -> None:
        """Let another service follow the archive: the lock is given back now, or when the
        round under way ends (on its daemon thread: the service does not wait for it), so
        two never write the state at once."""
        self.closing = True
        if self.lock.acquire(blocking=False):
            try:
                self._unlock()
            finally:
                self.lock.release()

    def _unlock(self) -> None:
        if self.lock_file is not None:
            os.close(self.lock_file)
            self.lock_file = None

    def _stamp(self) -> tuple[int, int, int] | None:
        """Which version the references hold now (None: none yet)."""
        try:
            return stamp_of(self.output)
        except OSError:
            return None

    def _publish(self, status: Status, files: int | None = None) -> None:
        """Hand the references as they now are to :attr:`on_version`; one that cannot be
        served is said in the status and handed again after the next round. The status's
        ``files`` are those of the version served: ``files`` where the round that wrote it
        counted them, else counted in its sources (a version another service wrote)."""
        if self.on_version is None or self._stamp() is None:
            return
        try:
            version = self.on_version()
            status.files = files if files is not None else source_count(version.group.sources)
            self.served = version.stamp
        except RefgridError as e:
            self.served = None
            status.error = f"the new version cannot be served (the one before it stays " \
                           f"served): {e}"

    def _round(self, status: Status) -> int | None:
        """One round; the archive's files if it wrote a new version of the references."""
        from refgrid.archive import BatchRun, convert

        try:
            listed = expand([self.follow.pattern], self.storage_options)
        except RefgridError as e:  # no file yet is no error
            status.error = None if "no file matches" in str(e) else str(e)
            status.waiting = 0
            return None
        settled = status.last_round - self.follow.older_than  # modified before: written
        ready = {url: ident for url, ident in listed.items()
                 if ident is None or float(ident.get("mtime", 0)) <= settled}
        status.waiting = len(listed) - len(ready)
        if not ready:
            return None
        self.output.parent.mkdir(parents=True, exist_ok=True)
        follow = self.follow
        try:
            result = convert(list(ready), self.output, follow.spec, BatchRun(
                follow.scheduler, progress=False, storage_options=self.storage_options,
                file_timeout=follow.file_timeout, data_url=follow.data_url))
        except RefgridError as e:
            status.error = str(e)
            log.warning("following %s: %s", self.follow.name, e)
            return None
        status.error = None
        status.failed = [{"url": f.url, "error": f.error, "message": f.message}
                         for f in result.failed]
        files = result.files - len(result.failed)
        status.update = result.update
        if result.update is not None and not result.update.startswith("unchanged"):
            status.last_update = time.time()
            newest = max((float(i.get("mtime", 0)) for i in ready.values() if i is not None),
                         default=None)
            status.lag = None if newest is None else round(status.last_update - newest, 3)
            log.info("following %s: %s", self.follow.name, result.update)
            return files
        return None

    async def run(self) -> None:
        """Rounds every ``every`` seconds, or at once when woken (a refresh), until
        cancelled."""
        while True:
            await _on_daemon_thread(self.round)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.follow.every)
            self.wake.clear()


async def _on_daemon_thread(work: Callable[[], object]) -> None:
    """Run ``work`` on a thread of its own that does not hold the process up when the
    service stops (a round may be scanning for minutes; the loop's own executor is joined at
    exit). A round stopped that way leaves the references as they were or as the next
    round finds and repairs them: each file is swapped in whole."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finish() -> None:
        if not done.done():  # (cancelled when the service stops)
            done.set_result(None)

    def target() -> None:
        try:
            work()
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the service stops
                loop.call_soon_threadsafe(finish)

    threading.Thread(target=target, name="refgrid-follow", daemon=True).start()
    await done

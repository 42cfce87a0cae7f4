"""A per-file deadline for batch workers: a scan that hangs — a server that stalls past every
timeout, libhdf5 looping on a damaged file, a file system that never answers — is stopped.

A thread in each worker process watches the file being scanned. When its scan passes the
deadline, the thread writes a note naming the file into the batch's work directory and ends
the worker process (only a process can stop a thread stuck in C code). The runner reads the
notes, records those files as failed ("timed out after ..."), replaces the worker pool and
goes on with the other files (:mod:`refgrid.archive.runner`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POLL = 0.2
"""Seconds between the watchdog's looks."""
EXIT_STATUS = 70
"""The status a worker ends with when one of its scans timed out."""

_current: dict[str, tuple[str, float, float, str | None]] = {}
_lock = threading.Lock()
_watching = False


@contextmanager
def deadline(url: str, seconds: float | None, notes: str | None) -> Iterator[None]:
    """Within the block, the scan of ``url`` may take ``seconds`` (None: no deadline)."""
    if seconds is None:
        yield
        return
    _watch()
    key = str(threading.get_ident())
    with _lock:
        _current[key] = (url, time.monotonic() + seconds, seconds, notes)
    try:
        yield
    finally:
        with _lock:
            _current.pop(key, None)


def _watch() -> None:
    global _watching
    with _lock:
        if _watching:
            return
        _watching = True
    threading.Thread(target=_watchdog, name="refgrid-deadline", daemon=True).start()


def _watchdog() -> None:
    while True:
        time.sleep(POLL)
        now = time.monotonic()
        with _lock:
            late = [entry for entry in _current.values() if entry[1] < now]
        if late:
            for url, _, seconds, notes in late:
                if notes is not None:
                    write_note(Path(notes), url, seconds)
            os._exit(EXIT_STATUS)


def write_note(notes: Path, url: str, seconds: float) -> None:
    notes.mkdir(parents=True, exist_ok=True)
    name = hashlib.blake2b(url.encode(), digest_size=12).hexdigest() + ".json"
    temporary = notes / f".{name}.{os.getpid()}"
    temporary.write_text(json.dumps({"url": url, "seconds": seconds}))
    os.replace(temporary, notes / name)


def read_notes(notes: Path) -> dict[str, float]:
    """The files whose scans timed out (url → the deadline in seconds), the notes removed."""
    found: dict[str, float] = {}
    if not notes.is_dir():
        return found
    for path in notes.glob("*.json"):
        try:
            note = json.loads(path.read_text())
            found[str(note["url"])] = float(note["seconds"])
        except (OSError, ValueError, KeyError):
            pass
        path.unlink(missing_ok=True)
    return found


UNGUARDED = "unguarded-script"
"""The note a worker leaves when it finds itself importing an unguarded script."""
GUARD = ("the script that runs refgrid.batch must call it under `if __name__ == "
         "\"__main__\":` — batch scans in worker processes, which import the script again and "
         "would start the batch again")


def importing_script() -> bool:
    """Whether this is a batch worker process importing the user's script: worker processes
    are started fresh and import the script that started the batch, and a script that calls
    ``refgrid.batch`` at its top level (not under ``if __name__ == "__main__":``) calls it
    again in every worker."""
    import multiprocessing
    import sys

    if multiprocessing.current_process().name == "MainProcess":
        return False
    frame = sys._getframe(1)
    while frame is not None:  # the script's own top level, run by the worker's import of it
        if frame.f_globals.get("__name__") == "__mp_main__" and \
                frame.f_code.co_name == "<module>":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def note_unguarded(notes: Path) -> None:
    """(In such a worker.) Leave the note the batch reads when its worker ends, and end the
    worker: the batch names the reason once, rather than each worker a traceback."""
    with contextlib.suppress(OSError):
        notes.mkdir(parents=True, exist_ok=True)
        (notes / UNGUARDED).write_text(GUARD)
    os._exit(EXIT_STATUS)

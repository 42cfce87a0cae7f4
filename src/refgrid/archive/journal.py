"""The work directory of a batch: one record per scanned file, appended as scans finish.

``records.jsonl`` holds a line per file: a small JSON header (URL, identity, the first value
of the concat coordinate), a tab, and the file's references (refgrid JSON, with the concat
coordinate inlined and digests of the variables without the concat dimension). A batch reads
the headers to know what is done, and each file's references only when it combines them.

A killed batch leaves at most one torn line at the end, which the next run drops. Lines are
flushed one by one, so a record written before a kill is kept; a file is recorded only once
its scan has succeeded. The directory is locked while a batch uses it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NotRequired, TypedDict

import orjson

from refgrid.errors import BatchError
from refgrid.sources import SourceIdentity
from refgrid.write.atomic import clean_leftovers, replace_file, temporary_for

RECORDS = "records.jsonl"
LOCK = "lock"
SEPARATOR = b"\t"
"""Between a line's header and its references (JSON escapes tabs inside strings)."""


class Header(TypedDict):
    url: str
    identity: SourceIdentity
    first: NotRequired[list[Any]]
    """``[value, units, calendar]``: the concat coordinate's first value, to order files."""


@dataclass(frozen=True)
class Entry:
    header: Header
    offset: int
    length: int


class Journal:
    """The records of a work directory, opened for one batch (a context manager)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._lock = open(directory / LOCK, "a+b")  # noqa: SIM115 - held until close
        except OSError as e:
            raise BatchError(f"cannot use the work directory {directory}: {e}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise BatchError(f"another batch is using the work directory {directory}; wait "
                             "for it, or give this one its own --work-dir") from None
        self.path = directory / RECORDS
        self.entries: dict[str, Entry] = {}
        self._load()
        self._out: IO[bytes] = open(self.path, "ab")  # noqa: SIM115 - held until close

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._out.flush()
        os.fsync(self._out.fileno())
        self._out.close()
        self._lock.close()

    def _load(self) -> None:
        """Index the records; drop a torn last line and superseded or damaged records."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as e:
            raise BatchError(f"cannot read the batch records {self.path}: {e}") from None
        lines = 0
        for offset, line in _lines(data):
            lines += 1
            head, sep, _ = line.partition(SEPARATOR)
            try:
                header = orjson.loads(head)
                url = header["url"]
            except (orjson.JSONDecodeError, TypeError, KeyError):
                continue  # torn or damaged: that file is scanned again
            if sep and isinstance(url, str) and isinstance(header.get("identity"), dict):
                self.entries[url] = Entry(header, offset, len(line))
        if lines != len(self.entries) or not data.endswith(b"\n"):
            self._compact(data)

    def _compact(self, data: bytes) -> None:
        """Rewrite the records with only the current ones (atomically)."""
        clean_leftovers(self.path)
        temporary = temporary_for(self.path)
        entries: dict[str, Entry] = {}
        try:
            with open(temporary, "wb") as f:
                for url, entry in self.entries.items():
                    entries[url] = Entry(entry.header, f.tell(), entry.length)
                    f.write(data[entry.offset:entry.offset + entry.length] + b"\n")
                f.flush()
                os.fsync(f.fileno())
            replace_file(temporary, self.path)
        except OSError as e:
            raise BatchError(f"cannot rewrite the batch records {self.path}: {e}") from None
        finally:
            temporary.unlink(missing_ok=True)
        self.entries = entries

    def append(self, header: Header, references: bytes) -> None:
        """Record one scanned file (it supersedes an earlier record of the same URL)."""
        line = orjson.dumps(header) + SEPARATOR + references
        offset = self._out.tell()
        try:
            self._out.write(line + b"\n")
            self._out.flush()
        except OSError as e:
            raise BatchError(f"cannot write the batch records {self.path}: {e}") from None
        self.entries[header["url"]] = Entry(header, offset, len(line))

    def references(self, url: str) -> dict[str, Any]:
        """The recorded references of ``url``."""
        entry = self.entries[url]
        with open(self.path, "rb") as f:
            f.seek(entry.offset)
            line = f.read(entry.length)
        try:
            refs = orjson.loads(line.partition(SEPARATOR)[2])
        except orjson.JSONDecodeError as e:
            raise BatchError(f"{self.path}: the record of {url} is damaged ({e}); delete "
                             "the work directory to scan every file again") from None
        if not isinstance(refs, dict):
            raise BatchError(f"{self.path}: the record of {url} is not a reference set")
        return refs


def _lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """Each complete line with its offset (a last line without its newline is torn)."""
    offset = 0
    while True:
        end = data.find(b"\n", offset)
        if end < 0:
            return
        yield offset, data[offset:end]
        offset = end + 1

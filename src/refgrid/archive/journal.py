"""The work directory of a batch: one record per scanned file, appended as scans finish.

``records.bin`` is a sequence of records, each a JSON header line — URL, identity, the first
value of the concat coordinate, the record's length and a CRC of header and record —
followed by the record
(:mod:`.record`) and a newline. A batch reads the headers to know what is done, and a file's
record only when it combines it.

A killed batch leaves at most one torn record at the end, which the next run drops; a record
whose CRC does not match is dropped too (its file is scanned again). Records are flushed one
by one, so a record written before a kill is kept; a file is recorded only once its scan has
succeeded. The directory is locked while a batch uses it.
"""

from __future__ import annotations

import fcntl
import os
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, NamedTuple, NotRequired, TypedDict, cast

import orjson

from refgrid.archive.record import FORMAT
from refgrid.core.sources import SourceIdentity
from refgrid.core.typed import JSON
from refgrid.core.util import gc_paused
from refgrid.errors import BatchError
from refgrid.writers.atomic import clean_leftovers, replace_file, temporary_for, write_file

RECORDS = "records.bin"
LOCK = "lock"
INDEX = "index.bin"
"""The headers, offsets and lengths of the records up to a point of ``records.bin``, written
when a batch closes the work directory: the next one reads the records after it only. A
sequence of frames (a length, a JSON body, its CRC): the first indexes every record, each
later one the records a batch added (appended, so a 1-file append writes one header, not
10^5); every frame names the records file it describes, and the last must name it as it
is."""
FRAMES = 64
"""Frames an index may reach before a batch writes it whole again, as one."""


class Header(TypedDict):
    url: str
    identity: SourceIdentity
    first: NotRequired[list[JSON]]
    """``[value, units, calendar]``: the concat coordinate's first value, to order files."""
    stack: NotRequired[list[str | int]]
    """The file's value along the dimension files are stacked along (``names.to_json``)."""
    set: NotRequired[list[str]]
    """The file's data variables along the concat dimension (its file set, merging)."""
    shape: NotRequired[str]
    """What the file was shaped with (``FileShape.key``; absent: nothing)."""
    named: NotRequired[list[str]]
    """The chosen variable names the file holds."""
    format: NotRequired[int]
    bytes: NotRequired[int]
    crc: NotRequired[int]


class Entry(NamedTuple):
    """(A named tuple: 10^5 are built when a work directory opens.)"""

    header: Header
    offset: int
    """Where the record (after its header line) starts."""
    length: int


class Journal:
    """The records of a work directory, opened for one batch (a context manager).

    ``lazy``: the records already there are indexed only when :attr:`entries` is first
    asked for (an append of a few files to an archive of 10^5 reads none of theirs); the
    records this batch appends are known at once."""

    def __init__(self, directory: Path, *, lazy: bool = False) -> None:
        self.directory = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._lock = open(directory / LOCK, "a+b")  # noqa: SIM115 - held until close
        except OSError as e:
            raise BatchError(f"cannot use the work directory {directory}: {e}") from e
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise BatchError(f"another batch is using the work directory {directory}; wait "
                             "for it, or give this one its own --work-dir") from None
        self.path = directory / RECORDS
        self._entries: dict[str, Entry] | None = None
        self._added: dict[str, Entry] = {}
        """The records this batch appended (the index's next frame)."""
        self._frames = 0
        """The index's frames as it was read (0: it was not)."""
        self._dirty = False
        self._index: list[bytes] = []
        """(A lazy journal's) the index's frame bodies, which describe the records file as
        this batch found it."""
        try:
            self._before = _signature(self.path) if self.path.exists() else None
            """The records file as this batch found it (what the index must describe for
            a lazy journal to add its frame)."""
            if lazy:  # (an index that does not describe the records, or has frames enough:
                self._index = _frames(directory / INDEX, self._before)  # read them whole,
            if not self._index or len(self._index) >= FRAMES:  # a torn tail compacted, the
                self._load()  # index written whole, before this batch appends)
            self._out: IO[bytes] = open(self.path, "ab")  # noqa: SIM115 - held until close
            self._in: IO[bytes] = open(self.path, "rb")  # noqa: SIM115 - held until close
        except OSError as e:
            self._lock.close()
            raise BatchError(f"cannot use the batch records {self.path}: {e}") from e

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def entries(self) -> dict[str, Entry]:
        """Every usable record by URL (indexed on first use)."""
        if self._entries is None:
            self._load()
            assert self._entries is not None
        return self._entries

    def header(self, url: str) -> Header:
        return self._entry(url).header

    def _entry(self, url: str) -> Entry:
        """``url``'s entry: a lazy journal finds it in the index alone (:func:`_row`), the
        records of 10^5 files left unread, until :attr:`entries` is asked for."""
        found = self._added.get(url)
        if found is None and self._entries is None and self._index:
            found = _row(self._index, url)
        return found if found is not None else self.entries[url]

    def close(self) -> None:
        self._out.flush()
        os.fsync(self._out.fileno())
        self._out.close()
        self._in.close()
        try:
            if self._dirty:
                _write_index(self.directory / INDEX, self.path, self.entries)
            elif self._added:  # (a lazy journal's index described the records it found)
                _add_frame(self.directory / INDEX, self.path, self._added)
        except OSError:  # the index only saves time: the next batch reads the records
            pass
        finally:
            self._lock.close()

    def _load(self) -> None:
        """Index the records; drop a torn tail and superseded, damaged or foreign ones. When
        the records file is as the last batch left it (:data:`INDEX`), the entries come from
        its index: opening the work directory of 10^5 files then reads their headers, not
        the gigabytes of their records (each record's CRC is checked when it is read,
        :meth:`record`); a records file changed since in any way is read whole."""
        indexed = _read_index(self.directory / INDEX, self.path)
        clean = True
        if indexed is None:
            self._entries, clean = read_entries(self.path)
        else:
            self._entries, self._frames = indexed
            self._entries.update(self._added)  # (a lazy journal's own, after the index)
        self._dirty = indexed is None or self._frames >= FRAMES
        """The index is to be written whole on :meth:`close` (it does not describe the
        records file, or has frames enough)."""
        if not clean and not hasattr(self, "_out"):  # (a lazy journal's records file is
            self._compact()  # open for appends: compacted by the next batch instead)

    def _compact(self) -> None:
        """Rewrite the records with only the current ones (atomically)."""
        clean_leftovers(self.path)
        temporary = temporary_for(self.path)
        entries: dict[str, Entry] = {}
        try:
            with open(self.path, "rb") as old, open(temporary, "wb") as new:
                for url, entry in self.entries.items():
                    old.seek(entry.offset)
                    head = orjson.dumps(entry.header) + b"\n"
                    entries[url] = Entry(entry.header, new.tell() + len(head), entry.length)
                    new.write(head + old.read(entry.length) + b"\n")
                new.flush()
                os.fsync(new.fileno())
            replace_file(temporary, self.path)
        finally:
            temporary.unlink(missing_ok=True)
        self._entries = entries
        self._dirty = True

    def append(self, header: Header, record: bytes) -> None:
        """Record one scanned file (it supersedes an earlier record of the same URL)."""
        header = {**header, "format": FORMAT, "bytes": len(record)}
        header["crc"] = _crc(header, record)
        head = orjson.dumps(header) + b"\n"
        offset = self._out.tell() + len(head)
        try:
            self._out.write(head + record + b"\n")
            self._out.flush()
        except OSError as e:
            raise BatchError(f"cannot write the batch records {self.path}: {e}") from e
        entry = self._added[header["url"]] = Entry(header, offset, len(record))
        if self._entries is not None:
            self._entries[header["url"]] = entry

    def record(self, url: str) -> bytes:
        """The recorded bytes of ``url`` (checked against the CRC of its header)."""
        entry = self._entry(url)
        self._in.seek(entry.offset)
        data = self._in.read(entry.length)
        if _crc(entry.header, data) != entry.header.get("crc"):
            raise BatchError(f"{self.path}: the record of {url} is damaged (its CRC does not "
                             "match); delete the work directory to scan again")
        return data


def read_entries(path: Path) -> tuple[dict[str, Entry], bool]:
    """The usable records of a records file by URL (the last of each), and whether the
    file holds nothing else. Takes no lock: it may watch a batch that is running."""
    entries: dict[str, Entry] = {}
    records, clean = 0, True
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return entries, True
    with f:
        for entry in _scan_records(f):
            records += 1
            if entry is None:
                clean = False
            else:
                entries[entry.header["url"]] = entry
        clean = clean and f.tell() == os.fstat(f.fileno()).st_size
    return entries, clean and records == len(entries)


def _signature(records: Path) -> list[int]:
    """What changes when a records file does: its size and modification time (a copy of
    the work directory that keeps modification times keeps its index)."""
    stat = os.stat(records)
    return [stat.st_size, stat.st_mtime_ns]


def _read_index(index: Path, records: Path) -> tuple[dict[str, Entry], int] | None:
    """The entries an index holds and its frames — None when it is absent or damaged, or
    the records file is not the one it describes (appended to by a killed batch, compacted,
    edited)."""
    try:
        bodies = _bodies(index.read_bytes())
        if bodies is None:
            return None
        entries: dict[str, Entry] = {}
        signature = None
        with gc_paused():  # 10^5 headers: the collector would walk them again and again
            for body in bodies:
                found = orjson.loads(body)
                if found["format"] != FORMAT:
                    return None  # records of another version: scanned (and dropped) as usual
                signature = found["records"]
                entries.update((row[0]["url"], Entry._make(row)) for row in found["entries"])
        return (entries, len(bodies)) if signature == _signature(records) else None
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


ENTRIES = b',"entries":['
"""What separates a frame's signature and format from its entries (:func:`_frame`)."""
ROW = b'[{"url":'
"""How each entry of a frame begins: a header's URL comes first (:meth:`Journal.append`)."""


def _bodies(data: bytes) -> list[bytes] | None:
    """The bodies of an index's frames (a length, the body, its CRC), each checked against
    its CRC; None if one does not match (a frame torn by a kill)."""
    bodies, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "big")
        body = data[at + 4:at + 4 + size]
        if len(body) != size or zlib.crc32(body).to_bytes(4, "big") != \
                data[at + 4 + size:at + 8 + size]:
            return None
        bodies.append(body)
        at += 8 + size
    return bodies


def _frames(index: Path, signature: list[int] | None) -> list[bytes]:
    """The bodies of an index's frames, each checked against its CRC, if the last
    describes the records file whose signature is ``signature``, and every frame is of the
    current format; else none. Their entries are not parsed (:func:`_row` finds one)."""
    try:
        bodies = _bodies(index.read_bytes()) or []
    except OSError:
        return []
    try:
        heads = [orjson.loads(body[:body.find(ENTRIES)] + b"}") for body in bodies]
    except orjson.JSONDecodeError:
        return []
    if not heads or any(not isinstance(h, dict) or h.get("format") != FORMAT for h in heads) \
            or signature is None or heads[-1].get("records") != signature:
        return []
    return bodies


def _row(frames: list[bytes], url: str) -> Entry | None:
    """The entry of ``url`` in the last frame naming it, found as bytes: a row begins
    ``[{"url":<url>,`` and ends where the next begins or the entries end (a quote inside a
    JSON string is escaped, so no value holds either), so one row is parsed, not 10^5."""
    key = ROW + orjson.dumps(url) + b","
    for body in reversed(frames):
        start = body.rfind(key)
        if start < 0:
            continue
        end = body.find(b"," + ROW, start + 1)
        try:
            header, offset, length = orjson.loads(body[start:end if end >= 0 else -2])
        except (orjson.JSONDecodeError, ValueError):
            return None
        return Entry(cast("Header", header), offset, length) if isinstance(header, dict) \
            and header.get("url") == url else None
    return None


def _frame(records: Path, entries: Mapping[str, Entry]) -> bytes:
    """A frame of ``entries``, every one of the current record format (:meth:`Journal.append`
    writes it, :func:`read_entries` keeps no other): checked once a frame on reading. Its
    signature and format come first and its rows are compact JSON, so a lazy journal finds
    one entry without parsing the others (:func:`_frames`, :func:`_row`)."""
    rows = [[e.header, e.offset, e.length] for e in entries.values()]
    body = orjson.dumps({"records": _signature(records), "format": FORMAT, "entries": rows})
    return len(body).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")


def _write_index(index: Path, records: Path, entries: Mapping[str, Entry]) -> None:
    """Index ``entries`` (every record of the records file as it is now) as one frame,
    atomically."""
    write_file(index, _frame(records, entries))


def _add_frame(index: Path, records: Path, added: Mapping[str, Entry]) -> None:
    """Append a frame of the records ``added`` since the index was read. A frame torn by
    a kill fails its CRC: the next batch reads the records file whole and indexes it
    again."""
    with open(index, "r+b") as f:  # (an index removed meanwhile is not begun by a delta)
        f.seek(0, os.SEEK_END)
        f.write(_frame(records, added))
        f.flush()
        os.fsync(f.fileno())


def _scan_records(f: IO[bytes]) -> Iterator[Entry | None]:
    """Each record in turn (``None`` for one that cannot be used); stops at a torn tail,
    leaving the file position after the last whole record."""
    while True:
        start = f.tell()
        head = f.readline()
        if not head.endswith(b"\n"):
            f.seek(start)
            return
        try:
            header = orjson.loads(head)
            length, crc = int(header["bytes"]), int(header["crc"])
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
            f.seek(start)
            return  # the framing is lost: what follows is scanned again
        offset = f.tell()
        body = f.read(length + 1)
        if len(body) != length + 1 or body[-1:] != b"\n":
            f.seek(start)
            return
        usable = (_crc(header, body[:-1]) == crc and header.get("format") == FORMAT
                  and isinstance(header.get("url"), str)
                  and isinstance(header.get("identity"), dict))
        yield Entry(header, offset, length) if usable else None


def _crc(header: Mapping[str, object], record: bytes) -> int:
    """The CRC of a record and its header (all but the CRC itself): a damaged URL or
    identity never attributes a record to another file."""
    fields = {k: v for k, v in header.items() if k != "crc"}
    return zlib.crc32(record, zlib.crc32(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)))

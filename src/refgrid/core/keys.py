"""Store keys of a Zarr v3 node tree: metadata at ``zarr.json``, chunks at ``tas/c/0/3/1``.

One module names them for every reader and writer (as zarr-python's
``chunk_key_encodings``), so the parsers of keys can never drift from the writers of keys.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict, TypeVar, cast

import numpy as np

V = TypeVar("V")

METADATA = "zarr.json"
ZMETADATA = ".zmetadata"
"""The consolidated metadata of parquet references (kerchunk's and refgrid's)."""
BOOKKEEPING = "refgrid.json"
"""refgrid's bookkeeping beside a served store's documents (``{"attributes": {node: ...}}``),
answered but never listed: stock readers do not see it, refgrid's engine reads it back."""
ZGROUP, ZARRAY, ZATTRS = ".zgroup", ".zarray", ".zattrs"
"""Zarr v2 metadata documents (classic kerchunk references, read and written)."""
REPORT_SUFFIX = ".report.json"
"""A batch's report lies beside its output, named as it is with this added
(``tas.parq.report.json``): JSON, but no references (``refgrid serve`` does not list it)."""


class ChunkKeyEncodingJSON(TypedDict):
    name: Literal["default", "v2"]
    configuration: dict[str, str]


@dataclass(frozen=True)
class KeyEncoding:
    """A chunk key encoding — zarr's ``default`` (``c/0/3/1``, ``c.0.3.1``) or ``v2``
    (``0.3.1``, ``0/3/1``) — in both directions, as zarr-python's ``chunk_key_encodings``
    pair them: :meth:`encode` gives the key of chunk coordinates below their array,
    :meth:`decode` the coordinates of such a key. The one place keys become coordinates."""

    name: Literal["default", "v2"] = "default"
    separator: Literal["/", "."] = "/"

    @classmethod
    def from_json(cls, value: object) -> KeyEncoding:
        """From an array document's ``chunk_key_encoding`` (None: the default); a
        ``ValueError`` for one zarr does not define."""
        name, separator = _key_encoding({"chunk_key_encoding": value})
        if name not in ("default", "v2") or separator not in ("/", "."):
            raise ValueError(f"unknown chunk key encoding {value!r:.80}")
        return cls(name, separator)  # type: ignore[arg-type]

    def to_json(self) -> ChunkKeyEncodingJSON:
        return {"name": self.name, "configuration": {"separator": self.separator}}

    def encode(self, coords: tuple[int, ...]) -> str:
        """The key of chunk ``coords`` below its array: ``c/0/3/1``; ``c`` (``0`` in v2)
        for a 0-d array's chunk."""
        if self.name == "v2":
            return self.separator.join(map(str, coords)) if coords else "0"
        return self.separator.join(("c", *map(str, coords)))

    def decode(self, tail: str, ndim: int) -> tuple[int, ...] | None:
        """The coordinates a key below its array names, or None if it names no chunk of an
        array of ``ndim`` dimensions."""
        text = _coords(tail, self.name, self.separator, ndim)
        if text is None:
            return None
        return coordinates(text)


DEFAULT_ENCODING = KeyEncoding()
"""What refgrid writes unless a source store had another: Zarr v3's ``default`` with ``/``."""


def document_key(node: str) -> str:
    """The ``zarr.json`` key of a node path (``""`` is the root)."""
    return f"{node}/{METADATA}" if node else METADATA


def document_node(key: str) -> str | None:
    """The node path of a ``zarr.json`` key (``""`` for the root), or None for any other key."""
    if key == METADATA or key.endswith(f"/{METADATA}"):
        return key[: -len(METADATA)].rstrip("/")
    return None


def document_keys(keys: Iterable[str]) -> dict[str, str]:
    """Node path → key, for the ``zarr.json`` keys among ``keys``."""
    return {node: k for k in keys
            if k.endswith(METADATA) and (node := document_node(k)) is not None}


def chunk_key(array_path: str, coords: tuple[int, ...],
              encoding: KeyEncoding = DEFAULT_ENCODING) -> str:
    """A chunk's whole key: ``tas/c/0/3/1`` (``tas/c`` for a 0-d array) by default."""
    tail = encoding.encode(coords)
    return f"{array_path}/{tail}" if array_path else tail


def split_key(key: str, arrays: Container[str]) -> tuple[str, str] | None:
    """``(array path, the rest)`` for a key below one of ``arrays`` (the innermost; ``""`` a
    store whose root is an array), else None. A few lookups, however many arrays."""
    head = key
    while "/" in head:
        head = head.rpartition("/")[0]
        if head in arrays:
            return head, key[len(head) + 1:]
    return ("", key) if "" in arrays else None


def chunk_key_v2(array_path: str, coords: tuple[int, ...]) -> str:
    """Zarr v2 chunk key with ``.`` separators: ``tas/0.3.1``; ``name/0`` for a 0-d array."""
    return f"{array_path}/{'.'.join(map(str, coords)) if coords else '0'}"


DIGITS = re.compile(r"(0|[1-9][0-9]*)(/(0|[1-9][0-9]*))*")
"""Chunk coordinates as keys name them: decimal, no leading zeros (``c/01`` is no key)."""
LEADING_ZERO = re.compile(r"(?:^|/)0[0-9]")


def chunk_entries(entries: Iterable[tuple[str, V]],
                  documents: Mapping[str, Mapping[str, object]]
                  ) -> dict[str, list[tuple[str, V]]]:
    """Each array's chunks among store ``entries`` (key, value): array path → ``[(coordinates
    "0/3/1", value), ...]``, each array under its own ``chunk_key_encoding`` (``default`` or
    ``v2``, ``/`` or ``.``). One pass over 10^5 keys: the common encoding (``default``, ``/``,
    no array at the root) is parsed inline, without a call per key."""
    arrays = {path: _key_encoding(doc) for path, doc in documents.items()
              if doc.get("node_type") == "array"}
    found: dict[str, list[tuple[str, V]]] = {path: [] for path in arrays}
    if "" not in arrays and all(e == ("default", "/") for e in arrays.values()):
        for key, value in entries:
            head, sep, tail = key.rpartition("/c/")
            if sep and head in found:
                found[head].append((tail, value))
            elif key.endswith("/c") and key[:-2] in found:
                found[key[:-2]].append(("", value))
        return found
    ndims = {path: len(cast("Sequence[int]", documents[path].get("shape") or ()))
             for path in arrays}
    for key, value in entries:
        head = key
        while True:
            head = head.rpartition("/")[0]
            if head in arrays or not head:
                break
        if head not in arrays:
            continue
        tail = key[len(head) + 1:] if head else key
        coords = _coords(tail, *arrays[head], ndims[head])
        if coords is not None:
            found[head].append((coords, value))
    return found


def coordinates(tail: str) -> tuple[int, ...]:
    """The coordinates of a chunk as :func:`chunk_entries` names it (``"0/3/1"``; ``""``
    for a 0-d array's chunk)."""
    return tuple(int(c) for c in tail.split("/")) if tail else ()


def flat_indices(tails: list[str], counts: tuple[int, ...]) -> np.ndarray:
    """The C-order index of each chunk :func:`chunk_entries` names (``"0/3/1"``) in a grid
    of ``counts`` chunks, -1 where it is not in the grid: 10^7 keys parsed by numpy at
    once, one by one only where some key is of another rank or not numeric."""
    if not counts:
        return np.where(np.array([t == "" for t in tails], bool), 0, -1)
    text = "/".join(tails)
    digits = text.replace("/", "")
    try:
        if not (digits.isascii() and digits.isdigit()) or set(
                map(operator.methodcaller("count", "/"), tails)) != {len(counts) - 1} \
                or LEADING_ZERO.search(text):
            raise ValueError("keys of another rank, or not numeric")
        numbers = np.fromstring(text.replace("/", " "), dtype=np.int64, sep=" ")
        if len(numbers) != len(tails) * len(counts):  # an empty part ("1//2")
            raise ValueError("empty coordinates")
        coords = numbers.reshape(len(tails), len(counts))
    except ValueError:  # some keys of another rank or not numeric: parse one by one
        coords = np.array([coordinates(t) if DIGITS.fullmatch(t) and t.count("/") + 1 ==
                           len(counts) else [-1] * len(counts) for t in tails],
                          np.int64).reshape(-1, len(counts))
    inside = ((coords >= 0) & (coords < np.array(counts))).all(axis=1)
    flat = np.full(len(tails), -1, np.int64)
    flat[inside] = np.ravel_multi_index(tuple(coords[inside].T), counts)
    return flat


def _key_encoding(doc: Mapping[str, object]) -> tuple[str, str]:
    encoding = doc.get("chunk_key_encoding") or {"name": "default"}
    name = encoding.get("name", "default") if isinstance(encoding, Mapping) else "default"
    config = (encoding.get("configuration") or {}) if isinstance(encoding, Mapping) else {}
    return name, config.get("separator", "/" if name == "default" else ".")


def _coords(tail: str, name: str, separator: str, ndim: int) -> str | None:
    """Coordinates ``"0/3/1"`` of a chunk key's part below its array, or None."""
    if name == "default":
        if tail == "c":
            return "" if ndim == 0 else None
        if not tail.startswith("c" + separator):
            return None
        tail = tail[2:]
    elif ndim == 0:
        return "" if tail == "0" else None
    if separator != "/" and "/" in tail:  # ("a/0/1" is no key of a "."-separated array)
        return None
    coords = tail.replace(separator, "/") if separator != "/" else tail
    if not DIGITS.fullmatch(coords) or coords.count("/") + 1 != ndim:
        return None
    return coords

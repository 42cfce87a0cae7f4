"""JSON of 10^5 entries — a grown archive's sources table, its journal's headers — is
parsed and written on every append, where json costs a third of a second each way and
orjson a tenth of that. But orjson refuses what Zarr documents may hold (the bare ``NaN`` and
``Infinity`` that json, and so zarr-python, write for such attribute values), parses an
integer beyond 64 bits as a float, and would write a NaN float as ``null``. So :func:`loads`
gives json what orjson would refuse or read otherwise (the same objects either way), and
:func:`dumps_table` writes by orjson only tables whose values cannot be NaN."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from refgrid.core.util import gc_paused

_DIGITS = bytes(ord("0") if chr(c).isdigit() and c < 128 else ord(" ") for c in range(256))
LONG_NUMBER = b"0" * 19
"""Nineteen digits in a row (after ``_DIGITS``): an integer orjson may read as a float (it
keeps -2**63 .. 2**64-1; a float written by json has 17 significant digits at most; a string
of digits is sent to json too, which costs time only)."""


def loads(data: bytes) -> Any:
    """``data`` parsed as json would parse it; a ``ValueError`` (``json.JSONDecodeError``,
    ``UnicodeDecodeError``) when it is not JSON."""
    with gc_paused():  # 10^5 small dicts
        if LONG_NUMBER in data.translate(_DIGITS):
            return json.loads(data)
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:  # NaN, Infinity
            return json.loads(data)


def dumps_table(table: Mapping[str, Mapping[str, str | int | float]]) -> bytes:
    """A table of file identities (sizes, modification times, ETags), compact. A table read
    from elsewhere may hold what orjson writes otherwise than json — a NaN or infinite
    number (as ``null``), an integer beyond 64 bits — and is then written by json."""
    try:
        out = orjson.dumps(table)
    except TypeError:  # an integer beyond 64 bits
        out = b":null"
    return out if b":null" not in out else json.dumps(table, separators=(",", ":")).encode()

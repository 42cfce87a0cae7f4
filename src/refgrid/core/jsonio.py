"""JSON of 10^5 entries — JSON references, an archive of before's sources table in
``.zmetadata`` — is parsed where json costs a third of a second and orjson a tenth of that.
But orjson refuses what Zarr documents may hold (the bare ``NaN`` and ``Infinity`` that json,
and so zarr-python, write for such attribute values) and parses an integer beyond 64 bits as
a float. So :func:`loads` gives json what orjson would refuse or read otherwise (the same
objects either way)."""

from __future__ import annotations

import json
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


def dumps(document: object) -> str:
    """``document`` as compact JSON text (no spaces), as references and stores hold it."""
    return json.dumps(document, separators=(",", ":"))

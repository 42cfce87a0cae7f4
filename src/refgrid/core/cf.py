"""CF conventions that decide what stored numbers mean: time units and calendars, and the
attributes that change decoded values.

A number in a NetCDF file is a value only together with its metadata: ``12`` is noon of
2001-02-01 in ``hours since 2001-02-01`` and 2001-01-13 in ``days since 2001-01-01``. When files
are combined, every variable whose meaning depends on per-file metadata must be re-encoded to
one encoding or refused (:mod:`refgrid.combining`); this module says which variables those are,
as xarray decides it, and converts times exactly or not at all.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeGuard, cast

import numpy as np

if TYPE_CHECKING:
    from xarray import Variable

TIME_MARK = "since"
"""What makes ``units`` a CF time (xarray's test: ``"since" in units``)."""
BOUNDS_ATTRS = ("bounds", "climatology")
"""Attributes naming a variable whose values are in the naming variable's units (CF 7.1 and
7.4; xarray copies units to ``bounds`` variables when decoding)."""
PACKING_ATTRS = ("scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned")
"""Attributes xarray applies to stored numbers before anything else (mask and scale)."""
MEANING_ATTRS = (*PACKING_ATTRS, "units", "calendar", "valid_range", "valid_min", "valid_max",
                 "_Encoding", "dtype")
"""Attributes that change what a stored number means to a reader: packing, units and
calendars, the valid range (netCDF4 masks outside it), the byte strings' character set and
xarray's ``dtype: bool`` marker."""

STANDARD_CALENDARS = frozenset({"standard", "proleptic_gregorian"})
"""Calendars whose dates are numpy's and Python's; others are cftime's (a noleap year has no
29 February)."""
_CALENDARS = {"": "standard", "gregorian": "standard", "365_day": "noleap",
              "366_day": "all_leap"}
"""CF calendar names that mean the same calendar."""


def is_time_units(units: object) -> TypeGuard[str]:
    return isinstance(units, str) and TIME_MARK in units


def calendar_name(calendar: object) -> str:
    """The canonical name of a CF calendar (absent: ``standard``)."""
    name = str(calendar or "").strip().lower()
    return _CALENDARS.get(name, name)


TimeEncoding = tuple[str, str]
"""``(units, calendar)`` of a time variable, the calendar by its canonical name."""


def time_encodings(arrays: Mapping[str, Mapping[str, object]]) -> dict[str, TimeEncoding]:
    """The variables of one group whose values are CF times, with the units and calendar a
    reader decodes them with: their own ``units``, or — for the ``bounds`` and
    ``climatology`` variables of a time variable — that variable's units and calendar where
    they have none of their own (as xarray completes bounds when it decodes a file)."""
    effective = {name: dict(attrs) for name, attrs in arrays.items()}
    for name, attrs in arrays.items():
        if not is_time_units(attrs.get("units")):
            continue
        for key in BOUNDS_ATTRS:
            target = attrs.get(key)
            if isinstance(target, str) and target in effective and target != name:
                effective[target].setdefault("units", attrs["units"])
                if "calendar" in attrs:
                    effective[target].setdefault("calendar", attrs["calendar"])
    return {name: (cast(str, attrs["units"]), calendar_name(attrs.get("calendar")))
            for name, attrs in effective.items() if is_time_units(attrs.get("units"))}


def decode_times(values: np.ndarray, units: str, calendar: object) -> np.ndarray:
    """CF times decoded as xarray decodes them (datetime64, or cftime objects for other
    calendars and far dates). Quietly: xarray warns when dates beyond 2262 come back as
    cftime objects, which is a matter of representation here, not of the values.
    ``calendar`` as an attribute holds it: xarray refuses one that names no calendar."""
    from xarray.coding.times import decode_cf_datetime
    from xarray.coding.variables import SerializationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SerializationWarning)
        return np.asarray(decode_cf_datetime(np.asarray(values), units,
                                             cast("str | None", calendar)))


def encode_times(dates: np.ndarray, units: str, calendar: str, dtype: np.dtype) -> np.ndarray:
    """``dates`` as numbers of ``units`` stored as ``dtype`` — exactly, or a ``ValueError``
    saying why not (the values need a fraction an integer cannot hold, or more digits than
    the type has, or a date the calendar lacks)."""
    from xarray.coding.times import encode_cf_datetime
    from xarray.coding.variables import SerializationWarning

    with warnings.catch_warnings():  # xarray warns where it would change the units
        warnings.simplefilter("error", SerializationWarning)
        warnings.filterwarnings("error", "Times can't be serialized", UserWarning)
        try:
            numbers, used, _ = encode_cf_datetime(dates, units, calendar, np.dtype("float64"))
        except Exception as e:
            raise ValueError(f"cannot be written in {units!r} ({calendar}): {e}") from e
    if used != units:
        raise ValueError(f"cannot be written in {units!r} (xarray would use {used!r})")
    numbers = np.asarray(numbers)
    stored = numbers.astype(dtype)
    if not np.array_equal(stored.astype(np.float64), numbers, equal_nan=True):
        raise ValueError(f"need values {dtype} cannot hold in {units!r} (such as "
                         f"{_first_inexact(numbers, stored)})")
    back = decode_times(stored, units, calendar)
    if not np.array_equal(back, np.asarray(dates)):
        raise ValueError(f"cannot be written exactly in {units!r} as {dtype} (rounding)")
    return stored


def _first_inexact(numbers: np.ndarray, stored: np.ndarray) -> str:
    odd = np.flatnonzero(stored.astype(np.float64).reshape(-1) != numbers.reshape(-1))
    return repr(float(numbers.reshape(-1)[odd[0]])) if len(odd) else "?"


def stored_mask(values: np.ndarray, attrs: Mapping[str, object]) -> np.ndarray:
    """Where ``values`` hold no value: the ``_FillValue`` or ``missing_value``, or NaN."""
    mask = np.zeros(values.shape, bool)
    if values.dtype.kind in "fc":
        mask |= np.isnan(values)
    for name in ("_FillValue", "missing_value"):
        marker = attrs.get(name)
        if marker is not None:
            for m in np.atleast_1d(np.asarray(marker)).tolist():
                if not (isinstance(m, float) and np.isnan(m)):
                    mask |= values == m
    return mask


def mask_and_scale(name: str, dims: tuple[str, ...], attrs: Mapping[str, object],
                   values: np.ndarray) -> Variable:
    """``values`` stored under ``attrs`` (their numeric types restored: a float32
    ``scale_factor`` unpacks to float32), masked and scaled by xarray's own decoder — what
    xarray reads from the file, bit for bit. xarray is imported here, when first needed: the
    service and the stores need it for nothing else (it doubles the service's memory)."""
    from xarray import Variable, conventions

    return conventions.decode_cf_variable(name, Variable(dims, values, attrs),
                                          mask_and_scale=True, decode_times=False,
                                          decode_timedelta=False, concat_characters=False)

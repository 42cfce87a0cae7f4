"""What an archive's time axes span: a climate user's first question of ``refgrid
inspect``. Only each axis's first and last values are read (one or two chunks), and they
are decoded by xarray's CF time decoder, as ``xr.open_dataset`` would decode them."""

from __future__ import annotations

from typing import TypedDict

import numpy as np

from refgrid.core.cf import decode_times, is_time_units
from refgrid.errors import RefgridError
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.read.array import read


class TimeRange(TypedDict):
    first: str
    last: str
    steps: int


def time_ranges(group: VirtualGroup, storage_options: dict[str, object] | None = None
                ) -> dict[str, TimeRange]:
    """Each 1-d array with CF time units (``days since ...``): its first and last dates."""
    out: dict[str, TimeRange] = {}
    for path, node in group.walk():
        if not (isinstance(node, VirtualArray) and len(node.shape) == 1 and node.shape[0]):
            continue
        units = node.attrs.get("units")
        if not is_time_units(units):
            continue
        try:
            ends = read(node, np.array([0, node.shape[0] - 1]), path=path,
                        storage_options=storage_options)
            dates = decode_times(ends, str(units), node.attrs.get("calendar", "standard"))
        except RefgridError:
            raise
        except Exception:  # units xarray cannot decode: not a time axis to show
            continue
        first, last = _dates(np.asarray(dates))
        out[path] = {"first": first, "last": last, "steps": int(node.shape[0])}
    return out


def _dates(values: np.ndarray) -> list[str]:
    """Dates as a person writes them: the time of day only where there is one (numpy
    datetimes, or cftime dates of other calendars)."""
    if values.dtype.kind == "M":
        texts = np.datetime_as_string(values.astype("datetime64[s]")).tolist()
    else:
        texts = [str(v) for v in values.tolist()]
    return [t.replace("T", " ").removesuffix(" 00:00:00") for t in texts]

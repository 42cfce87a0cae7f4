"""Values in file names: ``{member}``, ``{year:d}``, ``%Y%m%d`` and ``*`` in a pattern.

Archives often put what a file holds in its name only: the member of an ensemble
(``r1i1p1f1/tas_*.nc``), the day of a daily file without a time coordinate
(``sst_20030101.nc``), as NcML's ``dateFormatMark`` and pangeo-forge's file patterns read
them. One small pattern language serves :func:`refgrid.combine`'s ``stack_by`` and
``time_from``:

- ``{name}`` a text field (one path segment or part of one), ``{name:d}`` an integer field;
- ``%Y %y %m %d %j %H %M %S``: a date, as ``strftime`` writes it (fixed widths, so
  ``%Y%m%d`` reads ``20030101``);
- ``*`` anything within a path segment; every other character stands for itself.

A pattern matches the end of a path or URL at a segment boundary: ``{member}/tas_*.nc``
matches ``s3://b/cmip/r1i1p1f1/tas_2000.nc``. Parsing is the one place that knows the syntax,
so a bad pattern is refused once, with where it went wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from refgrid.errors import ArgumentError

DIRECTIVES = {"Y": r"\d{4}", "y": r"\d{2}", "m": r"\d{2}", "d": r"\d{2}", "j": r"\d{3}",
              "H": r"\d{2}", "M": r"\d{2}", "S": r"\d{2}"}
"""The ``strftime`` directives a pattern may hold, with what they match (fixed widths)."""
CLOCK = frozenset("HMS")
"""Directives below a day: times with them are kept to the second, others to the day."""
_TOKEN = re.compile(r"\{(?P<field>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<kind>d))?\}"
                    r"|%(?P<directive>.)|(?P<star>\*)|(?P<brace>[{}])")

Value = str | int | datetime
"""A field's value: text, an integer (``{name:d}``) or a date (``%`` directives)."""


@dataclass(frozen=True)
class NamePattern:
    """A parsed pattern (:func:`parse`); :meth:`match` reads a path's values."""

    text: str
    regex: re.Pattern[str]
    fields: tuple[str, ...]
    """The named fields, in order."""
    integers: frozenset[str]
    directives: frozenset[str]
    """The date directives the pattern holds (empty: no date)."""

    @classmethod
    def parse(cls, text: str) -> NamePattern:
        if not isinstance(text, str) or not text:
            raise ArgumentError(f"a file-name pattern must be a non-empty string, not {text!r}")
        out, fields, integers, directives = [], [], set(), set()
        position = 0
        for token in _TOKEN.finditer(text):
            out.append(re.escape(text[position:token.start()]))
            position = token.end()
            if token["field"]:
                name = token["field"]
                if name in fields:
                    raise ArgumentError(f"file-name pattern {text!r}: the field {{{name}}} "
                                        "appears twice")
                fields.append(name)
                if token["kind"]:
                    integers.add(name)
                out.append(rf"(?P<f_{name}>-?\d+)" if token["kind"] else
                           rf"(?P<f_{name}>[^/]+?)")
            elif token["directive"]:
                d = token["directive"]
                if d == "%":
                    out.append("%")
                    continue
                if d not in DIRECTIVES:
                    raise ArgumentError(f"file-name pattern {text!r}: %{d} is not one of the "
                                        f"date directives it reads (%{', %'.join(DIRECTIVES)})")
                out.append(f"(?P<d_{d}>{DIRECTIVES[d]})" if d not in directives else
                           f"(?P=d_{d})")
                directives.add(d)
            elif token["star"]:
                out.append(r"[^/]*?")
            else:
                raise ArgumentError(f"file-name pattern {text!r}: a lone {token['brace']!r} at "
                                    f"character {token.start()} (fields are {{name}} or "
                                    "{name:d})")
        out.append(re.escape(text[position:]))
        if directives and not directives & {"Y", "y"}:
            raise ArgumentError(f"file-name pattern {text!r}: dates need a year (%Y or %y)")
        return cls(text, re.compile(r"(?:^|/)" + "".join(out) + "$"), tuple(fields),
                   frozenset(integers), frozenset(directives))

    def match(self, path: str) -> dict[str, Value] | None:
        """The fields (and under ``"date"`` the date) the end of ``path`` holds, or None when
        it does not match."""
        found = self.regex.search(path.rstrip("/"))
        if found is None:
            return None
        values: dict[str, Value] = {}
        for name in self.fields:
            text = found[f"f_{name}"]
            values[name] = int(text) if name in self.integers else text
        if self.directives:
            values["date"] = _date({d: found[f"d_{d}"] for d in self.directives}, path)
        return values

    def values(self, path: str) -> dict[str, Value]:
        """:meth:`match`, or an :class:`ArgumentError` naming the path and the pattern."""
        found = self.match(path)
        if found is None:
            raise ArgumentError(f"{path} does not match the file-name pattern {self.text!r}")
        return found

    @property
    def clock(self) -> bool:
        """Whether the pattern reads times of day (not only dates)."""
        return bool(self.directives & CLOCK)


def _date(parts: dict[str, str], path: str) -> datetime:
    numbers = {d: int(v) for d, v in parts.items()}
    year = numbers["Y"] if "Y" in numbers else numbers["y"] + (1900 if numbers["y"] >= 69
                                                               else 2000)
    try:
        if "j" in numbers:
            day = datetime(year, 1, 1) + timedelta(days=numbers["j"] - 1)
            if day.year != year:
                raise ValueError(f"day of year {numbers['j']} is past the year's end")
        else:
            day = datetime(year, numbers.get("m", 1), numbers.get("d", 1))
        return day.replace(hour=numbers.get("H", 0), minute=numbers.get("M", 0),
                           second=numbers.get("S", 0))
    except ValueError as e:
        raise ArgumentError(f"{path}: its name holds no valid date ({e})") from e


def to_json(value: Value) -> list[str | int]:
    """A value as a batch worker records it (``["date", ISO]``, ``["int", n]``...)."""
    if isinstance(value, datetime):
        return ["date", value.isoformat()]
    return ["int", value] if isinstance(value, int) else ["str", value]


def from_json(recorded: object) -> Value:
    """:func:`to_json`'s value back."""
    if not isinstance(recorded, list) or len(recorded) != 2 or recorded[0] not in (
            "date", "int", "str"):
        raise ValueError(f"not a recorded value: {recorded!r}")
    kind, value = recorded
    if kind == "date":
        return datetime.fromisoformat(str(value))
    return int(value) if kind == "int" else str(value)

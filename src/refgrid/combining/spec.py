"""How files are combined, as one object: :class:`CombineSpec`.

A combine's settings — the dimension, the policies (overlap, codecs, missing variables,
others), merging file sets, and the per-file choices (:class:`~.shaping.FileShape`:
variables, times from names, stacking) — travel together from the front that takes them
(:func:`refgrid.combine`, :func:`refgrid.batch`, the CLI, ``serve --follow``) to every stage
that uses them (shaping on a batch's workers, partitioning, concatenating, stacking,
appending), and are recorded with an archive (:meth:`CombineSpec.to_dict`, in the settings
a batch compares: it appends to an archive only under the same settings;
:meth:`CombineSpec.from_dict` makes a spec of them again).
Checked once, when it is made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast, get_args

from refgrid.combining.shaping import FileShape
from refgrid.errors import ArgumentError

Overlap = Literal["error", "allow"]
Others = Literal["identical", "stack"]
Codecs = Literal["segments", "recode", "error"]
Missing = Literal["error", "fill"]
CHOICES: dict[str, tuple[str, ...]] = {name: get_args(kind) for name, kind in (
    ("overlap", Overlap), ("others", Others), ("codecs", Codecs), ("missing", Missing))}
"""The policies' values (their types' own: one list of each)."""


@dataclass(frozen=True)
class CombineSpec:
    """How files are combined (see :func:`refgrid.combine` for each setting)."""

    concat_dim: str = "time"
    overlap: Overlap = "error"
    """``"allow"``: files whose coordinate ranges overlap are kept."""
    others: Others = "identical"
    """``"stack"``: variables without the concat dimension are kept per file."""
    codecs: Codecs = "segments"
    """Files that store a variable in other ways (types, codecs, packing, fill markers):
    ``"segments"`` joins them, each read by its own encoding; ``"recode"`` re-encodes and
    inlines the chunks of files whose codecs differ; ``"error"`` refuses any difference."""
    missing: Missing = "error"
    """``"fill"``: a variable absent from some files reads as its fill value there."""
    merge: bool = False
    """Files are grouped into file sets by the data variables they hold, then merged."""
    shape: FileShape = field(default_factory=FileShape)
    """The per-file choices: variables, times from names, the stacking dimension."""

    def __post_init__(self) -> None:
        if not isinstance(self.concat_dim, str) or not self.concat_dim:
            raise ArgumentError(f"concat_dim must be a dimension's name, not "
                                f"{self.concat_dim!r}")
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ArgumentError(f"{name} must be one of "
                                    f"{', '.join(repr(c) for c in allowed)}, not {value!r}")
        if not isinstance(self.merge, bool):
            raise ArgumentError(f"merge must be True or False, not {self.merge!r}")

    @classmethod
    def of(cls, concat_dim: str = "time", *, overlap: str = "error",
           others: str = "identical", codecs: str = "error", missing: str = "error",
           merge: bool = False, variables: Sequence[str] | str | None = None,
           drop_variables: Sequence[str] | str | None = None, stack_dim: str | None = None,
           stack_by: str | None = None, time_from: str | None = None,
           time_units: str | None = None, calendar: str | None = None) -> CombineSpec:
        """The settings as the public functions take them, checked."""
        return cls(concat_dim, cast(Overlap, overlap), cast(Others, others),
                   cast(Codecs, codecs), cast(Missing, missing), merge,
                   FileShape.of(variables, drop_variables, time_from, time_units, calendar,
                                stack_dim, stack_by))

    @property
    def stack_dim(self) -> str | None:
        return self.shape.stack_dim

    @property
    def whole(self) -> str | None:
        """Why an archive combined so is written whole when it grows (None: it may be
        appended to)."""
        if self.merge or self.stack_dim is not None:
            return "a merged or stacked archive is written whole when it grows (its file " \
                   "sets or members are combined apart, then joined)"
        if self.others != "identical":
            return "an archive whose other variables are kept per file is written whole " \
                   "when it grows (its files' dimension is not appended to)"
        return None

    def to_dict(self) -> dict[str, str]:
        """The settings as an archive records them (strings; ``others`` only where it is
        not the default, which is all a batch combines with)."""
        out = {"concat_dim": self.concat_dim, "overlap": self.overlap, "codecs": self.codecs,
               "missing": self.missing, "merge": str(self.merge).lower(),
               **self.shape.settings}
        if self.others != "identical":
            out["others"] = self.others
        return out

    @classmethod
    def from_dict(cls, settings: Mapping[str, str]) -> CombineSpec:
        """The spec :meth:`to_dict` recorded, equal to it. Other keys are ignored: a
        batch's output format, say, and ``time_rule`` (the rule of times from names a
        record was made under: a batch compares it with today's and rebuilds an archive
        made under another, it does not make a spec of it)."""
        def given(key: str) -> str | None:
            value = settings.get(key)
            if value is not None and not isinstance(value, str):
                raise ArgumentError(f"combine settings hold text: {key}={value!r}")
            return value if value else None

        def names(key: str) -> list[str] | None:
            value = given(key)
            return value.split(",") if value else None

        if settings.get("merge", "false") not in ("true", "false"):
            raise ArgumentError(f"combine settings: merge is 'true' or 'false', not "
                                f"{settings['merge']!r}")
        try:
            return cls.of(settings["concat_dim"], overlap=given("overlap") or "error",
                          others=given("others") or "identical",
                          codecs=given("codecs") or "error",
                          missing=given("missing") or "error",
                          merge=settings.get("merge", "false") == "true",
                          variables=names("variables"), drop_variables=names("drop_variables"),
                          stack_dim=given("stack_dim"), stack_by=given("stack_by"),
                          time_from=given("time_from"), time_units=given("time_units"),
                          calendar=given("calendar"))
        except KeyError as e:
            raise ArgumentError(f"combine settings without {e.args[0]!r}: {dict(settings)}") \
                from None

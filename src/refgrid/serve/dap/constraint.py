"""Constraint expressions: which variables a DAP request wants, and which hyperslab of each.

DAP2 puts them in the query string (``tas[0:1:364][2][3:5],time``: projections separated by
commas, a group's variables as ``surface.t2m``, ``&`` starting selections); DAP4 in its
``dap4.ce`` key (``/tas[0:1:364][2][3:5];/time``: fully qualified names separated by
semicolons). Both say a hyperslab the same way, per dimension: ``[i]``, ``[start:stop]``,
``[start:stride:stop]``, the stop *inclusive*; DAP4 also ``[]`` (all of it) and an empty or
``*`` stop (to the end). Only projections and hyperslabs are served: selections, filters and
functions are refused by name (:class:`ConstraintError`, a DAP error response with status
400), as is anything out of range — never clipped.

The parsers get the expression URL-decoded once. A DAP2 name is then as the DDS spells it,
its other characters %-escaped (:func:`refgrid.serve.dap.dap2.name`), and is unescaped once
more; a DAP4 name is as the DMR spells it, and is taken as it is (``/a%25b`` names
``a%25b``). Parsing is a split on the separators and brackets, linear in the text: no
pattern here can match one text two ways (a name pattern whose ``%`` matched both a
character and an escape took time exponential in the text's length).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from refgrid.errors import ConstraintError
from refgrid.serve.dap.model import DapDataset, DapGroup, DapVariable

MAX_PROJECTIONS = 4096
"""Projections one request may name (a longer list is refused, not parsed)."""


@dataclass(frozen=True)
class Projection:
    """One variable a request wants, and the hyperslab of it (a slice per dimension, each
    with a positive step and an exclusive stop)."""

    variable: DapVariable
    slices: tuple[slice, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(range(s.start, s.stop, s.step)) for s in self.slices)

    @property
    def count(self) -> int:
        n = 1
        for length in self.shape:
            n *= length
        return n


SYNTAX = frozenset("[],;&|{}()")
"""Characters no name in an expression holds: its separators, brackets and operators."""
SLAB = re.compile(r"\[[^\[\]]*\]")
"""One dimension's hyperslab (a bracket holds no bracket: found in one pass)."""
INDEX = re.compile(r"[0-9]{1,18}")
"""An index, start, stride or stop (at most 18 digits: an int64)."""


def parse_dap2(text: str, dataset: DapDataset) -> list[Projection]:
    """The projections of a DAP2 constraint expression (URL-decoded once; its names as the
    DDS spells them, %-escaped); every variable where it is empty."""
    projection, amp, selection = text.partition("&")
    if amp and selection.strip():
        raise ConstraintError(f"{dataset.name}: selections ({selection[:60]!r}) are not "
                              "served: ask for projections and hyperslabs only")
    return _resolved(_terms(projection, ",", dataset), dataset,
                     {g.path.replace("/", "."): g for g in _groups(dataset.root)},
                     {v.path.replace("/", "."): v for v in dataset.variables.values()},
                     unquote, "in DAP2, a group's variables are GROUP.NAME", False)


def parse_dap4(text: str, dataset: DapDataset) -> list[Projection]:
    """The projections of a DAP4 ``dap4.ce`` (URL-decoded once; its names as the DMR spells
    them); every variable where it is empty."""
    if "|" in text:
        raise ConstraintError(f"{dataset.name}: filters ('|') are not served: ask for "
                              "projections and hyperslabs only")
    terms = _terms(text, ";", dataset)
    for term in terms:
        if "=" in term.split("[", 1)[0]:
            raise ConstraintError(f"{dataset.name}: dimension constraints ({term[:60]!r}) are "
                                  "not served: give each variable its hyperslab")
    return _resolved(terms, dataset, {g.path: g for g in _groups(dataset.root)},
                     dataset.variables, lambda name: name.strip("/"),
                     "DAP4 names are fully qualified: /group/name", True)


def _resolved(terms: list[str], dataset: DapDataset, groups: Mapping[str, DapGroup],
              variables: Mapping[str, DapVariable], key: Callable[[str], str], hint: str,
              dap4: bool) -> list[Projection]:
    """The projections ``terms`` name, in the dataset's order (the order of its responses),
    each variable once; every variable where no term is given. A term is resolved once
    however it is spelt (``/`` or ``//``; in DAP2 ``a.b`` or ``a%2Eb``), and a group
    expanded once."""
    chosen: dict[str, Projection] = {}
    seen: set[tuple[str, str]] = set()
    for term in terms:
        name, slabs = _split(term, dataset)
        path = key(name)
        if (path, slabs) in seen:
            continue
        seen.add((path, slabs))
        if path in groups and not slabs:
            found = [_whole(v) for v in groups[path].walk()]
        elif path in variables:
            variable = variables[path]
            found = [Projection(variable, _slices(variable, slabs, dataset, dap4))]
        else:
            raise ConstraintError(f"{dataset.name}: no variable {name!r} ({hint})")
        for projection in found:
            before = chosen.setdefault(projection.variable.path, projection)
            if before.slices != projection.slices:
                raise ConstraintError(f"{dataset.name}: {projection.variable.path} is asked "
                                      "for twice with different hyperslabs")
    if not terms:
        return [_whole(v) for v in dataset.variables.values()]
    return [chosen[p] for p in dataset.variables if p in chosen]


def _groups(group: DapGroup) -> list[DapGroup]:
    return [group, *(g for child in group.groups for g in _groups(child))]


def _whole(variable: DapVariable) -> Projection:
    return Projection(variable, tuple(slice(0, n, 1) for n in variable.shape))


def _terms(text: str, separator: str, dataset: DapDataset) -> list[str]:
    """The projections of ``text``, each once (a group or variable named many times costs
    what it costs named once)."""
    terms = [t.strip() for t in text.split(separator)] if text.strip() else []
    if len(terms) > MAX_PROJECTIONS:
        raise ConstraintError(f"{dataset.name}: {len(terms)} projections, more than "
                              f"{MAX_PROJECTIONS}")
    if any(not t for t in terms):
        raise ConstraintError(f"{dataset.name}: an empty projection in {text[:80]!r}")
    return list(dict.fromkeys(terms))


def _split(term: str, dataset: DapDataset) -> tuple[str, str]:
    """A term's name (quotes taken off) and its hyperslabs' text (``[...]`` after ``[...]``,
    nothing between them)."""
    name, bracket, rest = term.partition("[")
    slabs = bracket + rest
    name = name.strip()
    if not name or not SYNTAX.isdisjoint(name) or "".join(SLAB.findall(slabs)) != slabs:
        what = "functions" if "(" in term else "this projection"
        raise ConstraintError(f"{dataset.name}: cannot serve {what}: {term[:80]!r} (give "
                              "NAME[start:stride:stop]...)")
    return name.strip('"'), slabs


def _slices(variable: DapVariable, slabs: str, dataset: DapDataset,
            dap4: bool) -> tuple[slice, ...]:
    parts = SLAB.findall(slabs)
    shape = variable.shape
    if not parts:
        return tuple(slice(0, n, 1) for n in shape)
    if len(parts) != len(shape):
        raise ConstraintError(f"{dataset.name}: {variable.path} has {len(shape)} dimensions, "
                              f"the hyperslab {slabs[:80]!r} gives {len(parts)}")
    out = []
    for dim, (part, size) in enumerate(zip(parts, shape, strict=True)):
        found = _slab(part, dap4)
        if found is None:
            raise ConstraintError(f"{dataset.name}: {variable.path}: cannot read hyperslab "
                                  f"{part[:40]!r} (give [i], [start:stop] or "
                                  "[start:stride:stop])")
        start, step, last = found
        last = size - 1 if last is None else last
        if step < 1 or not 0 <= start <= last < size:
            raise ConstraintError(f"{dataset.name}: {variable.path}: hyperslab {part} is "
                                  f"outside dimension {variable.dims[dim]!r} of length {size}"
                                  if step >= 1 else f"{dataset.name}: {variable.path}: "
                                  f"hyperslab {part}: the stride must be 1 or more")
        out.append(slice(start, last + 1, step))
    return tuple(out)


def _slab(part: str, dap4: bool) -> tuple[int, int, int | None] | None:
    """``[...]`` as (start, stride, last; None: to the end), or None where it is no
    hyperslab: ``[i]``, ``[start:stop]``, ``[start:stride:stop]``, a stop empty or ``*``
    after a colon, and in DAP4 ``[]``; spaces around the numbers."""
    fields = [f.strip() for f in part[1:-1].split(":")]
    if fields == [""]:
        return (0, 1, None) if dap4 else None
    to_end = len(fields) > 1 and fields[-1] in ("", "*")
    numbers = fields[:-1] if to_end else fields
    if len(fields) > 3 or not all(INDEX.fullmatch(f) for f in numbers):
        return None
    start, step = int(fields[0]), int(fields[1]) if len(fields) == 3 else 1
    return start, step, None if to_end else int(fields[-1])

"""Constraint expressions: which variables a DAP request wants, and which hyperslab of each.

DAP2 puts them in the query string (``tas[0:1:364][2][3:5],time``: projections separated by
commas, a group's variables as ``surface.t2m``, ``&`` starting selections); DAP4 in its
``dap4.ce`` key (``/tas[0:1:364][2][3:5];/time``: fully qualified names separated by
semicolons). Both say a hyperslab the same way, per dimension: ``[i]``, ``[start:stop]``,
``[start:stride:stop]``, the stop *inclusive*; DAP4 also ``[]`` (all of it) and an empty or
``*`` stop (to the end). Only projections and hyperslabs are served: selections, filters and
functions are refused by name (:class:`ConstraintError`, a DAP error response with status
400), as is anything out of range — never clipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

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


NAME = r"(?:[^\[\],;&|{}()\s]|%[0-9A-Fa-f]{2})+"
SLAB = re.compile(r"\[\s*(?:(\d{1,18})\s*(?::\s*(\d{1,18})\s*)?(?::\s*(\d{0,18}|\*)\s*)?)?\]")
TERM = re.compile(rf"({NAME})((?:\[[^\]]*\])*)")


def parse_dap2(text: str, dataset: DapDataset) -> list[Projection]:
    """The projections of a DAP2 constraint expression (already URL-decoded); every
    variable where it is empty."""
    projection, amp, selection = text.partition("&")
    if amp and selection.strip():
        raise ConstraintError(f"{dataset.name}: selections ({selection[:60]!r}) are not "
                              "served: ask for projections and hyperslabs only")
    return _resolved(_terms(projection, ",", dataset), dataset,
                     {g.path.replace("/", "."): g for g in _groups(dataset.root)},
                     {v.path.replace("/", "."): v for v in dataset.variables.values()},
                     lambda name: name, "in DAP2, a group's variables are GROUP.NAME", False)


def parse_dap4(text: str, dataset: DapDataset) -> list[Projection]:
    """The projections of a DAP4 ``dap4.ce`` (already URL-decoded); every variable where it
    is empty."""
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
    however it is spelt (``/``, ``%2F``, ...), and a group expanded once."""
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
    found = TERM.fullmatch(term)
    if found is None:
        what = "functions" if "(" in term else "this projection"
        raise ConstraintError(f"{dataset.name}: cannot serve {what}: {term[:80]!r} (give "
                              "NAME[start:stride:stop]...)")
    name = re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m[1], 16)), found[1])
    return name.strip('"'), found[2]


def _slices(variable: DapVariable, slabs: str, dataset: DapDataset,
            dap4: bool) -> tuple[slice, ...]:
    parts = re.findall(r"\[[^\]]*\]", slabs)
    shape = variable.shape
    if not parts:
        return tuple(slice(0, n, 1) for n in shape)
    if len(parts) != len(shape):
        raise ConstraintError(f"{dataset.name}: {variable.path} has {len(shape)} dimensions, "
                              f"the hyperslab {slabs[:80]!r} gives {len(parts)}")
    out = []
    for dim, (part, size) in enumerate(zip(parts, shape, strict=True)):
        found = SLAB.fullmatch(part)
        if found is None or (part.replace(" ", "") == "[]" and not dap4):
            raise ConstraintError(f"{dataset.name}: {variable.path}: cannot read hyperslab "
                                  f"{part[:40]!r} (give [i], [start:stop] or "
                                  "[start:stride:stop])")
        first, second, third = found.groups()
        if first is None:
            start, step, last = 0, 1, size - 1
        elif second is None and third is None:
            start, step, last = int(first), 1, int(first)
        elif third is None:  # [start:stop]
            start, step, last = int(first), 1, int(second)
        else:
            start, step = int(first), int(second) if second is not None else 1
            last = size - 1 if third in ("", "*") else int(third)
        if step < 1 or not 0 <= start <= last < size:
            raise ConstraintError(f"{dataset.name}: {variable.path}: hyperslab {part} is "
                                  f"outside dimension {variable.dims[dim]!r} of length {size}"
                                  if step >= 1 else f"{dataset.name}: {variable.path}: "
                                  f"hyperslab {part}: the stride must be 1 or more")
        out.append(slice(start, last + 1, step))
    return tuple(out)

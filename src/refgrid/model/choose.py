"""Choosing variables (``variables=`` / ``drop_variables=``) and telling coordinates apart.

Choosing comes before anything compares files: one odd variable (a ``Projection`` that
differs per granule, a diagnostic added one year) otherwise refuses a whole archive. A name
is a variable's path (``"tas"``, ``"sub/tas"``) or a group's (dropping a group drops what it
holds). Scanners leave dropped variables unscanned where they can (a variable refgrid cannot
read then stops nothing), noting each in the report as ``dropped``: choosing counts those
names as held and takes the notes off. ``variables=`` keeps what the chosen variables need
to be read as xarray reads them: the coordinate variables of their dimensions and the
variables their CF attributes name (``coordinates``, ``bounds``, ``climatology``,
``grid_mapping``), and those variables' own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace

from refgrid.errors import ArgumentError
from refgrid.model.virtual import VirtualArray, VirtualGroup

REFERRING_ATTRS = ("coordinates", "bounds", "climatology", "grid_mapping")
"""CF attributes that name other variables a variable is read with."""


def choose(group: VirtualGroup, variables: Sequence[str] | None,
           drop_variables: Sequence[str] | None, where: str, *,
           strict: bool = True) -> VirtualGroup:
    """``group`` with only the chosen variables (see the module docstring); the scan report
    keeps the entries of what is kept. ``strict``: a name ``group`` does not hold is an error
    naming ``where`` (a scan of one file); a combine checks names against all its files."""
    if variables is None and not drop_variables:
        return group
    paths = held_names(group)
    named = [*(variables or ()), *(drop_variables or ())]
    _check_names(named)
    if strict:
        unknown = [n for n in named if n.strip("/") not in paths]
        if unknown:
            raise ArgumentError(f"{where} holds no variable or group {', '.join(unknown)} "
                                f"(it holds: {', '.join(sorted(paths)) or 'nothing'})")
    arrays = {path for path, node in group.walk() if isinstance(node, VirtualArray)}
    if variables is not None:
        kept = _needed(group, {p for p in arrays if _under(p, variables)})
    else:
        kept = set(arrays)
    kept = {p for p in kept if not _under(p, drop_variables or ())}
    def keeps(path: str) -> bool:  # a group: kept where it holds what is, or nothing dropped
        if _under(path, drop_variables or ()):
            return False
        return variables is None or any(p.startswith(path + "/") for p in kept)

    chosen = _pruned(group, kept, keeps, "")
    report = tuple(e for e in group.report if not e.variable or e.variable.split("@")[0]
                   in kept or not _under(e.variable, named))
    return replace(chosen, report=report, sources=group.sources)


def chosen_names(value: object, what: str, *, keeping: bool) -> tuple[str, ...] | None:
    """The names a user passed as ``what`` (one name or several; None: no choice), checked:
    each a non-empty string; none at all, where they are what is kept (``keeping``), is
    refused (it would keep nothing: an empty dataset without a word)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if isinstance(value, bytes | bytearray) or not isinstance(value, Iterable):
        raise ArgumentError(f"{what} must be variable names, not {value!r}")
    names = tuple(value)
    if not all(isinstance(n, str) and n.strip("/") for n in names):
        raise ArgumentError(f"{what} must be variable names, not {value!r}")
    if keeping and not names:
        raise ArgumentError(f"{what}=[] keeps no variable: name some, or pass None for all")
    return names


def held_names(group: VirtualGroup) -> set[str]:
    """Every variable and group path ``group`` holds, those its scan dropped unscanned
    included (noted ``dropped`` in its report); a combine's names are checked against the
    union over its files."""
    return {path for path, _ in group.walk()} | {
        e.variable for e in group.report if e.action == "dropped"}


def unknown_names(names: Collection[str], held: Collection[str]) -> list[str]:
    """The chosen ``names`` none of the files holds."""
    return [n for n in names if n.strip("/") not in held]


def coordinate_names(group: VirtualGroup) -> set[str]:
    """The names of ``group``'s arrays that are coordinates, not data: dimension
    coordinates and the variables CF attributes name (bounds, auxiliary coordinates, grid
    mappings), as xarray's ``decode_coords="all"`` sets them apart."""
    out = {name for name, a in group.arrays.items() if a.dims == (name,)}
    for a in group.arrays.values():
        out |= {name for name in _referred(a) if name in group.arrays}
    return out


def _check_names(names: Sequence[str]) -> None:
    bad = [n for n in names if not isinstance(n, str) or not n.strip("/")]
    if bad:
        raise ArgumentError(f"variable names must be non-empty strings, not {bad[0]!r}")


def _under(path: str, names: Collection[str]) -> bool:
    """Whether ``path`` is one of ``names`` or lies in a group they name."""
    return any(path == n.strip("/") or path.startswith(n.strip("/") + "/") for n in names)


def _referred(array: VirtualArray) -> list[str]:
    words: list[str] = []
    for attr in REFERRING_ATTRS:
        value = array.attrs.get(attr)
        if isinstance(value, str):  # grid_mapping may be "crs: x y" (CF's extended form)
            words += [w.rstrip(":") for w in value.split()]
    return words


def _needed(group: VirtualGroup, chosen: set[str]) -> set[str]:
    """``chosen`` and, repeatedly, the coordinates and named variables they are read with
    — found in the variable's group or the nearest group above holding them, as netCDF4
    scopes dimensions (a subgroup's variables along the root's ``time``)."""
    needed = set(chosen)
    todo = list(chosen)
    while todo:
        path = todo.pop()
        array = group[path]
        assert isinstance(array, VirtualArray)
        for name in [*array.dims, *_referred(array)]:
            found = _in_scope(group, path.rpartition("/")[0], name)
            if found is not None and found not in needed:
                needed.add(found)
                todo.append(found)
    return needed


def _in_scope(group: VirtualGroup, parent: str, name: str) -> str | None:
    """The path of the array ``name`` seen from the group ``parent``: its own, or the
    nearest above."""
    while True:
        node = group[parent] if parent else group
        assert isinstance(node, VirtualGroup)
        if name in node.arrays:
            return f"{parent}/{name}" if parent else name
        if not parent:
            return None
        parent = parent.rpartition("/")[0]


def _pruned(group: VirtualGroup, kept: set[str], keeps: Callable[[str], bool],
            prefix: str) -> VirtualGroup:
    arrays = {n: a for n, a in group.arrays.items() if prefix + n in kept}
    groups = {n: _pruned(g, kept, keeps, f"{prefix}{n}/") for n, g in group.groups.items()
              if keeps(prefix + n)}
    return VirtualGroup(group.attrs, arrays, groups)

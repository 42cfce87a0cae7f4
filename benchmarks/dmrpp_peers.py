"""DMR++ documents read by refgrid and by VirtualiZarr 2.8's DMR++ parser, variable by variable,
against the data files' own values.

The corpus (``../shared/corpus/dmrpp/files``, 177 pairs) holds documents OPeNDAP Hyrax wrote
and the data files beside them (HDF5, NetCDF4, HDF4, one raw ``.bin``). Every variable each
document describes (its variable elements, by ``group/variable`` path) is read by both parsers
and classed per parser as:

- correct: equal to the ground truth (``tests/support/dmrpp_docs.py``: h5py, pyhdf for HDF4,
  compared by its ``same_values``); also, for both parsers alike: equal to netCDF-C's raw read where
  h5py's differs (as the project's tests accept), and records read as opaque bytes whose
  fields equal the file's (in its layout, padding bytes aside, or packed);
- refused: the parser said it cannot — refgrid: a ``report`` entry "skipped" with its reason,
  or a ``RefgridError`` (its documented error for inputs it cannot take); VirtualiZarr: its
  warning "contains the variable X that could not be parsed" (X left out), or a
  ``NotImplementedError``;
- failed: any other exception while parsing or reading, or the variable missing from the
  result with no message;
- wrong: values that differ from the ground truth;
- no-truth: read, but the data file does not hold the values: not in the file (values Hyrax
  computed), or HDF5 leaves them undefined (fill time "never", or a document's dimension
  longer than the file's variable, the values equal over the file's extent).

Target: refgrid has no "wrong" and no "failed", and reads correctly at least as many variables
as VirtualiZarr in every folder.

How VirtualiZarr is driven (its 2.8 API as installed, nothing patched or rewritten): one
``obspec_utils.registry.ObjectStoreRegistry({"file://": obstore.store.LocalStore()})``;
``DMRPPParser(group=g)(doc.as_uri(), registry)`` (a ManifestStore) for each group ``g`` that
holds variables, as its parser reads one group per call; where that call raises (one variable's
crash fails its whole group), each variable of the group again alone with
``skip_variables=`` the others, as VirtualiZarr's own warning advises, so a neighbour's crash
is not counted against it; each array read raw with
``zarr.open_group(store, mode="r", zarr_format=3)[name][...]`` (no mask, scale or time
decoding: the stored values, as refgrid's ``read`` gives them). VirtualiZarr ignores the
document's ``dmrpp:href`` and takes the data file to be the document's URL without
``.dmrpp``: the file beside each document here, so no document is rewritten. refgrid resolves
the href itself (relative, or Hyrax's placeholder: the file beside the document). Documents
are taken as Hyrax wrote them: VirtualiZarr finds nothing in the two whose DAP namespaces are
``https://`` (its namespaces are ``http://``), so their variables count as missing.

    python benchmarks/dmrpp_peers.py
"""

from __future__ import annotations

import collections
import re
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

import refgrid
from refgrid.read.array import read

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from dmrpp_docs import (
    CORPUS,
    corpus_pairs,
    folder,
    hyrax_attributes,
    same_values,
    truth,
)

OUTCOMES = ("correct", "refused", "failed", "wrong", "no-truth")
PARSERS = ("refgrid", "VirtualiZarr")
VZ_REFUSAL = re.compile(r"contains the variable (.+?) that could not\s+be parsed")

Result = tuple[str, object]
"""("values", ndarray), ("refused", reason) or ("failed", reason)."""


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def refgrid_results(doc: Path, paths: list[str]) -> dict[str, Result]:
    """refgrid's read of every variable: ``scan(doc, on_error="report")``, then ``read``."""
    try:
        group = refgrid.scan(doc, on_error="report")
    except refgrid.RefgridError as e:
        return dict.fromkeys(paths, ("refused", _why(e)))
    except Exception as e:  # a crash is a failure of every variable
        return dict.fromkeys(paths, ("failed", _why(e)))
    results: dict[str, Result] = {}
    for entry in group.report:
        if entry.action == "skipped":
            results[entry.variable] = ("refused", f"report: {entry.reason[:160]}")
    for path, node in group.walk():
        if not isinstance(node, refgrid.VirtualArray):
            continue
        try:
            results[path] = ("values", np.asarray(read(node)))
        except refgrid.RefgridError as e:
            results[path] = ("refused", _why(e))
        except Exception as e:
            results[path] = ("failed", _why(e))
    return results


def virtualizarr_results(doc: Path, paths: list[str], registry) -> dict[str, Result]:
    """VirtualiZarr's read of every variable: its DMR++ parser per group, zarr's read."""
    import zarr

    results: dict[str, Result] = {}
    for name in sorted({p.rpartition("/")[0] for p in paths}):
        members = [p.rpartition("/")[2] for p in paths if p.rpartition("/")[0] == name]
        prefix = f"{name}/" if name else ""
        try:
            stores = [_vz_parse(doc, name, (), registry, results, prefix)]
        except Exception:  # one variable's crash fails the group: each variable alone
            stores = []
            for member in members:
                try:
                    others = [m for m in members if m != member]
                    stores.append(_vz_parse(doc, name, others, registry, results, prefix))
                except NotImplementedError as e:
                    results[prefix + member] = ("refused", _why(e))
                except Exception as e:
                    results[prefix + member] = ("failed", _why(e))
        for store in stores:
            try:
                root = zarr.open_group(store, mode="r", zarr_format=3)
                keys = list(root.array_keys())
            except Exception as e:
                for member in members:
                    results.setdefault(prefix + member, ("failed", _why(e)))
                continue
            for key in keys:
                try:
                    results[prefix + key] = ("values", np.asarray(root[key][...]))
                except NotImplementedError as e:
                    results[prefix + key] = ("refused", _why(e))
                except Exception as e:
                    results[prefix + key] = ("failed", _why(e))
    return results


def _vz_parse(doc: Path, group: str, skip: list[str] | tuple[()], registry,
              results: dict[str, Result], prefix: str):
    """VirtualiZarr's ManifestStore of one group, its warnings' refusals noted."""
    from virtualizarr.parsers import DMRPPParser

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = DMRPPParser(group=group or None, skip_variables=skip)(doc.as_uri(), registry)
    for w in caught:
        if m := VZ_REFUSAL.search(str(w.message)):
            results[prefix + m.group(1)] = ("refused", "warning: could not be parsed")
    return store


def _netcdf4_raw(data: Path, path: str) -> np.ndarray | None:
    """netCDF-C's raw read (no mask or scale), or None where it has no such variable."""
    try:
        import netCDF4

        with netCDF4.Dataset(data) as ds:
            parent, _, name = path.rpartition("/")
            variable = (ds[parent] if parent else ds).variables[name]
            variable.set_auto_maskandscale(False)
            return np.asarray(variable[...])
    except Exception:
        return None


class Truth:
    """A document's ground truth, each variable read once for both parsers."""

    def __init__(self, data: Path, attrs: dict[str, dict[str, list[str]]]) -> None:
        self.data, self.attrs = data, attrs
        self.cache: dict[str, tuple[np.ndarray | None, str]] = {}
        self.other: dict[str, np.ndarray | None] = {}

    def value(self, path: str) -> tuple[np.ndarray | None, str]:
        """The file's values (h5py, pyhdf), or None and why: the file does not hold the
        variable (KeyError), or no reader of the ground truth can read it."""
        if path not in self.cache:
            try:
                self.cache[path] = (truth(self.data, path, self.attrs.get(path, {})), "")
            except KeyError:
                self.cache[path] = (None, "")
            except Exception as e:
                self.cache[path] = (None, f"ground truth unreadable: {_why(e)}")
        return self.cache[path]

    def netcdf4(self, path: str) -> np.ndarray | None:
        """netCDF-C's raw read of an HDF5/NetCDF4 variable (None: it cannot)."""
        if path not in self.other:
            self.other[path] = None if self.data.suffix in (".hdf", ".bin") else \
                _netcdf4_raw(self.data, path)
        return self.other[path]

    def never_filled(self, path: str) -> bool:
        """Whether HDF5 leaves the variable's unwritten values undefined (fill time never:
        h5py reads zeros, netCDF-C whatever memory held, a DMR++ reader the fill value)."""
        if self.data.suffix in (".hdf", ".bin"):
            return False
        try:
            import h5py

            parent, _, name = path.rpartition("/")
            with h5py.File(self.data, "r") as f:
                for candidate in (f"{parent}/_nc4_non_coord_{name}".lstrip("/"), path):
                    if candidate in f:
                        plist = f[candidate].id.get_create_plist()
                        return plist.get_fill_time() == h5py.h5d.FILL_TIME_NEVER
        except Exception:
            pass
        return False


def judge(result: Result, path: str, facts: Truth) -> tuple[str, str]:
    """The outcome of one parser's result for one variable, and why."""
    kind, value = result
    if kind != "values":
        return kind, str(value)
    assert isinstance(value, np.ndarray)
    expected, why = facts.value(path)
    if expected is None:
        return "no-truth", why
    try:
        if same_values(value, expected) or _same_records(value, expected):
            return "correct", ""
        other = facts.netcdf4(path)
        if other is not None and same_values(value, other):
            return "correct", "netCDF-C's view"
    except Exception as e:  # a result of a form no comparison accepts
        return "wrong", f"uncomparable: {_why(e)}"
    if _within(value, expected):
        return "no-truth", "past the file's extent (equal within it)"
    if facts.never_filled(path):
        return "no-truth", "undefined: HDF5 fill time 'never', unwritten values undefined"
    return "wrong", f"{value.dtype}{value.shape} vs {expected.dtype}{expected.shape}"


def _same_records(ours: np.ndarray, expected: np.ndarray) -> bool:
    """Records read as opaque bytes that hold the file's fields, in the file's layout
    (padding bytes aside) or packed."""
    fields = expected.dtype.fields
    if ours.dtype.kind != "V" or ours.dtype.fields is not None or fields is None:
        return False
    names = list(expected.dtype.names or ())
    packed = np.dtype({"names": names, "formats": [fields[n][0] for n in names]})
    flat = expected.reshape(-1)
    for layout in (expected.dtype, packed):
        if ours.dtype.itemsize != layout.itemsize:
            continue
        records = np.frombuffer(np.ascontiguousarray(ours).tobytes(), layout)
        if records.size == flat.size and all(
                np.array_equal(records[n], flat[n]) for n in names):
            return True
    return False


def _within(ours: np.ndarray, expected: np.ndarray) -> bool:
    """Whether ``ours`` is larger than the file's variable and equal to it over its extent
    (a document's dimension longer than what the file holds)."""
    if ours.ndim != expected.ndim or ours.shape == expected.shape or \
            any(e > o for e, o in zip(expected.shape, ours.shape, strict=True)):
        return False
    return same_values(ours[tuple(slice(0, e) for e in expected.shape)], expected)


def run(pairs: list[tuple[Path, Path]]) -> tuple[dict, dict, dict, dict]:
    """Per parser: outcomes by folder, reasons, seconds spent in the parser (and its
    reads), and results under names outside the documents' variables (none expected)."""
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore

    registry = ObjectStoreRegistry({"file://": LocalStore()})
    counts = {p: collections.defaultdict(collections.Counter) for p in PARSERS}
    reasons = {p: collections.Counter() for p in PARSERS}
    extra = dict.fromkeys(PARSERS, 0)
    seconds = dict.fromkeys(PARSERS, 0.0)
    readers: dict[str, Callable[[Path, list[str]], dict[str, Result]]] = {
        "refgrid": refgrid_results,
        "VirtualiZarr": lambda doc, paths: virtualizarr_results(doc, paths, registry)}
    for doc, data in pairs:
        where = folder(doc)
        try:
            attrs = hyrax_attributes(doc)
        except Exception as e:
            print(f"  {doc.name}: document unreadable for the variable list: {_why(e)}")
            continue
        paths = list(attrs)
        facts = Truth(data, attrs)
        for parser in PARSERS:
            t0 = time.perf_counter()
            try:
                results = readers[parser](doc, paths)
            except Exception as e:  # (the readers catch their own; this is a last resort)
                results = dict.fromkeys(paths, ("failed", _why(e)))
            seconds[parser] += time.perf_counter() - t0
            extra[parser] += len(results.keys() - set(paths))
            for path in paths:
                try:
                    outcome, why = judge(results.get(path, ("failed", "missing, no message")),
                                         path, facts)
                except Exception as e:
                    outcome, why = "failed", f"judging: {_why(e)}"
                counts[parser][where][outcome] += 1
                if outcome != "correct" and why:
                    reasons[parser][(outcome, _shorten(why))] += 1
    return counts, reasons, seconds, extra


def _shorten(why: str) -> str:
    """A reason without the paths and names that make each instance unique."""
    why = re.sub(r"(/|file://)\S+", "<path>", why)
    why = re.sub(r"'[^']*'", "'…'", why)
    return re.sub(r"\b\d+\b", "N", why)[:110]


def main() -> None:
    warnings.filterwarnings("ignore")
    if not CORPUS.is_dir():
        print(f"the DMR++ corpus is absent ({CORPUS})")
        return
    pairs = corpus_pairs()
    t0 = time.perf_counter()
    counts, reasons, seconds, extra = run(pairs)
    elapsed = time.perf_counter() - t0

    import virtualizarr

    print(f"DMR++ corpus: {len(pairs)} documents; refgrid vs VirtualiZarr "
          f"{virtualizarr.__version__} (DMRPPParser), variables by outcome")
    head = " ".join(f"{o:>8s}" for o in OUTCOMES)
    print(f"{'folder':9s} {'parser':13s} {head} {'total':>6s}")
    folders = sorted({f for p in PARSERS for f in counts[p]})
    for name in [*folders, "all"]:
        for parser in PARSERS:
            if name == "all":
                c = sum(counts[parser].values(), collections.Counter())
            else:
                c = counts[parser][name]
            cells = " ".join(f"{c[o]:8d}" for o in OUTCOMES)
            print(f"{name if parser == PARSERS[0] else '':9s} {parser:13s} {cells} "
                  f"{sum(c.values()):6d}")
    for parser in PARSERS:
        print(f"\n{parser}: why not correct (where known), most frequent first")
        for (outcome, why), n in reasons[parser].most_common(12):
            print(f"  {n:4d} {outcome:8s} {why}")
    print(f"\nresults under names the documents do not describe: refgrid {extra['refgrid']}, "
          f"VirtualiZarr {extra['VirtualiZarr']}")
    print(f"time: refgrid {seconds['refgrid']:.1f}s, VirtualiZarr "
          f"{seconds['VirtualiZarr']:.1f}s, run {elapsed:.1f}s (with ground truth)")


if __name__ == "__main__":
    main()

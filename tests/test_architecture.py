"""The house rules of design.md, checked: imports only go downward with no circles, every
input ``refgrid.scan`` takes the engine and the mapper take too (one dispatcher), and each
test lives in the room of what it tests."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

import refgrid
from helpers import FIXTURES, ROOT, closed
from refgrid.scanners import detect_format
from refgrid.scanners.source import Source

PACKAGE = ROOT / "src" / "refgrid"
LAYERS = {"errors": 0, "core": 1, "grid": 2, "codecs": 2, "model": 3, "refs": 4,
          "scanners": 5, "read": 6, "combining": 7, "materializing": 7, "writers": 7,
          "explore": 7, "archive": 8, "serve": 8, "cli": 9, "demo": 9, "__init__": 9}
"""Each package's layer (and the top-level modules', which are roles of their own): entry
points → archive/serve → combining/materializing/writers/explore → read → scanners → refs →
model → grid/codecs → core → errors. A package may import its own modules and lower layers'
(the reference layouts, refs, below both the scanners and the writers that use them)."""
ACROSS = {("materializing", "writers"), ("materializing", "explore"), ("cli", "demo"),
          ("cli", "__init__"), ("serve", "archive")}
"""The imports allowed between two parts of the same layer (materializing swaps its output
in with the writers' atomic replace and picks chunks with the advisor; the service follows
growing archives with batch); any other, such as grid ↔ codecs or archive → serve, is an
error."""
TOP_LEVEL_MODULES = {"__init__", "errors", "cli", "demo", "materializing"}
"""The only modules beside the packages: everything else lives in the package of its role."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts).removesuffix(".__init__")


def _part(module: str) -> str:
    """The package (``scanners``, ``grid``, ...) or top-level module (``materializing``, ``cli``)
    holding ``module``; ``__init__`` for the package itself."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def import_graph() -> dict[str, set[str]]:
    """Module → the refgrid modules it imports (lazy imports inside functions included)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def test_imports_only_go_downward():
    wrong = []
    for module, targets in import_graph().items():
        for target in targets:
            a, b = _part(module), _part(target)
            if a == b or LAYERS[b] < LAYERS[a] or (a, b) in ACROSS:
                continue
            way = "up" if LAYERS[b] > LAYERS[a] else "across"
            wrong.append(f"{module} -> {target} ({a} may not import {b}: {way})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_top_level_holds_only_roles_and_packages():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert modules == TOP_LEVEL_MODULES, modules ^ TOP_LEVEL_MODULES
    assert len(modules) <= 6
    assert packages | modules == set(LAYERS), (packages | modules) ^ set(LAYERS)
    for package in packages:
        assert (PACKAGE / package / "__init__.py").is_file(), f"{package}/ has no docstring"


def test_no_import_cycles():
    graph = import_graph()
    for module in graph:  # a package's __init__ re-exports its modules: not a dependency
        if module.count(".") == 1 and (PACKAGE / module.split(".")[1]).is_dir():
            for other in graph:
                graph[other].discard(module) if other.startswith(f"{module}.") else None
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The two tests above can fail: a copy of the package with one bad import added."""
    copy = tmp_path / "src" / "refgrid"
    shutil.copytree(PACKAGE, copy)
    source = copy / "scanners" / "source.py"
    source.write_text(source.read_text() + "\nfrom refgrid.read.array import read\n")
    grid = copy / "grid" / "rectilinear.py"
    grid.write_text(grid.read_text() + "\nfrom refgrid.grid.json_forms import rle\n")
    codecs = copy / "codecs" / "filters.py"
    codecs.write_text(codecs.read_text() + "\nfrom refgrid.grid.rectilinear import GridForm\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    with pytest.raises(AssertionError, match=r"refgrid.scanners.source -> refgrid.read.array "
                                             r"\(scanners may not import read: up\)"):
        test_imports_only_go_downward()
    with pytest.raises(AssertionError, match=r"refgrid.codecs.filters -> "
                                             r"refgrid.grid.rectilinear "
                                             r"\(codecs may not import grid: across\)"):
        test_imports_only_go_downward()
    with pytest.raises(AssertionError, match=r"refgrid.grid.rectilinear -> "
                                             r"refgrid.grid.json_forms -> "
                                             r"refgrid.grid.rectilinear"):
        test_no_import_cycles()


TESTS = ROOT / "tests"
TEST_ROOMS = {"acceptance", "reliability"}
"""The tests' rooms beside one per part of the package (design.md, "Tests by room"):
acceptance/ for what a user meets through the whole system, reliability/ for damaged input,
faults and fuzzing."""
SUPPORT = "support"
"""The modules the tests share, imported by their own names (pytest's ``pythonpath``)."""


def misplaced_tests() -> list[str]:
    """Test modules outside a room. A room is a folder named as a part of ``src/refgrid`` (a
    package, a subpackage below it such as ``serve/dap``, or a top-level module such as
    ``cli``), or one of :data:`TEST_ROOMS`; it is a package, so that modules of one name in
    two rooms (``test_combine.py``) are two modules. Only this module, about the whole tree,
    sits at the top; support/ holds no tests and is no package (its modules would be
    imported twice, by their names and as ``tests.support.*``)."""
    parts = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
             if p.is_dir() and (p / "__init__.py").is_file()}
    parts |= {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    wrong = []
    if (TESTS / SUPPORT / "__init__.py").exists():
        wrong.append(f"{SUPPORT}/__init__.py: {SUPPORT}/ is on the path, not a package")
    for path in sorted(TESTS.rglob("test_*.py")):
        name, folder = path.relative_to(TESTS).as_posix(), path.parent.relative_to(TESTS)
        if folder == Path():
            if path.name != Path(__file__).name:
                wrong.append(f"{name}: at the top of tests/, where only "
                             f"{Path(__file__).name} is")
        elif folder.parts[0] == SUPPORT:
            wrong.append(f"{name}: {SUPPORT}/ holds the modules the tests share, no tests")
        elif folder.as_posix() not in parts | TEST_ROOMS:
            wrong.append(f"{name}: {folder.as_posix()}/ is no part of src/refgrid, nor "
                         f"{' nor '.join(sorted(TEST_ROOMS))}")
        elif missing := [d for d in (TESTS.joinpath(*folder.parts[:k])
                                     for k in range(len(folder.parts) + 1))
                         if not (d / "__init__.py").is_file()]:
            wrong.append(f"{name}: {missing[0].relative_to(TESTS.parent).as_posix()}/ has no "
                         f"__init__.py")
    return wrong


def test_tests_live_in_the_room_of_what_they_test():
    assert len(list(TESTS.rglob("test_*.py"))) > 50
    assert not misplaced_tests(), "\n".join(misplaced_tests())


def test_the_room_checker_sees_tests_out_of_place(tmp_path, monkeypatch):
    """A tree of tests with one module in each wrong place, and the right places beside."""
    tests = tmp_path / "tests"
    for relative in ["__init__.py", "test_architecture.py", "test_new.py",
                     "serve/__init__.py", "serve/test_serve.py", "serve/dap/__init__.py",
                     "serve/dap/test_dap.py", "cli/__init__.py", "cli/test_cli.py",
                     "reliability/__init__.py", "reliability/test_combine.py",
                     "nonexistent_pkg/__init__.py", "nonexistent_pkg/test_x.py",
                     "acceptance/test_no_init.py", "support/__init__.py",
                     "support/helpers.py", "support/test_helpers.py"]:
        (tests / relative).parent.mkdir(parents=True, exist_ok=True)
        (tests / relative).touch()
    monkeypatch.setattr(sys.modules[__name__], "TESTS", tests)
    assert misplaced_tests() == [
        "support/__init__.py: support/ is on the path, not a package",
        "acceptance/test_no_init.py: tests/acceptance/ has no __init__.py",
        "nonexistent_pkg/test_x.py: nonexistent_pkg/ is no part of src/refgrid, nor "
        "acceptance nor reliability",
        "support/test_helpers.py: support/ holds the modules the tests share, no tests",
        "test_new.py: at the top of tests/, where only test_architecture.py is"]


def test_the_scanners_the_formats_table_names_lie_under_the_dispatcher():
    """The dispatcher imports each row's scanner by its name (``module:function``), which the
    import walk does not see: those imports keep to the layers too."""
    from refgrid.core.formats import FORMATS

    modules = import_graph()
    for row in FORMATS:
        module = row.scanner.partition(":")[0]
        assert module in modules, f"{row.name}: no module {module}"
        part = _part(module)
        assert part == "scanners" or LAYERS[part] < LAYERS["scanners"] or (
            "scanners", part) in ACROSS, f"{row.name}: refgrid.scanners -> {module}"


TABLE = "refgrid.core.formats"
"""The one module that names the input formats' suffixes and signatures."""
COMMON_SUFFIXES = {".json"}
"""Suffixes too common to police: every JSON document has it (``zarr.json``, a batch's
report, outputs chosen by name)."""
OUTPUT_NAMES = {"refgrid.writers.references": {".parq", ".parquet"}}
"""Output names: the writers choose parquet output by the names parquet references are
read by."""


def format_names_outside_the_table(names: set[str | bytes]) -> list[str]:
    """Constants in code equal to a format's suffix or signature, outside the table: a
    module that tells a format by its name or first bytes, which a new format's row would
    not reach. Docstrings and the pieces of f-strings (``f"{array}/refs.{n}.parq"`` builds
    a name, it tells no format) are not code that tells."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    wrong = []
    for module, path in sorted(modules.items()):
        if module == TABLE:
            continue
        tree = ast.parse(path.read_text())
        skipped = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        skipped |= {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)
                    for v in n.values}
        allowed = OUTPUT_NAMES.get(module, set())
        wrong += [f"{module}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and id(n) not in skipped
                  and isinstance(n.value, str | bytes) and n.value in names - allowed]
    return wrong


def _format_names() -> set[str | bytes]:
    from refgrid.core import formats

    return {s for row in formats.FORMATS for s in row.suffixes if s not in COMMON_SUFFIXES} | {
        formats.HDF5_MAGIC, *formats.NETCDF3_MAGIC, formats.DMRPP_MARK}


def test_formats_are_told_only_by_their_table():
    """Adding a format is its scanner and one row of ``refgrid.core.formats.FORMATS``: no
    other module names a format's suffix or signature (the catalog had its own list of
    suffixes, core/inputs its own of data files, the dispatcher its magic numbers)."""
    assert ".dmrpp" in _format_names() and b"CDF\x01" in _format_names()
    assert not format_names_outside_the_table(_format_names())


def test_the_format_checker_sees_a_suffix_and_a_signature(tmp_path, monkeypatch):
    """A copy of the package with a list of suffixes and a magic number added."""
    added = {"serve/catalog.py": '\nSUFFIXES = (".json", ".zarr", ".dmrpp")\n',
             "read/store.py": '\n\ndef _hdf5(head):\n    return head[:8] == '
                              'b"\\x89HDF\\r\\n\\x1a\\n"\n'}
    copy = shutil.copytree(PACKAGE, tmp_path / "src" / "refgrid")
    for relative, text in added.items():
        with open(copy / relative, "a") as f:
            f.write(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    wrong = format_names_outside_the_table(_format_names())
    assert [w.split(":", 1)[0] for w in wrong] == ["refgrid.read.store", "refgrid.serve.catalog",
                                                   "refgrid.serve.catalog"], wrong
    assert "'.dmrpp'" in wrong[-1] and "HDF" in wrong[0]


def test_the_writers_read_no_layout_through_the_scanners():
    """Each reference layout is read and written by one module of ``refs/`` (design.md,
    "Formats at the edges"): a writer that needs what an output holds (an append: its
    ``.zmetadata``, record files and sources) asks ``refs/``, never a scanner, whose modules
    are the dispatcher's inputs (a file's size, :mod:`refgrid.scanners.source`, is no
    layout)."""
    wrong = sorted(f"{module} -> {target}" for module, targets in import_graph().items()
                   if _part(module) == "writers" for target in targets
                   if _part(target) == "scanners" and target != "refgrid.scanners.source")
    assert not wrong, "\n".join(wrong)


VIEWS = {"refgrid.read.view", "refgrid.read.native", "refgrid.read.regular"}
"""The View protocol and its two implementations (design.md, "The read side")."""
ADAPTERS = {"refgrid.read.store": "store", "refgrid.read.mapper": "mapper",
            "refgrid.read.pipeline": "pipeline", "refgrid.serve.app": "service",
            "refgrid.serve.catalog": "service"}
"""The ways in over views: each a thin adapter over a View, never over another adapter."""


def read_side_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that put an adapter under a view (or under the reader the views use), or one
    adapter on another."""
    wrong = []
    for module, targets in graph.items():
        for target in targets & set(ADAPTERS):
            if module in VIEWS or (module.startswith("refgrid.read.") and
                                   module not in ADAPTERS):
                wrong.append(f"{module} -> {target} (a view or the reader under an adapter)")
            elif module in ADAPTERS and ADAPTERS[module] != ADAPTERS[target]:
                wrong.append(f"{module} -> {target} (the {ADAPTERS[module]} adapter on the "
                             f"{ADAPTERS[target]} adapter)")
    return sorted(wrong)


def test_adapters_sit_on_views_never_on_each_other():
    assert VIEWS | set(ADAPTERS) <= set(import_graph())
    assert not read_side_violations(import_graph())


def test_the_read_side_checker_sees_a_view_on_an_adapter_and_an_adapter_on_another():
    graph = import_graph()
    graph["refgrid.read.regular"].add("refgrid.read.mapper")
    graph["refgrid.read.store"].add("refgrid.read.mapper")
    graph["refgrid.serve.catalog"].add("refgrid.read.store")
    assert read_side_violations(graph) == [
        "refgrid.read.regular -> refgrid.read.mapper (a view or the reader under an adapter)",
        "refgrid.read.store -> refgrid.read.mapper (the store adapter on the mapper adapter)",
        "refgrid.serve.catalog -> refgrid.read.store (the service adapter on the store "
        "adapter)"]


def test_every_public_exception_is_in_refgrid_errors_and_exported():
    import refgrid.errors as errors

    defined = {name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, errors.RefgridError)}
    assert defined <= set(refgrid.__all__), defined - set(refgrid.__all__)
    for module in import_graph():
        __import__(module)
        for name, value in vars(sys.modules[module]).items():
            if isinstance(value, type) and issubclass(value, refgrid.RefgridError):
                assert value.__module__ == "refgrid.errors", (module, name)


MONTHS = [FIXTURES / "monthly" / "chunk10" / f"tas_2001{m:02d}.nc" for m in (1, 2)]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, object]:
    """One input of every kind, all holding January's ``tas`` (the NetCDF3 one its own)."""
    out = tmp_path_factory.mktemp("inputs")
    group = refgrid.scan(MONTHS[0])
    refgrid.write(group, out / "refs.json")
    refgrid.write(group, out / "refs.parq")
    shutil.copytree(out / "refs.parq", out / "parquet-without-suffix")
    kerchunk = _kerchunk_v2(MONTHS[0])
    (out / "kerchunk.json").write_text(json.dumps(kerchunk))
    store = out / "store.zarr"
    root = zarr.open_group(store, mode="w", zarr_format=3)
    with xr.open_dataset(MONTHS[0], engine="netcdf4") as ds:
        array = root.create_array("tas", shape=ds.tas.shape, chunks=(10, 6, 8), dtype="f4",
                                  dimension_names=list(ds.tas.dims))
        array[...] = ds.tas.values
    return {
        "hdf5": MONTHS[0],
        "netcdf3": next((FIXTURES / "netcdf3").glob("*.nc")),
        "json (refgrid)": out / "refs.json",
        "json (kerchunk v2)": out / "kerchunk.json",
        "dict": refgrid.to_kerchunk(group),
        "parquet": out / "refs.parq",
        "parquet directory without suffix": out / "parquet-without-suffix",
        "zarr store": store,
    }


def _kerchunk_v2(path: Path) -> dict:
    from kerchunk.hdf import SingleHdf5ToZarr

    with open(path, "rb") as f:
        return SingleHdf5ToZarr(f, str(path), inline_threshold=0).translate()


KINDS = ["hdf5", "netcdf3", "json (refgrid)", "json (kerchunk v2)", "dict", "parquet",
         "parquet directory without suffix", "zarr store"]


@pytest.mark.parametrize("kind", KINDS)
def test_scan_the_engine_and_the_mapper_accept_the_same_inputs(inputs, kind):
    source = inputs[kind]
    group = refgrid.scan(source)
    ds = xr.open_dataset(source, engine="refgrid")
    view = xr.open_dataset(refgrid.get_mapper(source), engine="zarr")
    names = {name for name, _ in group.walk()}
    assert set(ds.variables) == names == set(view.variables)
    for name in names:
        np.testing.assert_array_equal(ds[name].values, view[name].values)
    if kind != "netcdf3":  # every other input holds January: compare with netCDF4's read
        with xr.open_dataset(MONTHS[0], engine="netcdf4") as truth:
            np.testing.assert_array_equal(ds.tas.values, truth.tas.values)


def test_the_dispatcher_names_what_it_found(inputs, tmp_path):
    kinds = {kind: detect_format(Source.of(inputs[kind], {}))
             for kind in KINDS if kind != "dict"}
    assert kinds == {"hdf5": "hdf5", "netcdf3": "netcdf3", "json (refgrid)": "json",
                     "json (kerchunk v2)": "json", "parquet": "parquet",
                     "parquet directory without suffix": "parquet", "zarr store": "zarr"}
    (tmp_path / "empty").mkdir()
    with pytest.raises(refgrid.FormatError, match=r"empty: a directory with no zarr.json"):
        refgrid.scan(tmp_path / "empty")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(refgrid.FormatError, match=r"list\.json: not a kerchunk reference set "
                                                  r"\(the JSON is a list"):
        xr.open_dataset(tmp_path / "list.json", engine="refgrid")


def test_groups_are_opened_from_one_scan(monkeypatch):
    import refgrid.read.dataset as backend

    source = FIXTURES / "groups" / next(p.name for p in (FIXTURES / "groups").iterdir())
    calls = []
    real = backend.scan_with
    monkeypatch.setattr(backend, "scan_with", lambda *a, **k: calls.append(a) or real(*a, **k))
    tree = xr.open_datatree(source, engine="refgrid")
    assert len(calls) == 1
    expected = closed(xr.open_datatree(source, engine="netcdf4"))
    assert sorted(tree.groups) == sorted(expected.groups)
    for path in expected.groups:
        for name, var in expected[path].dataset.data_vars.items():
            np.testing.assert_array_equal(tree[path].dataset[name].values, var.values)


HEAVY = ("dask", "distributed", "pandas", "pyarrow", "zarr", "xarray", "h5py", "fsspec",
         "numcodecs", "imagecodecs", "netCDF4", "click", "matplotlib", "aiohttp", "tqdm",
         "icechunk")


@pytest.mark.parametrize("statement", ["import refgrid",
                                       "import refgrid; refgrid.RefgridError; dir(refgrid)",
                                       "import refgrid.errors, refgrid.core.bounds"])
def test_importing_refgrid_loads_no_heavy_library(statement):
    """``import refgrid`` stays cheap: each library is imported by what first needs it."""
    code = f"{statement}; import sys; print(sorted({{m.partition('.')[0] for m in sys.modules}}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    loaded = set(ast.literal_eval(done.stdout.strip()))
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


@pytest.mark.parametrize("module", ["refgrid.serve.app", "refgrid.read.store",
                                    "refgrid.read.mapper"])
def test_the_service_and_the_stores_load_no_xarray(module):
    """xarray (and pandas under it) doubled the service's memory: only a view that unpacks
    needs it, and imports it then."""
    code = f"import {module}, sys; print(sorted({{m.partition('.')[0] for m in sys.modules}}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    loaded = set(ast.literal_eval(done.stdout.strip()))
    assert loaded.isdisjoint({"xarray", "pandas", "dask"}), sorted(loaded)


def test_xarray_discovers_the_engine_without_loading_refgrid():
    """xarray imports every engine's entry point whenever it opens anything: refgrid's costs
    it no more than the entry point."""
    code = ("import xarray as xr, sys; xr.backends.list_engines(); "
            "print(sorted(m for m in sys.modules if m.startswith(('refgrid', 'zarr', 'h5py', "
            "'pyarrow')) ))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    loaded = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert [m for m in loaded if m.startswith("refgrid")] == [
        "refgrid", "refgrid.errors", "refgrid.read", "refgrid.read.backend"]


def test_public_functions_survive_their_subpackages_being_imported():
    """No module class needed: no module is named after a public function."""
    code = ("import refgrid, refgrid.scanners.hdf5, refgrid.writers.parquet, "
            "refgrid.combining, refgrid.materializing, refgrid.archive.task; import types; "
            "print([isinstance(getattr(refgrid, n), types.FunctionType) "
            "for n in ('scan', 'write', 'combine', 'batch', 'get_mapper')])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[True, True, True, True, True]"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        refgrid.nothing  # noqa: B018
    assert {"scan", "batch", "VirtualGroup"} <= set(dir(refgrid))
    assert type(refgrid) is types.ModuleType  # a plain module
    publics = {n for n in refgrid.__all__ if not n[0].isupper() and n != "plot"}
    modules = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}
    assert not publics & modules, publics & modules


def test_type_checker_is_clean():
    """``make test`` runs mypy too; this keeps a plain ``pytest`` run honest."""
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_benchmarks_import_names_that_exist():
    """Benchmarks run only under ``make bench``: every refgrid name they import (lazily
    inside functions too) must still exist, or a move breaks them unnoticed."""
    import importlib

    missing = []
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("refgrid"):
                module = importlib.import_module(node.module)
                missing += [f"{script.name}: {node.module}.{alias.name}" for alias in node.names
                            if not hasattr(module, alias.name)]
    assert not missing, missing


def test_every_public_name_imports_and_every_entry_point_resolves():
    """The layout moves modules, never public names: each name in ``refgrid.__all__``, the
    public module ``refgrid.plot``, and every entry point ``pyproject.toml`` declares."""
    import importlib
    import tomllib

    for name in refgrid.__all__:
        assert getattr(refgrid, name) is not None, name
    from refgrid import plot

    assert plot.__name__ == "refgrid.explore.plot"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {f"scripts.{k}": v for k, v in project["scripts"].items()}
    for group, points in project["entry-points"].items():
        declared |= {f"{group}.{k}": v for k, v in points.items()}
    assert len(declared) == 19, sorted(declared)
    for name, target in declared.items():
        module, _, attribute = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attribute)), name
    from importlib.metadata import distribution

    installed = {f"{e.group}.{e.name}": e.value for e in distribution("refgrid").entry_points}
    assert {k: v for k, v in installed.items() if not k.startswith("console_scripts")} == {
        k: v for k, v in declared.items() if not k.startswith("scripts")}, (
        "the installed entry points differ from pyproject.toml: reinstall (make test does)")

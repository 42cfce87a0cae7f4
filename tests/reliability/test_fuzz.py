"""Fuzzing the parsers: every outcome is data netCDF-C agrees with, or a RefgridError.

* NetCDF3: mutated headers (bytes, header integers, truncation) are scanned and every
  variable read; the same bytes are opened by netCDF4 (netCDF-C, in memory). A file both
  accept must read equal, variable by variable; refgrid may refuse what netCDF-C reads only
  with a RefgridError.
* References: refgrid JSON, kerchunk JSON and parquet reference sets, mutated structurally
  (values replaced by odd JSON) and byte-wise, are scanned and every array read.
* Fill values: DMR++ documents and HDF5 files whose ``_FillValue`` and fill value have odd
  shapes and types (none, several values, text, numbers the type cannot hold) are scanned,
  written and read: the fill value is one the variable's type holds exactly, or the
  variable is refused by name.

Every case must end within a time bound and without anything but a RefgridError. CI runs a
few hundred cases; ``REFGRID_FUZZ_EXAMPLES=1000000`` runs a long campaign, and
``REFGRID_FUZZ_REPORT=path.json`` writes the outcome counts there.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import resource
import shutil
import struct
import time
from collections import Counter
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import refgrid
from helpers import CORPUS, FIXTURES
from refgrid.read.array import read

EXAMPLES = int(os.environ.get("REFGRID_FUZZ_EXAMPLES", "250"))
SECONDS_PER_CASE = 5.0
"""CPU seconds a case may take (runaway work: a loop, a quadratic parse)."""
HANG_SECONDS = 120.0
"""Wall seconds a case may take (a hang: waiting, not working), far above any case's CPU
time, so that a machine under load never trips it."""
ORACLE_SECONDS = 2.0
"""netCDF-C loops forever on some mutants: after this long it counts as refusing."""
OUTCOMES: dict[str, Counter[str]] = {"netcdf3": Counter(), "references": Counter(),
                                     "fill values": Counter()}
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate],  # a failure is reported as found
                suppress_health_check=list(HealthCheck))

NETCDF3_SEEDS = [FIXTURES / "netcdf3" / n for n in
                 ("single_byte_record.nc", "cdf5.nc", "empty_record.nc",
                  "classic/tas_200101.nc", "offset64/tas_200102.nc")]
NETCDF3_SEEDS += [p for p in sorted(CORPUS.glob("ncc__ref_nctest_*.nc")) if CORPUS.is_dir()]
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 100, 10**6]


def _write_report() -> None:
    target = os.environ.get("REFGRID_FUZZ_REPORT")
    if target:
        Path(target).write_text(json.dumps({k: dict(v) for k, v in OUTCOMES.items()}))


def _count(area: str, outcome: str) -> None:
    OUTCOMES[area][outcome] += 1
    if OUTCOMES[area].total() % 10_000 == 0:  # a long campaign reports as it goes
        _write_report()


@pytest.fixture(scope="module", autouse=True)
def report_outcomes():
    yield
    print("\nfuzz outcomes:", {k: dict(v) for k, v in OUTCOMES.items()})
    _write_report()


def _started() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def _within_bounds(start: tuple[float, float]) -> None:
    assert time.process_time() - start[0] < SECONDS_PER_CASE, "a case worked too long"
    assert time.perf_counter() - start[1] < HANG_SECONDS, "a case hung"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 3 * 2**20, "memory grew >3 GB"


# -- NetCDF3, against netCDF-C ---------------------------------------------------------------

def _mutant(data: st.DataObject) -> bytes:
    seed = data.draw(st.sampled_from(NETCDF3_SEEDS))
    raw = bytearray(seed.read_bytes())
    header = min(len(raw), 1024)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["byte", "word", "delta"]))
        if kind == "byte":
            raw[data.draw(st.integers(4, header - 1))] = data.draw(st.integers(0, 255))
        else:
            at = data.draw(st.integers(1, header // 4 - 1)) * 4
            old = struct.unpack(">I", raw[at:at + 4])[0]
            new = data.draw(st.sampled_from(INTERESTING)) if kind == "word" else \
                (old + data.draw(st.integers(-8, 8))) % 2**32
            raw[at:at + 4] = struct.pack(">I", new)
    if data.draw(st.integers(0, 9)) == 0:
        raw = raw[:data.draw(st.integers(4, len(raw)))]
    return bytes(raw)


def _netcdf4_read(raw: bytes) -> dict[str, np.ndarray] | None:
    try:
        with netCDF4.Dataset("mutant", memory=raw) as nc:
            out = {}
            for name, var in nc.variables.items():
                var.set_auto_maskandscale(False)
                var.set_auto_chartostring(False)
                out[name] = np.asarray(var[...])
            return out
    except Exception:
        return None


def _oracle_loop(connection: Any) -> None:
    while True:
        raw = connection.recv()
        connection.send(_netcdf4_read(raw))


class NetCDFOracle:
    """netCDF-C in a worker process: some mutants crash it (SIGSEGV) or make it loop, which
    must not end the fuzzing; either counts as netCDF-C refusing the file, and the worker
    restarts."""

    def __init__(self) -> None:
        self.process: Any = None
        self.crashes = 0

    def _start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self.connection, child = ctx.Pipe()
        self.process = ctx.Process(target=_oracle_loop, args=(child,), daemon=True)
        self.process.start()

    def __call__(self, raw: bytes) -> dict[str, np.ndarray] | None:
        if self.process is None or not self.process.is_alive():
            self._start()
        self.connection.send(raw)
        if self.connection.poll(ORACLE_SECONDS):
            try:
                return self.connection.recv()
            except EOFError:
                pass
        self.crashes += 1
        self.process.kill()
        self.process.join()
        self.process = None
        return None

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()


@pytest.fixture(scope="module")
def netcdf_c():
    oracle = NetCDFOracle()
    yield oracle
    oracle.close()
    OUTCOMES["netcdf3"]["netCDF-C crashed or hung (counted as refusing)"] += oracle.crashes


def _refgrid_values(path: Path) -> dict[str, np.ndarray] | None:
    try:
        group = refgrid.scan(path)
        return {name: read(array) for name, array in group.arrays.items()}
    except refgrid.RefgridError:
        return None


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b.astype(a.dtype), equal_nan=True))
    return bool(np.array_equal(a, b.astype(a.dtype) if b.dtype != a.dtype else b))


@FUZZ
@given(data=st.data())
def test_netcdf3_mutants_read_as_netcdf_c_reads_them_or_are_refused(tmp_path_factory,
                                                                    netcdf_c, data):
    raw = _mutant(data)
    path = tmp_path_factory.getbasetemp() / "netcdf3-mutant.nc"
    path.write_bytes(raw)
    start = _started()
    ours = _refgrid_values(path)
    _within_bounds(start)  # refgrid's time: netCDF-C may hang on a mutant, refgrid may not
    theirs = netcdf_c(raw)
    if ours is None:
        _count("netcdf3", "refgrid refuses, netCDF-C too" if theirs is None else
               "refgrid refuses, netCDF-C reads")
        return
    if theirs is None:
        _count("netcdf3", "refgrid reads, netCDF-C refuses")
        return
    differ = sorted(set(ours) ^ set(theirs)) or [
        name for name, values in ours.items() if not _same(values, theirs[name])]
    if differ:
        keep = Path(os.environ.get("REFGRID_FUZZ_FAILURES", tmp_path_factory.getbasetemp()))
        (keep / f"mismatch-{len(raw)}-{hash(raw) & 0xFFFFFF:06x}.nc").write_bytes(raw)
        raise AssertionError(f"refgrid and netCDF-C differ on {differ} (mutant kept in {keep})")
    _count("netcdf3", "both read, equal")


# -- reference sets --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference_seeds(tmp_path_factory) -> dict[str, Any]:
    """refgrid JSON (a combined month pair), kerchunk JSON (Zarr v2 keys) and parquet."""
    root = tmp_path_factory.mktemp("reference-seeds")
    months = [FIXTURES / "monthly" / "chunk10" / f"tas_2001{m:02d}.nc" for m in (1, 2)]
    combined = refgrid.combine([refgrid.scan(m) for m in months], "time")
    seeds: dict[str, Any] = {"refgrid": refgrid.to_kerchunk(combined),
                             "features": refgrid.to_kerchunk(refgrid.scan(
                                 FIXTURES / "features" / "netcdf4_features.nc"))}
    try:
        from kerchunk.hdf import SingleHdf5ToZarr

        seeds["kerchunk"] = SingleHdf5ToZarr(str(months[0]), inline_threshold=50).translate()
    except ImportError:
        pass
    seeds["parquet"] = refgrid.write(combined, root / "seed.parq", record_size=3)
    return seeds


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() |
    st.text(max_size=20) | st.sampled_from(["base64:@@", "{{u0}}", "zarr.json", "/etc/passwd",
                                            "[1,2]", '{"zarr_format": 3}']),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=8)


def _mutate_json(value: Any, data: st.DataObject, depth: int = 0) -> Any:
    """Replace one node somewhere inside ``value`` (documents inside strings included)."""
    if depth > 6 or data.draw(st.integers(0, 4)) == 0:
        return data.draw(JSON_VALUES)
    if isinstance(value, dict) and value:
        key = data.draw(st.sampled_from(sorted(value)))
        return {**value, key: _mutate_json(value[key], data, depth + 1)}
    if isinstance(value, list) and value:
        k = data.draw(st.integers(0, len(value) - 1))
        return [*value[:k], _mutate_json(value[k], data, depth + 1), *value[k + 1:]]
    if isinstance(value, str) and value.startswith("{"):
        try:
            return json.dumps(_mutate_json(json.loads(value), data, depth + 1))
        except ValueError:
            pass
    return data.draw(JSON_VALUES)


def _exercise(refs: Any) -> str:
    """Scan and read everything; 'read' or 'refused' — anything else propagates."""
    try:
        group = refgrid.scan(refs)
        for _, node in group.walk():
            if isinstance(node, refgrid.VirtualArray):
                read(node)
        refgrid.get_mapper(refs)
    except refgrid.RefgridError:
        return "refused"
    return "read"


@FUZZ
@given(data=st.data())
def test_reference_mutants_read_or_raise_refgrid_errors(reference_seeds, tmp_path_factory,
                                                        data):
    kind = data.draw(st.sampled_from(sorted(reference_seeds)))
    seed = reference_seeds[kind]
    start = _started()
    if kind == "parquet":
        work = tmp_path_factory.getbasetemp() / "parquet-mutant.parq"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(seed, work)
        files = sorted(p for p in work.rglob("*") if p.is_file())
        target = data.draw(st.sampled_from(files))
        raw = bytearray(target.read_bytes())
        if target.name == ".zmetadata" and data.draw(st.booleans()):
            raw = bytearray(json.dumps(_mutate_json(json.loads(raw), data)).encode())
        else:
            for _ in range(data.draw(st.integers(1, 4))):
                raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        target.write_bytes(bytes(raw))
        outcome = _exercise(work)
    elif data.draw(st.booleans()):
        outcome = _exercise(_mutate_json(seed, data))
    else:
        text = bytearray(json.dumps(seed).encode())
        for _ in range(data.draw(st.integers(1, 4))):
            text[data.draw(st.integers(0, len(text) - 1))] = data.draw(st.integers(32, 126))
        path = tmp_path_factory.getbasetemp() / "mutant.json"
        path.write_bytes(bytes(text))
        outcome = _exercise(path)
    _within_bounds(start)
    _count("references", f"{kind}: {outcome}")


# -- fill values of odd shapes and types ------------------------------------------------------

DAP4_TYPES = {"Int8": "i1", "UInt8": "u1", "Int16": "<i2", "UInt16": "<u2", "Int32": "<i4",
              "UInt32": "<u4", "Int64": "<i8", "UInt64": "<u8", "Float32": "<f4",
              "Float64": "<f8", "String": "S3"}
NUMBER_TEXTS = st.one_of(
    st.integers(-(2**65), 2**65).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(width=32).map(lambda v: f"{v:.6g}"),
    st.sampled_from(["nan", "-inf", "1e39", "1e400", "9.96921e+36", "-3.40282e+38", "", " 5",
                     "0x10", "1 2", "unsupported-string", "abcd", "-0"]))
"""What a document may print for a number (``fillValue``, ``<Value>``)."""


def _fill_document(path: Path, kind: str, attribute: tuple[str, list[str]] | None,
                   printed: str | None) -> Path:
    """A DMR++ document of one variable ``v`` of 4 elements in chunks of 2, the second
    absent (it reads as the fill value), over the 64-byte file ``path``."""
    from xml.sax.saxutils import escape, quoteattr

    dtype = np.dtype(DAP4_TYPES[kind])
    held = "" if attribute is None else (
        f'<Attribute name="_FillValue" type="{attribute[0]}">'
        + "".join(f"<Value>{escape(v)}</Value>" for v in attribute[1]) + "</Attribute>")
    fill = "" if printed is None else f" fillValue={quoteattr(printed)}"
    strings = '<dmrpp:FixedLengthStringArray string_length="3" pad="null_pad"/>' \
        if kind == "String" else ""
    doc = path.with_name(path.name + ".dmrpp")
    doc.write_text(
        '<?xml version="1.0" encoding="ISO-8859-1"?>\n<Dataset xmlns="http://xml.opendap.org/'
        'ns/DAP/4.0#" xmlns:dmrpp="http://xml.opendap.org/dap/dmrpp/1.0.0#" name="x" '
        f'dmrpp:href="data/{path.name}"><{kind} name="v"><Dim size="4"/>{held}'
        f'<dmrpp:chunks{fill} byteOrder="LE"><dmrpp:chunkDimensionSizes>2'
        f'</dmrpp:chunkDimensionSizes><dmrpp:chunk offset="0" nBytes="{2 * dtype.itemsize}" '
        f'chunkPositionInArray="[0]"/></dmrpp:chunks>{strings}</{kind}></Dataset>',
        encoding="latin-1")
    return doc


def _typed(kind: str, texts: list[str]) -> float:
    """The one value of an attribute as its declared type holds it: a ``Float32``
    ``8.20478e+15`` is 8204780178505728, which an ``Int64`` variable holds exactly."""
    if kind != "String":
        with contextlib.suppress(ValueError, OverflowError), np.errstate(all="ignore"):
            return float(np.asarray(texts[0].strip()).astype(DAP4_TYPES[kind]))
    return float(texts[0])


def _written_and_read(group: refgrid.VirtualGroup, out: Path) -> None:
    """Every array's fill value one of its type (the same after writing), the group written
    and read back."""
    from refgrid.core.dtypes import zarr_fill_value

    refgrid.write(group, out)
    again = refgrid.scan(out)
    for path, node in group.walk():
        if isinstance(node, refgrid.VirtualArray):
            zarr_fill_value(node.dtype, node.fill_value)
            assert np.ndim(node.fill_value) == 0, (path, node.fill_value)
            values = read(node)
            if node.fill_value is not None and node.dtype.kind != "S":
                expected = np.asarray(node.fill_value).astype(node.value_dtype)
                assert np.array_equal(values[2:], np.full(2, expected), equal_nan=True)
            assert np.array_equal(read(again[path]), values, equal_nan=values.dtype.kind == "f")


@FUZZ
@given(kind=st.sampled_from(sorted(DAP4_TYPES)),
       attribute=st.none() | st.tuples(st.sampled_from([*DAP4_TYPES, "String"]),
                                       st.lists(NUMBER_TEXTS, max_size=3)),
       printed=st.none() | NUMBER_TEXTS)
@example(kind="Int64", attribute=("Float32", ["8.20478e+15"]), printed=None)
def test_dmrpp_fill_values_of_any_shape_are_exact_or_refused_by_name(tmp_path_factory, kind,
                                                                     attribute, printed):
    """#51: a ``_FillValue`` of two values reached ``zarr_fill_value`` as an array (a bare
    ``TypeError`` when written). Whatever a document holds: a fill value the variable's
    type holds exactly, which writing keeps and absent chunks read as; or the variable
    refused, naming it (the report, or a RefgridError)."""
    work = tmp_path_factory.getbasetemp() / "fill"
    work.mkdir(exist_ok=True)
    data = work / "x"
    data.write_bytes(bytes(range(64)))
    doc = _fill_document(data, kind, attribute, printed)
    start = _started()
    try:
        group = refgrid.scan(doc, on_error="report")
    except refgrid.RefgridError as e:
        assert "'v'" in str(e) or str(doc) in str(e), e
        _count("fill values", "document refused")
        return
    if "v" not in group.arrays:
        assert [e.variable for e in group.report if e.action == "skipped"] == ["v"], \
            group.report
        _count("fill values", "refused")
        return
    array = group["v"]  # (its second chunk absent: its fill value is exact, or it is refused)
    if printed is None and array.dtype.kind != "S":  # then the one _FillValue given
        assert attribute is not None and len(attribute[1]) == 1, attribute
        value = float(array.fill_value)  # type: ignore[arg-type]
        assert value == _typed(*attribute) or np.isnan(value), (value, attribute)
    _written_and_read(group, work / "fill.json")
    _within_bounds(start)
    _count("fill values", "read")


HDF5_FILLS = st.one_of(st.integers(-(2**40), 2**40), st.floats(width=32), st.none())


@FUZZ
@given(dtype=st.sampled_from(["i1", "<u2", "<i4", ">i8", "<f4", ">f8", "S3"]),
       fill=HDF5_FILLS,
       attribute=st.none() | st.lists(st.integers(-300, 300), max_size=3) |
       st.lists(st.floats(allow_nan=True), max_size=3) | st.just("text"))
def test_hdf5_fill_values_of_any_shape_are_exact_or_refused_by_name(tmp_path_factory, dtype,
                                                                    fill, attribute):
    """The HDF5 scanner's fill value is HDF5's own, one value of the type, whatever the
    ``_FillValue`` attribute holds (several values, text, another type): written and read
    as h5py reads absent chunks."""
    import h5py

    work = tmp_path_factory.getbasetemp() / "hdf5-fill"
    work.mkdir(exist_ok=True)
    path = work / "f.h5"
    kind = np.dtype(dtype)
    with np.errstate(all="ignore"):
        held = None if fill is None else np.asarray(
            fill if kind.kind != "S" else str(fill)[:3].encode()).astype(kind)[()]
    with h5py.File(path, "w") as f:
        d = f.create_dataset("v", shape=(4,), chunks=(2,), dtype=kind, fillvalue=held)
        d[:2] = np.zeros(2, kind)
        if attribute is not None:
            d.attrs["_FillValue"] = attribute
    with h5py.File(path) as f:
        expected = f["v"][()]
    group = refgrid.scan(path, on_error="report")
    if "v" not in group.arrays:
        assert [e.variable for e in group.report if e.action == "skipped"] == ["v"], \
            group.report
        _count("fill values", "hdf5 refused")
        return
    assert np.array_equal(read(group["v"]), expected, equal_nan=kind.kind == "f")
    _written_and_read(group, work / "fill.json")
    _count("fill values", "hdf5 read")

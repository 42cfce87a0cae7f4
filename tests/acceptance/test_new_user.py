"""What a new user met going through the three uses, each a test: messages that name the
command line's own flags, a directory given where files are named, the unguarded batch
script, counts and the progress bar, served names that collide, source counts, inputs that
are not there, ``xr.open_dataset`` without ``engine=``, and the notebooks' pictures."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

import refgrid
from helpers import FIXTURES
from refgrid.cli import main

MONTHLY = FIXTURES / "monthly" / "chunk10"


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


# -- messages in the words of the interface used ------------------------------------------------

def test_cli_messages_name_cli_flags(tmp_path):
    jan = str(MONTHLY / "tas_200101.nc")
    shutil.copy(jan, tmp_path / "again.nc")  # the same times twice: an overlap
    code, out = _run("combine", jan, str(tmp_path / "again.nc"), "-o", str(tmp_path / "o.json"))
    assert code == 1 and "--allow-overlap" in out and "overlap='allow'" not in out, out


def test_python_messages_name_python_arguments(tmp_path):
    shutil.copy(MONTHLY / "tas_200101.nc", tmp_path / "again.nc")
    with pytest.raises(refgrid.CombineError, match=r"pass overlap='allow'"):
        refgrid.combine([str(MONTHLY / "tas_200101.nc"), str(tmp_path / "again.nc")], "time")


@pytest.mark.parametrize("command", ["combine", "batch"])
def test_a_directory_gets_the_pattern_in_the_command_being_run(tmp_path, command):
    data = tmp_path / "data"
    shutil.copytree(MONTHLY, data)
    out = tmp_path / "out.parq"
    code, text = _run(command, str(data), "-o", str(out))
    assert code == 1
    assert f"refgrid {command} '{data}/*.nc' -o {out}" in text, text
    assert "12 data files" in text, text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no .parts, no report


def test_a_directory_in_python_gets_the_pattern(tmp_path):
    with pytest.raises(refgrid.DirectoryError, match=r"e\.g\. '.*chunk10/\*\.nc'"):
        refgrid.batch(str(MONTHLY), tmp_path / "out.parq")
    assert list(tmp_path.iterdir()) == []


def test_combine_lists_every_file_it_cannot_scan(tmp_path):
    for name in ("a.nc", "b.nc"):
        (tmp_path / name).write_bytes(b"not a netCDF file")
    code, out = _run("combine", str(MONTHLY / "tas_200101.nc"), str(tmp_path / "a.nc"),
                     str(tmp_path / "b.nc"), "-o", str(tmp_path / "o.json"))
    assert code == 1 and "2 of 3 files cannot be scanned" in out, out
    assert "a.nc" in out and "b.nc" in out


# -- batch: the unguarded script, counts, the bar ---------------------------------------------

def test_a_batch_script_without_the_main_guard_is_told_so(tmp_path):
    script = tmp_path / "convert.py"
    script.write_text(textwrap.dedent(f"""
        import refgrid
        refgrid.batch({str(MONTHLY / "*.nc")!r}, {str(tmp_path / "out.json")!r},
                      progress=False, workers=1)
        """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert 'if __name__ == "__main__":' in last and "BatchError" in last, done.stderr
    assert not (tmp_path / "out.json.parts").exists()


def test_the_batch_line_counts_failures_apart(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(MONTHLY, data)
    (data / "tas_209901.nc").write_bytes(b"broken")
    code, out = _run("batch", str(data / "*.nc"), "-o", str(tmp_path / "o.json"), "-q",
                     "--allow-failures", "--workers", "1")
    assert code == 0 and "13 files: 12 scanned, 0 reused, 1 failed" in out, out


def test_no_bar_on_a_terminal_without_columns(monkeypatch):
    from refgrid.core.tasks import showing

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setattr(shutil, "get_terminal_size",
                        lambda fallback=None: os.terminal_size((0, 0)))
    assert showing(None) is False
    monkeypatch.setattr(shutil, "get_terminal_size",
                        lambda fallback=None: os.terminal_size((120, 40)))
    assert showing(None) is True
    assert showing(False) is False


def test_the_bar_shows_every_recorded_file(tmp_path, capsys):
    files = sorted(MONTHLY.glob("*.nc"))[:3]
    refgrid.batch([str(f) for f in files], tmp_path / "o.json", scheduler="synchronous",
                  progress=True)
    err = capsys.readouterr().err
    for n in (1, 2, 3):  # redrawn at each file, not only every tenth of a second
        assert f"{n}/3" in err, err


def test_a_batch_result_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = refgrid.batch([str(f) for f in sorted(MONTHLY.glob("*.nc"))[:2]],
                           tmp_path / "out" / "o.json", scheduler="synchronous", progress=False)
    text = repr(result)
    assert "\n" not in text and len(text) < 120, text
    assert text == ("BatchResult(out/o.json: 2 files, 2 scanned, 0 reused, 0 failed, 1 notes; "
                    "report o.json.report.json beside it)"), text


# -- serve ------------------------------------------------------------------------------------

def test_serve_names_a_busy_port_before_announcing_a_url(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        done = subprocess.run([sys.executable, "-m", "refgrid.cli", "serve", str(tmp_path),
                               "--port", str(port)], capture_output=True, text=True, timeout=60)
    finally:
        busy.close()
    assert done.returncode == 1
    assert "the port is in use" in done.stderr and "http://" not in done.stderr, done.stderr


def test_serve_names_the_missing_extra_before_announcing_a_url(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    code, out = _run("serve", str(tmp_path), "--port", "0")
    assert code == 1 and "'serve' extra" in out and "http://" not in out, out


def test_a_json_and_a_parquet_of_one_name_are_both_served(tmp_path):
    from servers import start_refgrid_serve

    group = refgrid.scan(MONTHLY / "tas_200101.nc")
    refgrid.write(group, tmp_path / "api.json")
    refgrid.write(group, tmp_path / "api.parq")
    from refgrid.serve.catalog import collisions, discover

    entries = discover(tmp_path)
    assert sorted(entries) == ["api.json", "api.parq"] == collisions(entries)
    for served in start_refgrid_serve(tmp_path, allow_sources=(str(FIXTURES),)):
        for name in ("api.json", "api.parq"):
            ds = xr.open_dataset(f"{served.url}/{name}/native", engine="refgrid")
            assert ds.sizes["time"] == 31


# -- counts, missing inputs, engine guessing ----------------------------------------------------

def test_source_counts_leave_out_the_rewritten_chunks(tmp_path):
    files = sorted(MONTHLY.glob("*.nc"))[:3]
    out = refgrid.write(refgrid.combine([str(f) for f in files], "time"),
                        tmp_path / "refs.json", inline_limit=0)
    assert any((tmp_path / "refs.json.chunks").rglob("c/*/*/*"))
    group = refgrid.scan(out)
    from refgrid.core.reprs import group_summary

    assert group_summary(group)["sources"] == 3
    assert "from 3 source files" in repr(group)
    one = refgrid.scan(files[0])
    assert "from 1 source file" in repr(one) and "1 source files" not in repr(one)
    code, text = _run("inspect", str(out))
    assert code == 0 and "3 source files" in text, text


def test_a_missing_parquet_path_is_not_found(tmp_path):
    for name in ("missing.parq", "missing.json", "missing.nc"):
        with pytest.raises(refgrid.ScanError, match=r"No such file or directory"):
            refgrid.scan(tmp_path / name)


def test_refgrid_outputs_open_without_engine(tmp_path):
    group = refgrid.scan(MONTHLY / "tas_200101.nc")
    parq = refgrid.write(group, tmp_path / "refs.parq")
    js = refgrid.write(group, tmp_path / "refs.json")
    from refgrid.read.backend import RefgridBackendEntrypoint

    guess = RefgridBackendEntrypoint().guess_can_open
    assert guess(str(parq)) and guess(js) and not guess(MONTHLY / "tas_200101.nc")
    (tmp_path / "other.json").write_text(json.dumps({"version": 1, "refs": {}}))
    assert not guess(tmp_path / "other.json")
    with xr.open_dataset(parq) as ds, xr.open_dataset(MONTHLY / "tas_200101.nc") as truth:
        np.testing.assert_array_equal(ds["tas"].values, truth["tas"].values)
    if "kerchunk" not in xr.backends.list_engines():  # kerchunk's engine claims any .json
        with xr.open_dataset(js) as ds:
            assert ds.sizes["time"] == 31


# -- make demo and the notebooks ----------------------------------------------------------------

def test_demo_shows_the_fast_way_to_open_with_zarr(tmp_path):
    code, out = _run("demo", str(FIXTURES), "--out", str(tmp_path / "demo"))
    assert code == 0, out
    assert "refgrid.open_store(" in out and "refgrid.zarr_config()" in out
    assert "fsspec" not in out and "reference://" not in out  # the slow path


def test_the_notebooks_extra_runs_the_notebooks_and_every_cell_has_an_id():
    import tomllib

    extras = tomllib.loads((FIXTURES.parent / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["notebooks"]
    assert any(d.startswith("nbconvert") for d in extras)
    assert any(d.startswith("jupyterlab") for d in extras)
    for path in sorted((FIXTURES.parent / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        assert all("id" in c for c in cells), path.name


def test_the_plots_say_what_they_show(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    group = refgrid.combine([str(f) for f in sorted(MONTHLY.glob("*.nc"))], "time")
    fig, (strip, lengths, cost) = plt.subplots(3, 1, figsize=(9, 7), layout="constrained")
    refgrid.plot.time_axis(group["tas"], ax=strip)
    refgrid.plot.chunk_lengths(group["tas"], ax=lengths)
    refgrid.plot.selection_cost(group["tas"], ax=cost)
    fig.canvas.draw()
    assert strip.get_title() != lengths.get_title()
    legend = strip.get_legend().get_window_extent()
    assert legend.x0 >= strip.get_window_extent().x1 - 1  # beside the strip, not over it
    labels = [t.get_text() for t in cost.texts + fig.axes[-1].texts]
    assert "43" in labels and any(t.endswith(" MB") for t in labels), labels
    plt.close(fig)


def test_the_readmes_examples_ask_for_dask_chunks_only_saying_so():
    """The core install has no dask: an example that asks for dask chunks says it needs dask,
    beside one that does not."""
    readme = (FIXTURES.parent / "README.md").read_text()
    asking = [line for line in readme.splitlines() if "chunks={}" in line and "xr." in line]
    assert asking and all("dask" in line for line in asking), asking


def test_batch_needs_no_remote_extra():
    """The notebooks install has dask but not aiohttp: batch must not import it."""
    code = ("import sys; sys.modules['aiohttp'] = None; import refgrid.archive, "
            "refgrid.archive.runner; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


def test_only_a_workers_import_of_the_script_counts_as_unguarded(tmp_path):
    """A function of a guarded script that runs in a spawned worker is not the script's
    top level: only the import is."""
    script = tmp_path / "guarded.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing
        from refgrid.archive.deadline import importing_script

        AT_IMPORT = importing_script()

        def inside():
            return importing_script(), AT_IMPORT

        if __name__ == "__main__":
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                print(pool.apply(inside), importing_script())
        """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.stdout.strip() == "(False, True) False", done.stderr

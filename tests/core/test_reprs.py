"""Reprs and ``refgrid inspect``: the numbers they show are the references' own (checked
against the kerchunk references and the grid), the HTML has the structure a notebook shows,
and a grid of 10^5 chunks stays small and fast."""

from __future__ import annotations

import json
import re
import time

import numpy as np
from click.testing import CliRunner

import refgrid
from refgrid.cli import main
from refgrid.core.reprs import group_summary
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ChunkManifest
from tests.combining.test_combine import _files


def _archive():
    return refgrid.combine([refgrid.scan(f) for f in _files("monthly/chunk10")], "time")


def test_the_text_reprs_show_the_references_numbers():
    group = _archive()
    refs = refgrid.to_kerchunk(group)["refs"]
    referenced = sum(v[2] for k, v in refs.items() if k.startswith("tas/c/"))
    text = repr(group["tas"])
    assert text.startswith("<refgrid.VirtualArray tas (time: 365, lat: 6, lon: 8) float32")
    padded = int((group["tas"].grid.axes[0].encoded[:-1]
                  != group["tas"].grid.axes[0].logical[:-1]).sum())
    assert f"rectilinear grid, 43 chunks of 1-10 x 6 x 8 ({padded} padded)" in text
    assert f"{referenced / 1024:.1f} KiB in 12 files" in text
    assert "bytes→numcodecs.shuffle→numcodecs.zlib" in text
    lines = repr(group).splitlines()
    assert lines[0].startswith("<refgrid.VirtualGroup> 4 arrays") and "12 source files" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["time", "lat", "lon", "tas"]
    assert "2.9 KiB inline" in lines[1]  # the time coordinate, inlined
    assert repr(group["tas"].manifest) == (
        f"<refgrid.ChunkManifest (43, 1, 1): 43 stored in 12 files ({referenced / 1024:.1f} "
        "KiB), 0 missing, 0 inline (0 B)>")


def test_missing_and_inline_chunks_are_counted():
    group = refgrid.scan(_files("monthly/chunk10")[0].parent.parent.parent / "features"
                         / "netcdf4_features.nc")
    summary = group_summary(group)["arrays"]
    assert summary["partial"]["missing"] == int(group["partial"].manifest.missing.sum()) == 9
    assert summary["label"]["inline"] == 1 and summary["label"]["inline_bytes"] > 0
    assert "(9 missing)" in repr(group["partial"])


def test_html_reprs_have_a_table_row_per_array_and_the_chunk_pictures():
    group = _archive()
    html = group._repr_html_()
    assert "<b>refgrid.VirtualGroup</b>" in html
    rows = re.findall(r"<tr><td><b>([^<]+)</b>", html)
    assert rows == ["time", "lat", "lon", "tas"]
    assert html.count("<svg") == 4 and html.count("<details>") == 4
    array_html = group["tas"]._repr_html_()
    assert array_html.count("<svg") == 1 and "7 padded" in array_html
    assert "<svg" in group["tas"].grid._repr_html_()
    assert "43 stored in 12 files" in group["tas"].manifest._repr_html_()


def test_a_hundred_thousand_chunk_array_reprs_small_and_fast():
    lengths = np.full(100_000, 30)
    grid = RectilinearGrid.from_lengths([lengths, [90], [180]])
    manifest = ChunkManifest(("a.nc",), np.zeros(grid.chunk_counts, np.int32),
                             np.arange(100_000).reshape(grid.chunk_counts) * 1000,
                             np.full(grid.chunk_counts, 1000))
    array = refgrid.VirtualArray("tas", ("time", "lat", "lon"), np.dtype("f4"), grid, manifest)
    started = time.process_time()  # (CPU time: a loaded machine does not trip it)
    html, text = array._repr_html_(), repr(array)
    assert time.process_time() - started < 0.2
    assert len(html.encode()) < 50_000
    assert "100,000 chunks of 30 x 90 x 180" in text and "95.4 MiB in 1 file" in text


def test_inspect_prints_the_summary_and_json(tmp_path):
    refs = refgrid.write(_archive(), tmp_path / "year.json")
    runner = CliRunner()
    text = runner.invoke(main, ["inspect", str(refs)])
    assert text.exit_code == 0, text.output
    shown = text.output.strip().splitlines()
    assert "\n".join(shown[:-1]) == repr(refgrid.scan(refs))
    assert shown[-1].startswith("  time: ") and "steps)" in shown[-1]  # the time range
    as_json = json.loads(runner.invoke(main, ["inspect", str(refs), "--json"]).output)
    assert as_json.pop("time_ranges").keys() == {"time"}
    assert as_json == json.loads(json.dumps(group_summary(refgrid.scan(refs))))
    missing = runner.invoke(main, ["inspect", str(tmp_path / "none.json")])
    assert missing.exit_code == 1 and "none.json" in missing.output
    assert "Traceback" not in missing.output

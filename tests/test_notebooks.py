"""notebooks/: every notebook runs top to bottom (nbclient, a real kernel) on the bundled
fixtures, and is committed without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from helpers import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_the_four_notebooks():
    assert [p.stem for p in NOTEBOOKS] == ["01-quickstart", "02-irregular-archive",
                                           "03-choosing-chunks", "04-batch-and-materialize"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_notebook_is_committed_without_outputs(path: Path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_notebook_runs(path: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    copy = tmp_path / "notebooks"
    copy.mkdir()
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    client = NotebookClient(notebook, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(copy)}})
    client.execute()
    html = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs
            if "text/html" in o.get("data", {})]
    if path.stem in ("01-quickstart", "02-irregular-archive"):
        assert any("<svg" in o["data"]["text/html"] for o in html), "no chunk picture shown"
    assert not list(copy.iterdir()), "the notebook left files behind"

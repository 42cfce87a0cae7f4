"""notebooks/: every notebook runs top to bottom (nbclient, a real kernel) on the bundled
fixtures, from the repository root or from its folder, without a warning — also in a fresh
virtual environment holding only the documented install, ``pip install '.[notebooks]'`` —
and is committed without outputs."""

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


def _run(path: Path, where: Path, kernel: str = "python3") -> nbformat.NotebookNode:
    """``path`` executed with ``where`` as its working directory; its outputs checked."""
    notebook = nbformat.read(path, as_version=4)
    before = set(where.iterdir())
    client = NotebookClient(notebook, timeout=180, kernel_name=kernel,
                            resources={"metadata": {"path": str(where)}})
    client.execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    warned = [o.get("text", "") for o in outputs if o.get("name") == "stderr"]
    assert not warned, f"{path.name} printed on stderr: {warned}"
    if path.stem in ("01-quickstart", "02-irregular-archive"):
        html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
        assert any("<svg" in h for h in html), "no chunk picture shown"
    assert set(where.iterdir()) == before, "the notebook left files behind"
    return notebook


@pytest.mark.parametrize("where", ["notebooks", "root"])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_notebook_runs(path: Path, where: str, tmp_path: Path, monkeypatch):
    """From the repository root or from ``notebooks/`` (a copy: fixtures linked in)."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _run(path, folder if where == "notebooks" else tmp_path)


@pytest.mark.slow
def test_the_notebooks_run_on_the_documented_install_alone(tmp_path, monkeypatch):
    """A fresh venv with ``pip install '.[notebooks]'`` only (the README's line), its own
    kernel: every notebook runs without an error or a warning."""
    import json
    import os
    import subprocess
    import venv

    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    subprocess.run([env / "bin" / "python", "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", f"{ROOT}[notebooks]"], check=True,
                   env=environ, timeout=1200)
    for tool in (["nbconvert", "--version"], ["lab", "--version"]):  # the ways users run them
        subprocess.run([env / "bin" / "jupyter", *tool], check=True, env=environ,
                       capture_output=True, timeout=120)
    spec = tmp_path / "jupyter" / "kernels" / "notebooks-install"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(env / "bin" / "python"), "-m", "ipykernel_launcher", "-f",
                 "{connection_file}"],
        "display_name": "refgrid[notebooks]", "language": "python",
        "env": {"MPLBACKEND": "Agg", "PYTHONPATH": ""}}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for path in NOTEBOOKS:
        _run(path, folder, kernel="notebooks-install")

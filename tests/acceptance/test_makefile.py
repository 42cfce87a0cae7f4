"""The Makefile a new user runs: ``make demo`` installs the core only, the venv uses the
newest Python found, and a different ``PYTHON`` makes the venv anew."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import ROOT


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True,
                          text=True, timeout=300)


def _version(python: str | Path) -> tuple[int, int]:
    out = subprocess.run([str(python), "-c", "import sys; print(*sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


def _pythons() -> list[Path]:
    """The interpreters >= 3.11 pyenv has here (the Makefile looks there too)."""
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip() \
        if subprocess.run(["sh", "-c", "command -v pyenv"], capture_output=True).returncode \
        == 0 else ""
    found = [p for p in Path(root or "/nonexistent").glob("versions/3.*/bin/python3.*")
             if p.name.count(".") == 1 and p.name[len("python3."):].isdigit()]
    return [p for p in found if _version(p) >= (3, 11)]


def test_make_demo_installs_the_core_only(tmp_path):
    plan = _make("-n", "demo", f"VENV={tmp_path / 'v'}").stdout
    installs = [line for line in plan.splitlines() if "pip install" in line and "-e" in line]
    assert installs and all(line.rstrip().endswith("-e .") for line in installs), installs
    assert "refgrid demo" in plan
    assert '-e ".[test]"' in _make("-n", "test", f"VENV={tmp_path / 'v'}").stdout


def test_the_newest_python_is_chosen():
    chosen = _make("python").stdout.strip()
    assert _version(chosen) >= (3, 11)
    available = _pythons()
    if available:  # pyenv's versions here: the newest wins
        assert _version(chosen) == max(map(_version, available))
    assert _make("python", f"PYTHON={sys.executable}").stdout.strip() == sys.executable


def test_another_python_makes_the_venv_anew(tmp_path):
    venv = tmp_path / "v"
    others = [p for p in _pythons() if _version(p) != _version(sys.executable)]
    first = _make(f"VENV={venv}", f"PYTHON={sys.executable}", f"{venv}/.python")
    assert first.returncode == 0 and "making" in first.stdout, first.stdout + first.stderr
    again = _make(f"VENV={venv}", f"PYTHON={sys.executable}", f"{venv}/.python")
    assert again.returncode == 0 and "making" not in again.stdout  # the same one: kept
    (venv / "marker").touch()
    assert others, "a second Python >= 3.11 is needed for this test (pyenv has 3.11-3.13 here)"
    changed = _make(f"VENV={venv}", f"PYTHON={others[0]}", f"{venv}/.python")
    assert changed.returncode == 0 and "making" in changed.stdout, changed.stderr
    assert not (venv / "marker").exists()
    assert _version(venv / "bin" / "python") == _version(others[0])

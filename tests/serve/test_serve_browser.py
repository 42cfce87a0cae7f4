"""The service's index pages in a real browser: headless Chromium (Debian's ``chromium``,
installed by ``make test`` where it can be) renders them; the DOM it built lists the datasets
and the screenshot shows the chunk pictures drawn."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import refgrid
from helpers import FIXTURES
from refgrid.grid.svg import CHUNK_COLOUR, EDGE_COLOUR, PADDED_COLOUR
from servers import start_refgrid_serve

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (`make "
                                "test` installs Debian's chromium when run as root)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    files = sorted((FIXTURES / "monthly" / "chunk10").glob("*.nc"))
    refgrid.write(refgrid.combine([refgrid.scan(f) for f in files], "time"),
                  root / "monthly.json", padded="encoded")  # the picture marks padded chunks
    refgrid.write(refgrid.scan(FIXTURES / "features" / "netcdf4_features.nc"),
                  root / "features.json")
    yield from start_refgrid_serve(root, allow_sources=(str(FIXTURES),))


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120, check=True)


def test_the_index_lists_the_datasets_in_the_browser(server, tmp_path):
    dom = _chromium(tmp_path, "--dump-dom", f"{server.url}/").stdout
    assert 'href="/monthly/"' in dom and 'href="/features/"' in dom
    assert "4 arrays (time, lat, lon, tas)" in dom


def test_the_dataset_page_renders_its_chunk_pictures(server, tmp_path):
    from PIL import Image

    dom = _chromium(tmp_path, "--dump-dom", f"{server.url}/monthly/").stdout
    assert dom.count("<svg") == 4 and "12 chunks" not in dom.split("tas")[0]
    png = tmp_path / "monthly.png"
    _chromium(tmp_path, f"--screenshot={png}", "--window-size=1100,1600", f"{server.url}/monthly/")
    image = Image.open(png).convert("RGB")
    assert image.size == (1100, 1600)
    colours = {c: n for n, c in image.getcolors(maxcolors=1 << 20)}

    def pixels(hex_colour: str) -> int:
        rgb = tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
        return colours.get(rgb, 0)

    assert pixels(CHUNK_COLOUR) > 5000  # the bars of four pictures
    assert pixels(EDGE_COLOUR) > 300  # their chunk boundaries
    assert pixels(PADDED_COLOUR) > 50  # tas's padded chunks (10-day chunks, monthly files)

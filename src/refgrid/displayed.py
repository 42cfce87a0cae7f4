"""Reprs for the model classes, drawn by :mod:`refgrid.reprs` (imported on first display,
so the model stays light; reprs needs nothing of the model at run time)."""

from __future__ import annotations

from typing import ClassVar


class Displayed:
    """``repr()`` and Jupyter's ``_repr_html_`` by :func:`refgrid.reprs.text` and
    :func:`refgrid.reprs.html` (dataclasses using it pass ``repr=False``)."""

    _display: ClassVar[str]

    def __repr__(self) -> str:
        from refgrid.reprs import text

        return text(self._display, self)

    def _repr_html_(self) -> str:
        from refgrid.reprs import html

        return html(self._display, self)

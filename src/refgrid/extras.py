"""Optional dependencies, imported when first used: ``import refgrid`` stays light, and a
missing one is a :class:`~refgrid.errors.MissingExtraError` naming the extra to install."""

from __future__ import annotations

import importlib
from typing import Any

from refgrid.errors import MissingExtraError


def import_extra(module: str, extra: str, what: str) -> Any:
    """``module``, imported; ``what`` needs it, and ``pip install 'refgrid[extra]'`` has it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(extra, what, e.name or module) from None

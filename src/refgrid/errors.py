"""Exceptions raised by refgrid.

Every error a user can provoke is one of these, so callers can catch ``RefgridError`` and
messages always say what was being processed and why it failed.
"""

from __future__ import annotations


class RefgridError(Exception):
    """Base class of every refgrid error."""


class GridError(RefgridError, ValueError):
    """A chunk grid description is malformed or inconsistent with the array's shape."""


class ModelError(RefgridError, ValueError):
    """Virtual arrays, manifests or groups that are inconsistent or cannot be combined."""

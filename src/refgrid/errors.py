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


class ScanError(RefgridError):
    """A source file, or one of its variables, cannot be scanned."""

    def __init__(self, url: str, variable: str | None, reason: str) -> None:
        where = f"{url}: variable {variable!r}" if variable else url
        super().__init__(f"{where}: {reason}")
        self.url = url
        self.variable = variable
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str | None, str]]:
        return type(self), (self.url, self.variable, self.reason)  # errors cross processes too


NO_SUCH_FILE = "No such file or directory"
"""The reason a :class:`NotFoundError` gives for a file that is not there: the operating
system's words, which zarr's stores and xarray's engines say too (and callers match)."""


class NotFoundError(ScanError, FileNotFoundError):
    """The input or a source file does not exist: a ``FileNotFoundError`` too, as zarr's
    stores and xarray's engines raise for a missing path."""


class FormatError(ScanError):
    """A file whose format refgrid does not recognise or that is malformed."""


class AccessError(ScanError):
    """References name a file outside the sources they may read (``allowed_sources``)."""


class GroupError(RefgridError, OSError):
    """The input has no group at the path asked for (an ``OSError``, as xarray's engines
    raise for a missing group)."""


class ArgumentError(RefgridError, ValueError):
    """An argument refgrid cannot use (a group that is not a string, ...)."""


class DirectoryError(ArgumentError):
    """A directory of data files given where files are named: ``pattern`` names them
    (``'data/*.nc'``), for the message each interface words its own way."""

    def __init__(self, directory: str, pattern: str, what: str) -> None:
        super().__init__(f"{directory} is a directory of {what}: to combine its files, name "
                         f"them with a pattern, e.g. {pattern!r}")
        self.directory = directory
        self.pattern = pattern
        self.what = what

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return type(self), (self.directory, self.pattern, self.what)


class ConstraintError(ArgumentError):
    """An OPeNDAP constraint expression the service cannot serve (a DAP error response with
    status 400, naming why)."""


class WriteError(RefgridError):
    """The model cannot be written in the requested form."""


class CombineError(RefgridError, ValueError):
    """Files that cannot be combined; the message names the variable and every file."""


class ReadError(RefgridError):
    """A chunk could not be read or decoded; names the array, chunk, URL and byte range."""


class MissingExtraError(RefgridError, ImportError):
    """An optional capability whose dependencies are not installed; names the extra."""

    def __init__(self, extra: str, what: str, missing: str) -> None:
        super().__init__(f"{what} needs the {extra!r} extra ({missing} is not installed): "
                         f"pip install 'refgrid[{extra}]'")
        self.extra = extra
        self._args = (extra, what, missing)

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return type(self), self._args


class BatchError(RefgridError):
    """A batch cannot use its work directory or output (locked, unreadable, damaged)."""

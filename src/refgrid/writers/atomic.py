"""Outputs that appear whole or not at all, and leave nothing behind.

Every output is built under a hidden temporary name beside the target
(``.name.tmp-<pid>-<token>``) and then swapped in: a file with one ``rename``, a directory
(parquet references) with Linux's atomic ``renameat2(RENAME_EXCHANGE)``, so that at every
instant the path holds either the old output or the new one; where the exchange is not
available, two renames. A writer killed half-way leaves its temporary behind; the next write
of the same target removes every leftover whose process is gone. Concurrent writers of one
target each swap in a complete output; the last one wins.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
from pathlib import Path

TEMPORARY = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]+")
AT_FDCWD = -100
RENAME_EXCHANGE = 2


def temporary_for(target: Path) -> Path:
    """A fresh hidden name beside ``target`` for this process (and thread)."""
    return target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def clean_leftovers(target: Path) -> None:
    """Remove the temporaries of earlier writes of ``target`` whose writer is gone."""
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        found = TEMPORARY.fullmatch(entry.name)
        if found and found["name"] == target.name and not _alive(int(found["pid"])):
            _remove(entry)


def write_file(target: Path, data: bytes) -> None:
    """``data`` at ``target``, whole or not at all (a failed write leaves no temporary)."""
    temporary = temporary_for(target)
    try:
        temporary.write_bytes(data)
        replace_file(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def replace_file(temporary: Path, target: Path) -> None:
    os.replace(temporary, target)


def replace_directory(temporary: Path, target: Path) -> None:
    """Put the directory ``temporary`` at ``target``; the old ``target`` goes, whole."""
    while True:
        if _exchange(temporary, target):
            _remove(temporary)  # now the old output
            return
        try:
            os.rename(temporary, target)  # no target yet
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR, errno.ENOTDIR):
                raise
        if not _exchange_supported():  # another writer put a target there: move it aside
            aside = temporary_for(target)
            try:
                os.rename(target, aside)
            except FileNotFoundError:
                continue
            os.rename(temporary, target)
            _remove(aside)
            return


_libc: ctypes.CDLL | None = None
_supported = True


def _exchange_supported() -> bool:
    return _supported


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (False if ``b`` does not exist or the system cannot)."""
    global _libc, _supported
    if not _supported:
        return False
    try:
        _libc = _libc or ctypes.CDLL(None, use_errno=True)
        call = _libc.renameat2
    except (OSError, AttributeError):
        _supported = False
        return False
    if call(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.ENOENT:
        return False
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        _supported = False
        return False
    raise OSError(code, os.strerror(code), str(b))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)

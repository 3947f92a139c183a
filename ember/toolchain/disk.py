"""Saying why a file could not be written: the cause in words, the path, and what to do.

A full disk, a quota, a read-only mount or a missing permission surface in Python as a bare
``OSError`` ("[Errno 28] No space left on device", often without a file name: a failed
``write()`` on an open file has none).  Everything ember writes for a user -- an artifact, a
compile-cache entry -- goes through :func:`describe_write_failure` so that the message names
the file and the cause ("no space left on device while writing 'model.so' ...") and the remedy
fits the cause (free space for ENOSPC, another location for EROFS).

:class:`WriteError` is both an :class:`~ember.core.errors.EmberError` (what ember's callers and
its command line catch) and an ``OSError`` carrying the original ``errno`` and file name (what
code written against a bare ``OSError`` still catches).
"""

from __future__ import annotations

import errno
from pathlib import Path

from ember.core.errors import EmberError

_CAUSES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EFBIG: "file too large",
    errno.EIO: "input/output error",
    errno.ENOENT: "no such file or directory",
    errno.ENOTDIR: "a component of the path is not a directory",
    errno.EISDIR: "is a directory",
    errno.ENAMETOOLONG: "file name too long",
    errno.EMFILE: "too many open files",
}
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


class WriteError(EmberError, OSError):
    """A file ember writes (an artifact, a compile-cache entry) could not be written.

    ``errno`` and ``filename`` are those of the failure; the message says where, why and what
    to do."""

    def __init__(self, message: str, cause: OSError, filename: str | Path | None = None):
        super().__init__(message)
        self.errno = cause.errno
        self.strerror = cause.strerror
        self.filename = str(filename) if filename is not None else cause.filename

    def __str__(self) -> str:  # OSError would print "[Errno n] ..." from its fields
        return str(self.args[0])


def cause_of(error: OSError) -> str:
    """The cause of ``error`` in lower-case words ("no space left on device")."""
    if error.errno in _CAUSES:
        return _CAUSES[error.errno]
    text = error.strerror or str(error) or type(error).__name__
    return text[:1].lower() + text[1:]


def describe_write_failure(error: OSError, what: str, path: str | Path | None = None) -> str:
    """"<cause> while writing <what> '<file>'": the file is the one the error names, else
    ``path``."""
    where = error.filename if error.filename is not None else path
    return f"{cause_of(error)} while writing {what}" + (f" '{where}'" if where else "")


def remedy(error: OSError, location: str = "that file system",
           elsewhere: str = "write elsewhere") -> str:
    """What a user can do about ``error``, by its cause: fix ``location``, or ``elsewhere``."""
    if error.errno in _FULL:
        return f"free space on {location} (or raise the quota), or {elsewhere}"
    if error.errno in _NOT_WRITABLE:
        return f"make {location} writable, or {elsewhere}"
    return f"check {location}, or {elsewhere}"


def is_write_failure(error: BaseException) -> bool:
    """Whether ``error`` is an operating-system failure to write (it has an ``errno``), as
    opposed to ember's own refusals, which are ``OSError`` subclasses without one
    (``FileExistsError("... not overwriting it")``)."""
    return isinstance(error, OSError) and not isinstance(error, EmberError) and \
        error.errno is not None


def name_the_file(error: OSError, path: str | Path) -> OSError:
    """``error`` with ``path`` as its file name when it has none (a failed ``write()`` or
    ``close()`` of an open file does not say which file)."""
    if error.filename is None:
        error.filename = str(path)
    return error

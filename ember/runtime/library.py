"""Loading a compiled library from the very bytes whose digest was checked.

``ctypes.CDLL(path)`` opens the file by name again after the loader hashed it, so a file
swapped in between (or rewritten in place) would run unchecked code: its constructors run at
load time.  Here the verified bytes themselves are loaded:

* Linux: they go into a sealed ``memfd`` (no later write can change them), which is loaded
  through a uniquely named symlink to ``/proc/self/fd/<fd>`` in a private temporary directory.
  The unique name matters: the dynamic loader reuses an already loaded library whose *name*
  matches, and ``/proc/self/fd/<n>`` names are reused as soon as a descriptor number is; the
  symlink and the descriptor are gone right after loading (the mapping keeps the memory).
* Elsewhere, or where executable memfds are forbidden: a private copy (a fresh 0700 directory)
  is loaded and deleted.

Libraries are never unloaded (ctypes does not); one with the same SHA-256 is loaded once per
process and shared, so loading an artifact many times does not map its code many times.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import sys
import tempfile
import threading
import uuid
from pathlib import Path

from ember.runtime.errors import ModelLoadError

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}
_private_dir: Path | None = None


def load_library(data: bytes, sha256: str, source: str) -> ctypes.CDLL:
    """The library whose content is ``data`` (whose SHA-256 the caller checked)."""
    with _lock:
        library = _loaded.get(sha256)
        if library is None:
            library = _load(data, sha256, source)
            _loaded[sha256] = library
        return library


def _load(data: bytes, sha256: str, source: str) -> ctypes.CDLL:
    failures = []
    if sys.platform.startswith("linux") and hasattr(os, "memfd_create"):
        try:
            return _load_through_memfd(data, sha256)
        except OSError as error:  # e.g. vm.memfd_noexec forbids executable memfds
            failures.append(f"from memory: {error}")
    try:
        return _load_private_copy(data, sha256)
    except OSError as error:
        failures.append(f"from a private copy: {error}")
    raise ModelLoadError(f"cannot load the compiled library {source}: "
                         + "; ".join(failures)
                         + " (a library built for another OS or CPU, or a temporary "
                           "directory mounted noexec: set TMPDIR)")


def _private_directory() -> Path:
    global _private_dir
    if _private_dir is None:
        _private_dir = Path(tempfile.mkdtemp(prefix="ember-runtime-"))  # mode 0700
        atexit.register(shutil.rmtree, _private_dir, True)
    return _private_dir


def _load_through_memfd(data: bytes, sha256: str) -> ctypes.CDLL:
    import fcntl

    flags = os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0)
    fd = os.memfd_create(f"ember-{sha256[:16]}", flags)
    try:
        _write_all(fd, data)
        seals = sum(getattr(fcntl, name, 0) for name in
                    ("F_SEAL_WRITE", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_SEAL"))
        if seals and hasattr(fcntl, "F_ADD_SEALS"):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        link = _private_directory() / f"{sha256[:16]}-{uuid.uuid4().hex}.so"
        os.symlink(f"/proc/self/fd/{fd}", link)
        try:
            return ctypes.CDLL(str(link))
        finally:
            link.unlink()
    finally:
        os.close(fd)


def _load_private_copy(data: bytes, sha256: str) -> ctypes.CDLL:
    path = _private_directory() / f"{sha256[:16]}-{uuid.uuid4().hex}.so"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                 0o500)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)
    try:
        return ctypes.CDLL(str(path))
    finally:
        path.unlink()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]

"""A content-addressed cache of compiled shared libraries, checked before every use.

Compiling a model's C source takes seconds; loading the same model again should not.  The key
is the SHA-256 of everything that determines the binary -- the source, the compiler flags
(including the target description) and the compiler's identity (the first line of
``cc --version``) -- so a hit can never be a stale binary, and there is nothing to invalidate.

Layout: ``<dir>/<key>.c`` (the source, kept for debugging and error messages), ``<dir>/<key>.so``
and ``<dir>/<key>.so.sha256``, the entry's digest.  ``<dir>`` is ``$EMBER_CACHE_DIR``, else
``$XDG_CACHE_HOME/ember``, else ``~/.cache/ember``.

The cache is not trusted: a library found there is loaded into the process (its constructors
run), so a truncated file, another entry's library moved into this slot or a foreign file
must never be used.  The digest is SHA-256 over the key and the library's bytes, so it binds
the content to *this* slot: a library copied from another slot together with its digest file
does not verify.  :meth:`CompileCache.lookup` checks it, and a broken entry (wrong digest, no
digest, not a regular file, unreadable) is reported with a :class:`CacheWarning`, removed and
rebuilt by the caller -- never loaded.

Every file is written under a unique temporary name in the same directory and moved into
place with ``os.replace`` (atomic on POSIX), the digest before the library, so processes
compiling the same source at once both succeed and a reader never sees a half-written library.
Nothing is ever evicted; deleting the directory is always safe.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

DIGEST_SUFFIX = ".sha256"
# Larger files in a slot are not ember libraries; refuse them without reading them whole.
MAX_ENTRY_BYTES = 1 << 31


class CacheWarning(UserWarning):
    """A compile-cache entry was broken or foreign; it was discarded and rebuilt."""


def default_cache_dir() -> Path:
    explicit = os.environ.get("EMBER_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "ember"


def cache_key(source: str, flags: Sequence[str], compiler_identity: str) -> str:
    digest = hashlib.sha256()
    for part in (source, "\0".join(flags), compiler_identity):
        data = part.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))  # unambiguous concatenation
        digest.update(data)
    return digest.hexdigest()


def entry_digest(key: str, content_sha256: str) -> str:
    """The digest stored beside an entry: binds the content's SHA-256 to the slot's key."""
    return hashlib.sha256(f"ember-cache-entry\0{key}\0{content_sha256}".encode()).hexdigest()


@dataclass(frozen=True)
class CachedFile:
    """A verified cache entry: its path and the SHA-256 of the bytes that were verified."""

    path: Path
    sha256: str


def file_sha256(path: Path) -> str:
    """SHA-256 of a regular file, read without following a symlink or blocking on a FIFO.

    Raises OSError if ``path`` is not a regular file or is larger than MAX_ENTRY_BYTES."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if info.st_size > MAX_ENTRY_BYTES:
            raise OSError(f"{path} is {info.st_size} bytes, too large for a cache entry")
        digest = hashlib.sha256()
        with os.fdopen(os.dup(fd), "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


class CompileCache:
    """One cache directory (created on first use)."""

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()

    def path(self, key: str, suffix: str) -> Path:
        return self.root / f"{key}{suffix}"

    def lookup(self, key: str, suffix: str = ".so") -> CachedFile | None:
        """The verified entry for ``key``, or None (a miss, or a broken entry now removed)."""
        path = self.path(key, suffix)
        digest_path = self.path(key, suffix + DIGEST_SUFFIX)
        if not os.path.lexists(path):
            return None
        problem = None
        try:
            content = file_sha256(path)
            expected = digest_path.read_text(encoding="ascii").strip()
            if expected != entry_digest(key, content):
                problem = "its digest does not match (truncated, modified or foreign)"
        except (OSError, UnicodeDecodeError) as error:
            problem = f"it cannot be verified ({error})"
        if problem is None:
            return CachedFile(path, content)
        warnings.warn(f"compile cache entry {path} was discarded and will be rebuilt: {problem}",
                      CacheWarning, stacklevel=3)
        self.discard(key, suffix)
        return None

    def discard(self, key: str, suffix: str) -> None:
        """Remove an entry and its digest, whatever they are (a directory, a symlink ...)."""
        for path in (self.path(key, suffix), self.path(key, suffix + DIGEST_SUFFIX)):
            _clear_slot(path)

    def temp_path(self, key: str, suffix: str) -> Path:
        """A fresh name in the cache directory for a file that :meth:`commit` will publish."""
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root / f".{key}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp{suffix}"

    def commit(self, temp: Path, key: str, suffix: str) -> CachedFile:
        """Publish ``temp`` as the entry for ``key``: its digest first, then the file."""
        content = file_sha256(temp)
        self.write_text(key, suffix + DIGEST_SUFFIX, entry_digest(key, content) + "\n")
        final = self.path(key, suffix)
        _clear_slot(final, only_directories=True)  # os.replace cannot replace a directory
        os.replace(temp, final)
        return CachedFile(final, content)

    def write_text(self, key: str, suffix: str, text: str) -> Path:
        """Atomically store ``text`` as ``<key><suffix>``."""
        temp = self.temp_path(key, suffix)
        try:
            temp.write_text(text, encoding="utf-8")
            final = self.path(key, suffix)
            _clear_slot(final, only_directories=True)
            os.replace(temp, final)
            return final
        finally:
            temp.unlink(missing_ok=True)


def _clear_slot(path: Path, only_directories: bool = False) -> None:
    """Remove whatever occupies ``path`` (a directory's tree; a symlink itself, not its target).

    Failures are ignored: the caller's next write fails with a clear error if the slot stays
    blocked."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif not only_directories and os.path.lexists(path):
            path.unlink()
    except OSError:
        pass

"""A content-addressed cache of compiled shared libraries.

Compiling a model's C source takes seconds; loading the same model again should not.  The key
is the SHA-256 of everything that determines the binary -- the source, the compiler flags
(including the target description) and the compiler's identity (the first line of
``cc --version``) -- so a hit can never be a stale binary, and there is nothing to invalidate.

Layout: ``<dir>/<key>.c`` (the source, kept for debugging and error messages) and
``<dir>/<key>.so``.  ``<dir>`` is ``$EMBER_CACHE_DIR``, else ``$XDG_CACHE_HOME/ember``, else
``~/.cache/ember``.  Every file is written under a unique temporary name in the same directory
and moved into place with ``os.replace`` (atomic on POSIX), so processes compiling the same
source at once both succeed and a reader never sees a half-written library.  Nothing is ever
evicted; deleting the directory is always safe.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Sequence


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


class CompileCache:
    """One cache directory (created on first use)."""

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()

    def path(self, key: str, suffix: str) -> Path:
        return self.root / f"{key}{suffix}"

    def lookup(self, key: str, suffix: str = ".so") -> Path | None:
        """The cached file for ``key``, if a complete one exists."""
        path = self.path(key, suffix)
        return path if path.is_file() else None

    def temp_path(self, key: str, suffix: str) -> Path:
        """A fresh name in the cache directory for a file that :meth:`commit` will publish."""
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root / f".{key}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp{suffix}"

    def commit(self, temp: Path, key: str, suffix: str) -> Path:
        final = self.path(key, suffix)
        os.replace(temp, final)
        return final

    def write_text(self, key: str, suffix: str, text: str) -> Path:
        """Atomically store ``text`` as ``<key><suffix>``."""
        temp = self.temp_path(key, suffix)
        try:
            temp.write_text(text, encoding="utf-8")
            return self.commit(temp, key, suffix)
        finally:
            temp.unlink(missing_ok=True)

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
must never be used.  The digest is an HMAC-SHA-256, keyed with the cache's own secret
(``<dir>/.secret``: 32 random bytes made with the cache, mode 0600), over the key and the
library's bytes: it binds the content to *this* slot, and nobody without the secret -- anyone
who can write the directory but not read the secret -- can make a planted library verify.
:meth:`CompileCache.lookup` checks it before the library is used; a broken entry (wrong
digest, no digest, not a regular file, unreadable) is reported with a :class:`CacheWarning`,
removed and rebuilt by the caller -- never loaded (an entry of an older ember, whose digest
had no secret, is rebuilt without a warning).  A cache directory that is not owned by this
user, or that others may write, or whose secret is not a private file of this user, is
refused with a :class:`CacheError` that says how to choose another (``EMBER_CACHE_DIR``).

Every file is written under a unique temporary name in the same directory and moved into
place with ``os.replace`` (atomic on POSIX), the digest before the library, so processes
compiling the same source at once both succeed and a reader never sees a half-written library.
Nothing is ever evicted; deleting the directory is always safe.

A cache that cannot be *written* (a full disk, a quota, a read-only mount, no permission) does
not fail the compile: the cache is an optimization.  The build goes on in a private temporary
cache of this process (:func:`fallback_cache`, removed at exit) and a :class:`CacheWarning`
says once per directory why the cache is not used and what to do; only when that temporary
directory cannot be written either is the compile an error.  A cache that cannot be
*trusted* (another user's, writable by others, a secret that is not private) stays an error:
the user should know.
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import os
import shutil
import stat
import tempfile
import threading
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ember.core.errors import EmberError
from ember.toolchain.disk import cause_of, remedy

DIGEST_SUFFIX = ".sha256"
SECRET_FILE = ".secret"
SECRET_BYTES = 32
_DIGEST_PREFIX = "hmac-sha256:"
# Larger files in a slot are not ember libraries; refuse them without reading them whole.
MAX_ENTRY_BYTES = 1 << 31


class CacheWarning(UserWarning):
    """A compile-cache entry was broken or foreign (it was discarded and rebuilt), or the cache
    cannot be written (the build went on without it)."""


class CacheError(EmberError):
    """The compile cache directory cannot be used or trusted (owner, permissions, secret)."""


class CacheWriteError(CacheError):
    """The compile cache directory cannot be created or written; ``cause`` is the OSError.

    Unlike its parent (a cache that cannot be trusted), this is a reason to compile without
    the cache (:func:`fallback_cache`), not to fail."""

    def __init__(self, message: str, cause: OSError):
        super().__init__(message)
        self.cause = cause


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


def entry_digest(key: str, content_sha256: str, secret: bytes) -> str:
    """The digest stored beside an entry: binds the content's SHA-256 to the slot's key,
    under the cache's secret."""
    mac = hmac.new(secret, f"ember-cache-entry\0{key}\0{content_sha256}".encode(),
                   hashlib.sha256)
    return _DIGEST_PREFIX + mac.hexdigest()


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

    def __init__(self, root: Path | str | None = None, *, temporary: bool = False):
        self.root = Path(root) if root is not None else default_cache_dir()
        # the process's own fallback (fallback_cache): nowhere else to fall back to
        self.temporary = temporary
        self._secret: bytes | None = None

    @property
    def secret(self) -> bytes:
        """The cache's secret, made on first use; the directory is checked first."""
        if self._secret is None:
            self._secret = _cache_secret(self.root)
        return self._secret

    def path(self, key: str, suffix: str) -> Path:
        return self.root / f"{key}{suffix}"

    def lookup(self, key: str, suffix: str = ".so") -> CachedFile | None:
        """The verified entry for ``key``, or None (a miss, or a broken entry now removed)."""
        path = self.path(key, suffix)
        digest_path = self.path(key, suffix + DIGEST_SUFFIX)
        if not os.path.lexists(path):
            return None
        problem = None
        secret = self.secret
        try:
            content = file_sha256(path)
            expected = digest_path.read_text(encoding="ascii").strip()
            if not expected.startswith(_DIGEST_PREFIX):  # an older ember's entry
                self.discard(key, suffix)
                return None
            if not hmac.compare_digest(expected, entry_digest(key, content, secret)):
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
        self.secret  # the directory is made and checked before anything is written to it
        return self.root / f".{key}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp{suffix}"

    def commit(self, temp: Path, key: str, suffix: str) -> CachedFile:
        """Publish ``temp`` as the entry for ``key``: its digest first, then the file."""
        content = file_sha256(temp)
        self.write_text(key, suffix + DIGEST_SUFFIX,
                        entry_digest(key, content, self.secret) + "\n")
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


# The private temporary cache of this process, and the cache directories already warned
# about (a build writes many entries; the user hears once per directory).
_fallback_lock = threading.Lock()
_fallback: CompileCache | None = None
_warned_roots: set[str] = set()


def fallback_cache(cache: CompileCache, error: OSError) -> CompileCache:
    """The cache to use instead of ``cache``, which failed to be written with ``error``.

    A private directory made for this process (``tempfile.mkdtemp``: mode 0700, under
    ``$TMPDIR``) and removed when it exits -- libraries built there stay loadable until then.
    Warns once per cache directory.  Raises the ``OSError`` of making that directory when it
    cannot be made (the caller reports both failures)."""
    global _fallback
    with _fallback_lock:
        if str(cache.root) not in _warned_roots:
            _warned_roots.add(str(cache.root))
            where = f": '{error.filename}'" if error.filename is not None else ""
            warnings.warn(
                f"the compile cache {cache.root} cannot be written ({cause_of(error)}{where}); "
                f"compiling without it, in a temporary directory removed at exit, so builds "
                f"are not reused by other processes until it can be written: "
                + remedy(error, "its file system",
                         "set EMBER_CACHE_DIR to a writable directory"),
                CacheWarning, stacklevel=4)
        if _fallback is None or not _fallback.root.is_dir():
            root = Path(tempfile.mkdtemp(prefix="ember-uncached-"))
            atexit.register(shutil.rmtree, root, ignore_errors=True)
            _fallback = CompileCache(root, temporary=True)
        return _fallback


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


def _cache_secret(root: Path) -> bytes:
    """The secret of the cache in ``root``: made (and the directory with it, private) when
    missing, else read after checking that the directory and the file are this user's alone."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise CacheWriteError(f"cannot create the compile cache {root} "
                              f"({error.strerror}); set EMBER_CACHE_DIR to a writable "
                              f"directory", error) from None
    info = os.stat(root)
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    if uid is not None and info.st_uid != uid:
        raise CacheError(f"the compile cache {root} belongs to another user "
                         f"(uid {info.st_uid}); set EMBER_CACHE_DIR to a directory of yours")
    if info.st_mode & 0o022:
        raise CacheError(f"the compile cache {root} may be written by other users "
                         f"(mode {stat.S_IMODE(info.st_mode):o}); make it private (chmod "
                         f"700) or set EMBER_CACHE_DIR to a private directory")
    path = root / SECRET_FILE
    for _ in range(2):
        try:
            return _read_secret(path, uid)
        except FileNotFoundError:
            pass
        temp = root / f".secret.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                         getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError as error:
            raise CacheWriteError(f"cannot write to the compile cache {root} "
                                  f"({error.strerror}); set EMBER_CACHE_DIR to a writable "
                                  f"directory", error) from None
        try:
            os.write(fd, os.urandom(SECRET_BYTES))
        except OSError as error:
            os.close(fd)
            temp.unlink(missing_ok=True)
            raise CacheWriteError(f"cannot write to the compile cache {root} "
                                  f"({error.strerror}); set EMBER_CACHE_DIR to a writable "
                                  f"directory", error) from None
        else:
            os.close(fd)
        try:
            os.link(temp, path)  # atomic: the first process to make it wins, whole
        except FileExistsError:
            pass
        finally:
            temp.unlink(missing_ok=True)
    return _read_secret(path, uid)


def _read_secret(path: Path, uid: int | None) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) |
                     getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as error:
        raise CacheError(f"the compile cache secret {path} cannot be read ({error.strerror}); "
                         f"delete the cache directory (it is rebuilt) or set "
                         f"EMBER_CACHE_DIR") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (uid is not None and info.st_uid != uid) or \
                info.st_mode & 0o077 or info.st_size != SECRET_BYTES:
            raise CacheError(f"the compile cache secret {path} is not a private "
                             f"file of {SECRET_BYTES} bytes of this user; delete the cache "
                             f"directory (it is rebuilt) or set EMBER_CACHE_DIR")
        return os.read(fd, SECRET_BYTES)
    finally:
        os.close(fd)

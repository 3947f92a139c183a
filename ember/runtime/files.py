"""Reading an artifact's files without trusting the directory they are in.

An artifact directory may come from anyone.  A listed file could be a symbolic link (to
``/dev/zero``, to another model's library, to ``/etc/shadow``), a FIFO that blocks forever, a
device, a directory or a file of many gigabytes.  Every file is therefore opened by its fixed
name relative to the opened directory (``dir_fd``), with ``O_NOFOLLOW`` (a symlink fails to
open) and ``O_NONBLOCK`` (opening a FIFO does not wait for a writer), and ``fstat`` of the open
descriptor must say "regular file" of bounded size before one byte is read.  The bytes read are
the bytes that are hashed and then used: nothing is opened a second time by name.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ember.runtime.errors import ModelLoadError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_READ_CHUNK = 1 << 24


class ArtifactDirectory:
    """An opened artifact directory; files are read relative to it, never through a path
    that could be redirected after the directory was opened.  Use as a context manager."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        try:
            info = os.stat(self.root)
        except FileNotFoundError:
            raise ModelLoadError(f"artifact '{self.root}' does not exist") from None
        except OSError as error:
            raise ModelLoadError(f"cannot open artifact '{self.root}': {error.strerror}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise ModelLoadError(f"'{self.root}' is not an ember artifact directory (it should "
                                 f"hold manifest.json, model.so and weights.safetensors)")
        self._fd: int | None = None
        if os.open in os.supports_dir_fd:
            try:
                self._fd = os.open(self.root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
            except OSError as error:
                raise ModelLoadError(f"cannot open artifact '{self.root}': "
                                     f"{error.strerror}") from None

    def subdirectory(self, name: str) -> "ArtifactDirectory":
        """The directory entry ``name`` (a fixed name the caller made, never one read from a
        file), opened relative to this one without following a symbolic link: a part of an
        artifact must be inside it."""
        where = f"artifact '{self.root}': '{name}'"
        if self._fd is None:  # no dir_fd on this platform: refuse links by lstat first
            try:
                if stat.S_ISLNK(os.lstat(self.root / name).st_mode):
                    raise ModelLoadError(f"{where} is a symbolic link; the parts of an "
                                         f"artifact must be inside its directory")
            except FileNotFoundError:
                raise ModelLoadError(f"{where} is missing; the artifact is incomplete") from None
            return ArtifactDirectory(self.root / name)
        try:
            fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=self._fd)
        except FileNotFoundError:
            raise ModelLoadError(f"{where} is missing; the artifact is incomplete") from None
        except OSError as error:
            # Linux says ENOTDIR for a link opened with O_DIRECTORY | O_NOFOLLOW
            if error.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR) and stat.S_ISLNK(
                    os.stat(name, dir_fd=self._fd, follow_symlinks=False).st_mode):
                raise ModelLoadError(f"{where} is a symbolic link; the parts of an artifact "
                                     f"must be inside its directory") from None
            if error.errno == errno.ENOTDIR:
                raise ModelLoadError(f"{where} is not a directory; the artifact is "
                                     f"malformed") from None
            raise ModelLoadError(f"{where} cannot be opened: {error.strerror}") from None
        opened = ArtifactDirectory.__new__(ArtifactDirectory)
        opened.root, opened._fd = self.root / name, fd
        return opened

    def __enter__(self) -> "ArtifactDirectory":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def exists(self, name: str) -> bool:
        """Whether ``name`` is an entry of the directory (of any kind, without following it)."""
        try:
            if self._fd is not None:
                os.stat(name, dir_fd=self._fd, follow_symlinks=False)
            else:
                os.lstat(self.root / name)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # it is there; reading it will say what is wrong
        return True

    def read(self, name: str, max_bytes: int) -> bytes:
        """The whole content of the regular file ``name`` (at most ``max_bytes`` bytes)."""
        where = f"artifact '{self.root}': '{name}'"
        flags = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC
        try:
            if self._fd is not None:
                fd = os.open(name, flags, dir_fd=self._fd)
            else:  # no dir_fd on this platform: refuse links by lstat first
                if stat.S_ISLNK(os.lstat(self.root / name).st_mode):
                    raise OSError(errno.ELOOP, "symbolic link")
                fd = os.open(self.root / name, flags)
        except FileNotFoundError:
            raise ModelLoadError(f"{where} is missing; the artifact is incomplete") from None
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.EMLINK):
                raise ModelLoadError(f"{where} is a symbolic link; artifact files must be "
                                     f"regular files inside the artifact directory") from None
            raise ModelLoadError(f"{where} cannot be opened: {error.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ModelLoadError(f"{where} is {_kind(info.st_mode)}, not a regular file; "
                                     f"artifact files must be regular files")
            if info.st_size > max_bytes:
                raise ModelLoadError(f"{where} is {info.st_size:,} bytes, more than the "
                                     f"{max_bytes:,} this artifact can need")
            return _read_all(fd, max_bytes, where)
        finally:
            os.close(fd)


def _read_all(fd: int, max_bytes: int, where: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - total))
        except OSError as error:
            raise ModelLoadError(f"{where} cannot be read: {error.strerror}") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:  # it grew while being read
            raise ModelLoadError(f"{where} is larger than the {max_bytes:,} bytes this "
                                 f"artifact can need")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"

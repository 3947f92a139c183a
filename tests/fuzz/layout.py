"""Files, directories, symbolic links and FIFOs that a case lays out before ember runs, and
snapshots of a directory tree to tell what ember changed.

The external-data and save-target families test ember against the file system: a weights
file reached through a symbolic link, a FIFO where a file should be, a user's folder where an
artifact is saved.  A case describes its layout as a list of :class:`Entry` (built in the
session, so the case id alone rebuilds it) and the worker makes it in a fresh scratch
directory: absolute paths only exist there, so a path that must point into the scratch
directory is written with :data:`SCRATCH` and substituted by the worker.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

# Stands for the case's scratch directory in symlink targets, external-data locations and
# base directories: the session building the case does not know where the worker makes it.
SCRATCH = "@SCRATCH@"


@dataclass(frozen=True)
class Entry:
    """One file-system entry of a case, relative to the scratch directory.

    ``path`` may be bytes (a name that is not UTF-8); ``kind`` is ``file``, ``dir``,
    ``symlink``, ``fifo`` or ``copy`` (of the file ``target``, relative to the scratch
    directory, as it is when the entry is made); ``target`` is a symlink's target
    (``SCRATCH`` substituted);
    ``mode``, if set, is applied after every entry exists (a read-only directory still gets
    its content first)."""

    path: str | bytes
    kind: str = "file"
    data: bytes = b""
    target: str = ""
    mode: int | None = None


def substitute(text: str, root: Path) -> str:
    return text.replace(SCRATCH, str(root))


def _join(root: Path, path: str | bytes) -> bytes:
    raw = path if isinstance(path, bytes) else substitute(path, root).encode("utf-8",
                                                                          "surrogateescape")
    return os.path.join(os.fsencode(root), raw)


def materialize(entries: list[Entry], root: Path) -> None:
    """Make ``entries`` under ``root`` (parents as needed; modes last, deepest first)."""
    for entry in entries:
        target = _join(root, entry.path)
        parent = os.path.dirname(target)
        if parent:
            os.makedirs(parent, exist_ok=True)
        if entry.kind == "dir":
            os.makedirs(target, exist_ok=True)
        elif entry.kind == "symlink":
            os.symlink(substitute(entry.target, root), target)
        elif entry.kind == "fifo":
            os.mkfifo(target)
        elif entry.kind == "copy":
            with open(_join(root, entry.target), "rb") as source, open(target, "wb") as copy:
                copy.write(source.read())
        else:
            with open(target, "wb") as handle:
                handle.write(entry.data)
    moded = [e for e in entries if e.mode is not None]
    for entry in sorted(moded, key=lambda e: -len(_join(root, e.path))):
        if entry.kind != "symlink":  # Linux cannot change a link's own mode
            os.chmod(_join(root, entry.path), entry.mode)


def make_writable(root: Path) -> None:
    """Give every directory under ``root`` write permission back, so it can be removed."""
    for folder, directories, _ in os.walk(root):
        for name in directories:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                try:
                    os.chmod(path, 0o755)
                except OSError:
                    pass


# What a snapshot records of an entry: its kind, its content (a regular file's bytes, a
# symlink's target) and its permission bits.
Record = tuple[str, bytes, int]


def snapshot(root: Path) -> dict[bytes, Record]:
    """Every entry under ``root`` (symbolic links not followed, FIFOs not opened), by path
    relative to ``root``."""
    records: dict[bytes, Record] = {}
    base = os.fsencode(root)
    for folder, directories, files in os.walk(base, followlinks=False):
        for name in directories + files:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, base)
            info = os.lstat(path)
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                records[relative] = ("symlink", os.readlink(path), mode)
            elif stat.S_ISDIR(info.st_mode):
                records[relative] = ("dir", b"", mode)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    records[relative] = ("file", handle.read(), mode)
            else:
                records[relative] = ("other", b"", mode)
    return records


def under(path: bytes, prefix: bytes) -> bool:
    """Whether relative ``path`` is ``prefix`` or inside it."""
    return path == prefix or path.startswith(prefix.rstrip(b"/") + b"/")

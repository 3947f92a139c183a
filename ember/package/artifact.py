"""Write a :class:`~ember.driver.Build` as an artifact directory (format: ember.runtime.artifact).

The directory is written under a temporary name and renamed into place at the end, so a
failure never leaves a half-written artifact where a valid one is expected.  The manifest is
validated with the runtime's own schema before it is written and sealed with its digest.

A write that fails (a full disk, a quota, a read-only mount, no permission) removes the
temporary directory, leaves any artifact already at the target as it was, and raises a
:class:`~ember.toolchain.disk.WriteError` -- an ``EmberError`` that is also the ``OSError`` it
was -- naming the artifact, the file and the cause.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ember import __version__
from ember.driver.pipeline import Build, describe_value
from ember.core.errors import EmberError
from ember.core.target import Target
from ember.runtime.artifact import MAX_LIBRARY_BYTES
from ember.runtime.blocked import (BLOCKS_FILE, BLOCKS_FORMAT, BLOCKS_FORMAT_VERSION,
                                   BLOCKS_FORMAT_VERSION_AXES,
                                   block_directory, parse_block_index)
from ember.runtime.files import ArtifactDirectory
from ember.toolchain.disk import (WriteError, cause_of, is_write_failure, name_the_file,
                                  remedy)
from ember.runtime.manifest import (DIGEST_FIELD, FORMAT, FORMAT_VERSION, HOST_NODES_FILE,
                                    LIBRARY_FILE, MANIFEST_FILE, SCHEDULES, WEIGHTS_FILE,
                                    parse_manifest, seal, strict_json, verify_digest)


def host_node_entries(build: Build) -> list[dict[str, Any]]:
    """The manifest's description of every fallback node (what the runtime must call)."""
    entries = []
    for impl in build.host_nodes:
        node = impl.node
        entries.append({
            "index": impl.index, "op": node.op, "name": node.name, "reason": impl.reason,
            "inputs": [describe_value(build.graph, n)
                       for n in [n for n in node.inputs if n] + node.implicit_inputs()],
            "implicit_inputs": node.implicit_inputs(),
            "outputs": [describe_value(build.graph, n) for n in node.outputs if n],
        })
    return entries


def required_cpu_features(target: Target) -> list[str]:
    """The CPU flags the target's code may use, spelled as in /proc/cpuinfo (as the runtime's
    ``host_features()`` reports them)."""
    if target.arch == "x86_64":
        flags = set(target.features)
        if "amx" in flags:  # ember's shorthand for the three AMX flags
            flags = (flags - {"amx"}) | {"amx_tile", "amx_int8", "amx_bf16"}
        return sorted(flags)
    if target.arch == "aarch64":
        from ember.core.target import _ARM_FEATURES  # ember name -> (cpuinfo word, -march ext)

        return sorted(_ARM_FEATURES[f][0] for f in target.features if f in _ARM_FEATURES)
    return []  # wasm32: the arch check alone decides


def manifest_for(build: Build) -> dict[str, Any]:
    g = build.graph
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "ember_version": __version__,
        "model": g.name,
        # "arch" and "required_features" are what the runtime checks against the host CPU.
        "target": {**build.target.to_dict(), "arch": build.target.arch,
                   "required_features": required_cpu_features(build.target)},
        "inputs": [describe_value(g, n) for n in g.inputs],
        "outputs": [describe_value(g, n) for n in g.outputs],
        "workspace_size": build.workspace_size,
        "weights_size": build.weights_size,
        "weights": {name: {"key": f"w{i}", "offset": build.weight_offsets[name],
                           "nbytes": int(array.nbytes), "dtype": array.dtype.name,
                           "shape": list(array.shape)}
                    for i, (name, array) in enumerate(build.weights.items())},
        "host_nodes": host_node_entries(build),
        # ember_run's index range checks (status code 2 names the node, input and range)
        "checks": [check.to_json() for check in build.checks],
        **_schedules(build),
    }


def _schedules(build: Build) -> dict[str, Any]:
    """The configs of kernels not scheduled by the default heuristic (a tuning database's,
    or the caller's ``kernel_configs``); none: no field (readable by older runtimes)."""
    entries = [{"step": impl.index, "workload_key": impl.workload_key,
                "source": impl.config_source,
                "config": {name: list(value) if isinstance(value, tuple) else value
                           for name, value in impl.config.values}}
               for impl in build.kernels if impl.config_source != "default"]
    return {SCHEDULES: entries} if entries else {}


@dataclasses.dataclass(frozen=True)
class PackedArtifact:
    """An artifact in memory: its sealed manifest and the bytes of its other files."""

    manifest: dict[str, Any]
    files: dict[str, bytes]


def pack_artifact(build: Build) -> PackedArtifact:
    """Everything :func:`save_artifact` writes, in memory: a module compiled in this process
    loads it from here (through the runtime's checks) without a round trip through disk."""
    from safetensors.numpy import save

    from ember.ir.serialize import graph_to_json

    files = {LIBRARY_FILE: _verified_library(build)}
    tensors = {f"w{i}": _as_bytes_if_needed(array)
               for i, array in enumerate(build.weights.values())}
    files[WEIGHTS_FILE] = save(tensors)
    if build.host_nodes:
        details = {str(impl.index): {"node": graph_to_json(_node_graph(build, impl.node))}
                   for impl in build.host_nodes}
        files[HOST_NODES_FILE] = json.dumps(details, allow_nan=False).encode("utf-8")
    manifest = manifest_for(build)
    manifest["files"] = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    manifest = seal(manifest)
    parse_manifest(manifest, f"the manifest of model '{build.graph.name}'")  # a writer bug
    return PackedArtifact(manifest, files)


def save_artifact(build: Build, path: str | Path) -> Path:
    """Write the artifact directory ``path`` (replacing an existing artifact there)."""
    packed = pack_artifact(build)
    return _write_in_place(Path(path), lambda staging: _write_packed(packed, staging))


def save_batch_blocks(builds: Mapping[int, Build], batch_inputs: Sequence[str],
                      batch_outputs: Sequence[str], path: str | Path,
                      output_axes: Sequence[tuple[str, int]] = ()) -> Path:
    """Write a batch-blocked artifact (format: ``ember.runtime.blocked``): ``builds`` maps
    each block size to the build compiled for that many samples (a block of 1 among them);
    ``batch_inputs`` and ``batch_outputs`` are the values whose first dim is the batch, but
    for the outputs ``output_axes`` gives another axis (written as format version 2)."""
    if 1 not in builds:
        raise EmberError("a batch-blocked artifact needs a block of 1 sample, so that every "
                         "batch size can be served")
    packed = {size: pack_artifact(builds[size]) for size in sorted(builds, reverse=True)}
    fields: dict[str, Any] = {
        "format": BLOCKS_FORMAT,
        "format_version": BLOCKS_FORMAT_VERSION_AXES if output_axes else BLOCKS_FORMAT_VERSION,
        "ember_version": __version__,
        "model": builds[1].graph.name,
        "batch_inputs": list(batch_inputs),
        "batch_outputs": list(batch_outputs),
        "blocks": [{"size": size, "manifest_sha256": part.manifest[DIGEST_FIELD]}
                   for size, part in packed.items()],
    }
    if output_axes:
        fields["batch_output_axes"] = dict(output_axes)
    index = seal(fields)
    parse_block_index(index, "the index of a batch-blocked artifact")  # a writer bug

    def write(staging: Path) -> None:
        written: dict[str, Path] = {}  # the blocks' identical files, stored once
        for size, part in packed.items():
            directory = staging / block_directory(size)
            directory.mkdir()
            _write_packed(part, directory, written)
        _write_file(staging / BLOCKS_FILE,
                    json.dumps(index, indent=1, allow_nan=False).encode("utf-8"))

    return _write_in_place(Path(path), write)


def _write_packed(packed: PackedArtifact, directory: Path,
                  written: dict[str, Path] | None = None) -> None:
    """Write one artifact's files into ``directory``.  ``written`` (content digest -> path)
    gathers what earlier blocks of the same artifact wrote: a file with the same bytes (the
    blocks' weights, most often; compared by the SHA-256 the manifest already lists) becomes
    a hard link to it instead of another copy.  Each block still has every file under its
    own name, so the reader sees ordinary artifacts; where the file system has no hard links,
    the bytes are written again."""
    contents = {**packed.files, MANIFEST_FILE: json.dumps(
        packed.manifest, indent=1, allow_nan=False).encode("utf-8")}
    digests = packed.manifest["files"]
    for name, data in contents.items():
        target = directory / name
        if written is not None and name in digests and len(data) >= MIN_LINKED_BYTES:
            digest = digests[name]
            earlier = written.get(digest)
            if earlier is not None:
                try:
                    os.link(earlier, target)
                    continue
                except OSError:
                    pass  # no hard links here: a copy
            written.setdefault(digest, target)
        _write_file(target, data)


def _write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``; a failure names the file (a failed ``write()`` does not)."""
    try:
        path.write_bytes(data)
    except OSError as error:
        raise name_the_file(error, path)


def _write_in_place(path: Path, write: Callable[[Path], None]) -> Path:
    """Have ``write`` fill a fresh directory beside ``path``, then rename it to ``path``: a
    failure leaves no half-written artifact behind (see :func:`write_directory_in_place`)."""
    return write_directory_in_place(path, write, _check_replaceable, _remove_ember_files,
                                    "artifact")


def write_directory_in_place(path: Path, write: Callable[[Path], None],
                             check_replaceable: Callable[[Path], None],
                             remove_owned: Callable[[Path], None], what: str) -> Path:
    """Have ``write`` fill a fresh directory beside ``path``, then rename it to ``path``: a
    failure leaves no half-written ``what`` (an artifact, an export) behind.

    Saving never deletes what ember did not write.  An existing ``path`` is replaced only
    when ``check_replaceable`` accepts it -- for an artifact, an empty directory or one made
    of ember's files alone (its manifest or block index, library, weights, fallback nodes
    and block directories); a file, a symbolic link, or a directory holding anything else is
    refused, naming what is in the way.  The old directory is renamed aside before the new
    one takes its place, and then ``remove_owned`` deletes only ember's own files from it.

    A write that fails removes the temporary directory and raises a :class:`WriteError`
    naming ``path``, the file and the cause."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _save_failed(path, error, f"creating the directory "
                                        f"'{error.filename or path.parent}'",
                           what=what) from error
    check_replaceable(path)
    existed = os.path.lexists(path)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as error:
        raise _save_failed(path, error, f"creating a temporary directory in '{path.parent}'",
                           existed, what) from error
    old: Path | None = None
    try:
        write(staging)
        if os.path.lexists(path):
            check_replaceable(path)  # again: it may have changed while writing
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.replace(path, old)  # an empty directory is replaced by a rename
        os.replace(staging, path)
    except BaseException as error:
        if old is not None and not os.path.lexists(path):
            os.replace(old, path)  # put the old artifact back
            old = None
        shutil.rmtree(staging, ignore_errors=True)
        if is_write_failure(error):
            raise _save_failed(path, error, _doing(error, staging), existed, what) from error
        raise
    finally:
        if old is not None:
            remove_owned(old)
    return path


def _doing(error: OSError, staging: Path) -> str:
    """What a save was doing when ``error`` happened, for its message."""
    if error.filename is None:
        return "writing it"
    with contextlib.suppress(ValueError):
        inner = Path(error.filename).relative_to(staging)
        return (f"writing its file '{inner}' (in the temporary directory '{staging}', "
                f"now removed)")
    return f"writing '{error.filename}'"


def _save_failed(path: Path, error: OSError, doing: str, existed: bool = False,
                 what: str = "artifact") -> WriteError:
    """The error of a save to ``path`` that failed with ``error`` while ``doing`` something:
    where, why, that nothing half-written is left, and what to do."""
    kept = f"the {what} already at '{path}' is unchanged" if existed else \
        "nothing was left behind"
    advice = remedy(error, elsewhere="save it elsewhere")
    return WriteError(f"cannot save the {what} '{path}': {cause_of(error)} while {doing}; "
                      f"{kept}. {advice[:1].upper()}{advice[1:]}.", error)


# Files of batch blocks smaller than this are written again rather than linked: a link saves
# nothing worth its inode.
MIN_LINKED_BYTES = 64 << 10
_ARTIFACT_FILES = frozenset({MANIFEST_FILE, LIBRARY_FILE, WEIGHTS_FILE, HOST_NODES_FILE})


def _foreign_entries(directory: Path) -> list[str]:
    """The entries of ``directory`` that ember cannot prove it wrote (relative names).

    Names alone prove nothing (a user's folder may hold a ``manifest.json`` or a
    ``model.so`` of its own): a file is ember's when a valid, sealed manifest in the
    directory lists it and its bytes have the digest listed; the manifest itself when it is
    valid; a block directory's files when ``blocks.json`` pins its manifest by digest."""
    owned = _files_ember_wrote(directory)
    foreign = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        name = entry.name
        if entry.is_dir(follow_symlinks=False) and name[:1] == "b" and name[1:].isdigit() \
                and block_directory(int(name[1:])) == name:
            inner_entries = sorted(os.scandir(entry.path), key=lambda e: e.name)
            foreign += [f"{name}/{inner.name}" for inner in inner_entries
                        if f"{name}/{inner.name}" not in owned]
        elif name not in owned:
            foreign.append(name + ("/" if entry.is_dir(follow_symlinks=False) else ""))
    return foreign


_MAX_INDEX_BYTES = 16 * 2**20  # a manifest or block index is a few KiB


def _files_ember_wrote(directory: Path) -> set[str]:
    """Relative names of the files in ``directory`` that an ember save wrote: see
    :func:`_foreign_entries`."""
    index = _read_json_file(directory / BLOCKS_FILE)
    if index is None:
        return _artifact_files(directory, "")
    try:
        blocks = parse_block_index(index, str(directory / BLOCKS_FILE)).blocks
    except EmberError:
        return set()
    owned = {BLOCKS_FILE}
    for size, digest in blocks:
        name = block_directory(size)
        owned |= _artifact_files(directory / name, f"{name}/", pinned=digest)
    return owned


def _artifact_files(directory: Path, prefix: str, pinned: str | None = None) -> set[str]:
    """The files of the artifact in ``directory`` that its manifest vouches for (names with
    ``prefix``); none if the manifest is missing, invalid, or not the ``pinned`` one."""
    data = _read_json_file(directory / MANIFEST_FILE)
    if data is None:
        return set()
    source = str(directory / MANIFEST_FILE)
    try:
        digest = verify_digest(data, source)
        manifest = parse_manifest(data, source)
    except EmberError:
        return set()
    if pinned is not None and digest != pinned:
        return set()
    owned = {prefix + MANIFEST_FILE}
    for name, expected in manifest.files.items():
        if _sha256_of_regular_file(directory / name) == expected:
            owned.add(prefix + name)
    return owned


def _read_json_file(path: Path) -> Any | None:
    """The JSON in ``path`` if it is a small regular file (no symbolic link) that parses
    strictly, else None."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) |
                     getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_INDEX_BYTES:
            return None
        data = file.read(_MAX_INDEX_BYTES + 1)
    try:
        return strict_json(data, str(path))
    except EmberError:
        return None


def _sha256_of_regular_file(path: Path) -> str | None:
    """The SHA-256 of ``path`` if it is a regular file (no symbolic link), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) |
                     getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return None
        for chunk in iter(lambda: file.read(2**20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class SaveTargetError(WriteError, FileExistsError):
    """The save target exists and is not an artifact ember may replace (a file, a symbolic
    link, a folder of other files): left untouched, named, with what to do.  Also a
    ``FileExistsError``, as before it was an ``EmberError``."""

    def __init__(self, message: str, path: Path):
        super().__init__(message, FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST)),
                         path)


def _check_replaceable(path: Path) -> None:
    """Refuse a ``path`` that exists and is not an empty directory or an ember artifact of
    ember's files only."""
    if not os.path.lexists(path):
        return
    if path.is_symlink():
        raise SaveTargetError(f"'{path}' is a symbolic link; not saving through it (choose "
                              f"another path)", path)
    if not path.is_dir():
        raise SaveTargetError(f"'{path}' exists and is not an ember artifact; not "
                              f"overwriting it (choose another path)", path)
    entries = os.listdir(path)
    if not entries:
        return
    if MANIFEST_FILE not in entries and BLOCKS_FILE not in entries:
        raise SaveTargetError(f"'{path}' exists and is not an ember artifact (it has no "
                              f"{MANIFEST_FILE}); not overwriting it (choose another path)",
                              path)
    refuse_foreign_entries(path, _foreign_entries(path), "write")


def refuse_foreign_entries(path: Path, foreign: list[str], verb: str) -> None:
    """Refuse to replace ``path`` when it holds ``foreign`` entries (files ember did not
    ``verb`` there, or that changed since), naming the first few."""
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more"
                                          if len(foreign) > 5 else "")
        raise SaveTargetError(f"'{path}' holds files that ember did not {verb}, or that "
                              f"changed since ({shown}); not overwriting it: move them "
                              f"away or choose another path", path)


def _remove_ember_files(directory: Path) -> None:
    """Delete an artifact's own files and block directories from ``directory``, then the
    directory if nothing else is left in it (nothing that ember did not write is removed)."""
    for name in _ARTIFACT_FILES | {BLOCKS_FILE}:
        with contextlib.suppress(OSError):  # gone, or not empty
            (directory / name).unlink()
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False) and entry.name[:1] == "b" and \
                entry.name[1:].isdigit():
            for name in _ARTIFACT_FILES:
                with contextlib.suppress(OSError):  # gone, or not empty
                    (Path(entry.path) / name).unlink()
            with contextlib.suppress(OSError):  # gone, or not empty
                os.rmdir(entry.path)
    with contextlib.suppress(OSError):  # gone, or not empty
        os.rmdir(directory)


def _verified_library(build: Build) -> bytes:
    """The library's bytes, read once and checked against the digest the compile cache
    verified (a cache entry changed since the build is not copied into the artifact)."""
    library = Path(build.library)
    with ArtifactDirectory(library.parent) as directory:
        data = directory.read(library.name, MAX_LIBRARY_BYTES)
    if build.library_sha256 and hashlib.sha256(data).hexdigest() != build.library_sha256:
        raise EmberError(f"the compiled library '{library}' changed after it was built; "
                         f"compile the model again")
    return data


def _as_bytes_if_needed(array: np.ndarray) -> np.ndarray:
    """safetensors' numpy API knows the standard dtypes; store the others as raw bytes."""
    if array.dtype.kind in "fiub" and array.dtype.name in (
            "float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint64",
            "uint32", "uint16", "uint8", "bool"):
        return np.require(array, requirements="C")  # keeps a 0-d shape
    return np.frombuffer(np.ascontiguousarray(array).tobytes(), dtype=np.uint8)


def _node_graph(build: Build, node):
    """A one-node graph holding the node (its subgraphs' outer reads become graph inputs)."""
    from ember.ir.graph import Graph

    reads = [n for n in node.inputs if n] + node.implicit_inputs()
    names = reads + [n for n in node.outputs if n]
    return Graph(name=node.name or node.op, inputs=list(dict.fromkeys(reads)),
                 outputs=[n for n in node.outputs if n], nodes=[node],
                 types={n: build.graph.types[n] for n in names if n in build.graph.types})

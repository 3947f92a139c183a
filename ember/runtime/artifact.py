"""The artifact format (version 2): what a compiled model is on disk, and reading it safely.

An artifact is a directory of fixed file names::

    model.ember/
      manifest.json        inputs/outputs (names, shapes, dtypes), target and CPU features,
                           ember version, memory sizes, weight offsets, fallback nodes, index
                           checks, the SHA-256 of every other file, and its own digest
      model.so             the compiled library (ember_run, ember_workspace_size,
                           ember_signature)
      weights.safetensors  the constants, one named tensor each
      host_nodes.json      only if some nodes run their numpy reference (fallbacks)

No file name comes from the manifest.  :func:`read_artifact` reads it in an order where
nothing is used before it was checked: the manifest (a bounded regular file, strict JSON),
its format and version, its digest, its schema, the CPU features it needs, then every other
file (regular, bounded, hashed against the manifest).  The library is loaded afterwards, from
the bytes that were hashed (:mod:`ember.runtime.library`), and cross-checked with the manifest
through its own signature (:mod:`ember.runtime.signature`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from ember.runtime.cpu import host_arch, host_features
from ember.runtime.errors import ModelLoadError
from ember.runtime.files import ArtifactDirectory
from ember.runtime.manifest import (FORMAT, FORMAT_VERSION, HOST_NODES_FILE, LIBRARY_FILE,
                                    MANIFEST_FILE, MAX_BYTES, WEIGHTS_FILE, Manifest,
                                    check_header, parse_manifest, strict_json, verify_digest)
from ember.runtime.safetensors_io import MAX_HEADER_BYTES

__all__ = ["Artifact", "FORMAT", "FORMAT_VERSION", "HOST_NODES_FILE", "LIBRARY_FILE",
           "MANIFEST_FILE", "WEIGHTS_FILE", "artifact_from_memory", "read_artifact",
           "read_artifact_in"]

MAX_MANIFEST_BYTES = 64 << 20
MAX_LIBRARY_BYTES = 1 << 30
MAX_HOST_NODES_BYTES = 1 << 30


@dataclass(frozen=True)
class Artifact:
    """A checked artifact: its manifest and the verified bytes of its files."""

    root: Path
    manifest: Manifest
    library: bytes
    weights: bytes

    def source(self, name: str) -> str:
        return f"artifact '{self.root}': '{name}'"


def read_artifact(path: str | Path, expected_digest: str | None = None) -> Artifact:
    """Read and check the artifact directory ``path`` (see the module docstring).

    ``expected_digest`` pins the artifact: its ``manifest_sha256`` must equal it (the digest
    covers every file, so this is the one check that also rules out a replaced library).
    """
    with ArtifactDirectory(path) as directory:
        return read_artifact_in(directory, expected_digest)


def read_artifact_in(directory: ArtifactDirectory, expected_digest: str | None = None
                     ) -> Artifact:
    """:func:`read_artifact` of an artifact directory that is already open (a block of a
    batch-blocked artifact, opened inside its parent)."""
    root = directory.root
    where = f"artifact '{root}': '{MANIFEST_FILE}'"
    if not directory.exists(MANIFEST_FILE):
        raise ModelLoadError(f"'{root}' has no {MANIFEST_FILE}: not an ember artifact")
    data = strict_json(directory.read(MANIFEST_FILE, MAX_MANIFEST_BYTES), where)
    return _checked_artifact(root, data, directory.read, expected_digest)


def artifact_from_memory(manifest: Any, files: Mapping[str, bytes], label: str) -> Artifact:
    """The artifact whose manifest (a parsed JSON object) and files are in memory, checked
    exactly as :func:`read_artifact` checks one on disk; ``label`` names it in errors (a model
    compiled in this process loads its code this way, without writing it to disk first)."""

    def read(name: str, limit: int) -> bytes:
        if name not in files:
            raise ModelLoadError(f"artifact '{label}' has no file '{name}'")
        if len(files[name]) > limit:
            raise ModelLoadError(f"artifact '{label}': '{name}' is larger than {limit} bytes")
        return files[name]

    return _checked_artifact(Path(label), manifest, read, None)


def _checked_artifact(root: Path, data: Any, read: Callable[[str, int], bytes],
                      expected_digest: str | None) -> Artifact:
    where = f"artifact '{root}': '{MANIFEST_FILE}'"
    check_header(data, where)
    digest = verify_digest(data, where)
    if expected_digest is not None and digest != expected_digest.lower():
        raise ModelLoadError(f"artifact '{root}' is not the expected one: its manifest "
                             f"digest is {digest}, expected {expected_digest}")
    manifest = parse_manifest(data, where)
    check_cpu(manifest, root)
    files = {name: _read_checked(root, read, manifest, name)
             for name in manifest.required_files()}
    if HOST_NODES_FILE in files:
        manifest = replace(manifest, host_nodes=_host_node_details(
            manifest, files[HOST_NODES_FILE], f"artifact '{root}': '{HOST_NODES_FILE}'"))
    return Artifact(root, manifest, files[LIBRARY_FILE], files[WEIGHTS_FILE])


def _read_checked(root: Path, read: Callable[[str, int], bytes], manifest: Manifest,
                  name: str) -> bytes:
    limits = {LIBRARY_FILE: MAX_LIBRARY_BYTES, HOST_NODES_FILE: MAX_HOST_NODES_BYTES,
              # the data is at most the blob (which pads every tensor), plus the header
              WEIGHTS_FILE: 8 + MAX_HEADER_BYTES + min(manifest.weights_size, MAX_BYTES)}
    data = read(name, limits[name])
    actual = hashlib.sha256(data).hexdigest()
    expected = manifest.files[name]
    if actual != expected:
        raise ModelLoadError(f"artifact '{root}': '{name}' is corrupted or was "
                             f"modified (SHA-256 {actual[:12]}… does not match the manifest's "
                             f"{expected[:12]}…); save the artifact again")
    return data


def _host_node_details(manifest: Manifest, data: bytes, where: str):
    """The host-node entries with their host_nodes.json detail (an object per node index,
    holding what the compiler needs to rebuild the node; checked by the resolver)."""
    details = strict_json(data, where)
    if not isinstance(details, dict):
        raise ModelLoadError(f"{where} must hold a JSON object (node index -> node)")
    expected = {str(entry.index) for entry in manifest.host_nodes}
    if set(details) != expected:
        raise ModelLoadError(f"{where} describes nodes {sorted(details)}, the manifest's "
                             f"host_nodes are {sorted(expected)}; save the artifact again")
    entries = []
    for entry in manifest.host_nodes:
        detail = details[str(entry.index)]
        if not isinstance(detail, dict):
            raise ModelLoadError(f"{where}: the entry of node {entry.index} must be a JSON "
                                 f"object")
        entries.append(replace(entry, detail=detail))
    return tuple(entries)


def check_cpu(manifest: Manifest, root: Path) -> None:
    """Refuse code for another architecture or for CPU features this machine lacks (it would
    die of SIGILL)."""
    if manifest.arch and manifest.arch != host_arch():
        raise ModelLoadError(f"artifact '{root}' was compiled for {manifest.arch}; this "
                             f"machine is {host_arch()}")
    if not host_features():
        return  # this OS does not tell (no /proc/cpuinfo): trust the user, as compilers do
    missing = sorted(set(manifest.required_features) - host_features())
    if missing:
        raise ModelLoadError(
            f"artifact '{root}' was compiled for a CPU with {', '.join(missing)}, which this "
            f"machine lacks; recompile it with a target this CPU supports (e.g. "
            f"target='x86_64-avx2' or target='native' on this machine)")

"""The artifact format: what a compiled model is on disk.

An artifact is a directory::

    model.ember/
      manifest.json        inputs/outputs (names, shapes, dtypes), target and CPU features,
                           ember version, memory plan sizes, weight offsets, content hashes
      model.so             the compiled library (one entry point, ``ember_run``)
      weights.safetensors  the constants, one named tensor each
      host_nodes.json      only if some nodes run their numpy reference (fallbacks)

Loading checks every file's SHA-256 against the manifest and the CPU features the code needs
against this machine, and refuses with a clear error rather than crash later.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ember.runtime.cpu import host_arch, host_features
from ember.runtime.errors import ModelLoadError

FORMAT = "ember-artifact"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(path: Path) -> dict[str, Any]:
    """Read and validate an artifact's manifest (files, hashes, CPU compatibility)."""
    root = Path(path)
    if not root.exists():
        raise ModelLoadError(f"artifact '{root}' does not exist")
    if not root.is_dir():
        raise ModelLoadError(f"'{root}' is not an ember artifact directory (it should hold "
                             f"{MANIFEST}, the library and the weights)")
    manifest_path = root / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"'{root}' has no {MANIFEST}: not an ember artifact") from None
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"'{manifest_path}' is unreadable or not JSON: {error}") from None
    if manifest.get("format") != FORMAT:
        raise ModelLoadError(f"'{manifest_path}' is not an ember artifact manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ModelLoadError(f"artifact format version {manifest.get('format_version')} is not "
                             f"supported by this runtime (it reads version {FORMAT_VERSION})")
    for name, expected in manifest.get("files", {}).items():
        file_path = root / name
        if not file_path.exists():
            raise ModelLoadError(f"artifact '{root}' is incomplete: '{name}' is missing")
        actual = sha256_of(file_path)
        if actual != expected:
            raise ModelLoadError(f"artifact '{root}': '{name}' is corrupted or was modified "
                                 f"(SHA-256 {actual[:12]}… does not match the manifest's "
                                 f"{expected[:12]}…); rebuild the artifact")
    check_cpu(manifest, root)
    return manifest


def check_cpu(manifest: dict[str, Any], root: Path) -> None:
    target = manifest.get("target", {})
    arch = target.get("arch")
    if arch and arch != host_arch():
        raise ModelLoadError(f"artifact '{root}' was compiled for {arch}; this machine is "
                             f"{host_arch()}")
    required = set(target.get("required_features", []))
    if not host_features():
        return  # this OS does not tell (no /proc/cpuinfo): trust the user, as compilers do
    missing = sorted(required - host_features())
    if missing:
        raise ModelLoadError(
            f"artifact '{root}' was compiled for a CPU with {', '.join(missing)}, which this "
            f"machine lacks; recompile it with a target this CPU supports (e.g. "
            f"target='x86_64-avx2' or target='native' on this machine)")

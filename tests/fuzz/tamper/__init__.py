"""Tampering with saved artifacts, one module per target (manifest, files, weights header);
``ARTIFACT_KINDS`` maps each kind (a category of the outcome table) to its tamper."""

from __future__ import annotations

import random
from pathlib import Path

from fuzz.tamper import files, manifest, safetensors
from fuzz.tamper.base import ArtifactContext, NotApplicable, Tamper


def intact(case_dir: Path, context: ArtifactContext, base: str, rng: random.Random) -> str:
    """The control: an untouched copy must load and reproduce the base outputs."""
    return "untouched copy"


ARTIFACT_KINDS: dict[str, Tamper] = {
    "intact": intact,
    "manifest-key": manifest.delete_key,
    "manifest-type": manifest.change_type,
    "manifest-number": manifest.change_number,
    "manifest-string": manifest.change_string,
    "manifest-list": manifest.resize_list,
    "manifest-document": manifest.replace_document,
    "truncate": files.truncate,
    "flip": files.flip_bytes,
    "replace": files.replace_file,
    "extra-file": files.extra_file,
    "host-nodes": files.host_nodes,
    "weights-header": safetensors.tamper_header,
    "inputs": intact,  # the artifact stays intact; fuzz.cases changes the inputs instead
}

__all__ = ["ARTIFACT_KINDS", "ArtifactContext", "NotApplicable", "Tamper"]

"""What an artifact tamper gets to work with, and the helpers every tamper uses.

A tamper edits a private copy of a base artifact (``case_dir``) in place and returns a
description of what it did.  Some tampers *rehash*: they rewrite the SHA-256 entries of the
manifest after the damage, as an attacker (or a careless tool) would, so that the damage gets
past the integrity check and reaches the parsers behind it.  For the same reason every
manifest edit is *resealed*: when the manifest carries a digest of its own content (a field
holding the SHA-256 of the canonical JSON of the rest), the digest is recomputed -- it is not
a secret, anyone editing the manifest can do it.  The field is recognised by its value, not
by its name, so the fuzzer needs no knowledge of ember's manifest format.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")
MANIFEST = "manifest.json"
_HEX64 = re.compile(r"[0-9a-f]{64}")


class NotApplicable(Exception):
    """The tamper has nothing to act on in this artifact."""


@dataclass(frozen=True)
class ArtifactContext:
    """The session's untampered artifacts, by seed name (a tamper may borrow another
    artifact's files)."""

    bases: dict[str, Path]

    def other_than(self, case_dir_base: str) -> Path:
        others = [path for name, path in sorted(self.bases.items()) if name != case_dir_base]
        if not others:
            raise NotApplicable("only one base artifact")
        return others[0]


Tamper = Callable[[Path, "ArtifactContext", str, random.Random], str]


def pick(rng: random.Random, items: Sequence[T], what: str = "site") -> T:
    if not items:
        raise NotApplicable(f"no {what} to tamper with")
    return items[rng.randrange(len(items))]


def read_manifest(case_dir: Path) -> Any:
    return json.loads((case_dir / MANIFEST).read_text())


def write_manifest(case_dir: Path, manifest: Any, seal_field: str | None = None) -> None:
    """Write ``manifest``, recomputing its self-digest ``seal_field`` if it has one."""
    if seal_field and isinstance(manifest, dict) and seal_field in manifest:
        manifest[seal_field] = canonical_sha256(manifest, seal_field)
    (case_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))


def canonical_sha256(manifest: dict, without: str) -> str:
    body = {key: value for key, value in manifest.items() if key != without}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def self_digest_field(manifest: Any) -> str | None:
    """The top-level field holding the SHA-256 of the rest of the manifest, if any."""
    if not isinstance(manifest, dict):
        return None
    for key, value in manifest.items():
        if (isinstance(value, str) and _HEX64.fullmatch(value)
                and canonical_sha256(manifest, key) == value):
            return key
    return None


class ManifestEdit:
    """The manifest of ``case_dir`` for a tamper to edit; ``save`` writes it back resealed
    (unless the edit touched the digest field itself, which is then what is tested)."""

    def __init__(self, case_dir: Path):
        self.case_dir = case_dir
        self.doc = read_manifest(case_dir)
        self.seal_field = self_digest_field(self.doc)

    def save(self, touched_key: object = None) -> str:
        """Write the edit; returns a note for the description ("resealed" or "")."""
        field = self.seal_field if touched_key != self.seal_field else None
        write_manifest(self.case_dir, self.doc, field)
        return " (resealed)" if field else ""


def listed_files(case_dir: Path) -> list[str]:
    """The artifact's files other than the manifest, as they are on disk (not as the
    manifest claims, which a previous edit may have damaged)."""
    return sorted(p.name for p in case_dir.iterdir() if p.name != MANIFEST and p.is_file())


def rehash(case_dir: Path) -> None:
    """Rewrite the manifest's SHA-256 of every listed regular file to match the disk (and
    reseal the manifest)."""
    manifest = read_manifest(case_dir)
    seal_field = self_digest_field(manifest)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return
    for name in files:
        path = case_dir / name
        if path.is_file() and not path.is_symlink():
            files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    write_manifest(case_dir, manifest, seal_field or None)

"""Tampering with the artifact's files: truncation, byte flips, a file replaced by a symlink
(to another file, to /dev/zero, dangling, looping), a FIFO, a directory or another
artifact's file, and extra files the manifest does or does not list.

Without rehashing, every one of these must be caught by the integrity check (or, for special
files, before it: reading a FIFO or /dev/zero to hash it never ends).  The rehashed variants
get past the hash and test what the loader does with a library or a file that belongs to
another model.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from pathlib import Path

from fuzz.tamper.base import (MANIFEST, ArtifactContext, ManifestEdit, NotApplicable,
                              listed_files, pick, rehash)


def _target_file(case_dir: Path, rng: random.Random, include_manifest: bool) -> str:
    names = listed_files(case_dir) + ([MANIFEST] if include_manifest else [])
    return pick(rng, names, "file")


def truncate(case_dir: Path, context: ArtifactContext, base: str,
             rng: random.Random) -> str:
    name = _target_file(case_dir, rng, include_manifest=True)
    path = case_dir / name
    size = path.stat().st_size
    keep = pick(rng, [0, 1, 8, size // 2, max(size - 1, 0)])
    with open(path, "r+b") as handle:
        handle.truncate(keep)
    return f"{name} truncated {size} -> {keep} bytes"


def flip_bytes(case_dir: Path, context: ArtifactContext, base: str,
               rng: random.Random) -> str:
    name = _target_file(case_dir, rng, include_manifest=False)
    path = case_dir / name
    data = bytearray(path.read_bytes())
    if not data:
        raise NotApplicable("empty file")
    region = pick(rng, ["start", "anywhere"])
    limit = min(len(data), 64) if region == "start" else len(data)
    positions = sorted(rng.randrange(limit) for _ in range(pick(rng, [1, 3, 16])))
    for position in positions:
        data[position] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return f"{name}: bits flipped at bytes {positions[:8]} (hash not updated)"


def _replace_with(path: Path, how: str, case_dir: Path, context: ArtifactContext,
                  base: str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    if how == "symlink-other-file":
        other = next(n for n in sorted(os.listdir(case_dir)) if n != path.name)
        path.symlink_to(other)
    elif how == "symlink-dev-zero":
        path.symlink_to("/dev/zero")
    elif how == "symlink-dev-null":
        path.symlink_to("/dev/null")
    elif how == "symlink-dev-urandom":
        path.symlink_to("/dev/urandom")
    elif how == "symlink-dangling":
        path.symlink_to(case_dir / "no_such_file")
    elif how == "symlink-loop":
        path.symlink_to(path.name)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "directory":
        path.mkdir()
        (path / "inside").write_bytes(b"x")
    elif how == "empty-file":
        path.write_bytes(b"")
    elif how in ("other-artifact", "other-artifact-rehashed"):
        source = context.other_than(base) / path.name
        if not source.exists():
            raise NotApplicable(f"the other artifact has no {path.name}")
        shutil.copyfile(source, path)
    else:
        raise ValueError(how)


REPLACEMENTS = ["symlink-other-file", "symlink-dev-zero", "symlink-dev-null",
                "symlink-dev-urandom", "symlink-dangling", "symlink-loop", "fifo", "directory",
                "empty-file", "other-artifact", "other-artifact-rehashed"]


def replace_file(case_dir: Path, context: ArtifactContext, base: str,
                 rng: random.Random) -> str:
    name = _target_file(case_dir, rng, include_manifest=True)
    how = pick(rng, REPLACEMENTS)
    if name == MANIFEST and how == "other-artifact-rehashed":
        how = "other-artifact"
    _replace_with(case_dir / name, how, case_dir, context, base)
    if how == "other-artifact-rehashed":
        rehash(case_dir)
    return f"{name} replaced by {how}"


def extra_file(case_dir: Path, context: ArtifactContext, base: str,
               rng: random.Random) -> str:
    """An unlisted file, or a manifest 'files' entry for a file outside the artifact or a
    special file (with its true hash where one exists, so only the path is wrong)."""
    how = pick(rng, ["unlisted-library", "unlisted-host-nodes", "listed-outside",
                     "listed-dev-zero", "listed-fifo", "listed-missing"])
    if how == "unlisted-library":
        (case_dir / "evil.so").write_bytes(b"\x7fELF" + bytes(100))
        return "unlisted evil.so added"
    if how == "unlisted-host-nodes":
        (case_dir / "host_nodes.json").write_text('{"0": {"node": "not a graph"}}')
        return "unlisted host_nodes.json with a bogus node added"
    edit = ManifestEdit(case_dir)
    files = edit.doc.setdefault("files", {})
    if how == "listed-outside":
        target = "/etc/hostname" if os.path.exists("/etc/hostname") else "/etc/passwd"
        files[f"../../../../../../..{target}"] = hashlib.sha256(
            Path(target).read_bytes()).hexdigest()
    elif how == "listed-dev-zero":
        files["/dev/zero"] = "0" * 64
    elif how == "listed-fifo":
        os.mkfifo(case_dir / "pipe")
        files["pipe"] = "0" * 64
    else:
        files["missing.bin"] = "0" * 64
    return f"manifest 'files' gains an entry: {how}{edit.save()}"


def host_nodes(case_dir: Path, context: ArtifactContext, base: str,
               rng: random.Random) -> str:
    """Rehashed edits of host_nodes.json (the serialized graphs of fallback nodes), which
    ember.load() rebuilds into executable numpy references."""
    path = case_dir / "host_nodes.json"
    if not path.is_file():
        raise NotApplicable("no host_nodes.json")
    text = path.read_text()
    variants = {
        "op-renamed": text.replace('"op": "If"', '"op": "Relu"'),
        "op-unknown": text.replace('"op": "If"', '"op": "FuzzNoSuchOp"'),
        "index-key-changed": text.replace('{"2":', '{"7":', 1),
        "empty-object": "{}",
        "list": "[]",
        "node-null": text.replace('"node": {', '"node": null, "was": {', 1),
        "shape-changed": text.replace('"shape": [2, 3]', '"shape": [3, 2]'),
        "dtype-changed": text.replace('"tensor": "f32"', '"tensor": "f64"'),
        "format-version": text.replace('"version": 1', '"version": 99'),
        "truncated": text[: len(text) // 2],
        "deep-nesting": "[" * 100_000 + "]" * 100_000,
    }
    name = pick(rng, sorted(variants))
    path.write_text(variants[name])
    rehash(case_dir)
    return f"host_nodes.json {name} (rehashed)"


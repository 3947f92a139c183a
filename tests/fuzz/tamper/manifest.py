"""Tampering with ``manifest.json``: delete any key, change any value's type, replace numbers
(shapes, sizes, offsets) and strings (file names, dtype names) with hostile ones, resize
lists, and replace the whole document with something that is not a manifest.

The manifest is the one file of an artifact that no hash protects (it holds the hashes), and
the runtime sizes buffers and computes offsets from it before calling native code: every
number in it must be checked against the others and against the files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from fuzz.hostile import HOSTILE_DTYPE_NAMES, HOSTILE_PATHS
from fuzz.tamper import json_paths
from fuzz.tamper.base import MANIFEST, ArtifactContext, ManifestEdit, pick

TYPE_REPLACEMENTS: dict[str, object] = {
    "null": None, "string": "12", "float": 1.5, "bool": True, "list": [], "object": {},
    "negative": -1, "2^64": 2**64, "nested-list": [[1]],
}


def _numbers(value: int) -> dict[str, int]:
    return {"zero": 0, "minus-one": -1, "minus-five": -5, "one": 1, "plus-one": value + 1,
            "minus-1": value - 1, "double": value * 2, "half": value // 2, "2^31": 2**31,
            "2^40": 2**40, "int64-max": 2**63 - 1, "2^64": 2**64, "int64-min": -(2**63)}


def delete_key(case_dir: Path, context: ArtifactContext, base: str,
               rng: random.Random) -> str:
    edit = ManifestEdit(case_dir)
    path = pick(rng, json_paths.all_paths(edit.doc), "manifest key")
    json_paths.delete(edit.doc, path)
    return f"deleted {json_paths.render(path)}{edit.save(path[0])}"


def change_type(case_dir: Path, context: ArtifactContext, base: str,
                rng: random.Random) -> str:
    edit = ManifestEdit(case_dir)
    path = pick(rng, json_paths.all_paths(edit.doc), "manifest key")
    old = json_paths.get(edit.doc, path)
    candidates = [k for k, v in TYPE_REPLACEMENTS.items() if type(v) is not type(old)]
    name = pick(rng, sorted(candidates))
    json_paths.replace(edit.doc, path, TYPE_REPLACEMENTS[name])
    return (f"{json_paths.render(path)} ({type(old).__name__}) -> {name} "
            f"{json.dumps(TYPE_REPLACEMENTS[name])}{edit.save(path[0])}")


def change_number(case_dir: Path, context: ArtifactContext, base: str,
                  rng: random.Random) -> str:
    edit = ManifestEdit(case_dir)
    paths = [p for p in json_paths.all_paths(edit.doc)
             if type(json_paths.get(edit.doc, p)) is int]
    path = pick(rng, paths, "number")
    old = json_paths.get(edit.doc, path)
    name, value = pick(rng, sorted(_numbers(old).items()))
    json_paths.replace(edit.doc, path, value)
    return f"{json_paths.render(path)} {old} -> {name} ({value}){edit.save(path[0])}"


def change_string(case_dir: Path, context: ArtifactContext, base: str,
                  rng: random.Random) -> str:
    edit = ManifestEdit(case_dir)
    manifest = edit.doc
    paths = [p for p in json_paths.all_paths(manifest)
             if isinstance(json_paths.get(manifest, p), str)]
    # Keys are strings too: renaming the key "model.so" of "files" is a path edit.
    key_paths = [p for p in json_paths.all_paths(manifest) if isinstance(p[-1], str)]
    as_key = rng.random() < 0.25 and key_paths
    path = pick(rng, key_paths if as_key else paths, "string")
    pool = {**{f"path:{k}": v for k, v in HOSTILE_PATHS.items()},
            **{f"dtype:{d!r}": d for d in HOSTILE_DTYPE_NAMES}}
    name, value = pick(rng, sorted(pool.items()))
    if as_key:
        parent = json_paths.get(manifest, path[:-1])
        parent[value] = parent.pop(path[-1])
        what = f"key {json_paths.render(path)} renamed to {name}"
    else:
        old = json_paths.get(manifest, path)
        json_paths.replace(manifest, path, value)
        what = f"{json_paths.render(path)} {old[:40]!r} -> {name}"
    return what + edit.save(path[0])


def resize_list(case_dir: Path, context: ArtifactContext, base: str,
                rng: random.Random) -> str:
    edit = ManifestEdit(case_dir)
    paths = [p for p in json_paths.all_paths(edit.doc)
             if isinstance(json_paths.get(edit.doc, p), list)]
    path = pick(rng, paths, "list")
    items = json_paths.get(edit.doc, path)
    how = pick(rng, ["append-copy", "drop-last", "empty", "duplicate-all", "reverse"])
    if how == "append-copy" and items:
        items.append(json.loads(json.dumps(items[-1])))
    elif how == "drop-last" and items:
        items.pop()
    elif how == "duplicate-all":
        items.extend(json.loads(json.dumps(items)))
    elif how == "reverse":
        items.reverse()
    else:
        how = "empty"
        items.clear()
    return f"{json_paths.render(path)} ({len(items)} items now): {how}{edit.save(path[0])}"


def _document_variants(text: str, manifest: object) -> dict[str, bytes]:
    half = len(text) // 2
    library_twice = text.rstrip().rstrip("}") + ', "library": "../../evil.so"}'
    return {
        "list-instead-of-object": json.dumps([manifest]).encode(),
        "null": b"null", "number": b"42", "string": b'"manifest"', "empty": b"",
        "truncated": text[:half].encode(),
        "trailing-garbage": (text + "}}]garbage").encode(),
        "nan-workspace": text.replace('"workspace_size": ', '"workspace_size": NaN, "x": ')
        .encode(),
        "infinity-literal": text.replace('"weights_size": ', '"weights_size": Infinity, "y": ')
        .encode(),
        "huge-number-literal": text.replace('"workspace_size": ',
                                            '"workspace_size": 1e999, "z": ').encode(),
        "deep-nesting": b"[" * 200_000 + b"]" * 200_000,
        "duplicate-key-library": library_twice.encode(),
        "byte-order-mark": b"\xef\xbb\xbf" + text.encode(),
        "invalid-utf8": text.encode().replace(b'"format"', b'"form\xff\xfe"', 1),
        "utf16": text.encode("utf-16"),
        "nul-byte": text.encode().replace(b"{", b"{\x00", 1),
    }


def replace_document(case_dir: Path, context: ArtifactContext, base: str,
                     rng: random.Random) -> str:
    text = (case_dir / MANIFEST).read_text()
    variants = _document_variants(text, json.loads(text))
    name = pick(rng, sorted(variants))
    (case_dir / MANIFEST).write_bytes(variants[name])
    return f"manifest.json replaced: {name}"


"""Where an artifact is saved (kind ``save/target``): ``Module.save(path)`` and ``ember compile
-o path`` into whatever is at ``path``.

Saving replaces a directory, so it can destroy a user's work: a project folder that happens
to hold a ``manifest.json``, an artifact someone added notes to, the directory a symbolic
link points to.  ember's rule (``ember/package/artifact.py``): an existing target is
replaced only when it is an empty directory or an artifact made of ember's own files alone;
anything else is refused, and left exactly as it was.

Each case draws a target (absent, empty, a user's folder, a previous artifact with or without
user files in it, a file, a FIFO, symbolic links to each, a read-only directory, a path
through a file, the folder holding everything), the files in it, the entry point (API or
command line) and, where ``Module.save`` takes one, an ``overwrite`` flag.  The worker lays it
out, saves a *previous* artifact where the case wants one (those files, and only those, are
ember's), snapshots the whole scratch directory, saves, and snapshots again.  The property:
no entry ember did not write is deleted or changed, nothing is left outside the target, and
the save either raised an EmberError or wrote an artifact that loads and runs bitwise as the
module does.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from fuzz.generate.base import model, tensor, value
from fuzz.layout import Entry

ROOT = "work"
USER_NAMES = ("notes.txt", "thesis.tex", ".hidden", "data/results.csv", "src/app.py",
              "README.md", "manifest.json", "model.so", "weights.safetensors",
              "host_nodes.json", "blocks.json", "b1/notes.txt", "b2", "sub/dir/deep.bin")
EMBER_FILE_NAMES = ("manifest.json", "model.so", "weights.safetensors", "host_nodes.json",
                    "blocks.json")


@dataclass
class SaveCase:
    """A model, a target laid out around it, and how to save."""

    data: bytes                        # the model to save
    previous_data: bytes               # the model of a previous artifact (other weights)
    feeds: dict[str, np.ndarray]
    input_shapes: dict[str, tuple[int, ...]] | None
    layout: list[Entry]                # made before anything else
    previous: list[str]                # where ember saves a previous artifact first
    extras: list[Entry]                # made after the previous artifacts (user files in them)
    target: str                        # relative to the scratch directory
    entry: str                         # "api" or "cli"
    overwrite: bool | None
    cli_args: list[str] = field(default_factory=list)
    description: str = ""


def _save_model(scale: float, dynamic: bool) -> onnx.ModelProto:
    w = tensor("w", np.full((4, 3), scale, np.float32) + np.arange(12, dtype=np.float32)
               .reshape(4, 3) * 0.25)
    batch: int | str = "N" if dynamic else 2
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         helper.make_node("Relu", ["h"], ["y"], name="relu")], "save",
        [value("x", shape=[batch, 4])], [value("y", TensorProto.FLOAT, [batch, 3])],
        initializer=[w])
    return model(graph)


def _user_files(rng: random.Random, where: str, count: int) -> list[Entry]:
    """``count`` user files (random content) under ``where``; some with ember's names."""
    names = rng.sample(USER_NAMES, min(count, len(USER_NAMES)))
    entries = []
    for name in names:
        if name == "manifest.json":
            data = rng.choice([json.dumps({"name": "my web app", "version": 3}).encode(),
                               b"{}", b"not json", json.dumps({"format": "ember.artifact",
                                                               "files": {}}).encode()])
        else:
            data = bytes(rng.randrange(256) for _ in range(rng.choice([0, 5, 300])))
        entries.append(Entry(f"{where}/{name}", data=data))
    return entries


def _target(rng: random.Random, dynamic: bool
            ) -> tuple[str, list[Entry], list[str], list[Entry], str]:
    """(target, layout, previous artifacts, extras, description) for a drawn target kind
    (``dynamic``: the artifacts are batch-blocked, their manifests in block folders)."""
    t = f"{ROOT}/out.ember"
    kind = rng.choice(["absent", "absent-deep", "empty-dir", "user-dir", "user-manifest",
                       "user-dir-ember-manifest",
                       "ember-artifact", "ember-artifact", "ember-artifact-extras",
                       "ember-artifact-extras", "file", "fifo", "symlink-dir",
                       "symlink-file", "symlink-dangling", "symlink-loop", "symlink-artifact",
                       "read-only-dir", "read-only-parent", "parent-file", "parent-symlink",
                       "root-folder", "inside-artifact", "hostile-name"])
    layout = [Entry(ROOT, "dir"), Entry(f"{ROOT}/keep.txt", data=b"a user's file beside")]
    previous: list[str] = []
    extras: list[Entry] = []
    detail = ""
    if kind == "absent-deep":
        t = f"{ROOT}/a/b/c/out.ember"
    elif kind == "empty-dir":
        layout.append(Entry(t, "dir"))
    elif kind == "user-dir":
        files = _user_files(rng, t, rng.randint(1, 5))
        layout += files
        detail = ", ".join(str(e.path).split("/", 2)[-1] for e in files)
    elif kind == "user-manifest":
        layout += [e for e in _user_files(rng, t, len(USER_NAMES))
                   if str(e.path).endswith("/manifest.json")]
    elif kind == "user-dir-ember-manifest":
        # A manifest ember wrote, copied by the user into their folder with their files.
        previous.append(f"{ROOT}/prev.ember")
        manifest = "b1/manifest.json" if dynamic else "manifest.json"
        extras.append(Entry(f"{t}/manifest.json", "copy",
                            target=f"{ROOT}/prev.ember/{manifest}"))
        extras += [e for e in _user_files(rng, t, 4)
                   if not str(e.path).endswith("/manifest.json")][:rng.randint(1, 3)]
    elif kind == "ember-artifact":
        previous.append(t)
    elif kind == "ember-artifact-extras":
        previous.append(t)
        extra = rng.choice(["user-file", "user-dir", "symlink", "fifo", "block-like",
                            "unlisted-ember-name", "user-files"])
        detail = extra
        if extra == "user-file":
            extras.append(Entry(f"{t}/notes.txt", data=b"mine"))
        elif extra == "user-dir":
            extras.append(Entry(f"{t}/results/run1.csv", data=b"1,2,3"))
        elif extra == "symlink":
            extras.append(Entry(f"{t}/link", "symlink", target="../keep.txt"))
        elif extra == "fifo":
            extras.append(Entry(f"{t}/pipe", "fifo"))
        elif extra == "block-like":
            extras.append(Entry(f"{t}/b2/notes.txt", data=b"not a block"))
        elif extra == "unlisted-ember-name":
            name = rng.choice(["host_nodes.json", "blocks.json"])
            extras.append(Entry(f"{t}/{name}", data=b'{"mine": true}'))
            detail = f"unlisted {name} written by the user"
        else:
            extras += _user_files(rng, t, rng.randint(1, 4))
    elif kind == "file":
        layout.append(Entry(t, data=b"not a directory"))
    elif kind == "fifo":
        layout.append(Entry(t, "fifo"))
    elif kind == "symlink-dir":
        pointed = rng.choice(["empty", "user files"])
        layout.append(Entry(f"{ROOT}/elsewhere", "dir"))
        if pointed == "user files":
            layout += _user_files(rng, f"{ROOT}/elsewhere", rng.randint(1, 3))
        layout.append(Entry(t, "symlink", target="elsewhere"))
        detail = f"to a directory ({pointed})"
    elif kind == "symlink-file":
        layout.append(Entry(t, "symlink", target="keep.txt"))
    elif kind == "symlink-dangling":
        layout.append(Entry(t, "symlink", target="nowhere"))
    elif kind == "symlink-loop":
        layout += [Entry(t, "symlink", target="loop2"),
                   Entry(f"{ROOT}/loop2", "symlink", target="out.ember")]
    elif kind == "symlink-artifact":
        previous.append(f"{ROOT}/real.ember")
        layout.append(Entry(t, "symlink", target="real.ember"))
    elif kind == "read-only-dir":
        contents = rng.choice(["empty", "user files"])
        layout.append(Entry(t, "dir", mode=0o555))
        if contents == "user files":
            layout += _user_files(rng, t, 2)
        detail = contents
    elif kind == "read-only-parent":
        layout = [Entry(ROOT, "dir", mode=0o555), Entry(f"{ROOT}/keep.txt", data=b"beside")]
    elif kind == "parent-file":
        t = f"{ROOT}/keep.txt/out.ember"
    elif kind == "parent-symlink":
        layout.append(Entry(f"{ROOT}/real", "dir"))
        layout += _user_files(rng, f"{ROOT}/real", 2)
        layout.append(Entry(f"{ROOT}/linked", "symlink", target="real"))
        t = f"{ROOT}/linked/out.ember"
    elif kind == "root-folder":
        layout += _user_files(rng, ROOT, 2)
        t = ROOT
    elif kind == "inside-artifact":
        previous.append(f"{ROOT}/prev.ember")
        t = f"{ROOT}/prev.ember/{rng.choice(['sub', 'b1', 'deep/er'])}"
    elif kind == "hostile-name":
        t = f"{ROOT}/" + rng.choice(["out\nput.ember", "ou\u202et.ember", "\u00e9\u540d.ember",
                                      " lead space", "-o", "--help"])
    described = f"{kind}" + (f" ({detail})" if detail else "")
    return t, layout, previous, extras, described


def save_case(rng: random.Random, number: int) -> SaveCase:
    """A target drawn as above, with the entry point and the model (static, or with a
    dynamic batch, which saves batch blocks)."""
    dynamic = rng.random() < 0.25
    target, layout, previous, extras, described = _target(rng, dynamic)
    entry = rng.choice(["api", "api", "cli"])
    overwrite = rng.choice([None, True, False]) if entry == "api" else None
    feeds = {"x": np.random.default_rng(5).standard_normal((4 if dynamic else 2, 4))
             .astype(np.float32)}
    description = (f"{described}: {entry}"
                   + (f", overwrite={overwrite} (if Module.save takes it)"
                      if overwrite is not None else "")
                   + (", dynamic batch (batch blocks)" if dynamic else ""))
    return SaveCase(_save_model(1.0, dynamic).SerializeToString(),
                    _save_model(2.0, dynamic).SerializeToString(), feeds,
                    {"x": (4, 4)} if dynamic else None, layout, previous, extras, target,
                    entry, overwrite, ["--dim", "N=4"] if dynamic else [], description)

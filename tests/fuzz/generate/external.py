"""External tensor data (kind ``external``): where ember may read a tensor's bytes from.

A tensor's ``location`` is text from the model, so it is untrusted: an absolute path, ``..``,
a symbolic link out of the model's directory, a FIFO, ``/dev/zero``, an offset past the end.
ember's rule (``ember/frontend/onnx/external_data.py``): data is read only from inside one
*allowed directory* -- the model file's own, or the ``base_dir=`` given with it; a model
given as bytes or as a ModelProto with external tensors and no ``base_dir`` is refused --
from regular files only, in bounded amounts.

Each case draws a small model (dense layer, table lookup, Constant node, If branch,
function body, sparse initializer), moves 1-3 of its tensors to external files with a
location variant each (valid ones, hostile ones, odd ones), a way to hand the model to
ember (path, bytes, ModelProto), a base directory and a working directory.  Around it, a
*sentinel* -- a distinctive 16-byte pattern -- fills every file outside the allowed
directory that a wrong resolution could reach: ``outside/secret.bin``, a copy of each
location in the working directory and, when the allowed directory is not the model's own,
in the model's directory.  Correct means: ember's outputs match the oracle run on the model
with its data inline (the legitimate load), or an EmberError; and the sentinel appears in no
output and no artifact saved from the compiled module.  A case whose locations are all valid
and whose allowed directory is sound must succeed.
"""

from __future__ import annotations

import os
import random
import zlib
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fuzz.generate.base import feeds_for, model, tensor, value
from fuzz.layout import SCRATCH, Entry
from fuzz.mutate.base import Mutant

# float32 1234.5678, -8765.4321, 3.1415e-7, 2.7182e17: no model here computes these bytes.
SENTINEL = np.array([1234.5678, -8765.4321, 3.1415e-7, 2.7182e17], np.float32).tobytes()
SENTINEL_FILE_BYTES = 1 << 16
FILLER = b"\x5a\xa5\x3c\xc3"  # legitimate bytes that are not the tensor's, inside the dir
# Valid variants: the model is sound, ember must load it.
VALID = ("plain", "offset", "subdir", "trailing", "unicode", "shared")
# Odd but arguably valid: ember may read them as Python's int() does, or refuse.
ODD = ("odd-number", "symlink-inside", "absolute-inside", "traversal-inside", "stale-entries",
       "dot-path")
HOSTILE = ("absolute-outside", "traversal", "symlink-file-out", "symlink-dir-out",
           "symlink-dangling", "symlink-loop", "symlink-dev-zero", "directory", "fifo",
           "device", "proc", "missing", "offset-past-end", "length-past-end", "short-length",
           "negative", "huge-number", "not-a-number", "offset-overflow", "duplicate-key",
           "no-location", "empty-location", "nul", "non-utf8", "backslash", "long-name",
           "deep-path", "huge-dims", "cwd-only", "external-and-raw")
ODD_NUMBERS = (" 16", "+16", "16 ", "0016", "\uff11\uff16", "1_6")
# A location that is not UTF-8 cannot be set through protobuf: a placeholder of the same
# length is replaced in the serialized model (by the worker, see Mutant.byte_patches).
NON_UTF8_PLACEHOLDER = b"\x01\x02\x03\x04\x05\x06"
NON_UTF8_BYTES = b"\xff\xfe\x9b\xc0\x80\xed"


def sentinel_block(size: int = SENTINEL_FILE_BYTES) -> bytes:
    return (SENTINEL * (size // len(SENTINEL) + 1))[:size]


# ---------------------------------------------------------------------------- templates


@dataclass
class Template:
    """A small valid model with its data inline, and the tensors that may go external."""

    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    sites: list[tuple[str, TensorProto]] = field(default_factory=list)


def _weights(name: str, shape: tuple[int, ...], dtype: str = "float32") -> TensorProto:
    """Deterministic by name and shape, so that cases share compiled libraries."""
    generator = np.random.default_rng(zlib.crc32(repr((name, shape, dtype)).encode()))
    if dtype == "float32":
        array = generator.standard_normal(shape).astype(np.float32)
    else:
        array = generator.integers(0, 5, shape).astype(dtype)
    return tensor(name, array)


def _dense(rng: random.Random) -> Template:
    k, n = rng.choice([3, 4, 8]), rng.choice([2, 4, 5])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
         helper.make_node("Add", ["h", "b"], ["y"], name="bias"),
         helper.make_node("Identity", ["W"], ["w_out"], name="show_w")],
        "dense", [value("x", shape=[2, k])],
        [value("y", shape=[2, n]), value("w_out", shape=[k, n])],
        initializer=[_weights("W", (k, n)), _weights("b", (n,))])
    built = model(graph)
    return Template("dense", built, feeds_for(7, {"x": [2, k]}),
                    [("initializer W", built.graph.initializer[0]),
                     ("initializer b", built.graph.initializer[1])])


def _table(rng: random.Random) -> Template:
    dtype = rng.choice(["float32", "int64", "int32", "uint8", "float16"])
    depth = rng.choice([2, 3])
    table = _weights("table", (5, depth), "float32" if dtype == "float16" else dtype)
    if dtype == "float16":
        table = tensor("table", numpy_helper.to_array(table).astype(np.float16))
    index = tensor("index", np.array([4, 0, 2], np.int64))
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "index"], ["rows"], name="lookup", axis=0),
         helper.make_node("Cast", ["rows"], ["rows_f"], name="cast", to=TensorProto.FLOAT),
         helper.make_node("Add", ["x", "rows_f"], ["y"], name="add"),
         helper.make_node("Identity", ["table"], ["table_out"], name="show")],
        "table", [value("x", shape=[3, depth])],
        [value("y", shape=[3, depth]), value("table_out", table.data_type, [5, depth])],
        initializer=[table, index])
    built = model(graph)
    return Template("table", built, feeds_for(8, {"x": [3, depth]}),
                    [("initializer table", built.graph.initializer[0]),
                     ("initializer index", built.graph.initializer[1])])


def _constant_node(rng: random.Random) -> Template:
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], name="const",
                          value=_weights("c", (2, 3))),
         helper.make_node("Mul", ["x", "c"], ["y"], name="mul"),
         helper.make_node("Identity", ["c"], ["c_out"], name="show")],
        "constant", [value("x", shape=[2, 3])],
        [value("y", shape=[2, 3]), value("c_out", shape=[2, 3])])
    built = model(graph)
    return Template("constant-node", built, feeds_for(9, {"x": [2, 3]}),
                    [("node const attribute value", built.graph.node[0].attribute[0].t)])


def _branch(rng: random.Random) -> Template:
    then_graph = helper.make_graph(
        [helper.make_node("Add", ["x", "t"], ["then_out"], name="then_add")], "then", [],
        [value("then_out", shape=[2, 3])], initializer=[_weights("t", (2, 3))])
    else_graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "e"], ["else_out"], name="else_sub")], "else", [],
        [value("else_out", shape=[2, 3])], initializer=[_weights("e", (2, 3))])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_graph,
                          else_branch=else_graph)],
        "branch", [value("x", shape=[2, 3]), value("cond", TensorProto.BOOL, [])],
        [value("y", shape=[2, 3])])
    built = model(graph)
    feeds = feeds_for(10, {"x": [2, 3]})
    feeds["cond"] = np.array(rng.random() < 0.5)
    node = built.graph.node[0]
    return Template("branch", built, feeds,
                    [("then-branch initializer t", node.attribute[0].g.initializer[0]),
                     ("else-branch initializer e", node.attribute[1].g.initializer[0])])


def _function(rng: random.Random) -> Template:
    body = [helper.make_node("Constant", [], ["k"], name="k", value=_weights("k", (3,))),
            helper.make_node("Mul", ["X", "k"], ["Y"], name="scale")]
    function = helper.make_function("local", "Scale", ["X"], ["Y"], body,
                                    opset_imports=[helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("Scale", ["x"], ["y"], name="call", domain="local")], "function",
        [value("x", shape=[2, 3])], [value("y", shape=[2, 3])])
    built = model(graph, [function], extra_opsets=[("local", 1)])
    return Template("function", built, feeds_for(11, {"x": [2, 3]}),
                    [("function Scale constant k", built.functions[0].node[0].attribute[0].t)])


def _sparse(rng: random.Random) -> Template:
    values = tensor("s", np.array([1.5, -2.0, 0.25], np.float32))
    indices = tensor("s_indices", np.array([1, 4, 6], np.int64))
    sparse = helper.make_sparse_tensor(values, indices, [2, 4])
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "s"], ["y"], name="add"),
         helper.make_node("Identity", ["s"], ["s_out"], name="show")],
        "sparse", [value("x", shape=[2, 4])],
        [value("y", shape=[2, 4]), value("s_out", shape=[2, 4])],
        sparse_initializer=[sparse])
    built = model(graph)
    held = built.graph.sparse_initializer[0]
    return Template("sparse", built, feeds_for(12, {"x": [2, 4]}),
                    [("sparse initializer s values", held.values),
                     ("sparse initializer s indices", held.indices)])


TEMPLATES = {"dense": _dense, "table": _table, "constant-node": _constant_node,
             "branch": _branch, "function": _function, "sparse": _sparse}


# ---------------------------------------------------------------------------- layout


class _Files:
    """The files of a case being laid out: data files built up piece by piece (several
    tensors may share one), plus symlinks, directories and FIFOs."""

    def __init__(self) -> None:
        self.data: dict[str | bytes, bytearray] = {}
        self.others: list[Entry] = []

    def put(self, path: str | bytes, content: bytes, offset: int | None = None) -> int:
        """Place ``content`` in file ``path`` at ``offset`` (default: the end, after filler
        to a random-ish alignment); returns the offset used."""
        buffer = self.data.setdefault(path, bytearray())
        at = len(buffer) if offset is None else offset
        if len(buffer) < at:
            buffer += (FILLER * (at // len(FILLER) + 1))[: at - len(buffer)]
        buffer[at:at + len(content)] = content
        return at

    def pad(self, path: str | bytes, extra: int) -> None:
        self.data.setdefault(path, bytearray()).extend((FILLER * (extra // 4 + 1))[:extra])

    def entries(self) -> list[Entry]:
        return [Entry(p, data=bytes(b)) for p, b in self.data.items()] + self.others


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name


@dataclass
class _Placement:
    """Where a case's legitimate data lives, and everything around it."""

    allowed: str | None          # the allowed directory (relative to scratch), None: none
    data_dir: str                # where the case puts the legitimate files
    depth: int                   # path components of data_dir below the scratch dir


def _externalize(tensor_proto: TensorProto, entries: dict[str, str]) -> bytes:
    """Move the tensor's bytes out (returns them) and point it at ``entries``."""
    if not tensor_proto.HasField("raw_data"):
        tensor_proto.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor_proto),
                                                      tensor_proto.name))
    raw = tensor_proto.raw_data
    tensor_proto.ClearField("raw_data")
    tensor_proto.data_location = TensorProto.EXTERNAL
    del tensor_proto.external_data[:]
    for key, text in entries.items():
        tensor_proto.external_data.add(key=key, value=text)
    return raw


def _variant(rng: random.Random, index: int, raw: bytes, tensor_proto: TensorProto,
             place: _Placement, files: _Files, cwd_names: list[str]) -> tuple[str, str]:
    """Lay out one external tensor for a drawn variant; returns (variant, description)."""
    group = rng.choices(["valid", "odd", "hostile"], [3, 1, 5])[0]
    variant = rng.choice({"valid": VALID, "odd": ODD, "hostile": HOSTILE}[group])
    here = place.data_dir
    up = "/".join([".."] * place.depth)
    name = f"w{index}.bin"
    entries: dict[str, str] = {}
    size = len(raw)

    def legit(location: str, offset: int | None = None, with_length: bool | None = None) -> None:
        at = files.put(_join(here, location), raw, offset)
        entries["location"] = location
        if at or rng.random() < 0.5:
            entries["offset"] = str(at)
        if with_length if with_length is not None else rng.random() < 0.6:
            entries["length"] = str(size)
        cwd_names.append(location)

    if variant == "plain":
        legit(name)
    elif variant == "offset":
        legit(name, rng.choice([1, 3, 16, 4096, 65536 + 7]))
    elif variant == "shared":
        legit("weights.bin")
    elif variant == "subdir":
        legit(rng.choice([f"sub/{name}", f"sub/deeper/{name}"]))
    elif variant == "trailing":
        legit(name, with_length=True)
        files.pad(_join(here, name), rng.choice([1, 7, 4096]))
    elif variant == "unicode":
        legit(f"w\u00e9ight \u540d {index}.bin")
    elif variant == "dot-path":
        files.put(_join(here, f"sub/{name}"), raw, 0)
        entries["location"] = rng.choice([f"./sub/{name}", f"sub//{name}", f"sub/./{name}",
                                          f"./sub/./{name}"])
    elif variant == "odd-number":
        text = rng.choice(ODD_NUMBERS)
        files.put(_join(here, name), raw, int(text))
        entries.update(location=name, offset=text)
    elif variant == "symlink-inside":
        files.put(_join(here, name), raw, 0)
        files.others.append(Entry(_join(here, f"alias{index}.bin"), "symlink", target=name))
        entries["location"] = f"alias{index}.bin"
    elif variant == "absolute-inside":
        files.put(_join(here, name), raw, 0)
        entries["location"] = f"{SCRATCH}/{_join(here, name)}"
    elif variant == "traversal-inside":
        files.put(_join(here, name), raw, 0)
        files.others.append(Entry(_join(here, "sub"), "dir"))
        entries["location"] = f"sub/../{name}"
    elif variant == "stale-entries":
        # The data stays inline (DEFAULT location): external_data entries are to be ignored.
        tensor_proto.external_data.add(key="location", value=f"{up}/outside/secret.bin")
        return variant, f"inline data with stale external_data entries ({variant})"
    elif variant == "absolute-outside":
        entries["location"] = f"{SCRATCH}/outside/secret.bin"
    elif variant == "traversal":
        entries["location"] = rng.choice([f"{up}/outside/secret.bin",
                                          f"sub/../{up}/outside/secret.bin",
                                          f"./{up}//outside/secret.bin",
                                          f"{up}/outside/./secret.bin"])
    elif variant == "symlink-file-out":
        target = rng.choice([f"{SCRATCH}/outside/secret.bin", f"{up}/outside/secret.bin"])
        files.others.append(Entry(_join(here, f"link{index}.bin"), "symlink", target=target))
        entries["location"] = f"link{index}.bin"
    elif variant == "symlink-dir-out":
        files.others.append(Entry(_join(here, f"linkdir{index}"), "symlink",
                                  target=f"{SCRATCH}/outside"))
        entries["location"] = f"linkdir{index}/secret.bin"
    elif variant == "symlink-dangling":
        files.others.append(Entry(_join(here, f"dangling{index}.bin"), "symlink",
                                  target="nowhere.bin"))
        entries["location"] = f"dangling{index}.bin"
    elif variant == "symlink-loop":
        files.others += [Entry(_join(here, f"loop{index}a"), "symlink", target=f"loop{index}b"),
                         Entry(_join(here, f"loop{index}b"), "symlink", target=f"loop{index}a")]
        entries["location"] = f"loop{index}a"
    elif variant == "symlink-dev-zero":
        files.others.append(Entry(_join(here, f"zero{index}.bin"), "symlink",
                                  target="/dev/zero"))
        entries["location"] = f"zero{index}.bin"
    elif variant == "directory":
        files.others.append(Entry(_join(here, f"folder{index}"), "dir"))
        entries["location"] = rng.choice([f"folder{index}", ".", f"folder{index}/"])
    elif variant == "fifo":
        files.others.append(Entry(_join(here, f"pipe{index}.bin"), "fifo"))
        entries["location"] = f"pipe{index}.bin"
    elif variant == "device":
        entries["location"] = rng.choice(["/dev/zero", "/dev/urandom", "/dev/null",
                                          f"{up}/{up}/{up}/{up}/{up}/dev/zero"])
    elif variant == "proc":
        entries["location"] = rng.choice(["/proc/self/environ", "/proc/self/mem",
                                          "/proc/self/cmdline", "/etc/passwd"])
    elif variant == "missing":
        entries["location"] = f"missing{index}.bin"
    elif variant == "cwd-only":
        # Exists only in the working directory (holding the sentinel): never to be read.
        entries["location"] = f"cwd{index}.bin"
        cwd_names.append(f"cwd{index}.bin")
    elif variant == "offset-past-end":
        files.put(_join(here, name), raw, 0)
        entries.update(location=name, offset=str(size + rng.choice([1, 4096, 1 << 30])))
    elif variant == "length-past-end":
        files.put(_join(here, name), raw, 0)
        entries.update(location=name, length=str(size + rng.choice([1, 4, 4096])))
    elif variant == "short-length":
        files.put(_join(here, name), raw, 0)
        entries.update(location=name, length=str(max(size - rng.choice([1, 4]), 0)))
    elif variant == "negative":
        files.put(_join(here, name), raw, 0)
        entries.update(location=name, **{rng.choice(["offset", "length"]):
                                         rng.choice(["-1", "-4", str(-(2**63))])})
    elif variant == "huge-number":
        files.put(_join(here, name), raw, 0)
        entries.update(location=name, **{rng.choice(["offset", "length"]):
                                         rng.choice([str(2**63 - 1), str(2**64),
                                                     "9" * 40, str(2**31)])})
    elif variant == "not-a-number":
        files.put(_join(here, name), raw, 0)
        entries.update(location=name, **{rng.choice(["offset", "length"]):
                                         rng.choice(["", "0x10", "1e3", "nan", "four", "1.0",
                                                     "\u0661"])})
    elif variant == "offset-overflow":
        files.put(_join(here, name), raw, 0)
        entries.update(location=name, offset=str(2**64 - size // 2))
    elif variant == "duplicate-key":
        files.put(_join(here, name), raw, 0)
        first, second = name, f"{up}/outside/secret.bin"
        if rng.random() < 0.5:
            first, second = second, first
        _externalize(tensor_proto, {})
        tensor_proto.external_data.add(key="location", value=first)
        tensor_proto.external_data.add(key="location", value=second)
        return variant, f"location given twice: {first!r} then {second!r}"
    elif variant == "no-location":
        files.put(_join(here, name), raw, 0)
        entries.update(offset="0", length=str(size))
    elif variant == "empty-location":
        entries["location"] = ""
    elif variant == "nul":
        files.put(_join(here, name), raw, 0)
        entries["location"] = f"{name}\x00/{up}/outside/secret.bin"
    elif variant == "non-utf8":
        # The file exists under its non-UTF-8 name, with the right data.
        files.put(os.fsencode(_join(here, "")) + b"w" + NON_UTF8_BYTES + b".bin", raw, 0)
        entries["location"] = "w" + NON_UTF8_PLACEHOLDER.decode() + ".bin"
    elif variant == "backslash":
        files.put(_join(here, f"sub/{name}"), raw, 0)
        entries["location"] = rng.choice([f"sub\\{name}", f"..\\..\\outside\\secret.bin"])
    elif variant == "long-name":
        entries["location"] = "a" * rng.choice([256, 4096, 100_000])
    elif variant == "deep-path":
        entries["location"] = "d/" * rng.choice([100, 2000]) + name
    elif variant == "huge-dims":
        legit(name)
        del tensor_proto.dims[:]
        tensor_proto.dims.extend(rng.choice([[2**40], [2**31, 2**31], [2**62, 4]]))
    elif variant == "external-and-raw":
        if rng.random() < 0.5:
            legit(name)
        else:
            entries["location"] = f"{up}/outside/secret.bin"
        _externalize(tensor_proto, entries)
        tensor_proto.raw_data = raw
        return variant, f"data inline and external at once (location {entries['location']!r})"
    raw_entries = dict(entries)
    _externalize(tensor_proto, raw_entries)
    shown = ", ".join(f"{k}={v!r}" if len(v) < 80 else f"{k}=<{len(v)} chars>"
                      for k, v in raw_entries.items())
    return variant, f"{variant} ({shown})"


def external(rng: random.Random, number: int) -> Mutant:
    """A template with 1-3 tensors moved to external files, handed over as a path, bytes or
    a ModelProto, with or without base_dir=, in a working directory that may hold decoys."""
    template_name = rng.choice(sorted(TEMPLATES))
    template = TEMPLATES[template_name](rng)
    oracle_data = template.model.SerializeToString()
    source = rng.choices(["path", "bytes", "proto"], [2, 1, 1])[0]
    bases = {"none": 3, "model": 2, "alt": 2, "inner": 1, "relative": 1, "link": 1,
             "missing": 0.5, "file": 0.5}
    base = rng.choices(sorted(bases), [bases[b] for b in sorted(bases)])[0]
    if source == "path" and base == "none":
        place, base_dir = _Placement("model", "model", 1), None
    elif base == "none":
        place, base_dir = _Placement(None, "model", 1), None
    elif base == "model":
        place, base_dir = _Placement("model", "model", 1), f"{SCRATCH}/model"
    elif base == "inner":
        place, base_dir = _Placement("model/inner", "model/inner", 2), f"{SCRATCH}/model/inner"
    elif base == "relative":
        place, base_dir = _Placement("alt", "alt", 1), "alt"  # relative to the cwd: scratch
    elif base == "link":
        place, base_dir = _Placement("alt", "alt", 1), f"{SCRATCH}/altlink"
    elif base == "missing":
        place, base_dir = _Placement(None, "alt", 1), f"{SCRATCH}/no_such_dir"
    elif base == "file":
        place, base_dir = _Placement(None, "model", 1), f"{SCRATCH}/model/model.onnx"
    else:
        place, base_dir = _Placement("alt", "alt", 1), f"{SCRATCH}/alt"
    cwd = "" if base == "relative" else rng.choice([None, "outside", "outside"])

    working = onnx.ModelProto()
    working.CopyFrom(template.model)
    sites = _sites(working, template)
    count = rng.randint(1, len(sites))
    chosen = sorted(rng.sample(range(len(sites)), count))
    files = _Files()
    cwd_names: list[str] = []
    variants, details = [], []
    for index in chosen:
        label, proto = sites[index]
        raw = numpy_helper.from_array(numpy_helper.to_array(proto)).raw_data
        variant, detail = _variant(rng, index, raw, proto, place, files, cwd_names)
        variants.append(variant)
        details.append(f"{label}: {detail}")

    layout = files.entries()
    layout.append(Entry("outside/secret.bin", data=sentinel_block()))
    decoys = set(cwd_names)
    for location in sorted(decoys):
        safe = location.lstrip("/")
        if ".." in safe.split("/") or "\x00" in safe or not safe or len(safe) > 200:
            continue
        layout.append(Entry(f"outside/{safe}", data=sentinel_block()))  # the cwd's copy
        if place.data_dir != "model":
            layout.append(Entry(f"model/{safe}", data=sentinel_block()))  # the model dir's
    if base == "link":
        layout.append(Entry("altlink", "symlink", target=f"{SCRATCH}/alt"))
    layout += [Entry("alt", "dir"), Entry("model", "dir")]
    data = working.SerializeToString()
    patches = [(NON_UTF8_PLACEHOLDER, NON_UTF8_BYTES)] if "non-utf8" in variants else []
    valid = place.allowed is not None and all(v in VALID for v in variants)
    description = (f"{template_name} as {source}, base_dir={_show(base_dir)}, cwd={_show(cwd)}: "
                   + "; ".join(details))
    return Mutant(data, description, feed_overrides=template.feeds, layout=layout,
                  source=source, base_dir=base_dir, cwd=cwd, byte_patches=patches,
                  oracle_data=oracle_data, must_succeed=valid, sentinel=SENTINEL,
                  budgets={"compile": 30.0, "run": 20.0})


def _show(path: str | None) -> str:
    if path is None:
        return "not given"
    return path.replace(SCRATCH, "<scratch>") if path else "<scratch>"


def _sites(working: onnx.ModelProto, template: Template) -> list[tuple[str, TensorProto]]:
    """The template's externalizable tensors, found again in the copy ``working``."""
    found: dict[str, TensorProto] = {}
    graph = working.graph
    for t in graph.initializer:
        found[f"initializer {t.name}"] = t
    for sparse in graph.sparse_initializer:
        found[f"sparse initializer {sparse.values.name} values"] = sparse.values
        found[f"sparse initializer {sparse.values.name} indices"] = sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                found[f"node {node.name} attribute {attr.name}"] = attr.t
            if attr.HasField("g"):
                prefix = "then-branch" if attr.name == "then_branch" else "else-branch"
                for t in attr.g.initializer:
                    found[f"{prefix} initializer {t.name}"] = t
    for function in working.functions:
        for node in function.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    found[f"function {function.name} constant {node.name}"] = attr.t
    result = []
    for label, original in template.sites:
        key = next((k for k, t in found.items() if t.SerializeToString() ==
                    original.SerializeToString() and k not in {r[0] for r in result}), None)
        assert key is not None, f"template site {label} not found"
        result.append((key, found[key]))
    return result

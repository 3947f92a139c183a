"""Mutations of stored tensors: their encoding (``init``) and the values of index and shape
constants (``const``).

``init`` damages how a tensor is stored -- truncated or oversized raw data, dims that
disagree with the data, external data pointing outside the model directory, sparse
initializers with out-of-range indices -- which the importer must refuse before the bytes
are reinterpreted.  ``const`` keeps tensors well-formed but gives index, axis and shape
constants values out of range, which constant folding, shape inference and the compiled
index arithmetic must all refuse (or handle as ONNX says) rather than read out of bounds.
"""

from __future__ import annotations

import random

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fuzz.hostile import HOSTILE_DIMS, HOSTILE_INTS
from fuzz.mutate.base import Mutant, NotApplicable, apply_sub_mutations, pick, pick_named
from fuzz.mutate.walk import graphs, tensors

# ---------------------------------------------------------------------------- init


def _as_raw(tensor: onnx.TensorProto) -> bytes:
    """Re-encode a tensor with its data in raw_data (the common storage) and return it."""
    if not tensor.HasField("raw_data"):
        array = numpy_helper.to_array(tensor)
        tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
    return tensor.raw_data


def _numeric_tensor(model: onnx.ModelProto, rng: random.Random) -> tuple[str, TensorProto]:
    sites = [(label, t) for label, t in tensors(model)
             if t.data_type not in (TensorProto.STRING, TensorProto.UNDEFINED)]
    return pick(rng, sites, "numeric tensor")


def _truncate_raw(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tensor = _numeric_tensor(model, rng)
    raw = _as_raw(tensor)
    keep = pick(rng, [0, len(raw) // 2, max(len(raw) - 1, 0)])
    tensor.raw_data = raw[:keep]
    return f"{label} raw_data truncated {len(raw)} -> {keep} bytes"


def _extend_raw(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tensor = _numeric_tensor(model, rng)
    raw = _as_raw(tensor)
    extra = pick(rng, [1, 3, 4, 4096])
    tensor.raw_data = raw + bytes(extra)
    return f"{label} raw_data {len(raw)} -> {len(raw) + extra} bytes (too many)"


def _dims_disagree(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tensor = _numeric_tensor(model, rng)
    _as_raw(tensor)
    old = list(tensor.dims)
    how = pick(rng, ["value", "add", "remove"])
    if how == "value" and old:
        index = rng.randrange(len(old))
        name, value = pick_named(rng, HOSTILE_DIMS)
        tensor.dims[index] = value
        detail = f"dim {index} = {name} ({value})"
    elif how == "remove" and old:
        del tensor.dims[-1]
        detail = "last dim removed"
    else:
        tensor.dims.append(pick(rng, [2, 0, 2**31]))
        detail = f"dim {tensor.dims[-1]} appended"
    return f"{label} dims {old} {detail} (data unchanged)"


def _overflowing_dims(model: onnx.ModelProto, rng: random.Random) -> str:
    """Dims whose product overflows int64 (or wraps to the true element count)."""
    label, tensor = _numeric_tensor(model, rng)
    _as_raw(tensor)
    old = list(tensor.dims)
    del tensor.dims[:]
    tensor.dims.extend(pick(rng, [[2**32, 2**32], [2**62, 4], [-1, -len(tensor.raw_data)],
                                  [2**63 - 1, 2**63 - 1]]))
    return f"{label} dims {old} -> {list(tensor.dims)} (product overflows)"


def _typed_count(model: onnx.ModelProto, rng: random.Random) -> str:
    sites = [(lb, t) for lb, t in tensors(model) if t.data_type == TensorProto.FLOAT]
    label, tensor = pick(rng, sites, "float tensor")
    values = numpy_helper.to_array(tensor).reshape(-1).tolist()
    tensor.ClearField("raw_data")
    del tensor.float_data[:]
    delta = pick(rng, [-1, 1])
    tensor.float_data.extend(values[:-1] if delta < 0 else values + [0.0])
    return f"{label} float_data holds {len(values) + delta} values for {len(values)} elements"


def _raw_and_typed(model: onnx.ModelProto, rng: random.Random) -> str:
    sites = [(lb, t) for lb, t in tensors(model) if t.data_type == TensorProto.FLOAT]
    label, tensor = pick(rng, sites, "float tensor")
    raw = _as_raw(tensor)
    tensor.float_data.extend([123.0] * (len(raw) // 4))
    return f"{label} has both raw_data and float_data (different values)"


def _string_data(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tensor = _numeric_tensor(model, rng)
    tensor.ClearField("raw_data")
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        tensor.ClearField(field)
    tensor.string_data.extend([b"fuzz"] * max(1, int(np.prod(tensor.dims))))
    return f"{label} data given as string_data for data_type {tensor.data_type}"


def _segment(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tensor = _numeric_tensor(model, rng)
    tensor.segment.begin, tensor.segment.end = 0, 1
    return f"{label} marked as a segment [0, 1)"


def _external(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    """Move a tensor's data to an external file; the worker passes the model as a path so the
    references are resolved relative to the model's directory."""
    label, tensor = _numeric_tensor(model, rng)
    raw = _as_raw(tensor)
    variants = {
        "valid": ("data.bin", 0, len(raw)),
        "offset-past-end": ("data.bin", 1 << 20, len(raw)),
        "length-past-end": ("data.bin", 0, len(raw) + 4096),
        "short-length": ("data.bin", 0, max(len(raw) - 4, 0)),
        "missing-file": ("no_such_file.bin", 0, len(raw)),
        "absolute-path": ("/etc/hostname", 0, None),
        "traversal": ("../../../../../../etc/passwd", 0, None),
        "dev-zero": ("/dev/zero", 0, None),
        "dev-zero-sized": ("/dev/zero", 0, len(raw)),
        "directory": (".", 0, None),
        "proc": ("/proc/self/environ", 0, None),
    }
    variant, (location, offset, length) = pick_named(rng, variants)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    entries = {"location": location, "offset": str(offset)}
    if length is not None:
        entries["length"] = str(length)
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    return Mutant(model.SerializeToString(),
                  f"{label} data external: {variant} (location {location!r}, offset {offset}, "
                  f"length {length})", files={"data.bin": raw}, as_file=True)


def _sparse(model: onnx.ModelProto, rng: random.Random) -> str:
    """Replace a dense float initializer of the main graph by a sparse one (valid variant, or
    indices out of range, negative, miscounted or mis-shaped)."""
    graph = model.graph
    dense = pick(rng, [t for t in graph.initializer if t.data_type == TensorProto.FLOAT
                       and len(t.dims) >= 1], "float initializer")
    array = numpy_helper.to_array(dense)
    flat = array.reshape(-1)
    chosen = np.array(sorted(rng.sample(range(flat.size), min(3, flat.size))), dtype=np.int64)
    values = flat[chosen].astype(np.float32)
    variant = pick(rng, ["valid", "index-past-end", "index-huge", "index-negative",
                         "count-mismatch", "coo-wrong-shape", "duplicate-index"])
    indices = chosen.copy()
    if variant == "index-past-end":
        indices[-1] = flat.size
    elif variant == "index-huge":
        indices[-1] = 2**62
    elif variant == "index-negative":
        indices[0] = -1
    elif variant == "count-mismatch":
        indices = np.append(indices, 0)
    elif variant == "duplicate-index" and indices.size > 1:
        indices[1] = indices[0]
    index_tensor = numpy_helper.from_array(indices, "")
    if variant == "coo-wrong-shape":
        index_tensor = numpy_helper.from_array(
            np.stack([indices, indices, indices], axis=1)[:, : array.ndim + 1], "")
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(values, dense.name),
                                       index_tensor, list(array.shape))
    graph.initializer.remove(dense)
    graph.sparse_initializer.append(sparse)
    return f"initializer '{dense.name}' {list(array.shape)} stored sparse: {variant}"


def _duplicate_initializer(model: onnx.ModelProto, rng: random.Random) -> str:
    graph = model.graph
    tensor = pick(rng, [t for t in graph.initializer
                        if t.data_type == TensorProto.FLOAT], "float initializer")
    twin = numpy_helper.from_array(numpy_helper.to_array(tensor) + 1.0, tensor.name)
    graph.initializer.append(twin)
    return f"initializer '{tensor.name}' defined twice with different values"


def _nameless(model: onnx.ModelProto, rng: random.Random) -> str:
    label, graph = pick(rng, [(lb, g) for lb, g in graphs(model) if g.initializer],
                        "graph with initializers")
    tensor = pick(rng, list(graph.initializer))
    old = tensor.name
    tensor.name = ""
    return f"{label} initializer '{old}' has no name"


def mutate_initializers(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    return apply_sub_mutations(model, rng, {
        "truncate-raw": _truncate_raw, "extend-raw": _extend_raw,
        "dims-disagree": _dims_disagree, "overflowing-dims": _overflowing_dims,
        "typed-count": _typed_count, "raw-and-typed": _raw_and_typed,
        "string-data": _string_data, "segment": _segment, "external": _external,
        "sparse": _sparse, "duplicate": _duplicate_initializer, "nameless": _nameless,
    })


# ---------------------------------------------------------------------------- const

# Inputs (by position) that hold indices, axes or shapes, per op.
INDEX_INPUTS: dict[str, tuple[int, ...]] = {
    "Gather": (1,), "GatherElements": (1,), "GatherND": (1,), "Reshape": (1,),
    "Slice": (1, 2, 3, 4), "Unsqueeze": (1,), "Squeeze": (1,), "Expand": (1,), "Tile": (1,),
    "Pad": (1,), "ReduceSum": (1,), "ReduceMean": (1,), "TopK": (1,), "OneHot": (1,),
    "Split": (1,), "ScatterElements": (1,), "ScatterND": (1,), "Range": (0, 1, 2),
    "ConstantOfShape": (0,), "Resize": (3,), "CumSum": (1,),
}


def _index_sites(model: onnx.ModelProto) -> list[tuple[str, onnx.GraphProto, TensorProto]]:
    """(description, graph, tensor) of every initializer feeding an index-like input."""
    found = []
    for label, graph in graphs(model):
        by_name = {t.name: t for t in graph.initializer}
        for node in graph.node:
            for position in INDEX_INPUTS.get(node.op_type, ()):
                if position < len(node.input) and node.input[position] in by_name:
                    tensor = by_name[node.input[position]]
                    found.append((f"{label}:{node.name} ({node.op_type}) input {position} "
                                  f"'{tensor.name}'", graph, tensor))
    return found


def _const_element(model: onnx.ModelProto, rng: random.Random) -> str:
    label, _, tensor = pick(rng, _index_sites(model), "index constant")
    array = numpy_helper.to_array(tensor).astype(np.int64)
    flat = array.reshape(-1).copy()
    if flat.size == 0:
        raise NotApplicable("empty index tensor")
    index = rng.randrange(flat.size)
    name, value = pick_named(rng, {**HOSTILE_INTS, "just-past-end": 3, "five": 5,
                                   "minus-five": -5})
    old = flat[index]
    flat[index] = value
    tensor.CopyFrom(numpy_helper.from_array(flat.reshape(array.shape), tensor.name))
    return f"{label} element {index} {old} -> {name} ({value})"


def _const_plausible(model: onnx.ModelProto, rng: random.Random) -> str:
    """Another small index (-3..3): often still valid, selecting other elements or axes, so
    the result must follow (constant folding and the compiled gather/slice both see it)."""
    label, _, tensor = pick(rng, _index_sites(model), "index constant")
    array = numpy_helper.to_array(tensor).astype(np.int64)
    flat = array.reshape(-1).copy()
    if flat.size == 0:
        raise NotApplicable("empty index tensor")
    index = rng.randrange(flat.size)
    old = int(flat[index])
    flat[index] = pick(rng, [v for v in (-3, -2, -1, 0, 1, 2, 3) if v != old])
    tensor.CopyFrom(numpy_helper.from_array(flat.reshape(array.shape), tensor.name))
    return f"{label} element {index} {old} -> {int(flat[index])}"


def _const_shape(model: onnx.ModelProto, rng: random.Random) -> str:
    label, _, tensor = pick(rng, _index_sites(model), "index constant")
    array = numpy_helper.to_array(tensor).astype(np.int64)
    how = pick(rng, ["scalar", "vector", "empty", "matrix", "longer"])
    if how == "scalar":
        new = np.array(array.reshape(-1)[0] if array.size else 0, dtype=np.int64)
    elif how == "vector":
        new = array.reshape(-1)
    elif how == "empty":
        new = np.zeros((0,), dtype=np.int64)
    elif how == "matrix":
        new = array.reshape(1, -1)
    else:
        new = np.concatenate([array.reshape(-1), array.reshape(-1)])
    tensor.CopyFrom(numpy_helper.from_array(new, tensor.name))
    return f"{label} reshaped {list(array.shape)} -> {list(new.shape)} ({how})"


def _const_dtype(model: onnx.ModelProto, rng: random.Random) -> str:
    label, _, tensor = pick(rng, _index_sites(model), "index constant")
    array = numpy_helper.to_array(tensor)
    dtype = pick(rng, [np.int32, np.float32, np.uint64, np.int8, np.bool_])
    tensor.CopyFrom(numpy_helper.from_array(array.astype(dtype), tensor.name))
    return f"{label} stored as {np.dtype(dtype).name}"


def _runtime_index(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    """Turn a Gather's constant indices into a graph input and feed out-of-range indices:
    the compiled gather must check its indices at run time."""
    sites = [(lb, g, t) for lb, g, t in _index_sites(model)
             if "(Gather)" in lb and g is model.graph]
    label, graph, tensor = pick(rng, sites, "main-graph Gather index")
    array = numpy_helper.to_array(tensor).astype(np.int64)
    graph.initializer.remove(tensor)
    graph.input.append(helper.make_tensor_value_info(tensor.name, TensorProto.INT64,
                                                     list(array.shape)))
    name, value = pick_named(rng, {"past-end": 1000, "negative-past-start": -1000,
                                   "int64-max": 2**63 - 1, "int64-min": -(2**63),
                                   "in-range-negative": -1})
    feed = array.copy()
    feed.reshape(-1)[0] = value
    return Mutant(model.SerializeToString(),
                  f"{label} becomes a run-time input fed {feed.tolist()} ({name})",
                  feed_overrides={tensor.name: feed})


def _constant_node(model: onnx.ModelProto, rng: random.Random) -> str:
    """Replace an index initializer by a Constant node holding an out-of-range value (the
    importer stores those differently from initializers)."""
    label, graph, tensor = pick(rng, _index_sites(model), "index constant")
    array = numpy_helper.to_array(tensor).astype(np.int64)
    bad = np.full_like(array, pick(rng, [99, -99, 2**40]))
    graph.initializer.remove(tensor)
    graph.node.insert(0, helper.make_node("Constant", [], [tensor.name], name="fuzz_const",
                                          value=numpy_helper.from_array(bad, "v")))
    return f"{label} from a Constant node holding {bad.reshape(-1)[:4].tolist()}"


def mutate_constants(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    return apply_sub_mutations(model, rng, {
        "element": _const_element, "plausible": _const_plausible, "shape": _const_shape,
        "dtype": _const_dtype,
        "runtime-index": _runtime_index, "constant-node": _constant_node,
    })


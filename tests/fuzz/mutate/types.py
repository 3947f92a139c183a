"""Mutations of declared types: tensor dimensions (``dims``) and element types (``dtype``).

Declared types are the part of a model an importer is most tempted to trust: a negative or
2**40 dimension flows into memory planning and buffer sizes, an element type into code
generation, unless something checks them first.
"""

from __future__ import annotations

import random

import onnx
from onnx import AttributeProto, TensorProto

from fuzz.hostile import HOSTILE_DIMS, HOSTILE_NAMES
from fuzz.mutate.base import Mutant, NotApplicable, apply_sub_mutations, pick, pick_named, short
from fuzz.mutate.walk import node_sites, tensor_value_infos, tensors

DIM_PARAMS = ["N", "batch", "", "-1", "0", "2", HOSTILE_NAMES["comment-close"],
              HOSTILE_NAMES["nul"], HOSTILE_NAMES["every-byte"]]


def _typed_site(model: onnx.ModelProto, rng: random.Random,
                with_dims: bool = False) -> tuple[str, onnx.TypeProto.Tensor]:
    sites = [(label, vi.type.tensor_type) for label, vi in tensor_value_infos(model)]
    if with_dims:
        sites = [(label, tt) for label, tt in sites if len(tt.shape.dim)]
    label, tensor_type = pick(rng, sites, "declared tensor type")
    return label, tensor_type


def _dim_value(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tt = _typed_site(model, rng, with_dims=True)
    index = rng.randrange(len(tt.shape.dim))
    name, value = pick_named(rng, HOSTILE_DIMS)
    tt.shape.dim[index].dim_value = value
    return f"{label} dim {index} = {name} ({value})"


def _dim_param(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tt = _typed_site(model, rng, with_dims=True)
    index = rng.randrange(len(tt.shape.dim))
    param = pick(rng, DIM_PARAMS)
    tt.shape.dim[index].dim_param = param
    return f"{label} dim {index} = symbol {short(param)}"


def _dim_unknown(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tt = _typed_site(model, rng, with_dims=True)
    index = rng.randrange(len(tt.shape.dim))
    tt.shape.dim[index].Clear()
    return f"{label} dim {index} has neither value nor symbol"


def _drop_shape(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tt = _typed_site(model, rng)
    tt.ClearField("shape")
    return f"{label} has no shape (unknown rank)"


def _scalar(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tt = _typed_site(model, rng, with_dims=True)
    del tt.shape.dim[:]
    tt.shape.SetInParent()
    return f"{label} declared as a scalar (rank 0)"


def _add_dim(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tt = _typed_site(model, rng)
    dims = [(d.dim_value, d.dim_param) for d in tt.shape.dim]
    position = rng.randrange(len(dims) + 1)
    value = pick(rng, [1, 2, 0, -1, 2**40])
    dims.insert(position, (value, ""))
    del tt.shape.dim[:]
    for dim_value, dim_param in dims:
        dim = tt.shape.dim.add()
        if dim_param:
            dim.dim_param = dim_param
        else:
            dim.dim_value = dim_value
    return f"{label} gains a dim {value} at position {position} (rank {len(dims)})"


def _remove_dim(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tt = _typed_site(model, rng, with_dims=True)
    index = rng.randrange(len(tt.shape.dim))
    del tt.shape.dim[index]
    return f"{label} loses dim {index} (rank {len(tt.shape.dim)})"


def _resize_input(model: onnx.ModelProto, rng: random.Random) -> str:
    """Give one input dim another small size and forget every other declared shape.  For a
    free dim (a batch, an image side) the model stays valid and computes something new, at
    sizes that leave remainders in every tiled loop -- where schedules go wrong."""
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    inputs = [vi for vi in graph.input if vi.name not in weights
              and vi.type.tensor_type.shape.dim]
    target = pick(rng, inputs, "input with dims")
    index = rng.randrange(len(target.type.tensor_type.shape.dim))
    size = pick(rng, [1, 2, 3, 5, 7, 13, 17, 31, 64])
    target.type.tensor_type.shape.dim[index].dim_value = size
    del graph.value_info[:]
    for output in graph.output:
        output.type.tensor_type.ClearField("shape")
    return f"input '{target.name}' dim {index} = {size}; other declared shapes dropped"


def mutate_dims(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    return apply_sub_mutations(model, rng, {
        "resize-input": _resize_input,
        "dim-value": _dim_value, "dim-param": _dim_param, "dim-unknown": _dim_unknown,
        "drop-shape": _drop_shape, "scalar": _scalar, "add-dim": _add_dim,
        "remove-dim": _remove_dim,
    })


# Every element type ONNX defines, plus values no version defines.
ELEM_TYPES: dict[str, int] = {**{name: value for name, value in TensorProto.DataType.items()},
                              "out-of-range-999": 999, "negative": -1}


def _elem_type_name(value: int) -> str:
    return next((name for name, v in ELEM_TYPES.items() if v == value), str(value))


def _declared_elem_type(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tt = _typed_site(model, rng)
    old = tt.elem_type
    name, value = pick_named(rng, ELEM_TYPES)
    tt.elem_type = value
    return f"{label} elem_type {_elem_type_name(old)} -> {name}"


def _tensor_data_type(model: onnx.ModelProto, rng: random.Random) -> str:
    label, tensor = pick(rng, tensors(model), "tensor")
    old = tensor.data_type
    name, value = pick_named(rng, ELEM_TYPES)
    tensor.data_type = value
    return f"{label} data_type {_elem_type_name(old)} -> {name} (same bytes reinterpreted)"


def _cast_target(model: onnx.ModelProto, rng: random.Random) -> str:
    """Cast's ``to`` is an element type held in an INT attribute: add a Cast when the model
    has none, so every seed exercises it."""
    casts = [s for s in node_sites(model) if s.node.op_type == "Cast"]
    name, value = pick_named(rng, ELEM_TYPES)
    if casts:
        site = pick(rng, casts)
        for attr in site.node.attribute:
            if attr.name == "to":
                attr.i = value
        return f"{site.label} Cast to={name}"
    graph = model.graph
    if not graph.output:
        raise NotApplicable("graph has no output")
    output = graph.output[0].name
    for node in graph.node:
        for i, out in enumerate(node.output):
            if out == output:
                node.output[i] = "fuzz_precast"
    graph.node.append(onnx.helper.make_node("Cast", ["fuzz_precast"], [output],
                                            name="fuzz_cast", to=value))
    if value in TensorProto.DataType.values():
        graph.output[0].type.tensor_type.elem_type = value
    return f"new Cast to={name} before output '{output}'"


def _cast_attr_kind(model: onnx.ModelProto, rng: random.Random) -> str:
    casts = [s for s in node_sites(model) if s.node.op_type == "Cast"]
    site = pick(rng, casts, "Cast node")
    for attr in site.node.attribute:
        if attr.name == "to":
            attr.type = AttributeProto.STRING
            attr.s = b"float"
    return f"{site.label} Cast to='float' (a string)"


def mutate_dtype(model: onnx.ModelProto, rng: random.Random) -> Mutant:
    return apply_sub_mutations(model, rng, {
        "declared-elem-type": _declared_elem_type, "tensor-data-type": _tensor_data_type,
        "cast-target": _cast_target, "cast-attr-kind": _cast_attr_kind,
    })

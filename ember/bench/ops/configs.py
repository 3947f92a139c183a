"""The distinct benched-op configurations of exported models, and how often each occurs.

Each file is shape-inferred, and every benched node is keyed by (op, input shapes,
attributes with ONNX's defaults filled in, which inputs are constants, dtype): the two
exporters' spellings of one Gemm (one writes ``transA=0``, the other leaves it out) are one
configuration.  Dims ONNX's inference leaves unknown come from ember's own inference; nodes
still without static shapes (or not float32) are skipped and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from ember.bench.ops.summary import shape_text, summarize

BENCHED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
# Initializers with more elements than this are given to shape inference as typed graph
# inputs instead: inference needs only their shapes, and copying BERT's 440 MB of weights
# into the probe model would double the memory.  Small ones (Reshape targets) keep their
# values, which inference does need.
INLINE_ELEMENTS = 4096

Shape = tuple[int, ...]
# A value's (ONNX element type, shape) as inferred: a dim is None when it is not a known
# number, the shape None when even the rank is unknown.
InferredType = tuple[int, tuple[int | None, ...] | None]


@dataclass(frozen=True)
class OpConfig:
    """One distinct benched node: what decides the kernel ember generates for it.

    ``shapes`` and ``constant`` have one entry per input position (None: an absent optional
    input); ``attributes`` are sorted (name, value) pairs with every default filled in.
    """

    op: str
    shapes: tuple[Shape | None, ...]
    constant: tuple[bool, ...]
    attributes: tuple[tuple[str, Any], ...]
    dtype: int = TensorProto.FLOAT

    def attribute(self, name: str, default: Any = None) -> Any:
        return dict(self.attributes).get(name, default)

    def summary(self) -> str:
        """A one-line human name, e.g. ``Conv 3x3/s2 64->128 @ 56x56``."""
        return summarize(self)


@dataclass
class ConfigUse:
    """A configuration and how many nodes of which zoo model have it (over every selected
    batch size and exporter)."""

    config: OpConfig
    uses: dict[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(self.uses.values())

    def where(self) -> str:
        """``bert_base 24, minilm 12``: the models, most uses first."""
        ranked = sorted(self.uses.items(), key=lambda item: -item[1])
        return ", ".join(f"{model} {count}" for model, count in ranked)


@dataclass(frozen=True)
class SkippedNode:
    """A benched-op node left out, and why (the summary line counts them per model)."""

    model: str
    node: str
    op: str
    reason: str


@dataclass
class Extraction:
    """The distinct configurations in first-seen order, and the benched-op nodes that were
    left out (shapes not static, not float32)."""

    configs: list[ConfigUse] = field(default_factory=list)
    skipped: list[SkippedNode] = field(default_factory=list)

    def skipped_by_model(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.skipped:
            counts[node.model] = counts.get(node.model, 0) + 1
        return counts


ModelSource = str | Path | onnx.ModelProto


def extract_configs(sources: Iterable[tuple[str, ModelSource]]) -> Extraction:
    """The distinct benched-op configurations of the (model name, ONNX file or proto) pairs,
    with the number of nodes of each, per model name."""
    extraction = Extraction()
    by_key: dict[OpConfig, ConfigUse] = {}
    for name, source in sources:
        model = source if isinstance(source, onnx.ModelProto) else onnx.load(str(source))
        types = value_types(model)
        if _unknown_benched_shapes(model, types):
            _fill_from_ember(model, types)
        constants = {t.name for t in model.graph.initializer} | {
            output for node in model.graph.node if node.op_type == "Constant"
            for output in node.output}
        for node in model.graph.node:
            if node.op_type not in BENCHED_OPS or node.domain not in ("", "ai.onnx"):
                continue
            config = node_config(node, types, constants)
            if isinstance(config, str):
                extraction.skipped.append(SkippedNode(name, node.name, node.op_type, config))
                continue
            use = by_key.get(config)
            if use is None:
                use = by_key[config] = ConfigUse(config)
                extraction.configs.append(use)
            use.uses[name] = use.uses.get(name, 0) + 1
    return extraction


def value_types(model: onnx.ModelProto) -> dict[str, InferredType]:
    """Every value's (element type, shape) after ONNX shape inference (with data
    propagation).  Inference failing leaves the exporter's own value_info (dynamo writes it)
    to go by."""
    graph = model.graph
    large = [t for t in graph.initializer if math.prod(t.dims) > INLINE_ELEMENTS]
    large_names = {t.name for t in large}
    declared = {value.name for value in graph.input}
    probe_graph = helper.make_graph(
        graph.node, graph.name,
        [*graph.input, *(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                         for t in large if t.name not in declared)],
        graph.output,
        initializer=[t for t in graph.initializer if t.name not in large_names],
        value_info=graph.value_info)
    probe = helper.make_model(probe_graph, opset_imports=model.opset_import,
                              ir_version=model.ir_version, functions=model.functions)
    try:
        probe = onnx.shape_inference.infer_shapes(probe, data_prop=True)
    except Exception:  # noqa: BLE001 -- a model inference rejects still has its value_info
        pass
    types: dict[str, InferredType] = {}
    for value in (*probe.graph.input, *probe.graph.value_info, *probe.graph.output):
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            continue
        shape = (tuple(d.dim_value if d.HasField("dim_value") else None
                       for d in tensor.shape.dim)
                 if tensor.HasField("shape") else None)
        types[value.name] = (tensor.elem_type, shape)
    for tensor in graph.initializer:
        types[tensor.name] = (tensor.data_type, tuple(tensor.dims))
    return types


def _unknown_benched_shapes(model: onnx.ModelProto, types: Mapping[str, InferredType]) -> bool:
    """Whether some benched node has an input ONNX's inference left without a static shape."""
    for node in model.graph.node:
        if node.op_type in BENCHED_OPS:
            for name in filter(None, node.input):
                shape = types.get(name, (0, None))[1]
                if shape is None or None in shape:
                    return True
    return False


def _fill_from_ember(model: onnx.ModelProto, types: dict[str, InferredType]) -> None:
    """Fill the shapes ONNX's inference left unknown from ember's own inference.

    ONNX's data propagation gives up on shape arithmetic through Where and Expand, which the
    TorchScript exporter wraps around BERT's embeddings and mask: every MatMul after them
    loses its batch dim.  ember must make those shapes static to compile the model at all,
    so its inference (the importer's) knows them; a model ember cannot import keeps what
    ONNX found, and its nodes are skipped as before.
    """
    from ember.frontend.onnx import import_onnx
    from ember.ir.types import TensorType

    try:
        graph = import_onnx(model)
    except Exception:  # noqa: BLE001 -- the nodes stay skipped, with ONNX's reason
        return
    for name, vtype in graph.types.items():
        if not isinstance(vtype, TensorType) or not vtype.is_static:
            continue
        elem, shape = types.get(name, (0, None))
        if shape is None or None in shape:
            if not elem and vtype.dtype.value == "f32":
                elem = TensorProto.FLOAT
            types[name] = (elem, tuple(int(d) for d in vtype.shape or ()))


def node_config(node: onnx.NodeProto, types: Mapping[str, InferredType],
                constants: set[str]) -> OpConfig | str:
    """The node's configuration, or why it cannot be benchmarked alone (a string)."""
    inputs = list(node.input)
    shapes: list[Shape | None] = []
    for name in inputs:
        if not name:
            shapes.append(None)  # an absent optional input (Conv without bias)
            continue
        shape = types.get(name, (0, None))[1]
        if shape is None or any(d is None for d in shape):
            return f"input {name!r} has no static shape ({shape_text(shape)})"
        shapes.append(tuple(int(d) for d in shape))  # type: ignore[arg-type]
    while shapes and shapes[-1] is None:  # trailing empty names mean "absent" too
        shapes.pop()
        inputs.pop()
    dtype = types.get(inputs[0], (0, None))[0] if inputs else 0
    if dtype != TensorProto.FLOAT:
        return f"element type {TensorProto.DataType.Name(dtype) if dtype else 'unknown'} " \
               f"(only float32 is benchmarked)"
    attributes = {a.name: _plain(helper.get_attribute_value(a)) for a in node.attribute}
    try:
        normalized = normalize_attributes(node.op_type, attributes, shapes)
    except ValueError as error:
        return str(error)
    return OpConfig(node.op_type, tuple(shapes), tuple(bool(n) and n in constants
                                                       for n in inputs),
                    tuple(sorted(normalized.items())), dtype)


def normalize_attributes(op: str, attributes: Mapping[str, Any],
                         shapes: Sequence[Shape | None]) -> dict[str, Any]:
    """The attributes with ONNX's defaults filled in, so that a node that spells out a default
    and one that leaves it out are the same configuration."""
    result = dict(attributes)
    if op == "Gemm":
        for name, default in (("alpha", 1.0), ("beta", 1.0), ("transA", 0), ("transB", 0)):
            result.setdefault(name, default)
    elif op in ("Conv", "ConvTranspose"):
        if len(shapes) < 2 or shapes[1] is None or len(shapes[1]) < 3:
            raise ValueError(f"{op} needs a weight of rank >= 3, got {shapes[1:2]}")
        kernel = tuple(shapes[1][2:])
        spatial = len(kernel)
        result.setdefault("kernel_shape", kernel)
        result.setdefault("strides", (1,) * spatial)
        result.setdefault("dilations", (1,) * spatial)
        result.setdefault("group", 1)
        result.setdefault("auto_pad", "NOTSET")
        if result["auto_pad"] == "NOTSET":
            result.setdefault("pads", (0,) * (2 * spatial))
        if op == "ConvTranspose":
            result.setdefault("output_padding", (0,) * spatial)
    return result


def _plain(value: Any) -> Any:
    """An attribute value as a hashable plain value (lists become tuples, bytes text)."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (list, tuple)):
        return tuple(_plain(item) for item in value)
    if isinstance(value, float):
        return float(np.float32(value))  # as stored: 1.0 and 1.0000000001 are one value
    return value

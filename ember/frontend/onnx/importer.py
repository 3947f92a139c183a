"""ONNX → ember Graph.

The importer reads a ModelProto (from a path, bytes or an object), turns its graph and every
subgraph into ember IR, applies the version upgrades of ``upgrades.py`` so that every node has
the semantics of the newest opset, inlines model-local functions, lists all unsupported ops at
once, and finally runs shape inference.

It uses the ``onnx`` package only to parse protobufs and convert tensors; the semantics of
every op are ember's own (``ember.ops``).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np

from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.core.errors import EmberError, ModelLoadError, UnsupportedOpError
from ember.frontend.onnx.table import ember_op_name, upgrades_for
from ember.ir.graph import Graph, Node
from ember.ir.types import OptionalType, SequenceType, TensorType, ValueType
from ember.ops.registry import get_op

# ONNX ops that ember declines on purpose, with the reason shown to the user.
_DECLINED_REASONS = {
    "Bernoulli": "random ops are not supported (results cannot be reproduced)",
    "RandomNormal": "random ops are not supported (results cannot be reproduced)",
    "RandomNormalLike": "random ops are not supported (results cannot be reproduced)",
    "RandomUniform": "random ops are not supported (results cannot be reproduced)",
    "RandomUniformLike": "random ops are not supported (results cannot be reproduced)",
    "Multinomial": "random ops are not supported (results cannot be reproduced)",
    "ImageDecoder": "image decoding is outside ember's scope; decode before inference",
}


def load_onnx_model(model: Any):
    """Parse ``model`` (path, bytes or ModelProto) into a ModelProto with external data loaded."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        if not model.HasField("graph"):
            raise ModelLoadError("the ONNX model holds no graph")
        return model
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_model_from_string(bytes(model))
        except Exception as error:
            raise ModelLoadError(f"the bytes given are not a valid ONNX model: {error}") from None
    path = Path(os.fspath(model))
    if not path.exists():
        raise ModelLoadError(f"model file '{path}' does not exist")
    if path.is_dir():
        raise ModelLoadError(f"'{path}' is a directory; pass the path of a .onnx file")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as error:
        raise ModelLoadError(
            f"'{path}' is not a valid ONNX model (truncated or not a protobuf?): "
            f"{type(error).__name__}: {error}"
        ) from None
    if not proto.HasField("graph"):
        raise ModelLoadError(f"'{path}' holds no graph: it is empty or not an ONNX model")
    try:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(proto, str(path.parent))
    except Exception as error:
        raise ModelLoadError(f"'{path}': cannot load its external tensor data: {error}") from None
    return proto


def import_onnx(model: Any, *, infer_shapes: bool = True) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) as an ember Graph."""
    proto = load_onnx_model(model)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    if not opsets:
        opsets[""] = 1  # IR version 1-2 models carry no opset_import; ONNX says opset 1
    functions = {(f.domain, f.name): f for f in proto.functions}
    importer = _Importer(opsets, functions)
    graph = importer.import_graph(proto.graph, outer_names=set())
    graph.metadata.update(
        {
            "producer": f"{proto.producer_name} {proto.producer_version}".strip(),
            "ir_version": int(proto.ir_version),
            "opsets": dict(opsets),
        }
    )
    if importer.unsupported:
        raise UnsupportedOpError(importer.unsupported)
    if infer_shapes:
        from ember.passes.infer_shapes import infer_shapes as run_inference

        run_inference(graph)
    return graph


class _Importer:
    def __init__(self, opsets: dict[str, int], functions: dict[tuple[str, str], Any]):
        self.opsets = opsets
        self.functions = functions
        self.unsupported: list[tuple[str, str, str]] = []
        self._node_counter = itertools.count()

    # ------------------------------------------------------------------ graphs
    def import_graph(self, gproto, outer_names: set[str]) -> Graph:
        from onnx import numpy_helper

        graph = Graph(name=gproto.name or "main")
        for init in gproto.initializer:
            graph.constants[init.name] = self._tensor(init, f"initializer '{init.name}'")
        for sparse in gproto.sparse_initializer:
            name = sparse.values.name
            graph.constants[name] = numpy_helper.to_array(sparse_to_dense(sparse))
        for name, array in graph.constants.items():
            graph.types[name] = _type_of_array(array)
        for vi in gproto.input:
            if vi.name in graph.constants:
                continue  # an input with an initializer is a weight, not a run-time input
            graph.inputs.append(vi.name)
            graph.types[vi.name] = value_type(vi.type, f"input '{vi.name}'")
        for vi in list(gproto.value_info) + list(gproto.output):
            if vi.HasField("type") and vi.name not in graph.types:
                declared = value_type(vi.type, f"value '{vi.name}'")
                if declared is not None:
                    graph.types[vi.name] = declared
        graph.outputs = [vi.name for vi in gproto.output]
        visible = outer_names | set(graph.inputs) | set(graph.constants)
        for nproto in gproto.node:
            self._import_node(nproto, graph, visible)
        return graph

    # ------------------------------------------------------------------ nodes
    def _import_node(self, nproto, graph: Graph, visible: set[str]) -> None:
        domain = "" if nproto.domain in ("", "ai.onnx") else nproto.domain
        name = nproto.name or f"{nproto.op_type}_{next(self._node_counter)}"
        if (nproto.domain, nproto.op_type) in self.functions:
            self._inline_function(nproto, graph, visible)
            return
        attrs = {a.name: self._attribute(a, name, visible) for a in nproto.attribute}
        if domain == "" and nproto.op_type == "Constant":
            graph.constants[nproto.output[0]] = constant_value(attrs, name)
            graph.types[nproto.output[0]] = _type_of_array(graph.constants[nproto.output[0]])
            visible.add(nproto.output[0])
            return
        node = Node(op=ember_op_name(domain, nproto.op_type), inputs=list(nproto.input),
                    outputs=list(nproto.output), attrs=attrs, name=name, domain=domain)
        opset = self.opsets.get(domain, self.opsets.get("", 1))
        builder = _GraphBuilder(graph, name)
        replacement: list[Node] = [node]
        for fn in upgrades_for(domain, nproto.op_type, opset):
            new_nodes: list[Node] = []
            for current in replacement:
                if current.op == node.op:
                    result = fn(current, builder, opset)
                    new_nodes.extend(result if result is not None else [current])
                else:
                    new_nodes.append(current)
            replacement = new_nodes
        # Nodes an upgrade built with the builder but did not place itself go first.
        placed = {id(n) for n in replacement}
        for new in [n for n in builder.pending if id(n) not in placed] + replacement:
            self._check_supported(new, nproto.op_type)
            graph.nodes.append(new)
            visible.update(o for o in new.outputs if o)
        builder.pending.clear()

    def _check_supported(self, node: Node, onnx_op: str) -> None:
        if get_op(node.op) is not None:
            return
        reason = _DECLINED_REASONS.get(onnx_op)
        if reason is None and node.domain.startswith("ai.onnx.preview.training"):
            reason = "training-only ops are outside ember's scope (it compiles inference)"
        elif reason is None and node.domain.startswith("ai.onnx.preview"):
            reason = "preview ops (not in a released opset) are not supported yet"
        if reason is None:
            domain = f" in domain '{node.domain}'" if node.domain else ""
            reason = f"ember has no implementation of {onnx_op}{domain}"
        self.unsupported.append((node.op, node.name, reason))

    def _attribute(self, aproto, node_name: str, visible: set[str]) -> Any:
        from onnx import AttributeProto, numpy_helper

        kind = aproto.type
        if kind == AttributeProto.GRAPH:
            return self.import_graph(aproto.g, set(visible))
        if kind == AttributeProto.GRAPHS:
            return [self.import_graph(g, set(visible)) for g in aproto.graphs]
        if kind == AttributeProto.TENSOR:
            return self._tensor(aproto.t, f"attribute '{aproto.name}' of node '{node_name}'")
        if kind == AttributeProto.TENSORS:
            return [self._tensor(t, f"attribute '{aproto.name}' of node '{node_name}'")
                    for t in aproto.tensors]
        if kind == AttributeProto.SPARSE_TENSOR:
            return _normalize_array(numpy_helper.to_array(sparse_to_dense(aproto.sparse_tensor)))
        if kind == AttributeProto.TYPE_PROTO:
            return value_type(aproto.tp, f"attribute '{aproto.name}'")
        if kind == AttributeProto.TYPE_PROTOS:
            return [value_type(t, f"attribute '{aproto.name}'") for t in aproto.type_protos]
        if kind == AttributeProto.FLOAT:
            return float(aproto.f)
        if kind == AttributeProto.INT:
            return int(aproto.i)
        if kind == AttributeProto.STRING:
            return aproto.s.decode("utf-8", errors="replace")
        if kind == AttributeProto.FLOATS:
            return [float(v) for v in aproto.floats]
        if kind == AttributeProto.INTS:
            return [int(v) for v in aproto.ints]
        if kind == AttributeProto.STRINGS:
            return [s.decode("utf-8", errors="replace") for s in aproto.strings]
        raise ModelLoadError(f"node '{node_name}': attribute '{aproto.name}' has an unsupported "
                             f"kind {kind}")

    def _tensor(self, tproto, where: str) -> np.ndarray:
        from onnx import numpy_helper

        try:
            array = numpy_helper.to_array(tproto)
        except Exception as error:
            raise ModelLoadError(f"{where}: cannot read tensor data ({error}); is the file "
                                 f"truncated or its external data missing?") from None
        return _normalize_array(array)

    # ------------------------------------------------------------------ functions
    def _inline_function(self, nproto, graph: Graph, visible: set[str]) -> None:
        """Expand a call of a model-local function into its body, renaming its values."""
        fproto = self.functions[(nproto.domain, nproto.op_type)]
        prefix = f"{nproto.name or nproto.op_type}_{next(self._node_counter)}__"
        rename = {formal: actual for formal, actual in zip(fproto.input, nproto.input)}
        rename.update({formal: actual for formal, actual in zip(fproto.output, nproto.output)})
        attr_values = {a.name: a for a in fproto.attribute_proto}
        attr_values.update({a.name: a for a in nproto.attribute})
        for inner in fproto.node:
            clone = type(inner)()
            clone.CopyFrom(inner)
            clone.name = prefix + (inner.name or inner.op_type)
            for i, value in enumerate(clone.input):
                clone.input[i] = rename.get(value, prefix + value if value else "")
            for i, value in enumerate(clone.output):
                clone.output[i] = rename.get(value, prefix + value if value else "")
            kept = []
            for attr in clone.attribute:
                if attr.ref_attr_name:
                    if attr.ref_attr_name in attr_values:
                        resolved = type(attr)()
                        resolved.CopyFrom(attr_values[attr.ref_attr_name])
                        resolved.name = attr.name
                        kept.append(resolved)
                else:
                    kept.append(attr)
            del clone.attribute[:]
            clone.attribute.extend(kept)
            saved = self.opsets
            self.opsets = {**saved, **{("" if o.domain == "ai.onnx" else o.domain): o.version
                                       for o in fproto.opset_import}}
            try:
                self._import_node(clone, graph, visible)
            finally:
                self.opsets = saved


class _GraphBuilder:
    """The Builder an upgrade sees: adds constants and nodes to the graph being imported."""

    def __init__(self, graph: Graph, node_name: str):
        self.graph = graph
        self.node_name = node_name
        self.pending: list[Node] = []

    def constant(self, array: np.ndarray, hint: str = "const") -> str:
        return self.graph.add_constant(np.asarray(array), hint=f"{self.node_name}_{hint}")

    def fresh(self, hint: str = "v") -> str:
        return self.graph.fresh_name(f"{self.node_name}_{hint}")

    def add_node(self, op: str, inputs: list[str], outputs: list[str], **attrs) -> Node:
        node = Node(op=op, inputs=list(inputs), outputs=list(outputs), attrs=attrs,
                    name=f"{self.node_name}_{op}_{len(self.pending)}")
        self.pending.append(node)
        return node


# ---------------------------------------------------------------------- helpers


def value_type(tproto, where: str) -> ValueType | None:
    """Convert an ONNX TypeProto (tensor, sequence, optional) to an ember ValueType."""
    which = tproto.WhichOneof("value")
    if which == "tensor_type":
        tt = tproto.tensor_type
        if tt.elem_type == 0:
            return None
        dtype = DType.from_onnx(tt.elem_type)
        if not tt.HasField("shape"):
            return TensorType(dtype, None)
        dims = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(sym(d.dim_param))
            else:
                dims.append(None)
        return TensorType(dtype, tuple(dims))
    if which == "sequence_type":
        return SequenceType(value_type(tproto.sequence_type.elem_type, where))
    if which == "optional_type":
        return OptionalType(value_type(tproto.optional_type.elem_type, where))
    if which is None:
        return None
    raise ModelLoadError(f"{where}: ONNX type '{which}' (maps, sparse tensors) is not supported")


def constant_value(attrs: dict[str, Any], node_name: str) -> np.ndarray:
    """The tensor a Constant node holds, whichever of its attributes carries it."""
    if "value" in attrs:
        return np.asarray(attrs["value"])
    if "sparse_value" in attrs:
        return np.asarray(attrs["sparse_value"])
    scalar_kinds = {
        "value_float": np.float32, "value_int": np.int64, "value_string": object,
        "value_floats": np.float32, "value_ints": np.int64, "value_strings": object,
    }
    for key, dtype in scalar_kinds.items():
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    raise ModelLoadError(f"Constant node '{node_name}' has no value attribute")


def sparse_to_dense(sparse):
    """A SparseTensorProto as a dense TensorProto."""
    from onnx import helper, numpy_helper

    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices)
    shape = tuple(sparse.dims)
    dense = np.zeros(int(np.prod(shape)) if shape else 1, dtype=values.dtype)
    if indices.ndim == 2:  # COO with one row per index tuple
        flat = np.ravel_multi_index(tuple(indices.T), shape)
    else:
        flat = indices
    dense[flat] = values
    return helper.make_tensor(sparse.values.name, sparse.values.data_type, shape,
                              dense.reshape(shape).flatten().tolist())


def _normalize_array(array: np.ndarray) -> np.ndarray:
    if array.dtype.kind in ("U", "S"):
        return array.astype(object)
    if array.dtype == object:
        return np.vectorize(lambda s: s.decode() if isinstance(s, bytes) else s,
                            otypes=[object])(array) if array.size else array
    return array


def _type_of_array(array: np.ndarray) -> TensorType:
    try:
        return TensorType(DType.from_numpy(array.dtype), tuple(array.shape))
    except EmberError:
        raise ModelLoadError(f"tensor of numpy dtype {array.dtype} is not supported") from None

"""ONNX → ember Graph.

The importer reads a ModelProto (from a path, bytes or an object), turns its graph and every
subgraph into ember IR, applies the version upgrades of ``upgrades.py`` so that every node has
the semantics of the newest opset, inlines model-local functions, lists all unsupported ops at
once, checks the graph (``ember.ir.verifier``: every value defined once and before use, every
attribute of its declared kind, ...; all problems listed in one VerificationError) and finally
runs shape inference, which also compares the types the file declares with the inferred ones.
Versions, dims and sparse tensors of the file are range-checked on the way in (``validate.py``).

It uses the ``onnx`` package only to parse protobufs and convert tensors; the semantics of
every op are ember's own (``ember.ops``).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np

from ember.core.config import memory_limit as resolve_memory_limit
from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.core.errors import EmberError, ModelLoadError, ShapeError, UnsupportedOpError
from ember.frontend.onnx.external_data import (has_external_data, load_external_data,
                                               refuse_unloaded_external)
from ember.frontend.onnx.sequences import split_sequences_to_tensors
from ember.frontend.onnx.table import ember_op_name, upgrades_for
from ember.frontend.onnx.validate import (canonical_domain, check_dims, check_opsets,
                                          check_text_fields, check_type_constraints,
                                          dim_problem, sparse_to_array)
from ember.ir.graph import Graph, Node
from ember.ir.types import OptionalType, SequenceType, TensorType, ValueType
from ember.ops.registry import get_op
from ember.passes.infer_shapes import types_compatible
from ember.passes.verify import verify_graph

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


# protobuf's own limit: larger weights live in external data files
MAX_MODEL_FILE_BYTES = 2 << 30


def check_regular_file(path: Path, what: str, max_bytes: int | None = None) -> None:
    """Refuse a path that is not a regular file (a FIFO would block forever, a device such
    as /dev/zero never end) or that is larger than ``max_bytes``, before opening it."""
    import stat

    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ModelLoadError(f"{what}: file '{path}' does not exist") from None
    except OSError as error:
        raise ModelLoadError(f"{what}: '{path}' cannot be read: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a device" if (
            stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)) else \
            "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise ModelLoadError(f"{what}: '{path}' is {kind}; give the path of a regular file")
    if max_bytes is not None and info.st_size > max_bytes:
        raise ModelLoadError(f"{what}: '{path}' is {info.st_size:,} bytes, more than the "
                             f"{max_bytes:,} a file of this kind can be")


def load_onnx_model(model: Any, base_dir: str | os.PathLike[str] | None = None,
                    memory_limit: int | str | None = None):
    """Parse ``model`` (path, bytes or ModelProto) into a ModelProto with its external data
    loaded (a proto given with external tensors is copied first, not changed).

    External tensor data is read only from inside one directory (``external_data.py``): the
    model file's own, or ``base_dir``, which a model given as bytes or as a ModelProto needs
    if it has external tensors.  ``memory_limit`` bounds the bytes read."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        if not model.HasField("graph"):
            raise ModelLoadError("the ONNX model holds no graph")
        if not has_external_data(model):
            return model
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        load_external_data(proto, base_dir, "the ONNX model", memory_limit)
        return proto
    if isinstance(model, (bytes, bytearray)):
        if not model:
            raise ModelLoadError("the bytes given are empty, not an ONNX model")
        try:
            proto = onnx.load_model_from_string(bytes(model))
        except Exception as error:
            raise ModelLoadError(f"the bytes given are not a valid ONNX model: {error}") from None
        if not proto.HasField("graph"):
            raise ModelLoadError("the bytes given hold no graph: they are not an ONNX model")
        load_external_data(proto, base_dir, "the ONNX model bytes", memory_limit)
        return proto
    path = Path(os.fspath(model))
    if not path.exists():
        raise ModelLoadError(f"model file '{path}' does not exist")
    if path.is_dir():
        raise ModelLoadError(f"'{path}' is a directory; pass the path of a .onnx file")
    check_regular_file(path, "the model", MAX_MODEL_FILE_BYTES)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as error:
        raise ModelLoadError(
            f"'{path}' is not a valid ONNX model (truncated or not a protobuf?): "
            f"{type(error).__name__}: {error}"
        ) from None
    if not proto.HasField("graph"):
        raise ModelLoadError(f"'{path}' holds no graph: it is empty or not an ONNX model")
    load_external_data(proto, base_dir if base_dir is not None else path.parent,
                       f"'{path}'", memory_limit)
    return proto


def import_onnx(model: Any, *, infer_shapes: bool = True,
                memory_limit: int | str | None = None,
                base_dir: str | os.PathLike[str] | None = None) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) as an ember Graph.

    ``memory_limit`` (bytes or "8GiB"; default ``ember.core.config.memory_limit()``) bounds
    the sparse tensors of the file once made dense, and the external data read.
    ``base_dir`` is the directory external tensor data is read from: by default the model
    file's own; a model given as bytes or a ModelProto with external tensors needs it.
    """
    proto = load_onnx_model(model, base_dir, memory_limit)
    check_text_fields(proto, "model")
    check_opsets(proto.opset_import, "the model")
    for function in proto.functions:
        check_opsets(function.opset_import, f"model-local function '{function.name}'")
    opsets = {canonical_domain(o.domain): o.version for o in proto.opset_import}
    if not opsets:
        if proto.ir_version >= 3:
            raise ModelLoadError(f"the model (IR version {proto.ir_version}) imports no opset; "
                                 f"from IR version 3 on, opset_import must name the version of "
                                 f"every operator domain the model uses")
        opsets[""] = 1  # IR version 1-2 models carry no opset_import; ONNX says opset 1
    functions = {(f.domain, f.name): f for f in proto.functions}
    importer = _Importer(opsets, functions, memory_limit)
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
    # Before inference: an undefined or doubly defined value is reported as what it is, with
    # everything else wrong with the file, rather than as whatever inference trips over first.
    verify_graph(graph, stage="after ONNX import", prior_problems=importer.problems)
    if infer_shapes:
        from ember.passes.infer_shapes import infer_shapes as run_inference

        run_inference(graph)
        # Needs the types, and gives the new nodes theirs: a split of a piece of another
        # split is rewritten in the next round, once the piece has its type.
        while split_sequences_to_tensors(graph):
            run_inference(graph)
        type_problems = check_type_constraints(graph)
        if type_problems:
            raise ShapeError(f"{len(type_problems)} node(s) have operands of types their op "
                             f"does not take:\n  - " + "\n  - ".join(type_problems[:30])
                             + "\nfix the model's data types (initializers, Cast targets, "
                               "declared input types)")
    return graph


class _Importer:
    def __init__(self, opsets: dict[str, int], functions: dict[tuple[str, str], Any],
                 memory_limit: int | str | None = None):
        self.opsets = opsets
        self.functions = functions
        self.unsupported: list[tuple[str, str, str]] = []
        # Problems of the file that the graph IR cannot hold (a Constant without an output, a
        # name given to two initializers); reported together with the verifier's.
        self.problems: list[str] = []
        self._memory_limit_setting = memory_limit
        self._memory_limit: int | None = None
        self._inlining: list[tuple[str, str]] = []  # functions being expanded, outermost first
        self._node_counter = itertools.count()

    @property
    def memory_limit(self) -> int:
        """The budget for dense sparse tensors, resolved on first use (reads the machine's
        available memory only for models that have sparse tensors)."""
        if self._memory_limit is None:
            self._memory_limit = resolve_memory_limit(self._memory_limit_setting)
        return self._memory_limit

    # ------------------------------------------------------------------ graphs
    def import_graph(self, gproto, outer_names: set[str]) -> Graph:
        graph = Graph(name=gproto.name or "main")
        where = f"graph '{graph.name}'"
        for init in gproto.initializer:
            self._add_constant(graph, init.name,
                               self._tensor(init, f"{where}: initializer '{init.name}'"),
                               "an initializer")
        for sparse in gproto.sparse_initializer:
            name = sparse.values.name
            array = sparse_to_array(sparse, f"{where}: sparse initializer '{name}'",
                                    self.memory_limit)
            self._add_constant(graph, name, _normalize_array(array), "a sparse initializer")
        for vi in gproto.input:
            if vi.name in graph.constants:
                continue  # an input with an initializer is a weight, not a run-time input
            graph.inputs.append(vi.name)
            graph.types[vi.name] = self._declared_type(vi, f"{where}: input '{vi.name}'")
        for vi in list(gproto.value_info) + list(gproto.output):
            if not vi.HasField("type"):
                continue
            declared = self._declared_type(vi, f"{where}: value '{vi.name}'")
            if declared is None:
                continue
            if vi.name not in graph.types:
                graph.types[vi.name] = declared
            elif not types_compatible(declared, graph.types[vi.name]):
                # Inputs and weights have their type already; node outputs are compared with
                # their inferred types by shape inference.
                self.problems.append(f"{where}: value '{vi.name}' is declared {declared} but is "
                                     f"{graph.types[vi.name]}; fix its value_info or output "
                                     f"type in the model")
        graph.outputs = [vi.name for vi in gproto.output]
        visible = outer_names | set(graph.inputs) | set(graph.constants)
        for nproto in gproto.node:
            self._import_node(nproto, graph, visible)
        return graph

    # ------------------------------------------------------------------ nodes
    def _import_node(self, nproto, graph: Graph, visible: set[str]) -> None:
        domain = "" if nproto.domain in ("", "ai.onnx") else nproto.domain
        name = nproto.name or f"{nproto.op_type}_{next(self._node_counter)}"
        if domain not in self.opsets:
            label = f"domain '{domain}'" if domain else "the default domain (ai.onnx)"
            self.problems.append(f"graph '{graph.name}': node '{name}' ({nproto.op_type}) is "
                                 f"of {label}, which the model does not import; add it to "
                                 f"opset_import")
        elif not _exists_at(nproto.op_type, domain, self.opsets[domain]):
            self.problems.append(f"graph '{graph.name}': node '{name}' ({nproto.op_type}) does "
                                 f"not exist in opset {self.opsets[domain]} of "
                                 f"{domain or 'ai.onnx'}; it was added in a later opset")
        if (nproto.domain, nproto.op_type) in self.functions:
            self._inline_function(nproto, graph, visible)
            return
        names = [a.name for a in nproto.attribute]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            self.problems.append(f"graph '{graph.name}': node '{name}' ({nproto.op_type}) "
                                 f"gives attribute(s) {twice} more than once")
        references = [a.name for a in nproto.attribute if a.ref_attr_name]
        if references:  # a function's body resolves these before nodes get here
            self.problems.append(f"graph '{graph.name}': node '{name}' ({nproto.op_type}) "
                                 f"refers to function attribute(s) for {references} outside "
                                 f"of a function")
        attrs = {a.name: self._attribute(a, name, visible) for a in nproto.attribute
                 if not a.ref_attr_name}
        if domain == "" and nproto.op_type == "Constant":
            if len(nproto.output) != 1 or not nproto.output[0]:
                self.problems.append(f"graph '{graph.name}': Constant node '{name}' has "
                                     f"outputs {list(nproto.output)}; a Constant must name "
                                     f"exactly one output value")
                return
            self._add_constant(graph, nproto.output[0], constant_value(attrs, name),
                               f"Constant node '{name}'")
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

    def _add_constant(self, graph: Graph, name: str, array: np.ndarray, what: str) -> None:
        """Record a constant; a name given twice is a problem of the file (a dict would keep
        the last silently)."""
        if name in graph.constants:
            self.problems.append(f"graph '{graph.name}': value '{name}' is defined twice, the "
                                 f"second time by {what}; every value needs a unique name")
            return
        graph.constants[name] = array
        graph.types[name] = _type_of_array(array)

    def _declared_type(self, vi, where: str) -> ValueType | None:
        """The type a ValueInfoProto declares; a malformed one is recorded as a problem (and
        the value left untyped) so that every bad declaration is listed at once."""
        try:
            return value_type(vi.type, where)
        except ModelLoadError as error:
            self.problems.append(str(error))
            return None

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
        from onnx import AttributeProto

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
            return _normalize_array(sparse_to_array(
                aproto.sparse_tensor, f"attribute '{aproto.name}' of node '{node_name}'",
                self.memory_limit))
        if kind in (AttributeProto.TYPE_PROTO, AttributeProto.TYPE_PROTOS):
            where = f"attribute '{aproto.name}' of node '{node_name}'"
            protos = [aproto.tp] if kind == AttributeProto.TYPE_PROTO else aproto.type_protos
            types = [value_type(t, where) for t in protos]
            if any(t is None for t in types):
                raise ModelLoadError(f"{where} is declared as a type but holds none (an empty "
                                     f"or undefined TypeProto); the model file is malformed")
            return types[0] if kind == AttributeProto.TYPE_PROTO else types
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

        check_dims(tproto.dims, where)
        refuse_unloaded_external(tproto, where)
        try:
            array = numpy_helper.to_array(tproto)
        except Exception as error:
            raise ModelLoadError(f"{where}: cannot read tensor data ({error}); is the file "
                                 f"truncated or its external data missing?") from None
        return _normalize_array(array)

    # ------------------------------------------------------------------ functions
    def _inline_function(self, nproto, graph: Graph, visible: set[str]) -> None:
        """Expand a call of a model-local function into its body, renaming its values."""
        key = (nproto.domain, nproto.op_type)
        if key in self._inlining:
            chain = " -> ".join(f"{d}.{n}" if d else n for d, n in self._inlining + [key])
            raise ModelLoadError(f"model-local function '{nproto.op_type}' calls itself "
                                 f"({chain}); recursive functions cannot be inlined, and ONNX "
                                 f"does not allow them")
        fproto = self.functions[key]
        if len(nproto.input) > len(fproto.input) or len(nproto.output) > len(fproto.output):
            self.problems.append(f"graph '{graph.name}': node '{nproto.name}' calls function "
                                 f"'{nproto.op_type}' with {len(nproto.input)} input(s) and "
                                 f"{len(nproto.output)} output(s); the function has "
                                 f"{len(fproto.input)} and {len(fproto.output)}")
            return
        self._inlining.append(key)
        try:
            self._expand_function(nproto, fproto, graph, visible)
        finally:
            self._inlining.pop()

    def _expand_function(self, nproto, fproto, graph: Graph, visible: set[str]) -> None:
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
            # A function's body sees the opsets the function imports, not the model's (ONNX
            # versions a function independently of the model that calls it).
            self.opsets = {canonical_domain(o.domain): o.version for o in fproto.opset_import}
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
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                problem = dim_problem(int(d.dim_value))
                if problem:
                    raise ModelLoadError(f"{where}: dimension {axis} of its declared type "
                                         f"{problem}; fix the type in the model")
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


def _exists_at(op_type: str, domain: str, opset: int) -> bool:
    """False if ONNX defines ``op_type`` only from an opset later than ``opset`` (ops ONNX does
    not know, and domains other than ai.onnx and ai.onnx.ml, are for ember to judge)."""
    import onnx.defs

    if domain not in ("", "ai.onnx.ml") or not onnx.defs.has(op_type, domain):
        return True
    try:
        onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return False
    return True


# The attributes that can carry a Constant's value: what each must hold, and its dtype.
_CONSTANT_ATTRS: dict[str, tuple[str, Any]] = {
    "value": ("a tensor", None), "sparse_value": ("a sparse tensor", None),
    "value_float": ("a float", np.float32), "value_floats": ("a list of floats", np.float32),
    "value_int": ("an int", np.int64), "value_ints": ("a list of ints", np.int64),
    "value_string": ("a string", object), "value_strings": ("a list of strings", object),
}


def constant_value(attrs: dict[str, Any], node_name: str) -> np.ndarray:
    """The tensor a Constant node holds: exactly one value attribute, of its own kind."""
    present = [key for key in attrs if key in _CONSTANT_ATTRS]
    unknown = sorted(set(attrs) - set(_CONSTANT_ATTRS))
    if len(present) != 1 or unknown:
        raise ModelLoadError(f"Constant node '{node_name}' must have exactly one of the "
                             f"attributes {sorted(_CONSTANT_ATTRS)}; it has "
                             f"{sorted(attrs) or 'none'}")
    key = present[0]
    what, dtype = _CONSTANT_ATTRS[key]
    value = attrs[key]
    if not _constant_kind_matches(key, value):
        raise ModelLoadError(f"Constant node '{node_name}': attribute '{key}' must be {what}, "
                             f"got {type(value).__name__}")
    return np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype)


def _constant_kind_matches(key: str, value: Any) -> bool:
    if key in ("value", "sparse_value"):
        return isinstance(value, np.ndarray)
    if key.endswith("s"):  # the list kinds
        return isinstance(value, list) and all(_constant_kind_matches(key[:-1], v)
                                               for v in value)
    if key == "value_float":
        return isinstance(value, (float, int)) and not isinstance(value, bool)
    if key == "value_int":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, str)


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

"""ONNX → ember Graph.

The importer reads a ModelProto (from a path, bytes or an object), turns its graph and every
subgraph into ember IR, applies the version upgrades of ``upgrades.py`` so that every node has
the semantics of the newest opset, inlines model-local functions, lists all unsupported ops at
once, checks the graph (``ember.ir.verifier``: every value defined once and before use, every
attribute of its declared kind, ...; all problems listed in one VerificationError) and finally
runs shape inference, which also compares the types the file declares with the inferred ones.
Versions, dims and sparse tensors of the file are range-checked on the way in (``validate.py``).

What a file can make the importer do is bounded too.  Inlining functions is iterative (a chain
of a thousand functions, each calling the next, is valid ONNX and must not exhaust Python's
stack), and before a call is expanded the size of its whole expansion is computed, per function
and memoized, from the functions it calls: thirty functions that each call the next one twice
fit in 2 KB and would expand to 2**30 nodes, so a model whose expansion exceeds
``ember.core.config.max_inlined_nodes()`` is refused at once.  Subgraphs (If/Loop/Scan bodies)
nest at most :data:`MAX_SUBGRAPH_DEPTH` deep, the bound on their recursion here and in every
later pass.

It uses the ``onnx`` package only to parse protobufs and convert tensors; the semantics of
every op are ember's own (``ember.ops``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ember.core.config import MAX_INLINED_NODES_ENV, max_inlined_nodes as resolve_max_inlined
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

# How deep subgraphs may nest (a body of a node in a body of ...).  Real models nest control flow
# two or three deep, and protobuf's parser refuses a file nesting more than 31 (its limit of 100
# nested messages, three per level); only local functions whose bodies call the next one inside
# an If can build more.  Importing, inference, the passes and the reference executor recurse
# once per level, and they stay well inside Python's stack at this depth.
MAX_SUBGRAPH_DEPTH = 32

# How deep sequences and optionals may nest in a declared type: real models use two levels
# (an optional sequence of tensors); protobuf parses a file with some fifty at most.
MAX_TYPE_DEPTH = 32

# Expansion sizes saturate here: a count of 2**1000 nodes is as refused as one of 2**63, and
# saturating keeps the arithmetic on machine-sized numbers.
_SIZE_CAP = 2**63


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
                base_dir: str | os.PathLike[str] | None = None,
                max_inlined_nodes: int | str | None = None) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) as an ember Graph.

    ``memory_limit`` (bytes or "8GiB"; default ``ember.core.config.memory_limit()``) bounds
    the sparse tensors of the file once made dense, and the external data read.
    ``base_dir`` is the directory external tensor data is read from: by default the model
    file's own; a model given as bytes or a ModelProto with external tensors needs it.
    ``max_inlined_nodes`` (default ``ember.core.config.max_inlined_nodes()``) bounds the nodes
    that inlining the model's local functions may produce.
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
    importer = _Importer(opsets, functions, memory_limit, max_inlined_nodes)
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


FunctionKey = tuple[str, str]  # (domain, name) of a model-local function


@dataclass(frozen=True)
class _FunctionSize:
    """What inlining one call of a function produces, computed without expanding it."""

    nodes: int  # nodes of its expansion, but for the graphs the caller passes as attributes
    uses: dict[str, int]  # attribute name -> copies the expansion makes of that attribute


@dataclass
class _Expansion:
    """A call being inlined: the opsets its function's body sees, the body's remaining nodes."""

    opsets: dict[str, int]
    body: Iterator[Any]


class _Importer:
    def __init__(self, opsets: dict[str, int], functions: dict[FunctionKey, Any],
                 memory_limit: int | str | None = None,
                 max_inlined_nodes: int | str | None = None):
        self.opsets = opsets
        self.functions = functions
        self.unsupported: list[tuple[str, str, str]] = []
        # Problems of the file that the graph IR cannot hold (a Constant without an output, a
        # name given to two initializers); reported together with the verifier's.
        self.problems: list[str] = []
        self._memory_limit_setting = memory_limit
        self._memory_limit: int | None = None
        self._max_inlined_setting = max_inlined_nodes
        self._max_inlined: int | None = None
        self._inlined_nodes = 0  # nodes the expansions reserved so far
        self._inlined_made = 0  # nodes they made: never more, so this only guards the count
        self._outermost_call = ""  # the call being inlined, for messages
        self._sizes: dict[FunctionKey, _FunctionSize] = {}
        self._inlining: list[FunctionKey] = []  # functions being expanded, outermost first
        self._depth = 0  # graphs being imported: 1 in the main graph, 2 in its bodies, ...
        self._node_counter = itertools.count()

    @property
    def memory_limit(self) -> int:
        """The budget for dense sparse tensors, resolved on first use (reads the machine's
        available memory only for models that have sparse tensors)."""
        if self._memory_limit is None:
            self._memory_limit = resolve_memory_limit(self._memory_limit_setting)
        return self._memory_limit

    @property
    def max_inlined_nodes(self) -> int:
        """The bound on inlined nodes, resolved on first use (so that only a model with local
        functions reads, and can be refused for, a malformed EMBER_MAX_INLINED_NODES)."""
        if self._max_inlined is None:
            self._max_inlined = resolve_max_inlined(self._max_inlined_setting)
        return self._max_inlined

    # ------------------------------------------------------------------ graphs
    def import_graph(self, gproto, outer_names: set[str], where: str = "") -> Graph:
        """Import ``gproto``, a subgraph if ``where`` (the attribute and node holding it) is
        given, refused if that nests subgraphs more than MAX_SUBGRAPH_DEPTH deep."""
        if self._depth > MAX_SUBGRAPH_DEPTH:
            inside = ""
            if self._inlining:
                inside = f", inside model-local function(s) {_chain(self._inlining)}"
            raise ModelLoadError(
                f"graph '{gproto.name}' ({where}{inside}) is nested {self._depth} subgraphs "
                f"deep, more than the {MAX_SUBGRAPH_DEPTH} levels of If/Loop/Scan bodies ember "
                f"imports; flatten the model's control flow")
        self._depth += 1
        try:
            return self._import_graph(gproto, outer_names)
        finally:
            self._depth -= 1

    def _import_graph(self, gproto, outer_names: set[str]) -> Graph:
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
        name = nproto.name or f"{nproto.op_type}_{next(self._node_counter)}"
        self._check_domain(nproto, name, graph)
        if (nproto.domain, nproto.op_type) in self.functions:
            self._inline_call(nproto, name, graph, visible)
        else:
            self._import_op(nproto, name, graph, visible)

    def _check_domain(self, nproto, name: str, graph: Graph) -> None:
        """Record a problem if the opsets in force do not have the node's op."""
        domain = "" if nproto.domain in ("", "ai.onnx") else nproto.domain
        if domain not in self.opsets:
            label = f"domain '{domain}'" if domain else "the default domain (ai.onnx)"
            self.problems.append(f"graph '{graph.name}': node '{name}' ({nproto.op_type}) is "
                                 f"of {label}, which the model does not import; add it to "
                                 f"opset_import")
        elif not _exists_at(nproto.op_type, domain, self.opsets[domain]):
            self.problems.append(f"graph '{graph.name}': node '{name}' ({nproto.op_type}) does "
                                 f"not exist in opset {self.opsets[domain]} of "
                                 f"{domain or 'ai.onnx'}; it was added in a later opset")

    def _import_op(self, nproto, name: str, graph: Graph, visible: set[str]) -> None:
        """Import a node of an op (not a function call), with its upgrades, into ``graph``."""
        if self._inlining:  # made by an expansion: the bound holds even if the count erred
            self._inlined_made += 1
            if self._inlined_made > self.max_inlined_nodes:
                raise self._too_many_nodes(f"makes more than {self.max_inlined_nodes:,} nodes")
        domain = "" if nproto.domain in ("", "ai.onnx") else nproto.domain
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
        where = f"attribute '{aproto.name}' of node '{node_name}'"
        if kind == AttributeProto.GRAPH:
            return self.import_graph(aproto.g, set(visible), where)
        if kind == AttributeProto.GRAPHS:
            return [self.import_graph(g, set(visible), where) for g in aproto.graphs]
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
    def _inline_call(self, nproto, name: str, graph: Graph, visible: set[str]) -> None:
        """Replace a call of a model-local function by the function's body, every call in that
        body by its callee's body, and so on.

        Iterative, with an explicit stack of the calls being expanded, so that the depth of the
        functions' nesting is not bounded by Python's stack.  The outermost call first reserves
        the size of its whole expansion (nested calls included) against the bound on inlined
        nodes; that computation also refuses recursive functions.
        """
        if not self._inlining:
            self._reserve_inlined_nodes(nproto, name, graph)
        saved_opsets, depth = self.opsets, len(self._inlining)
        stack: list[_Expansion] = []
        try:
            first = self._open_call(nproto, graph)
            if first is not None:
                stack.append(first)
            while stack:
                expansion = stack[-1]
                clone = next(expansion.body, None)
                if clone is None:
                    stack.pop()
                    self._inlining.pop()
                    continue
                # A function's body sees the opsets the function imports, not the model's
                # (ONNX versions a function independently of the model that calls it).
                self.opsets = expansion.opsets
                self._check_domain(clone, clone.name, graph)
                if (clone.domain, clone.op_type) in self.functions:
                    inner = self._open_call(clone, graph)
                    if inner is not None:
                        stack.append(inner)
                else:
                    self._import_op(clone, clone.name, graph, visible)
        finally:
            self.opsets = saved_opsets
            del self._inlining[depth:]

    def _open_call(self, nproto, graph: Graph) -> _Expansion | None:
        """Start expanding the call ``nproto``: None (and a problem recorded) if its arity does
        not fit the function.

        A function may be open already: a call of ``Apply`` inside a graph given to ``Apply`` as
        an attribute.  That is not recursion (the expansion ends, as its size computed before
        shows); recursion is a cycle of the functions' bodies, refused by that computation."""
        key = (nproto.domain, nproto.op_type)
        fproto = self.functions[key]
        if len(nproto.input) > len(fproto.input) or len(nproto.output) > len(fproto.output):
            self.problems.append(f"graph '{graph.name}': node '{nproto.name}' calls function "
                                 f"'{nproto.op_type}' with {len(nproto.input)} input(s) and "
                                 f"{len(nproto.output)} output(s); the function has "
                                 f"{len(fproto.input)} and {len(fproto.output)}")
            return None
        self._inlining.append(key)
        prefix = f"{nproto.name or nproto.op_type}_{next(self._node_counter)}__"
        opsets = {canonical_domain(o.domain): o.version for o in fproto.opset_import}
        return _Expansion(opsets, _function_body(nproto, fproto, prefix))

    # The size of an expansion, computed before expanding.
    def _reserve_inlined_nodes(self, nproto, node_name: str, graph: Graph) -> None:
        """Count the nodes that inlining the call ``nproto`` will produce, and refuse it (before
        any is made) if they and those inlined before exceed the bound."""
        self._compute_sizes(self._functions_called([nproto]))
        needed = self._expanded_size([nproto], uses=None)
        total = self._inlined_nodes + needed
        self._outermost_call = (f"model-local function "
                                f"'{_function_name((nproto.domain, nproto.op_type))}', called "
                                f"by node '{node_name}' of graph '{graph.name}',")
        if total > self.max_inlined_nodes:
            count = f"more than {_SIZE_CAP:,}" if needed >= _SIZE_CAP else f"{needed:,}"
            before = (f" (and {self._inlined_nodes:,} were inlined before it)"
                      if self._inlined_nodes else "")
            raise self._too_many_nodes(f"expands to {count} nodes{before}",
                                       total if total < _SIZE_CAP else None)
        self._inlined_nodes = total

    def _too_many_nodes(self, what: str, needed: int | None = None) -> ModelLoadError:
        """The error of an expansion beyond the bound: the call, the bound, how to raise it."""
        return ModelLoadError(
            f"{self._outermost_call} {what}: more than the {self.max_inlined_nodes:,} that "
            f"ember inlines for one model, a bound against small files whose functions call "
            f"each other many times over. If the model is genuine, raise the bound with "
            f"import_onnx(..., max_inlined_nodes=N) or the environment variable "
            f"{MAX_INLINED_NODES_ENV}=N" + (f" (N >= {needed:,})" if needed else ""))

    def _compute_sizes(self, roots: Iterable[FunctionKey]) -> None:
        """Compute the _FunctionSize of ``roots`` and of every function they call, callees
        first, with an explicit stack; a function reached again while it is being computed
        calls itself, and is refused."""
        for root in roots:
            if root in self._sizes:
                continue
            path, on_path = [root], {root}
            pending = [iter(self._callees(root))]
            while pending:
                callee = next(pending[-1], None)
                if callee is None:
                    pending.pop()
                    done = path.pop()
                    on_path.discard(done)
                    uses: dict[str, int] = {}
                    nodes = self._expanded_size(self.functions[done].node, uses)
                    self._sizes[done] = _FunctionSize(nodes, uses)
                elif callee in on_path:
                    raise _recursion_error(self._inlining + path + [callee])
                elif callee not in self._sizes:
                    path.append(callee)
                    on_path.add(callee)
                    pending.append(iter(self._callees(callee)))

    def _callees(self, key: FunctionKey) -> list[FunctionKey]:
        """The functions a function's body calls (subgraphs and attribute defaults too)."""
        fproto = self.functions[key]
        defaults = [g.node for a in fproto.attribute_proto for g in _graphs_of(a)]
        return self._functions_called(fproto.node, *defaults)

    def _functions_called(self, *groups: Sequence[Any]) -> list[FunctionKey]:
        """The functions that nodes of ``groups`` or of their subgraphs call, in first-seen
        order (references to attributes are not followed: they hold the caller's graphs)."""
        found: dict[FunctionKey, None] = {}
        stack = list(groups)
        while stack:
            for node in stack.pop():
                key = (node.domain, node.op_type)
                if key in self.functions:
                    found[key] = None
                for attr in node.attribute:
                    if not attr.ref_attr_name:
                        stack.extend(g.node for g in _graphs_of(attr))
        return list(found)

    def _expanded_size(self, nodes: Sequence[Any], uses: dict[str, int] | None) -> int:
        """How many nodes importing ``nodes`` makes, each call counted as its expansion, from
        the sizes of the functions called (all computed before).

        ``uses``, when given, collects how many copies the nodes make of each attribute of the
        function they are the body of: a node that refers to attribute ``a`` makes one copy of
        the graph the caller passes as ``a``, a call that passes it on makes as many as its
        callee makes.  Caller-given graphs are resolved where the caller is expanded, so their
        size counts there, times these copies.
        """
        total = 0
        stack: list[tuple[Sequence[Any], int, bool]] = [(nodes, 1, uses is not None)]
        while stack:
            group, weight, own = stack.pop()  # own: references resolve to ``uses``' function
            for node in group:
                key = (node.domain, node.op_type)
                callee = self._sizes[key] if key in self.functions else None
                total = min(total + weight * (callee.nodes if callee else 1), _SIZE_CAP)
                for attr in node.attribute:
                    copies = weight if callee is None else \
                        min(weight * callee.uses.get(attr.name, 0), _SIZE_CAP)
                    if attr.ref_attr_name:
                        if own and copies:
                            assert uses is not None
                            name = attr.ref_attr_name
                            uses[name] = min(uses.get(name, 0) + copies, _SIZE_CAP)
                    elif copies:
                        stack.extend((g.node, copies, own) for g in _graphs_of(attr))
                if callee is not None:  # defaults of graph attributes the call leaves out
                    given = {attr.name for attr in node.attribute}
                    for default in self.functions[key].attribute_proto:
                        copies = min(weight * callee.uses.get(default.name, 0), _SIZE_CAP)
                        if default.name not in given and copies:
                            stack.extend((g.node, copies, False) for g in _graphs_of(default))
        return total


def _function_body(nproto, fproto, prefix: str) -> Iterator[Any]:
    """The nodes of ``fproto``'s body as called by ``nproto``, one at a time: values renamed
    (formal inputs and outputs to the call's actual ones, every other value, in subgraphs too,
    prefixed by ``prefix`` so that the copies of several calls stay apart) and attribute
    references resolved to the call's attributes or the function's defaults."""
    rename = dict(zip(fproto.input, nproto.input))
    # Inputs the call leaves out are missing optional inputs, not values of the body.
    rename.update({formal: "" for formal in fproto.input[len(nproto.input):]})
    # An output the call leaves out (or names "") is a value of the body like any other.
    rename.update({formal: actual for formal, actual in zip(fproto.output, nproto.output)
                   if actual})
    attr_values = {a.name: a for a in fproto.attribute_proto}
    attr_values.update({a.name: a for a in nproto.attribute})

    def local(value: str) -> str:
        return rename.get(value, prefix + value) if value else ""

    for inner in fproto.node:
        clone = type(inner)()
        clone.CopyFrom(inner)
        clone.name = prefix + (inner.name or inner.op_type)
        pending = [clone]  # nodes to localize, the clone and those of its subgraphs
        while pending:
            node = pending.pop()
            if node is not clone and node.name:
                node.name = prefix + node.name
            for i, value in enumerate(node.input):
                node.input[i] = local(value)
            for i, value in enumerate(node.output):
                node.output[i] = local(value)
            for graph in _resolve_references(node, attr_values):
                # A function sees nothing of its caller, so every value a subgraph of its body
                # names is the function's own: prefixed like the body's.
                for info in (*graph.input, *graph.output, *graph.value_info):
                    info.name = local(info.name)
                for tensor in graph.initializer:
                    tensor.name = local(tensor.name)
                for sparse in graph.sparse_initializer:
                    sparse.values.name = local(sparse.values.name)
                pending.extend(graph.node)
        yield clone


def _resolve_references(node, attr_values: dict[str, Any]) -> list[Any]:
    """Replace ``node``'s references to function attributes by the attributes' values (one
    without a value is dropped: the op's default applies) and return the subgraphs of the
    node's own attributes (not of the resolved ones: those are the caller's, renamed by it)."""
    own: list[Any] = []
    if not any(attr.ref_attr_name for attr in node.attribute):
        for attr in node.attribute:
            own.extend(_graphs_of(attr))
        return own
    kept = []
    for attr in node.attribute:
        if not attr.ref_attr_name:
            kept.append((attr, True))
        elif attr.ref_attr_name in attr_values:
            resolved = type(attr)()
            resolved.CopyFrom(attr_values[attr.ref_attr_name])
            resolved.name = attr.name
            kept.append((resolved, False))
    del node.attribute[:]
    for attr, is_own in kept:
        node.attribute.append(attr)
        if is_own:
            own.extend(_graphs_of(node.attribute[-1]))
    return own


def _graphs_of(attr) -> list[Any]:
    """The graphs an attribute holds: one for GRAPH, a list for GRAPHS, else none."""
    from onnx import AttributeProto

    if attr.type == AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def _function_name(key: FunctionKey) -> str:
    return f"{key[0]}.{key[1]}" if key[0] else key[1]


def _chain(keys: Sequence[FunctionKey], shown: int = 4) -> str:
    """``a -> b -> c``; of a long chain only the ``shown`` first and last functions (a chain
    can be as long as the model has functions, and a message must stay readable)."""
    names = [_function_name(k) for k in keys]
    if len(names) > 2 * shown + 1:
        names = names[:shown] + [f"... ({len(names) - 2 * shown} more)"] + names[-shown:]
    return " -> ".join(names)


def _recursion_error(chain: list[FunctionKey]) -> ModelLoadError:
    return ModelLoadError(f"model-local function '{chain[-1][1]}' calls itself "
                          f"({_chain(chain)}); recursive functions cannot be inlined, and ONNX "
                          f"does not allow them")


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
    """Convert an ONNX TypeProto (tensor, sequence, optional) to an ember ValueType.

    The sequences and optionals around the element type are unwrapped in a loop and at most
    MAX_TYPE_DEPTH of them accepted: every later step that walks a type recurses once per
    level."""
    wrappers: list[type[SequenceType] | type[OptionalType]] = []
    which = tproto.WhichOneof("value")
    while which in ("sequence_type", "optional_type"):
        if len(wrappers) == MAX_TYPE_DEPTH:
            raise ModelLoadError(f"{where}: its declared type nests sequences and optionals "
                                 f"more than {MAX_TYPE_DEPTH} deep; fix the type in the model")
        if which == "sequence_type":
            wrappers.append(SequenceType)
            tproto = tproto.sequence_type.elem_type
        else:
            wrappers.append(OptionalType)
            tproto = tproto.optional_type.elem_type
        which = tproto.WhichOneof("value")
    vtype = _element_type(tproto, which, where)
    for wrap in reversed(wrappers):
        vtype = wrap(vtype)
    return vtype


def _element_type(tproto, which: str | None, where: str) -> TensorType | None:
    """The tensor type at the core of a declared type (None: unknown)."""
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

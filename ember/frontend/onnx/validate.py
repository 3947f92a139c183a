"""Checks of the parts of an ONNX file that ember's graph IR cannot represent wrongly later.

The importer turns a ModelProto into a Graph; what the file says about versions, dimensions and
sparse tensors must be checked on the way in, because afterwards a negative dim is just an int,
an opset of 999 is just a number and a sparse index out of range is an IndexError deep in numpy.
Each check names the value or tensor concerned and says what is wrong with it.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from ember.core.config import format_size, raise_limit_hint
from ember.core.errors import MemoryBudgetError, ModelLoadError
from ember.frontend.onnx.external_data import refuse_unloaded_external
from ember.ir.graph import Graph, Node
from ember.ir.types import OptionalType, SequenceType, TensorType

# The largest dimension ember accepts in a model file.  ONNX stores dims as int64, but a single
# axis longer than 2**31 - 1 elements is corrupt or hostile data in every real model; the bound
# keeps the product of any two dims inside int64, so the int64 shape arithmetic that exporters
# wrap around Shape (Mul/Concat/Reshape, folded during shape inference) cannot overflow on one
# product, and index arithmetic on an axis fits a 32-bit int.  Sizes of whole tensors are bounded
# separately, by the memory budget (ember.core.config).
MAX_DIM = 2**31 - 1

DEFAULT_DOMAIN = ""
ML_DOMAIN = "ai.onnx.ml"


def canonical_domain(domain: str) -> str:
    return DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain


def newest_opsets() -> dict[str, int]:
    """The newest opset of each domain whose version ember checks, as this onnx package knows
    it (ember implements the newest semantics and upgrades older versions to them)."""
    import onnx.defs

    return {DEFAULT_DOMAIN: onnx.defs.onnx_opset_version(),
            ML_DOMAIN: onnx.defs.onnx_ml_opset_version()}


def check_opsets(opset_imports: Iterable[Any], where: str) -> None:
    """Raise ModelLoadError listing every opset import of a known domain out of 1..newest.

    Custom domains (a model's own functions, vendor ops) have versions ember cannot judge.
    """
    newest = newest_opsets()
    problems = []
    too_new = False
    seen: dict[str, int] = {}
    for entry in opset_imports:
        domain = canonical_domain(entry.domain)
        if domain in seen:
            problems.append(f"domain '{domain or 'ai.onnx'}' is imported twice (opsets "
                            f"{seen[domain]} and {entry.version})")
            continue
        seen[domain] = entry.version
        if domain not in newest:
            continue
        if not 1 <= entry.version <= newest[domain]:
            label = "the default domain (ai.onnx)" if domain == DEFAULT_DOMAIN else \
                f"domain '{domain}'"
            problems.append(f"opset {entry.version} of {label}: valid opsets are 1 to "
                            f"{newest[domain]}")
            too_new = too_new or entry.version > newest[domain]
    if problems:
        hint = (" (if the opset is real, a newer onnx package knows it: pip install -U onnx)"
                if too_new else "")
        raise ModelLoadError(f"{where} imports invalid opset versions: " + "; ".join(problems)
                             + f". Fix the model's opset_import{hint}")


def check_text_fields(proto: Any, where: str) -> None:
    """Raise ModelLoadError if a string field anywhere in ``proto`` is not valid UTF-8.

    ONNX declares names, op types and domains as protobuf ``string`` fields, but its files use
    proto2, whose parser hands back ``bytes`` where a field holds invalid UTF-8.  Every later
    step assumes ``str`` (names are compared, hashed, printed and written to the manifest), so
    such a file is refused here, naming the field, instead of failing somewhere downstream.
    Only string fields are visited: tensor payloads are ``bytes`` or numbers and are skipped
    without being read.
    """
    from google.protobuf.descriptor import FieldDescriptor

    pending: list[tuple[Any, str]] = [(proto, where)]
    while pending:
        message, path = pending.pop()
        for field, value in message.ListFields():
            if field.type == FieldDescriptor.TYPE_STRING:
                values = value if _is_repeated(field) else [value]
                for index, text in enumerate(values):
                    if not isinstance(text, str):
                        raise ModelLoadError(
                            f"{path}.{field.name}{f'[{index}]' if _is_repeated(field) else ''} "
                            f"is not valid UTF-8 text ({bytes(text)[:40]!r}); the model file "
                            f"is corrupt or was written wrongly")
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                if _is_repeated(field):
                    pending.extend((item, f"{path}.{field.name}[{i}]")
                                   for i, item in enumerate(value))
                else:
                    pending.append((value, f"{path}.{field.name}"))


def _is_repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 5; older ones have .label
    return bool(repeated) if repeated is not None else field.label == field.LABEL_REPEATED


def dim_problem(dim: int) -> str | None:
    """Why ``dim`` (a concrete dimension from the file) is out of range, or None."""
    if dim < 0:
        return f"is negative ({dim})"
    if dim > MAX_DIM:
        return f"is {dim:,}, larger than the largest dimension ember accepts ({MAX_DIM:,})"
    return None


def check_dims(dims: Iterable[int], where: str) -> None:
    """Raise ModelLoadError if a concrete dim of a tensor in the file is out of range."""
    for axis, dim in enumerate(dims):
        problem = dim_problem(int(dim))
        if problem:
            raise ModelLoadError(f"{where}: dimension {axis} {problem}; the model file is "
                                 f"corrupt or was written wrongly")


def sparse_to_array(sparse: Any, where: str, memory_limit: int) -> np.ndarray:
    """The dense array of a SparseTensorProto, after checking that it is well formed.

    ONNX stores ``values`` (NNZ values) and ``indices``, either NNZ linear indices into the
    flattened tensor or an ``NNZ x rank`` matrix of coordinates.  The dense array is refused if
    it would exceed ``memory_limit`` bytes: a few bytes of file can describe terabytes.
    """
    from onnx import numpy_helper

    shape = tuple(int(d) for d in sparse.dims)
    check_dims(shape, where)
    refuse_unloaded_external(sparse.values, where)
    refuse_unloaded_external(sparse.indices, where)
    try:
        values = numpy_helper.to_array(sparse.values)
        indices = numpy_helper.to_array(sparse.indices) if sparse.HasField("indices") else \
            np.zeros((0,), np.int64)
    except Exception as error:
        raise ModelLoadError(f"{where}: cannot read the sparse tensor's values or indices "
                             f"({error})") from None
    count = math.prod(shape)
    nbytes = count * values.dtype.itemsize
    if nbytes > memory_limit:
        raise MemoryBudgetError(
            f"{where}: the sparse tensor of shape {list(shape)} is {format_size(nbytes)} dense, "
            f"more than the memory limit of {format_size(memory_limit)}; "
            f"{raise_limit_hint(nbytes)}", nbytes, memory_limit)
    if values.ndim != 1:
        raise ModelLoadError(f"{where}: sparse values must be a 1-D tensor, got shape "
                             f"{list(values.shape)}")
    nnz = values.shape[0]
    if indices.dtype.kind not in "iu":
        raise ModelLoadError(f"{where}: sparse indices must be integers, got {indices.dtype}")
    if indices.ndim == 1 and indices.shape[0] == nnz:
        bad = (indices < 0) | (indices >= count)
        flat = indices
    elif indices.ndim == 2 and indices.shape == (nnz, len(shape)):
        bad = ((indices < 0) | (indices >= np.asarray(shape, dtype=np.int64))).any(axis=1)
        strides = np.asarray([math.prod(shape[axis + 1:]) for axis in range(len(shape))],
                             dtype=np.int64)
        flat = indices.astype(np.int64) @ strides if not bad.any() else indices
    else:
        raise ModelLoadError(f"{where}: sparse indices of shape {list(indices.shape)} do not "
                             f"fit {nnz} values of a rank-{len(shape)} tensor (expected "
                             f"[{nnz}] or [{nnz}, {len(shape)}])")
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ModelLoadError(f"{where}: sparse index {indices[first].tolist()} (entry {first}) "
                             f"is out of range for shape {list(shape)}")
    dense = np.zeros(count, dtype=values.dtype)
    dense[flat] = values
    return dense.reshape(shape)


# ---------------------------------------------------------------------- type constraints


def check_type_constraints(graph: Graph) -> list[str]:
    """Problems of nodes whose inputs or outputs break their ONNX schema's type constraints.

    ONNX types every operand: ``Concat(inputs: T...)`` with ``T`` one of a list of tensor types
    means every input has the *same* type, from that list.  Shape inference checks some of
    this per op; checking it here, from the schemas of the installed ``onnx`` for every op
    ONNX defines, closes the rest at once (a Conv whose weight is int32 while its input is
    float, a Concat of int64 and float6 ...), before a kernel is built for operands it does
    not expect.  ember's nodes carry the newest opset's semantics (older ones were upgraded
    on import), so the newest schema is the one that applies.  Values of unknown type and
    ops ONNX does not define are skipped.
    """
    problems: list[str] = []
    _check_graph_types(graph, {}, problems)
    return problems


def _check_graph_types(graph: Graph, outer_types: dict[str, Any], problems: list[str]) -> None:
    types = {**outer_types, **graph.types}
    for node in graph.nodes:
        problem = _node_type_problem(node, types)
        if problem:
            problems.append(f"graph '{graph.name}': node '{node.name}' ({node.op}): {problem}")
        for sub in node.subgraphs():
            _check_graph_types(sub, types, problems)


def _node_type_problem(node: Node, types: dict[str, Any]) -> str | None:
    schema = _newest_schema(node)
    if schema is None:
        return None
    bound: dict[str, tuple[str, str]] = {}  # type parameter -> (type, which operand)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    for label, formals, names in (("input", schema.inputs, node.inputs),
                                  ("output", schema.outputs, node.outputs)):
        for position, name in enumerate(names):
            if not name or not formals:
                continue
            formal = formals[min(position, len(formals) - 1)]
            if position >= len(formals) and formal.option != formal.option.Variadic:
                continue  # surplus operands: the arity check reports them
            actual = _type_string(types.get(name))
            if actual is None:
                continue
            operand = f"{label} {position} ('{name}')"
            param = formal.type_str
            if param not in allowed:  # a concrete type, e.g. tensor(int64)
                if actual != param:
                    return f"{operand} is {actual}; ONNX requires {param}"
                continue
            if actual not in allowed[param]:
                return (f"{operand} is {actual}, which {node.op} does not take for "
                        f"'{formal.name}' ({param} is one of {_short(allowed[param])})")
            homogeneous = formal.option != formal.option.Variadic or formal.is_homogeneous
            if param in bound and bound[param][0] != actual and homogeneous:
                other_type, other = bound[param]
                return (f"{operand} is {actual} but {other} is {other_type}; both are of "
                        f"type {param} and must be the same type")
            bound.setdefault(param, (actual, operand))
    return None


def _newest_schema(node: Node) -> Any:
    import onnx.defs

    domain = node.domain if node.domain in ("", ML_DOMAIN) else None
    if domain is None:
        return None
    op_type = node.op[len(domain) + 1:] if domain and node.op.startswith(domain + ".") \
        else node.op
    if not onnx.defs.has(op_type, domain):
        return None
    try:
        return onnx.defs.get_schema(op_type, newest_opsets()[domain], domain)
    except onnx.defs.SchemaError:
        return None


def _type_string(vtype: Any) -> str | None:
    """The ONNX spelling of an ember value type (``tensor(float)``), None if not fully known."""
    from onnx import TensorProto

    if isinstance(vtype, TensorType):
        return f"tensor({TensorProto.DataType.Name(vtype.dtype.onnx).lower()})"
    if isinstance(vtype, SequenceType):
        inner = _type_string(vtype.elem)
        return None if inner is None else f"seq({inner})"
    if isinstance(vtype, OptionalType):
        inner = _type_string(vtype.elem)
        return None if inner is None else f"optional({inner})"
    return None


def _short(types: set[str]) -> str:
    listed = sorted(types)
    return ", ".join(listed[:6]) + (f" and {len(listed) - 6} more" if len(listed) > 6 else "")

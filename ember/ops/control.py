"""Control flow: If, Loop and Scan, whose bodies are subgraphs.

A body is an ember :class:`~ember.ir.graph.Graph` held in an attribute.  The references run it
with ``ctx.run_subgraph`` and the ``infer`` functions type it with ``ctx.infer_subgraph``; a
body may read values of its enclosing graphs by name.

Values carried from one iteration to the next (Loop's ``v_initial``, Scan's states) may change
shape across iterations, so their types are found as a fixed point: the body is typed with the
initial types, the types it produces are joined with them (dims that differ become unknown),
and the body is typed again until nothing changes.

The type-joining helpers (:func:`join_types`) are shared with the sequence ops, where elements
of several origins meet in one sequence.

These references are also how a compiled model runs control flow (a host node calls them), so
they are where a model file's loops are bounded: one run of a Loop makes at most
``ember.core.config.max_loop_iterations()`` iterations (``EMBER_MAX_LOOP_ITERATIONS``), and one
that would make more is an :class:`~ember.core.errors.ExecutionError` naming the node, instead
of a process that never returns.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ember.core.config import MAX_LOOP_ITERATIONS_ENV, max_loop_iterations
from ember.core.dims import Dim, SymDim, dims_equal
from ember.core.dtypes import DType
from ember.core.errors import ExecutionError
from ember.ir.graph import Graph
from ember.ir.types import OptionalType, SequenceType, TensorType, ValueType
from ember.ops.registry import REQUIRED, Attr, InferContext, RefContext, op
from ember.ops.shape_infer import normalize_axis

# ----------------------------------------------------------------------------- type joins


def join_shapes(a: tuple[Dim, ...] | None,
                b: tuple[Dim, ...] | None) -> tuple[Dim, ...] | None:
    """A shape that fits both ``a`` and ``b``: dims that may differ become unknown."""
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if dims_equal(x, y) is True else None for x, y in zip(a, b))


def join_types(a: ValueType | None, b: ValueType | None) -> ValueType | None:
    """The most precise type describing values of type ``a`` as well as values of type ``b``.

    An unknown type (None) on either side, or two kinds that differ, give an unknown type.
    """
    if a is None or b is None:
        return None
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        if a.dtype != b.dtype:
            return None
        return TensorType(a.dtype, join_shapes(a.shape, b.shape))
    if isinstance(a, SequenceType) and isinstance(b, SequenceType):
        return SequenceType(join_types(a.elem, b.elem))
    if isinstance(a, OptionalType) and isinstance(b, OptionalType):
        return OptionalType(join_types(a.elem, b.elem))
    return None


def element_dtype(vtype: ValueType | None) -> DType | None:
    """The element type of a tensor, or of the tensors a sequence/optional holds."""
    while isinstance(vtype, (SequenceType, OptionalType)):
        vtype = vtype.elem
    return vtype.dtype if isinstance(vtype, TensorType) else None


# ----------------------------------------------------------------------------- body typing

_MAX_WIDENING_ROUNDS = 6


def _snapshot_types(graph: Graph) -> list[tuple[Graph, dict[str, ValueType]]]:
    """The types of ``graph`` and of every graph nested in it, to undo an inference."""
    saved = [(graph, dict(graph.types))]
    for node in graph.nodes:
        for sub in node.subgraphs():
            saved.extend(_snapshot_types(sub))
    return saved


def _restore_types(saved: list[tuple[Graph, dict[str, ValueType]]]) -> None:
    for graph, types in saved:
        graph.types.clear()
        graph.types.update(types)


def _refine(given: ValueType | None, declared: ValueType | None) -> ValueType | None:
    """The type a body input gets: the one given by the op, unless the body says more."""
    if given is None:
        return declared
    if isinstance(given, TensorType) and isinstance(declared, TensorType) \
            and given.shape is None and given.dtype == declared.dtype:
        return declared
    return given


def infer_body(ctx: InferContext, body: Graph, input_types: Sequence[ValueType | None],
               what: str = "body") -> list[ValueType | None]:
    """Type ``body`` with ``input_types`` for its inputs; returns its output types."""
    if len(body.inputs) != len(input_types):
        raise ctx.error(f"the {what} takes {len(body.inputs)} input(s), "
                        f"the node gives it {len(input_types)}")
    for name, vtype in zip(body.inputs, input_types):
        refined = _refine(vtype, body.types.get(name))
        if refined is not None:
            body.types[name] = refined
    return list(ctx.infer_subgraph(body, list(input_types)))


def infer_carried_body(
    ctx: InferContext,
    body: Graph,
    prefix: list[ValueType | None],
    carried: list[ValueType | None],
    suffix: list[ValueType | None],
    out_offset: int,
) -> tuple[list[ValueType | None], list[ValueType | None]]:
    """Type a loop body whose inputs are ``prefix + carried + suffix`` and whose outputs hold
    the next carried values from position ``out_offset`` on.

    Returns (carried types valid in every iteration, body output types).
    """
    declared = _snapshot_types(body)
    current = list(carried)
    for _ in range(_MAX_WIDENING_ROUNDS):
        outputs = infer_body(ctx, body, prefix + current + suffix)
        if len(outputs) < out_offset + len(current):
            raise ctx.error(f"the body produces {len(outputs)} output(s); it must produce at "
                            f"least {out_offset + len(current)}")
        produced = outputs[out_offset:out_offset + len(current)]
        widened = [join_types(c, p) for c, p in zip(current, produced)]
        if widened == current:
            return current, outputs
        current = widened
        _restore_types(declared)
    # Still changing (deeply nested types): give up on the precision of what changes.
    current = [c if c == p else None for c, p in zip(current, produced)]
    _restore_types(declared)
    return current, infer_body(ctx, body, prefix + current + suffix)


def _with_new_axis(elem: ValueType | None, axis: int, dim: Dim) -> ValueType | None:
    """The type of per-iteration values ``elem`` stacked along a new ``axis`` of size ``dim``."""
    if not isinstance(elem, TensorType):
        return None
    if elem.shape is None:
        return TensorType(elem.dtype, None)
    shape = list(elem.shape)
    shape.insert(normalize_axis(axis, len(shape) + 1), dim)
    return TensorType(elem.dtype, tuple(shape))


# ----------------------------------------------------------------------------- run helpers


def _scalar(ctx: RefContext, value: np.ndarray, what: str) -> Any:
    array = np.asarray(value)
    if array.size != 1:
        raise ctx.error(f"{what} must hold exactly one element, got shape {array.shape}")
    return array.reshape(-1)[0].item()


def _stack(ctx: RefContext, body: Graph, output_index: int, items: list[np.ndarray],
           input_shapes: list[tuple[int, ...] | None], axis: int = 0) -> np.ndarray:
    """Stack per-iteration values along ``axis``.

    With no iteration there is no value to look at: the empty result is shaped after the
    body's output type, its symbols bound by the shapes the body inputs would have had
    (``input_shapes``); a dim that stays unknown becomes 0.
    """
    if items:
        shapes = {item.shape for item in items}
        if len(shapes) > 1:
            raise ctx.error(f"scan output {output_index} changes shape across iterations "
                            f"({sorted(shapes)}); ONNX requires one shape")
        return np.stack(items, axis=normalize_axis(axis, items[0].ndim + 1))
    vtype = body.types.get(body.outputs[output_index])
    if not isinstance(vtype, TensorType):
        raise ctx.error(f"the loop ran no iteration and the type of body output "
                        f"'{body.outputs[output_index]}' is unknown, so its empty scan output "
                        f"cannot be built")
    bindings = _bind_symbols(body, input_shapes)
    dims = [_concrete_dim(d, bindings) for d in (vtype.shape or ())]
    dims.insert(normalize_axis(axis, len(dims) + 1), 0)
    return np.zeros(dims, dtype=vtype.dtype.numpy)


def _bind_symbols(body: Graph, input_shapes: list[tuple[int, ...] | None]) -> dict[str, int]:
    """Sizes of the symbols in the body's input types, read off actual input shapes."""
    bindings: dict[str, int] = {}
    for name, shape in zip(body.inputs, input_shapes):
        vtype = body.types.get(name)
        if shape is None or not isinstance(vtype, TensorType) or vtype.shape is None \
                or len(vtype.shape) != len(shape):
            continue
        for dim, size in zip(vtype.shape, shape):
            if isinstance(dim, SymDim) and len(dim.terms) == 1 and dim.terms[0][1] == 1 \
                    and len(dim.terms[0][0]) == 1:
                bindings.setdefault(dim.terms[0][0][0], size)
    return bindings


def _concrete_dim(dim: Dim, bindings: dict[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    if isinstance(dim, SymDim) and dim.symbols <= bindings.keys():
        return dim.evaluate(bindings)
    return 0


def _shape_of(value: Any) -> tuple[int, ...] | None:
    return value.shape if isinstance(value, np.ndarray) else None


# ----------------------------------------------------------------------------- If


def _infer_if(ctx: InferContext) -> list[ValueType | None]:
    branches = []
    for key in ("then_branch", "else_branch"):
        types = infer_body(ctx, ctx.attrs[key], [], key)
        if len(types) != ctx.num_outputs:
            raise ctx.error(f"{key} produces {len(types)} output(s), the node has "
                            f"{ctx.num_outputs}")
        branches.append(types)
    then_types, else_types = branches
    for index, (a, b) in enumerate(zip(then_types, else_types)):
        dtype_a, dtype_b = element_dtype(a), element_dtype(b)
        if dtype_a is not None and dtype_b is not None and dtype_a != dtype_b:
            raise ctx.error(f"output {index} is {a} in then_branch but {b} in else_branch")
    cond = ctx.value(0)
    if cond is not None and np.asarray(cond).size == 1 and np.asarray(cond).dtype != object:
        return then_types if bool(np.asarray(cond).reshape(-1)[0]) else else_types
    return [join_types(a, b) for a, b in zip(then_types, else_types)]


@op("If", family="control", infer=_infer_if, outputs=(1, -1), foldable=False,
    attrs={"then_branch": Attr.graph(REQUIRED), "else_branch": Attr.graph(REQUIRED)})
def if_(ctx, cond, *, then_branch, else_branch):
    """Run then_branch if the one-element ``cond`` is true, else else_branch."""
    branch = then_branch if _scalar(ctx, cond, "the condition") else else_branch
    results = ctx.run_subgraph(branch, [])
    if len(results) < ctx.num_outputs:
        raise ctx.error(f"the branch produced {len(results)} output(s), the node has "
                        f"{ctx.num_outputs}")
    return tuple(results)


# ----------------------------------------------------------------------------- Loop

_ITERATION_TYPE = TensorType(DType.INT64, ())
_CONDITION_TYPE = TensorType(DType.BOOL, ())


def _infer_loop(ctx: InferContext) -> list[ValueType | None]:
    body: Graph = ctx.attrs["body"]
    initial = list(ctx.inputs[2:])
    carried, outputs = infer_carried_body(ctx, body, [_ITERATION_TYPE, _CONDITION_TYPE],
                                          initial, [], out_offset=1)
    scan_elems = outputs[1 + len(carried):]
    trips: Dim = None
    trip_value = ctx.value(0)
    if trip_value is not None and not ctx.has_input(1) and np.asarray(trip_value).size == 1:
        value = np.asarray(trip_value).reshape(-1)[0]
        trips = value if isinstance(value, SymDim) else max(int(value), 0)
    scans = [_with_new_axis(elem, 0, trips) for elem in scan_elems]
    return carried + scans


@op("Loop", family="control", infer=_infer_loop, outputs=(1, -1), foldable=False,
    attrs={"body": Attr.graph(REQUIRED)})
def loop(ctx, trip_count=None, cond=None, *initial, body):
    """Run body while the iteration count is below trip_count and the condition holds;
    returns the final loop-carried values and the per-iteration scan outputs stacked."""
    if trip_count is None and cond is None:
        raise ctx.error("Loop has neither a trip count nor a condition: it would never end")
    max_trips = None if trip_count is None else int(_scalar(ctx, trip_count, "trip count"))
    running = True if cond is None else bool(_scalar(ctx, cond, "the condition"))
    carried = list(initial)
    n_scan = len(body.outputs) - 1 - len(carried)
    if n_scan < 0:
        raise ctx.error(f"the body produces {len(body.outputs)} outputs; it must produce the "
                        f"condition and {len(carried)} loop-carried value(s)")
    limit = max_loop_iterations()
    if cond is None and max_trips is not None and max_trips > limit:
        # Without a condition input nothing but the trip count ends the loop: refuse it now
        # rather than after ``limit`` iterations.
        raise _too_many_iterations(ctx, limit, f"its trip count is {max_trips:,}")
    # The bound folds into the loop's own test, so checking it costs nothing per iteration.
    bound = limit if max_trips is None else min(max_trips, limit)
    scanned: list[list[np.ndarray]] = [[] for _ in range(n_scan)]
    iteration = 0
    while running and iteration < bound:
        results = ctx.run_subgraph(body, [np.array(iteration, dtype=np.int64),
                                          np.array(running), *carried])
        if cond is not None:
            running = bool(_scalar(ctx, results[0], "the body's condition output"))
        carried = list(results[1:1 + len(carried)])
        for items, value in zip(scanned, results[1 + len(carried):]):
            items.append(value)
        iteration += 1
    if running and iteration == limit and (max_trips is None or max_trips > limit):
        trips = "" if max_trips is None else f" and its trip count is {max_trips:,}"
        raise _too_many_iterations(ctx, limit, f"its condition stayed true{trips}")
    shapes = [(), (), *(_shape_of(value) for value in carried)]
    stacked = [_stack(ctx, body, 1 + len(carried) + k, items, shapes)
               for k, items in enumerate(scanned)]
    return tuple(carried + stacked)


def _too_many_iterations(ctx: RefContext, limit: int, why: str) -> ExecutionError:
    """The error of a Loop run that would make more than ``limit`` iterations: a model whose
    condition never turns false (or whose trip count is 2**62) would otherwise never return."""
    return ExecutionError(
        f"node '{ctx.node.name}' (Loop) would run more than {limit:,} iterations ({why}); ember "
        f"stops a Loop there. If the model really loops this long, raise the limit with the "
        f"environment variable {MAX_LOOP_ITERATIONS_ENV}={limit * 10}")


# ----------------------------------------------------------------------------- Scan


def _scan_axes(ctx: InferContext | RefContext, attrs_value: list[int] | None, count: int,
               what: str) -> list[int]:
    values = list(attrs_value) if attrs_value is not None else [0] * count
    if len(values) != count:
        raise ctx.error(f"{what} has {len(values)} entries; there are {count}")
    return values


def _infer_scan(ctx: InferContext) -> list[ValueType | None]:
    attrs = ctx.attrs
    body: Graph = attrs["body"]
    n_inputs = attrs["num_scan_inputs"]
    n_state = len(ctx.inputs) - n_inputs
    if n_inputs < 1 or n_state < 0:
        raise ctx.error(f"num_scan_inputs={n_inputs} does not fit the node's "
                        f"{len(ctx.inputs)} inputs")
    in_axes = _scan_axes(ctx, attrs["scan_input_axes"], n_inputs, "scan_input_axes")
    elems: list[ValueType | None] = []
    length: Dim = None
    for index, (vtype, axis) in enumerate(zip(ctx.inputs[n_state:], in_axes)):
        if not isinstance(vtype, TensorType) or vtype.shape is None:
            elems.append(TensorType(vtype.dtype, None) if isinstance(vtype, TensorType)
                         else None)
            continue
        axis = normalize_axis(axis, len(vtype.shape), ctx)
        dim = vtype.shape[axis]
        if index == 0 or length is None:
            length = dim
        elif dims_equal(length, dim) is False:
            raise ctx.error(f"scan inputs have different lengths ({length} and {dim})")
        elems.append(TensorType(vtype.dtype, vtype.shape[:axis] + vtype.shape[axis + 1:]))
    states, outputs = infer_carried_body(ctx, body, [], list(ctx.inputs[:n_state]), elems,
                                         out_offset=0)
    scan_elems = outputs[n_state:]
    out_axes = _scan_axes(ctx, attrs["scan_output_axes"], len(scan_elems), "scan_output_axes")
    return states + [_with_new_axis(elem, axis, length)
                     for elem, axis in zip(scan_elems, out_axes)]


@op("Scan", family="control", infer=_infer_scan, inputs=(1, -1), outputs=(1, -1),
    foldable=False, attrs={
        "body": Attr.graph(REQUIRED),
        "num_scan_inputs": Attr.int(REQUIRED),
        "scan_input_axes": Attr.ints(None),
        "scan_input_directions": Attr.ints(None),
        "scan_output_axes": Attr.ints(None),
        "scan_output_directions": Attr.ints(None),
    })
def scan(ctx, *inputs, body, num_scan_inputs, scan_input_axes, scan_input_directions,
         scan_output_axes, scan_output_directions):
    """Iterate body over slices of the scan inputs, carrying states; returns the final states
    and the per-iteration scan outputs stacked."""
    n_state = len(inputs) - num_scan_inputs
    if num_scan_inputs < 1 or n_state < 0:
        raise ctx.error(f"num_scan_inputs={num_scan_inputs} does not fit the node's "
                        f"{len(inputs)} inputs")
    states, sequences = list(inputs[:n_state]), inputs[n_state:]
    in_axes = [normalize_axis(a, x.ndim, ctx) for a, x in zip(
        _scan_axes(ctx, scan_input_axes, num_scan_inputs, "scan_input_axes"), sequences)]
    in_reverse = _scan_axes(ctx, scan_input_directions, num_scan_inputs,
                            "scan_input_directions")
    lengths = {x.shape[axis] for x, axis in zip(sequences, in_axes)}
    if len(lengths) != 1:
        raise ctx.error(f"scan inputs have different lengths {sorted(lengths)} along their "
                        f"scan axes")
    length = lengths.pop()
    n_scan_out = len(body.outputs) - n_state
    scanned: list[list[np.ndarray]] = [[] for _ in range(n_scan_out)]
    for t in range(length):
        elems = [np.take(x, length - 1 - t if reverse else t, axis=axis)
                 for x, axis, reverse in zip(sequences, in_axes, in_reverse)]
        results = ctx.run_subgraph(body, [*states, *elems])
        states = list(results[:n_state])
        for items, value in zip(scanned, results[n_state:]):
            items.append(value)
    out_axes = _scan_axes(ctx, scan_output_axes, n_scan_out, "scan_output_axes")
    out_reverse = _scan_axes(ctx, scan_output_directions, n_scan_out, "scan_output_directions")
    shapes = [_shape_of(value) for value in states] + \
        [x.shape[:axis] + x.shape[axis + 1:] for x, axis in zip(sequences, in_axes)]
    stacked = [_stack(ctx, body, n_state + k, items[::-1] if reverse else items, shapes, axis)
               for k, (items, axis, reverse) in enumerate(zip(scanned, out_axes, out_reverse))]
    return tuple(states + stacked)

"""The op registry: one :class:`OpDef` per op.

An OpDef is everything ember knows about an op, in one place:

* its attribute schema (kind and default of each attribute),
* how many inputs and outputs it takes,
* type/shape inference (``infer``), which works with symbolic dims,
* a numpy reference implementation (``reference``), the oracle for tests and the fallback
  when no compiled kernel exists,
* its *pattern kind* (:class:`PatternKind`: elementwise, broadcast, injective, reduction,
  anchor or opaque), which decides what the fusion pass may put in one kernel with it,
* whether constant folding may evaluate it at compile time (``foldable``: not control flow,
  whose bodies are graphs of their own),
* algebraic and behavioural facts that passes ask about instead of keeping op-name tables of
  their own: ``commutative`` (the two inputs of a two-input node may be swapped) and
  ``random`` (the op draws random numbers, so two equal nodes are not the same value),
* its cost rule (``flops``, from ``ember.ops.cost``; bytes moved follow from the types),
* the declarative compute definition that lowering turns into a loop nest (``compute``,
  attached by ``ember.ops.compute``).

Ops are declared with the :func:`op` decorator on the reference function, one file per family
(``elementwise.py``, ``reduce.py`` ...).  The reference takes ``(ctx, *inputs, **attrs)``;
optional inputs that are absent arrive as ``None``; its return is an array or a tuple of them.

Op semantics follow the newest ONNX opset; the ONNX frontend rewrites older versions of an op
into this form, so each op is implemented once.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ember.core.errors import OpAttributeError, ShapeError

if TYPE_CHECKING:
    from ember.ir.graph import Graph, Node
    from ember.ir.types import ValueType


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

ATTR_KINDS = ("int", "float", "string", "ints", "floats", "strings", "tensor", "graph", "graphs",
              "type", "any")


@dataclass(frozen=True)
class Attr:
    """Schema of one attribute: its kind and its default (``REQUIRED`` if it has none).

    ``default=None`` means optional with no default: the reference receives ``None``.
    """

    kind: str
    default: Any = None

    def __post_init__(self) -> None:
        if self.kind not in ATTR_KINDS:
            raise ValueError(f"unknown attribute kind {self.kind!r}")

    @staticmethod
    def int(default: Any = None) -> "Attr":
        return Attr("int", default)

    @staticmethod
    def float(default: Any = None) -> "Attr":
        return Attr("float", default)

    @staticmethod
    def string(default: Any = None) -> "Attr":
        return Attr("string", default)

    @staticmethod
    def ints(default: Any = None) -> "Attr":
        return Attr("ints", default)

    @staticmethod
    def floats(default: Any = None) -> "Attr":
        return Attr("floats", default)

    @staticmethod
    def strings(default: Any = None) -> "Attr":
        return Attr("strings", default)

    @staticmethod
    def tensor(default: Any = None) -> "Attr":
        return Attr("tensor", default)

    @staticmethod
    def graph(default: Any = None) -> "Attr":
        return Attr("graph", default)


InferFn = Callable[["InferContext"], "list[ValueType | None]"]


class PatternKind(enum.IntEnum):
    """How an op's outputs depend on its inputs, which is what fusion needs to know (the
    kinds of TVM's FuseOps).  Ordered from the most to the least fusable."""

    ELEMENTWISE = 0  # out[i] = f(x[i]): one input element per output element, same shape
    BROADCAST = 1    # elementwise over several inputs, some broadcast (a bias, a scalar)
    INJECTIVE = 2    # out[i] = x[g(i)]: data moved, not combined (transpose, gather, concat)
    REDUCTION = 3    # combines many input elements per output (ReduceSum, Softmax, pooling)
    ANCHOR = 4       # matmul, conv: elementwise consumers fuse into its epilogue
    OPAQUE = 5       # no kernel of its own kind: control flow, data-dependent shapes ...


# The pattern kind of each op family; ops that differ from their family's say so in ``op``.
FAMILY_PATTERNS = {
    "activation": PatternKind.ELEMENTWISE, "elementwise": PatternKind.ELEMENTWISE,
    "logical": PatternKind.ELEMENTWISE, "cast": PatternKind.ELEMENTWISE,
    "shape": PatternKind.INJECTIVE, "generator": PatternKind.INJECTIVE,
    "indexing": PatternKind.INJECTIVE, "image": PatternKind.INJECTIVE,
    "reduce": PatternKind.REDUCTION, "norm": PatternKind.REDUCTION,
    "pool": PatternKind.REDUCTION, "matmul": PatternKind.ANCHOR, "conv": PatternKind.ANCHOR,
}


@dataclass
class OpDef:
    name: str
    family: str
    reference: Callable[..., Any]
    infer: InferFn
    attrs: dict[str, Attr]
    min_inputs: int
    max_inputs: int  # -1 for variadic
    min_outputs: int = 1
    max_outputs: int = 1
    # Input positions that may be left empty ("" in ONNX): the reference's parameters with a
    # default.  Every other position, variadic ones included, must name a value.
    optional_inputs: frozenset[int] = frozenset()
    pattern: PatternKind = PatternKind.OPAQUE
    foldable: bool = True
    # ``op(a, b)`` and ``op(b, a)`` are the same value, bit for bit (NaN payloads aside), for
    # every input type the op accepts.  For a variadic op this speaks of a node with two
    # inputs only: with three or more, float rounding depends on the order of the inputs.
    # Read by CSE (``ember/passes/cse.py``) and the pattern matcher
    # (``ember/passes/patterns.py``).
    commutative: bool = False
    # The op draws random numbers (in some mode), so two nodes with equal inputs and
    # attributes are different values: CSE never merges them.  An op with a ``seed``
    # attribute must say so (tests/ops/test_opdef_facts.py).
    random: bool = False
    doc: str = ""
    # Attached when the registry loads; None means "not available".
    compute: Any = None  # ember.ops.compute: the compute definition
    flops: Callable[["Node", Any], Any] | None = None  # ember.ops.cost: FLOPs rule

    def resolve_attrs(self, node: "Node") -> dict[str, Any]:
        """The node's attributes with defaults filled in.

        Unknown, missing required and wrongly-kinded attributes are errors; all of a node's
        attribute problems are listed in one OpAttributeError, so that a malformed model is
        fixed in one round.
        """
        problems = []
        unknown = set(node.attrs) - set(self.attrs)
        if unknown:
            problems.append(f"unknown attribute(s) {sorted(unknown)}; {self.name} accepts "
                            f"{sorted(self.attrs) or 'no attributes'}")
        resolved = {}
        for key, spec in self.attrs.items():
            if key in node.attrs:
                value, problem = _coerce_attr(key, spec, node.attrs[key])
                if problem:
                    problems.append(problem)
                resolved[key] = value
            elif spec.default is REQUIRED:
                problems.append(f"required attribute '{key}' is missing")
            else:
                resolved[key] = spec.default
        if problems:
            raise OpAttributeError(f"node '{node.name}' ({self.name}): " + "; ".join(problems))
        return resolved

    def check_arity(self, node: "Node") -> None:
        n_in = len(node.inputs)
        if n_in < self.min_inputs or (self.max_inputs >= 0 and n_in > self.max_inputs):
            expected = (f"{self.min_inputs}" if self.min_inputs == self.max_inputs else
                        f"{self.min_inputs} to {'any' if self.max_inputs < 0 else self.max_inputs}")
            raise ShapeError(f"node '{node.name}' ({self.name}) has {n_in} inputs; "
                             f"{self.name} takes {expected}")
        empty = [i for i, name in enumerate(node.inputs)
                 if not name and i not in self.optional_inputs]
        if empty:
            raise ShapeError(f"node '{node.name}' ({self.name}): input(s) {empty} are empty, "
                             f"but {self.name} requires them (only optional inputs may be "
                             f"left out)")
        n_out = len(node.outputs)
        if n_out < self.min_outputs or (self.max_outputs >= 0 and n_out > self.max_outputs):
            raise ShapeError(f"node '{node.name}' ({self.name}) has {n_out} outputs; "
                             f"{self.name} produces {self.min_outputs} to "
                             f"{'any' if self.max_outputs < 0 else self.max_outputs}")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, (float, np.floating))


def _coerce_attr(key: str, spec: Attr, value: Any) -> tuple[Any, str | None]:
    """``(value, None)`` with numbers normalized to Python ints/floats, or ``(value, problem)``
    when the value is not of the declared kind.

    Kinds are strict: a float is never an int (a float ``perm`` or ``axis`` in a model file is
    a malformed model, not something to round), but an int is a valid float, as in ONNX's own
    checker.  A value of None stands for "not given" and passes.
    """
    from ember.ir.graph import Graph
    from ember.ir.types import OptionalType, SequenceType, TensorType

    if value is None or spec.kind == "any":
        return value, None
    scalar_checks = {"int": _is_int, "float": _is_number, "string": lambda v: isinstance(v, str)}
    if spec.kind in scalar_checks:
        if scalar_checks[spec.kind](value):
            return (int(value) if spec.kind == "int" else
                    float(value) if spec.kind == "float" else value), None
    elif spec.kind in ("ints", "floats", "strings"):
        item_kind = spec.kind[:-1]
        if isinstance(value, (list, tuple)) and all(scalar_checks[item_kind](v) for v in value):
            convert = {"int": int, "float": float, "string": str}[item_kind]
            return [convert(v) for v in value], None
    elif spec.kind == "tensor":
        if isinstance(value, np.ndarray):
            return value, None
    elif spec.kind == "graph":
        if isinstance(value, Graph):
            return value, None
    elif spec.kind == "graphs":
        if isinstance(value, list) and all(isinstance(v, Graph) for v in value):
            return value, None
    elif spec.kind == "type":
        if isinstance(value, (TensorType, SequenceType, OptionalType)):
            return value, None
    return value, (f"attribute '{key}' must be of kind {spec.kind}, got "
                   f"{_describe_value(value)}")


def _describe_value(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype}{list(value.shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


_REGISTRY: dict[str, OpDef] = {}


def op(
    name: str,
    *,
    family: str,
    infer: InferFn,
    attrs: dict[str, Attr] | None = None,
    inputs: tuple[int, int] | None = None,
    outputs: tuple[int, int] = (1, 1),
    pattern: PatternKind | None = None,
    foldable: bool = True,
    commutative: bool = False,
    random: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated numpy reference as op ``name``.

    ``inputs`` defaults to what the reference's signature says: positional parameters after
    ``ctx`` are inputs, those defaulting to None optional, ``*args`` variadic.  ``pattern``
    defaults to the family's (:data:`FAMILY_PATTERNS`), with elementwise ops of several
    inputs counted as broadcasting.  ``foldable=False`` keeps constant folding from evaluating
    the op at compile time.  ``commutative`` and ``random`` are the facts of the same names
    on :class:`OpDef`; a commutative op must take two inputs (or be variadic).
    """

    def register(reference: Callable[..., Any]) -> Callable[..., Any]:
        if name in _REGISTRY:
            raise ValueError(f"op {name} registered twice")
        min_in, max_in = inputs if inputs is not None else _arity_from_signature(reference)
        if commutative and max_in not in (2, -1):
            raise ValueError(f"op {name}: only an op of two inputs (or variadic) can be "
                             f"commutative")
        _REGISTRY[name] = OpDef(
            name=name,
            family=family,
            reference=reference,
            infer=infer,
            attrs=dict(attrs or {}),
            min_inputs=min_in,
            max_inputs=max_in,
            min_outputs=outputs[0],
            max_outputs=outputs[1],
            optional_inputs=_optional_positions(reference),
            pattern=pattern if pattern is not None else _default_pattern(family, max_in),
            foldable=foldable,
            commutative=commutative,
            random=random,
            doc=inspect.getdoc(reference) or "",
        )
        return reference

    return register


def compute_of(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Attach the decorated compute definition to the ops ``names`` (already registered).

    A compute function takes ``(ctx, *input_tensors, **attrs)`` (see ``ember.ir.compute``) and
    returns the output tensor(s); it raises ``ember.ops.registry.NoCompute`` for
    configurations it does not handle, which then run the numpy reference instead.
    """

    def attach(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            opdef = _REGISTRY.get(name)
            if opdef is None:
                raise ValueError(f"compute for unknown op {name}")
            if opdef.compute is not None:
                raise ValueError(f"op {name} has two compute definitions")
            opdef.compute = fn
        return fn

    return attach


class NoCompute(Exception):
    """Raised by a compute definition for a case it does not cover (dtype, attribute value)."""


def _arity_from_signature(fn: Callable[..., Any]) -> tuple[int, int]:
    params = list(inspect.signature(fn).parameters.values())[1:]  # skip ctx
    required = optional = 0
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            return required, -1
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if p.default is inspect.Parameter.empty:
                required += 1
            else:
                optional += 1
    return required, required + optional


def _default_pattern(family: str, max_inputs: int) -> PatternKind:
    kind = FAMILY_PATTERNS.get(family, PatternKind.OPAQUE)
    if kind is PatternKind.ELEMENTWISE and (max_inputs < 0 or max_inputs > 1):
        return PatternKind.BROADCAST
    return kind


def _optional_positions(fn: Callable[..., Any]) -> frozenset[int]:
    """Input positions of ``fn`` (after ``ctx``) whose parameter has a default."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    return frozenset(i for i, p in enumerate(params)
                     if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                     and p.default is not inspect.Parameter.empty)


def get_op(name: str) -> OpDef | None:
    _load_families()
    return _REGISTRY.get(name)


def all_ops() -> dict[str, OpDef]:
    _load_families()
    return dict(_REGISTRY)


_loaded = False


def _load_families() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import ember.ops.families  # noqa: F401  (registers every op family)
        import ember.ops.compute  # noqa: F401  (attaches compute definitions)
        from ember.ops.cost import attach_cost_rules

        attach_cost_rules(_REGISTRY)


# ---------------------------------------------------------------------------- contexts


class InferContext:
    """What an op's ``infer`` function sees of a node."""

    def __init__(
        self,
        node: "Node",
        opdef: OpDef,
        input_types: Sequence["ValueType | None"],
        attrs: dict[str, Any],
        constant_of: Callable[[str], np.ndarray | None],
        infer_subgraph: Callable[["Graph", list["ValueType | None"]], list["ValueType | None"]],
    ):
        self.node = node
        self.opdef = opdef
        self.inputs = list(input_types)
        self.attrs = attrs
        self._constant_of = constant_of
        self._infer_subgraph = infer_subgraph

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    @property
    def num_outputs(self) -> int:
        return len(self.node.outputs)

    def has_input(self, index: int) -> bool:
        return index < len(self.node.inputs) and bool(self.node.inputs[index])

    def value(self, index: int) -> np.ndarray | None:
        """The constant value of input ``index`` if known at compile time, else None."""
        if not self.has_input(index):
            return None
        return self._constant_of(self.node.inputs[index])

    def infer_subgraph(self, graph: "Graph", input_types: list["ValueType | None"]):
        return self._infer_subgraph(graph, input_types)

    def error(self, message: str) -> ShapeError:
        """An error naming this node; ``raise ctx.error('...')``."""
        return ShapeError(f"node '{self.node.name}' ({self.opdef.name}): {message}")


class RefContext:
    """What an op's numpy reference sees of the node it runs."""

    def __init__(self, node: "Node", opdef: OpDef, run_subgraph: Callable[..., list[Any]],
                 output_types: Sequence["ValueType | None"] = ()):
        self.node = node
        self.opdef = opdef
        self._run_subgraph = run_subgraph
        self.output_types = list(output_types)

    @property
    def num_outputs(self) -> int:
        return len(self.node.outputs)

    def output_requested(self, index: int) -> bool:
        return index < len(self.node.outputs) and bool(self.node.outputs[index])

    def run_subgraph(self, graph: "Graph", inputs: Sequence[Any]) -> list[Any]:
        """Run a body graph (If/Loop/Scan) with positional inputs; outer values stay visible."""
        return self._run_subgraph(graph, list(inputs))

    def error(self, message: str) -> ShapeError:
        return ShapeError(f"node '{self.node.name}' ({self.opdef.name}): {message}")

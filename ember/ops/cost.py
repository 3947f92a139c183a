"""The cost of an op: its FLOPs and the bytes it moves, and the FLOPs estimate of a graph.

The cost rule of an op lives on its :class:`~ember.ops.registry.OpDef` (``OpDef.flops``,
attached here by :func:`attach_cost_rules` when the registry loads), so everything about an op
is found in one place; ``ember inspect`` sums it over a graph, and the profiler divides it by
the measured time.  Each covered op has a FLOPs rule over the types of its inputs and outputs
(a multiply-add counts as two operations):

* MatMul / Gemm (and the integer/quantized variants): ``2 * K`` per output element;
* Conv: ``2 * C_in/group * prod(kernel)`` per output element, ConvTranspose the same per input
  element; plus one per output element for a bias;
* elementwise math and activations: one per output element (a few for the costlier ones);
* reductions and global pooling: one per input element; windowed pooling: ``prod(kernel)`` per
  output element;
* normalizations: a few per element;
* data movement (Reshape, Transpose, Gather, ...): zero.

Bytes moved (:func:`node_bytes`) are the same for every op: what it reads plus what it
writes, from the static types -- the memory traffic of an unfused kernel, which bounds a
memory-bound op's speed.

Costs are polynomials in the model's symbolic dims (``2*N*...``); a cost is ``None`` (unknown)
when a shape it needs is unknown.  Ops without a rule are listed in ``uncounted``.  Subgraph
(If/Loop/Scan) bodies are counted once, whatever their trip count.
"""

from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ember.core.dims import Dim, SymDim, dim_product
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType
from ember.ops.registry import OpDef, get_op

Types = Mapping[str, Any]  # value name -> ValueType | None
CostRule = Callable[[Node, Types], Dim]


@dataclass
class FlopsEstimate:
    """The estimate for a whole graph."""

    total: Dim = 0  # None when some covered node's cost is unknown
    known: Dim = 0  # the sum over the nodes whose cost is known
    by_op: dict[str, Dim] = field(default_factory=dict)
    uncounted: dict[str, int] = field(default_factory=dict)  # op -> nodes without a rule

    def format(self, bindings: Mapping[str, int] | None = None) -> str:
        """``"1.23 GFLOPs"``, a polynomial in the model's dims, or ``"unknown"``."""
        text = format_flops(self.total, bindings)
        if self.total is None and self.known != 0:
            text += f" (at least {format_flops(self.known, bindings)} from known shapes)"
        return text


def estimate_flops(graph: Graph) -> FlopsEstimate:
    """Estimate the FLOPs of ``graph`` (subgraph bodies counted once)."""
    estimate = FlopsEstimate()
    _accumulate(graph, ChainMap(graph.types), estimate)
    return estimate


def node_flops(node: Node, types: Types) -> Dim:
    """The FLOPs of one node: an int or polynomial, None if unknown; KeyError if no rule."""
    opdef = get_op(node.op)
    if opdef is None or opdef.flops is None:
        raise KeyError(f"op {node.op} has no FLOPs rule")
    return opdef.flops(node, types)


def node_bytes(node: Node, types: Types) -> Dim:
    """Bytes the node reads and writes (each named input and output once); None when a shape
    or element size is unknown."""
    total: Dim = 0
    for name in [*node.inputs, *node.outputs]:
        if not name:
            continue
        vtype = types.get(name)
        if not isinstance(vtype, TensorType) or vtype.shape is None:
            return None
        total = total + vtype.dtype.itemsize * dim_product(vtype.shape)
    return total


def has_rule(op: str) -> bool:
    opdef = get_op(op)
    return opdef is not None and opdef.flops is not None


def attach_cost_rules(registry: dict[str, OpDef]) -> None:
    """Give every registered op its FLOPs rule (``OpDef.flops``); ops without one keep None."""
    for name, rule in _RULES.items():
        if name in registry:
            registry[name].flops = rule


def format_flops(value: Dim, bindings: Mapping[str, int] | None = None) -> str:
    """Human form of a FLOPs count; symbols bound in ``bindings`` are substituted."""
    if value is None:
        return "unknown"
    if isinstance(value, SymDim):
        if bindings and value.symbols <= set(bindings):
            value = value.evaluate(dict(bindings))
        else:
            return f"{value} FLOPs"
    for scale, unit in ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}FLOPs"
    return f"{value} FLOPs"


# ---------------------------------------------------------------------- accumulation


def _accumulate(graph: Graph, types: ChainMap, estimate: FlopsEstimate) -> None:
    for node in graph.nodes:
        opdef = get_op(node.op)
        rule = opdef.flops if opdef is not None else None
        if rule is not None:
            cost = rule(node, types)
            estimate.by_op[node.op] = _add(estimate.by_op.get(node.op, 0), cost)
            estimate.total = _add(estimate.total, cost)
            if cost is not None:
                estimate.known = estimate.known + cost
        else:
            estimate.uncounted[node.op] = estimate.uncounted.get(node.op, 0) + 1
        for sub in node.subgraphs():
            _accumulate(sub, types.new_child(sub.types), estimate)


def _add(a: Dim, b: Dim) -> Dim:
    return None if a is None or b is None else a + b


# ---------------------------------------------------------------------- shape helpers


def _shape(types: Types, name: str) -> tuple[Dim, ...] | None:
    vtype = types.get(name) if name else None
    if isinstance(vtype, TensorType):
        return vtype.shape
    return None


def _numel(types: Types, name: str) -> Dim:
    shape = _shape(types, name)
    return None if shape is None else dim_product(shape)


def _scaled(factor: Dim, count: Dim) -> Dim:
    return None if factor is None or count is None else factor * count


def _output(node: Node) -> str:
    return node.outputs[0] if node.outputs else ""


# ---------------------------------------------------------------------- rules


def _per_output_element(cost: int) -> CostRule:
    def rule(node: Node, types: Types) -> Dim:
        return _scaled(cost, _numel(types, _output(node)))

    return rule


def _per_input_element(cost: int) -> CostRule:
    def rule(node: Node, types: Types) -> Dim:
        return _scaled(cost, _numel(types, node.inputs[0] if node.inputs else ""))

    return rule


def _variadic(node: Node, types: Types) -> Dim:
    """Sum/Max/Min/Mean of n inputs: n - 1 operations per output element (Mean one more)."""
    count = len([i for i in node.inputs if i]) - (0 if node.op == "Mean" else 1)
    return _scaled(max(count, 0), _numel(types, _output(node)))


def _zero(node: Node, types: Types) -> Dim:
    return 0


def _matmul(a_index: int = 0) -> CostRule:
    """2*K per output element, K the last dim of A (input ``a_index``)."""

    def rule(node: Node, types: Types) -> Dim:
        a = _shape(types, node.inputs[a_index])
        k = a[-1] if a else None
        return _scaled(_scaled(2, k), _numel(types, _output(node)))

    return rule


def _gemm(node: Node, types: Types) -> Dim:
    """2*K per output element, plus one for the bias C."""
    a = _shape(types, node.inputs[0])
    k = None if a is None or len(a) != 2 else a[0] if node.attrs.get("transA", 0) else a[1]
    return _with_bias(node, 2, _scaled(_scaled(2, k), _numel(types, _output(node))), types)


def _conv(weight_index: int, bias_index: int | None) -> CostRule:
    """Per output element 2*C_in/group*prod(kernel) (W is [M, C/group, k...]), plus bias."""

    def rule(node: Node, types: Types) -> Dim:
        weight = _shape(types, node.inputs[weight_index])
        per_output = None if weight is None else _scaled(2, dim_product(weight[1:]))
        cost = _scaled(per_output, _numel(types, _output(node)))
        return cost if bias_index is None else _with_bias(node, bias_index, cost, types)

    return rule


def _depthwise_blocked(node: Node, types: Types) -> Dim:
    """Per output element 2*KH*KW (W is [C/L, KH, KW, L]), plus bias."""
    weight = _shape(types, node.inputs[1])
    per_output = None if weight is None or len(weight) != 4 else \
        _scaled(2, dim_product(weight[1:3]))
    return _with_bias(node, 2, _scaled(per_output, _numel(types, _output(node))), types)


def _conv_blocked(node: Node, types: Types) -> Dim:
    """Per output element 2*C*KH*KW (W is [M/Lo, C/Li, KH, KW, Li, Lo]), plus bias."""
    weight = _shape(types, node.inputs[1])
    per_output = None if weight is None or len(weight) != 6 else \
        _scaled(2, dim_product(weight[1:5]))
    return _with_bias(node, 2, _scaled(per_output, _numel(types, _output(node))), types)


def _conv_transpose(node: Node, types: Types) -> Dim:
    """Per input element 2*M/group*prod(kernel) (W is [C, M/group, k...]), plus bias."""
    weight = _shape(types, node.inputs[1])
    per_input = None if weight is None else _scaled(2, dim_product(weight[1:]))
    return _with_bias(node, 2, _scaled(per_input, _numel(types, node.inputs[0])), types)


def _with_bias(node: Node, index: int, cost: Dim, types: Types) -> Dim:
    """``cost`` plus one operation per output element when the bias input is present."""
    has_bias = index < len(node.inputs) and bool(node.inputs[index])
    return _add(cost, _numel(types, _output(node))) if has_bias else cost


def _windowed_pool(node: Node, types: Types) -> Dim:
    """prod(kernel_shape) per output element."""
    kernel = node.attrs.get("kernel_shape")
    window = dim_product(int(k) for k in kernel) if kernel else None
    return _scaled(window, _numel(types, _output(node)))


_UNARY_CHEAP = (
    "Abs", "Neg", "Ceil", "Floor", "Round", "Sign", "Relu", "LeakyRelu", "PRelu", "ThresholdedRelu",
    "Clip", "Not", "IsNaN", "IsInf", "BitwiseNot", "Reciprocal", "Shrink", "HardSigmoid",
)
_UNARY_COSTLY = (
    "Exp", "Log", "Sqrt", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
    "Acosh", "Atanh", "Tanh", "Sigmoid", "Erf", "Elu", "Selu", "Celu", "Softplus", "Softsign",
    "HardSwish", "Mish", "Gelu", "Swish",
)
_BINARY = (
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
    "And", "Or", "Xor", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Where",
)
_REDUCTIONS = (
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ArgMax",
    "ArgMin", "GlobalAveragePool", "GlobalMaxPool", "CumSum",
)
_REDUCTIONS_SQUARED = ("ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
                       "GlobalLpPool")
_DATA_MOVEMENT = (
    "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice",
    "Gather", "GatherElements", "GatherND", "Scatter", "ScatterElements", "ScatterND", "Shape",
    "Size", "Identity", "Cast", "CastLike", "Expand", "Tile", "Pad", "ConstantOfShape",
    "DepthToSpace", "SpaceToDepth", "Dropout", "Range", "NonZero", "Compress", "ReverseSequence",
    "EyeLike", "OneHot", "Trilu", "Optional", "OptionalGetElement", "OptionalHasElement",
)

_RULES: dict[str, CostRule] = {
    **{name: _per_output_element(1) for name in _UNARY_CHEAP + _BINARY},
    **{name: _per_output_element(4) for name in _UNARY_COSTLY},
    **{name: _per_input_element(1) for name in _REDUCTIONS},
    **{name: _per_input_element(2) for name in _REDUCTIONS_SQUARED},
    **{name: _zero for name in _DATA_MOVEMENT},
    "Sum": _variadic, "Max": _variadic, "Min": _variadic, "Mean": _variadic,
    "MatMul": _matmul(),
    "MatMulInteger": _matmul(),
    "QLinearMatMul": _matmul(),
    "Gemm": _gemm,
    "Conv": _conv(weight_index=1, bias_index=2),
    "ConvInteger": _conv(weight_index=1, bias_index=None),
    "QLinearConv": _conv(weight_index=3, bias_index=8),
    "ConvTranspose": _conv_transpose,
    "DepthwiseConvBlocked": _depthwise_blocked,
    "ConvBlocked": _conv_blocked,
    "MaxPool": _windowed_pool,
    "AveragePool": _windowed_pool,
    "LpPool": _windowed_pool,
    "Softmax": _per_output_element(5),
    "LogSoftmax": _per_output_element(5),
    "Hardmax": _per_output_element(1),
    "BatchNormalization": _per_output_element(2),
    "InstanceNormalization": _per_output_element(5),
    "LayerNormalization": _per_output_element(5),
    "GroupNormalization": _per_output_element(5),
    "RMSNormalization": _per_output_element(4),
    "MeanVarianceNormalization": _per_output_element(5),
    "LpNormalization": _per_output_element(3),
    "LRN": _per_output_element(5),
}

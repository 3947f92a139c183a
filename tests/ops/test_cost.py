"""Op costs: FLOPs rules on the OpDefs over (symbolic) shapes, unknown dims, uncounted ops;
bytes moved; foldability."""

from __future__ import annotations

from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.ops import get_op
from ember.ops.cost import estimate_flops, format_flops, node_bytes, node_flops
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType, tensor

F32 = DType.FLOAT32
N = sym("N")


def _estimate(nodes: list[Node], types: dict) -> object:
    return estimate_flops(Graph(nodes=nodes, types=types))


def test_matmul_gemm_conv_and_conv_transpose():
    types = {
        "a": tensor(F32, "N", 8, 16), "b": tensor(F32, 16, 4), "mm": tensor(F32, "N", 8, 4),
        "ga": tensor(F32, 16, 5), "gb": tensor(F32, 16, 3), "gc": tensor(F32, 3),
        "gemm": tensor(F32, 5, 3),
        "x": tensor(F32, 1, 4, 8, 8), "w": tensor(F32, 6, 2, 3, 3), "bias": tensor(F32, 6),
        "conv": tensor(F32, 1, 6, 6, 6),
        "wt": tensor(F32, 4, 2, 3, 3), "convt": tensor(F32, 1, 2, 10, 10),
    }
    estimate = _estimate([
        Node("MatMul", ["a", "b"], ["mm"]),
        Node("Gemm", ["ga", "gb", "gc"], ["gemm"], attrs={"transA": 1}),
        Node("Conv", ["x", "w", "bias"], ["conv"], attrs={"group": 2}),
        Node("ConvTranspose", ["x", "wt"], ["convt"]),
    ], types)
    assert estimate.by_op["MatMul"] == 2 * 16 * (N * 8 * 4)
    assert estimate.by_op["Gemm"] == 2 * 16 * 15 + 15
    assert estimate.by_op["Conv"] == 2 * (2 * 3 * 3) * 216 + 216
    assert estimate.by_op["ConvTranspose"] == 2 * (2 * 3 * 3) * 256
    assert estimate.total == sum(estimate.by_op.values())
    assert str(estimate.total) == f"{1024}*N + {estimate.total.evaluate({'N': 0})}"


def test_elementwise_reductions_pooling_norms_and_data_movement():
    types = {"x": tensor(F32, "N", 4, 6, 6), "p": tensor(F32, "N", 4, 3, 3),
             "r": tensor(F32, "N", 1, 1, 1), "y": tensor(F32, "N", 4, 6, 6),
             "flat": tensor(F32, "N", 144)}
    estimate = _estimate([
        Node("Relu", ["x"], ["y"]),
        Node("MaxPool", ["y"], ["p"], attrs={"kernel_shape": [2, 2], "strides": [2, 2]}),
        Node("ReduceMean", ["y"], ["r"]),
        Node("LayerNormalization", ["x"], ["y"]),
        Node("Reshape", ["x"], ["flat"]),
        Node("Sum", ["x", "x", "x"], ["y"]),
    ], types)
    assert estimate.by_op["Relu"] == 144 * N
    assert estimate.by_op["MaxPool"] == 4 * (36 * N)
    assert estimate.by_op["ReduceMean"] == 144 * N
    assert estimate.by_op["LayerNormalization"] == 5 * 144 * N
    assert estimate.by_op["Reshape"] == 0
    assert estimate.by_op["Sum"] == 2 * 144 * N
    assert format_flops(estimate.total, {"N": 1000}) == "1.44 MFLOPs"


def test_unknown_dims_make_the_total_unknown_and_ops_without_rules_are_listed():
    types = {"x": TensorType(F32, (None, 4)), "y": TensorType(F32, (None, 4)),
             "z": tensor(F32, 2, 4), "w": tensor(F32, 2, 4)}
    estimate = _estimate([Node("Relu", ["x"], ["y"]), Node("Abs", ["z"], ["w"]),
                          Node("FancyOp", ["w"], ["v"]), Node("FancyOp", ["v"], ["u"])], types)
    assert estimate.total is None and estimate.by_op["Relu"] is None
    assert estimate.known == 8
    assert estimate.uncounted == {"FancyOp": 2}
    assert estimate.format() == "unknown (at least 8 FLOPs from known shapes)"


def test_subgraph_bodies_are_counted_with_their_own_types():
    body = Graph(name="body", inputs=["i"], outputs=["o"], nodes=[Node("Exp", ["i"], ["o"])],
                 types={"i": tensor(F32, 1000), "o": tensor(F32, 1000)})
    estimate = _estimate([Node("If", ["c"], ["r"], attrs={"then_branch": body})],
                         {"c": tensor(DType.BOOL)})
    assert estimate.by_op["Exp"] == 4000
    assert estimate.uncounted == {"If": 1}
    assert format_flops(estimate.total) == "4.00 KFLOPs"


def test_cost_rules_live_on_the_opdefs():
    assert get_op("MatMul").flops is not None and get_op("Relu").flops is not None
    types = {"a": tensor(F32, 3, 5), "b": tensor(F32, 5, 7), "c": tensor(F32, 3, 7)}
    node = Node("MatMul", ["a", "b"], ["c"])
    assert get_op("MatMul").flops(node, types) == node_flops(node, types) == 2 * 5 * 3 * 7


def test_bytes_moved_are_inputs_plus_outputs_and_unknown_without_shapes():
    types = {"a": tensor(F32, 3, 5), "b": tensor(DType.FLOAT16, 5), "c": tensor(F32, 3, 5)}
    assert node_bytes(Node("Add", ["a", "b"], ["c"]), types) == 4 * 15 + 2 * 5 + 4 * 15
    assert node_bytes(Node("Add", ["a", "b"], ["c"]), {**types, "b": tensor(F32, "N")}) == \
        4 * 15 + 4 * N + 4 * 15
    assert node_bytes(Node("Add", ["a", "z"], ["c"]), types) is None


def test_control_flow_is_not_folded_and_plain_ops_are():
    assert not get_op("If").foldable and not get_op("Loop").foldable
    assert not get_op("Scan").foldable and not get_op("SequenceMap").foldable
    assert get_op("Add").foldable and get_op("Shape").foldable

"""Einsum written as transposes, reshapes, sums and batched MatMuls (``passes/lower_einsum``).

Oracle: ``numpy.einsum`` on the same operands.  Every equation below must compile with no
numpy fallback left and match; equations the pass declines (a diagonal, integers) keep the
reference and still match.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

RNG = np.random.default_rng(5)

# equation -> operand shapes
CASES = {
    "ij,jk->ik": [(3, 4), (4, 5)],
    "ij,kj->ik": [(3, 4), (5, 4)],                       # nn.Linear
    "bij,bjk->bik": [(2, 3, 4), (2, 4, 5)],
    "bhqd,bhkd->bhqk": [(2, 3, 5, 4), (2, 3, 6, 4)],      # attention scores
    "bhqk,bhkd->bqhd": [(2, 3, 5, 6), (2, 3, 6, 4)],      # attention output, heads moved
    "i,j->ij": [(3,), (4,)],                              # outer product
    "i,i->": [(7,), (7,)],                                # dot product
    "ij->ji": [(3, 4)],
    "ij->": [(3, 4)],
    "bij->bj": [(2, 3, 4)],
    "ij,jk,kl->il": [(3, 4), (4, 5), (5, 2)],             # a chain
    "...ij,...jk->...ik": [(2, 3, 4, 5), (3, 5, 6)],      # ellipsis, broadcast
    "bn,anm,bm->ba": [(2, 3), (4, 3, 5), (2, 5)],         # bilinear
    "ij,ij->ij": [(3, 4), (3, 4)],                        # elementwise
    "bij,jk": [(2, 3, 4), (4, 5)],                        # implicit output
    "bi,bj,b->bij": [(2, 3), (2, 4), (2,)],
    "ab,cb->": [(3, 4), (5, 4)],                          # everything summed
    "bij,xjk->bik": [(2, 3, 4), (1, 4, 5)],               # letters only one side needs
}


def _einsum_model(equation: str, shapes: list[tuple[int, ...]], dtype=TensorProto.FLOAT):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation, name="einsum")
    graph = helper.make_graph([node], "einsum",
                              [helper.make_tensor_value_info(n, dtype, list(s))
                               for n, s in zip(names, shapes)],
                              [helper.make_tensor_value_info("y", dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("equation", sorted(CASES))
def test_einsum_compiles_and_matches_numpy(equation: str) -> None:
    shapes = CASES[equation]
    operands = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    module = ember.compile(_einsum_model(equation, shapes))
    assert not module.build.host_nodes
    assert "Einsum" not in {node.op for node in module.build.graph.nodes}
    np.testing.assert_allclose(module(*operands), np.einsum(equation, *operands),
                               rtol=1e-5, atol=1e-5)


def test_einsum_of_a_weight_folds_like_a_linear_layer() -> None:
    # x @ W^T with W constant: the transpose of W folds, the MatMul packs it
    weight = RNG.standard_normal((6, 4)).astype(np.float32)
    node = helper.make_node("Einsum", ["x", "w"], ["y"], equation="bi,oi->bo")
    graph = helper.make_graph([node], "linear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=10)
    module = ember.compile(model)
    assert len(module.build.kernels) == 1
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(module(x), x @ weight.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("equation,shapes,dtype", [
    ("ii->i", [(4, 4)], TensorProto.FLOAT),               # a diagonal
    ("ij,jk->ik", [(3, 4), (4, 5)], TensorProto.INT64),   # integers
])
def test_equations_the_pass_declines_keep_the_reference(equation, shapes, dtype) -> None:
    numpy_type = np.float32 if dtype == TensorProto.FLOAT else np.int64
    operands = [(RNG.standard_normal(s) * 4).astype(numpy_type) for s in shapes]
    module = ember.compile(_einsum_model(equation, shapes, dtype))
    assert [impl.node.op for impl in module.build.host_nodes] == ["Einsum"]
    np.testing.assert_allclose(module(*operands), np.einsum(equation, *operands),
                               rtol=1e-5, atol=1e-5)


def test_a_lowered_einsum_serves_every_length_of_a_class_from_one_build() -> None:
    # The lowering keeps a length the build takes at run time as one (a reshape target of
    # traced sizes), so lengths 16..31 share the build traced at 16.
    names = ["q", "k"]
    node = helper.make_node("Einsum", names, ["y"], equation="bqd,bkd->bqk")
    graph = helper.make_graph([node], "scores",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT,
                                                             [2, "S", 8]) for n in names],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=10)
    module = ember.compile(model)
    for length in (16, 20, 31):
        q, k = (RNG.standard_normal((2, length, 8)).astype(np.float32) for _ in range(2))
        np.testing.assert_allclose(module(q, k), np.einsum("bqd,bkd->bqk", q, k),
                                   rtol=1e-5, atol=1e-5)
    assert module.build_reasons == ["the first call"], module.build_reasons

"""Folding inference BatchNormalization into the preceding Conv (ember/passes/fold_batchnorm.py).

Where it folds, the graph loses the BN node and still computes what it did (reference executor
on the unfolded graph, and ONNX Runtime on the model, are the oracles); where folding would be
wrong -- the conv output has another reader, BN is in training mode, parameters are not
constants -- the graph is left alone.
"""

from __future__ import annotations

import copy

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.passes.fold_batchnorm import fold_batchnorm

F32, BOOL = TensorProto.FLOAT, TensorProto.BOOL
RNG = np.random.default_rng(20)


def _vi(name, elem=F32, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, initializers, opset=17):
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in initializers.items()]
    graph = helper.make_graph(nodes, "bn", inputs, outputs, initializer=inits)
    # IR version 10: what the installed ONNX Runtime (an oracle here) reads.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def _bn_params(channels, prefix="bn", dtype=np.float32):
    return {f"{prefix}_scale": RNG.standard_normal(channels).astype(dtype),
            f"{prefix}_bias": RNG.standard_normal(channels).astype(dtype),
            f"{prefix}_mean": RNG.standard_normal(channels).astype(dtype),
            f"{prefix}_var": (RNG.random(channels) + 0.25).astype(dtype)}


def _bn(x, y, prefix="bn", **attrs):
    return helper.make_node("BatchNormalization",
                            [x] + [f"{prefix}_{p}" for p in ("scale", "bias", "mean", "var")],
                            [y], name=prefix, **attrs)


def _conv_bn_model(bias=True, group=1, pads=(0, 0, 0, 0), strides=(1, 1), epsilon=1e-5,
                   in_channels=4, out_channels=6, extra_nodes=(), extra_outputs=(),
                   conv_output_is_output=False):
    w = RNG.standard_normal((out_channels, in_channels // group, 3, 3)).astype(np.float32)
    inits = {"W": w, **_bn_params(out_channels)}
    conv_inputs = ["x", "W"]
    if bias:
        inits["B"] = RNG.standard_normal(out_channels).astype(np.float32)
        conv_inputs.append("B")
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], name="conv", group=group,
                              pads=list(pads), strides=list(strides)),
             _bn("c", "y", epsilon=epsilon), *extra_nodes]
    outputs = [_vi("y")] + [_vi(o) for o in extra_outputs]
    if conv_output_is_output:
        outputs.append(_vi("c"))
    return _model(nodes, [_vi("x", F32, [2, in_channels, 7, 7])], outputs, inits)


def _fold(model, feeds):
    """Fold the imported model; returns (folded graph, count).  Results must match the
    reference on the unfolded graph and ONNX Runtime."""
    graph = import_onnx(model)
    expected = ReferenceExecutor(graph).run(feeds)
    folded = copy.deepcopy(graph)
    count = fold_batchnorm(folded)
    actual = ReferenceExecutor(folded).run(feeds)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    ort_out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-4, atol=1e-4,
                                   err_msg=name)
        np.testing.assert_allclose(actual[name], ort_out[name], rtol=1e-4, atol=1e-4,
                                   err_msg=name)
    return folded, count


def _x(channels=4):
    return RNG.standard_normal((2, channels, 7, 7)).astype(np.float32)


def _ops(graph):
    return [node.op for node in graph.nodes]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("group,pads,strides,epsilon", [
    (1, (0, 0, 0, 0), (1, 1), 1e-5),
    (2, (1, 1, 1, 1), (2, 1), 1e-3),
    (4, (0, 1, 2, 1), (1, 2), 0.5),  # one group per input channel, 2 outputs each
], ids=["plain", "grouped_padded", "depthwise"])
def test_conv_batchnorm_folds_and_matches(bias, group, pads, strides, epsilon):
    out_channels = 8 if group == 4 else 6
    model = _conv_bn_model(bias=bias, group=group, pads=pads, strides=strides, epsilon=epsilon,
                           out_channels=out_channels)
    folded, count = _fold(model, {"x": _x()})
    assert count == 1
    assert _ops(folded) == ["Conv"]
    conv = folded.nodes[0]
    assert conv.outputs == ["y"] and len(conv.inputs) == 3
    # The folded parameters are constants; BN's (and the old W/B) are gone.
    assert conv.inputs[1] in folded.constants and conv.inputs[2] in folded.constants
    assert not any(name.startswith("bn_") for name in folded.constants)
    assert "W" not in folded.constants and "B" not in folded.constants
    assert "c" not in folded.types


def test_two_conv_bn_pairs_in_a_chain_both_fold():
    w2 = RNG.standard_normal((3, 6, 1, 1)).astype(np.float32)
    model = _conv_bn_model(extra_nodes=[
        helper.make_node("Relu", ["y"], ["r"]),
        helper.make_node("Conv", ["r", "W2"], ["c2"], name="conv2"),
        _bn("c2", "y2", prefix="bn2")], extra_outputs=["y2"])
    model.graph.initializer.extend(
        [numpy_helper.from_array(w2, "W2")] +
        [numpy_helper.from_array(a, n) for n, a in _bn_params(3, "bn2").items()])
    folded, count = _fold(model, {"x": _x()})
    assert count == 2 and _ops(folded) == ["Conv", "Relu", "Conv"]


def test_not_folded_when_the_conv_output_has_another_consumer():
    model = _conv_bn_model(extra_nodes=[helper.make_node("Relu", ["c"], ["side"])],
                           extra_outputs=["side"])
    folded, count = _fold(model, {"x": _x()})
    assert count == 0 and _ops(folded) == ["Conv", "BatchNormalization", "Relu"]


def test_not_folded_when_a_subgraph_reads_the_conv_output():
    then_branch = helper.make_graph([helper.make_node("Relu", ["c"], ["t"])], "then", [],
                                    [_vi("t")])
    else_branch = helper.make_graph([helper.make_node("Neg", ["c"], ["e"])], "else", [],
                                    [_vi("e")])
    model = _conv_bn_model(extra_nodes=[helper.make_node("If", ["cond"], ["side"],
                                                         then_branch=then_branch,
                                                         else_branch=else_branch)],
                           extra_outputs=["side"])
    model.graph.input.append(_vi("cond", BOOL, []))
    for cond in (True, False):
        folded, count = _fold(model, {"x": _x(), "cond": np.array(cond)})
        assert count == 0 and _ops(folded) == ["Conv", "BatchNormalization", "If"]


def test_not_folded_when_the_conv_output_is_a_graph_output():
    folded, count = _fold(_conv_bn_model(conv_output_is_output=True), {"x": _x()})
    assert count == 0 and _ops(folded) == ["Conv", "BatchNormalization"]


def test_not_folded_in_training_mode():
    # Training mode normalizes with the batch's statistics, not the constants.
    w = RNG.standard_normal((6, 4, 3, 3)).astype(np.float32)
    model = _model([helper.make_node("Conv", ["x", "W"], ["c"], name="conv"),
                    _bn("c", "y", training_mode=1)],
                   [_vi("x", F32, [2, 4, 7, 7])], [_vi("y")], {"W": w, **_bn_params(6)})
    graph = import_onnx(model)
    x = _x()
    expected = ReferenceExecutor(graph).run({"x": x})["y"]
    assert fold_batchnorm(graph) == 0
    assert _ops(graph) == ["Conv", "BatchNormalization"]
    np.testing.assert_allclose(ReferenceExecutor(graph).run({"x": x})["y"], expected)


@pytest.mark.parametrize("runtime_input", ["W", "B", "bn_mean", "bn_scale"])
def test_not_folded_when_a_parameter_is_not_constant(runtime_input):
    model = _conv_bn_model()
    init = next(t for t in model.graph.initializer if t.name == runtime_input)
    value = numpy_helper.to_array(init)
    model.graph.initializer.remove(init)
    model.graph.input.append(_vi(runtime_input, F32, list(value.shape)))
    folded, count = _fold(model, {"x": _x(), runtime_input: value})
    assert count == 0 and _ops(folded) == ["Conv", "BatchNormalization"]


def test_batchnorm_after_something_else_than_conv_is_left_alone():
    model = _model([helper.make_node("Relu", ["x"], ["r"]), _bn("r", "y")],
                   [_vi("x", F32, [2, 4, 7, 7])], [_vi("y")], _bn_params(4))
    folded, count = _fold(model, {"x": _x()})
    assert count == 0 and _ops(folded) == ["Relu", "BatchNormalization"]


# ---------------------------------------------------------------------- Gemm and MatMul


def test_batchnorm_after_gemm_folds_into_its_weights_and_bias():
    from ember.passes.testing import assert_pass
    from pass_helpers import check_numerics

    text = """
        graph g(%x: f32[4, 6]) -> (%y: f32[4, 3]) {
          const %w: f32[3, 6] = random
          const %c: f32[3] = random
          const %gamma: f32[3] = random
          const %beta: f32[3] = random
          const %mean: f32[3] = random
          const %var: f32[3] = [0.5, 1.0, 2.0]
          %m = Gemm(%x, %w, %c) {beta=0.5, transB=1}
          %y = BatchNormalization(%m, %gamma, %beta, %mean, %var)
        }"""
    assert_pass(fold_batchnorm, text, """
        graph g(%x: f32[4, 6]) -> (%y: f32[4, 3]) {
          const %w2: f32[3, 6] = random
          const %c2: f32[3] = random
          %y = Gemm(%x, %w2, %c2) {beta=1.0, transB=1}
        }""", changed=1, values=False)
    check_numerics(fold_batchnorm, text, rtol=1e-4, atol=1e-4)


def test_batchnorm_after_a_matmul_without_bias_becomes_its_bias_add():
    from ember.passes.testing import assert_pass
    from pass_helpers import check_numerics

    text = """
        graph g(%x: f32[4, 6]) -> (%y: f32[4, 3]) {
          const %w: f32[6, 3] = random
          const %gamma: f32[3] = random
          const %beta: f32[3] = random
          const %mean: f32[3] = random
          const %var: f32[3] = [0.5, 1.0, 2.0]
          %m = MatMul(%x, %w)
          %y = BatchNormalization(%m, %gamma, %beta, %mean, %var)
        }"""
    assert_pass(fold_batchnorm, text, """
        graph g(%x: f32[4, 6]) -> (%y: f32[4, 3]) {
          const %w2: f32[6, 3] = random
          const %t: f32[3] = random
          %m = MatMul(%x, %w2)
          %y = Add(%m, %t)
        }""", changed=1, values=False)
    check_numerics(fold_batchnorm, text, rtol=1e-4, atol=1e-4)


def test_batchnorm_over_a_matmul_whose_channels_are_not_axis_1_stays():
    from ember.passes.testing import assert_unchanged

    assert_unchanged(fold_batchnorm, """
        graph g(%x: f32[2, 3, 6]) -> (%y: f32[2, 3, 3]) {
          const %w: f32[6, 3] = random
          const %gamma: f32[3] = random
          const %beta: f32[3] = random
          const %mean: f32[3] = random
          const %var: f32[3] = [0.5, 1.0, 2.0]
          %m = MatMul(%x, %w)
          %y = BatchNormalization(%m, %gamma, %beta, %mean, %var)
        }""")

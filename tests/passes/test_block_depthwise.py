"""Depthwise convolutions over narrow images in channel-blocked layout (block_depthwise).

Oracles: the graph before the rewrite run by the reference executor (the Conv reference),
ONNX Runtime on the original model, and compiled code against ONNX Runtime, under ASan/UBSan
too.  Shapes cover strides, dilations, asymmetric pads, 5x5 kernels, batches and no bias.
"""

from __future__ import annotations

import copy
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.core.dtypes import DType
from ember.core.target import Target
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ops.registry import get_op
from ember.passes.block_depthwise import MAX_BLOCKED_WIDTH, block_depthwise_convolutions



def depthwise_model(batch: int, channels: int, size: int, kernel: int, attrs: dict,
                    bias: bool = True, group: int | None = None) -> onnx.ModelProto:
    rng = np.random.default_rng(channels * size + kernel)
    group = channels if group is None else group
    inits = [numpy_helper.from_array(
        rng.standard_normal((channels, channels // group, kernel, kernel)).astype(np.float32),
        "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32),
                                             "b"))
    lo = numpy_helper.from_array(np.array(0, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(6, np.float32), "hi")
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"],
                              name="dw", group=group, kernel_shape=[kernel, kernel], **attrs),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="clip")]
    graph = helper.make_graph(
        nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                    [batch, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits + [lo, hi])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


CASES = {
    "3x3_pad1": (1, 16, 7, 3, {"pads": [1, 1, 1, 1]}),
    "3x3_stride2_into_7": (2, 48, 14, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "5x5_asymmetric_pads": (1, 32, 6, 5, {"pads": [2, 1, 2, 3]}),
    "3x3_dilated_unpadded": (1, 16, 9, 3, {"dilations": [2, 1], "strides": [1, 2]}),
}


def _input(model) -> np.ndarray:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(5).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("case", list(CASES))
def test_blocked_graph_computes_the_depthwise_convolution(case, bias):
    model = depthwise_model(*CASES[case], bias=bias)
    x = _input(model)
    graph = import_onnx(model)
    expected = ReferenceExecutor(graph).run({"x": x})["y"]
    blocked = copy.deepcopy(graph)
    assert block_depthwise_convolutions(blocked, Target.native()) == 1
    ops = [node.op for node in blocked.nodes]
    assert ops.count("DepthwiseConvBlocked") == 1 and "Conv" not in ops
    lanes = next(blocked.types[n.outputs[0]] for n in blocked.nodes
                 if n.op == "DepthwiseConvBlocked").shape[-1]
    assert lanes == Target.native().lanes_for(DType.FLOAT32)
    actual = ReferenceExecutor(blocked).run({"x": x})["y"]
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(actual, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("why,model", [
    ("channels not a multiple of the lanes", depthwise_model(1, 12, 7, 3, {"pads": [1] * 4})),
    ("an image wider than the threshold",
     depthwise_model(1, 16, MAX_BLOCKED_WIDTH + 1, 3, {"pads": [1] * 4})),
    ("a grouped, not depthwise, convolution",
     depthwise_model(1, 16, 7, 3, {"pads": [1] * 4}, group=8)),
    ("auto_pad", depthwise_model(1, 16, 7, 3, {"auto_pad": "SAME_UPPER"})),
])
def test_other_convolutions_are_left_alone(why, model):
    graph = import_onnx(model)
    assert block_depthwise_convolutions(graph, Target.native()) == 0, why
    assert [node.op for node in graph.nodes] == ["Conv", "Clip"]


class _Ctx:
    """The node context the reference reports errors through."""

    @staticmethod
    def error(message: str) -> ValueError:
        return ValueError(message)


def test_the_op_rejects_shapes_that_do_not_fit_together():
    opdef = get_op("DepthwiseConvBlocked")
    x = np.zeros((1, 2, 5, 5, 8), np.float32)
    with pytest.raises(ValueError, match="lanes"):
        opdef.reference(_Ctx(), x, np.zeros((2, 3, 3, 4), np.float32), strides=[1, 1],
                        dilations=[1, 1])
    with pytest.raises(ValueError, match="does not fit"):
        opdef.reference(_Ctx(), x, np.zeros((2, 7, 7, 8), np.float32), strides=[1, 1],
                        dilations=[1, 1])


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_blocked_convolution_matches_onnxruntime(case):
    model = depthwise_model(*CASES[case])
    x = _input(model)
    module = ember.compile(model)
    assert any(n.op == "DepthwiseConvBlocked" for n in module.build.graph.nodes)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(module(x), session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


SANITIZED = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, sys.argv[1] + "/tests/passes")
    import numpy as np
    import ember
    from test_block_depthwise import CASES, _input, depthwise_model
    from ember.interp import ReferenceExecutor
    from ember.frontend.onnx import import_onnx
    for case in CASES.values():
        model = depthwise_model(*case)
        x = _input(model)
        module = ember.compile(model, sanitize=True)
        expected = ReferenceExecutor(import_onnx(model)).run({"x": x})["y"]
        np.testing.assert_allclose(module(x), expected, rtol=1e-4, atol=1e-4)
    print("ok")
""")


def test_blocked_convolution_is_clean_under_asan_and_ubsan(run_sanitized):
    assert run_sanitized(SANITIZED).strip().endswith("ok")

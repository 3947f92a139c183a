"""Lowering ConvTranspose to Conv + pixel interleave (ember/passes/lower_conv_transpose.py).

The oracles are ONNX Runtime and the ONNX backend suite's expected outputs, never ember itself:

* a wide grid of configurations (kernel 1..4, stride 1..3, dilation 1..2, symmetric and
  asymmetric pads, output_padding, group 1 and 2, batch 1 and 2, odd sizes, with and without
  bias, auto_pad, explicit output_shape, 1-D to 3-D) runs the rewritten graph through ember's
  reference executor (fast: no C compiler) against ONNX Runtime;
* a representative subset is compiled end to end with ``ember.compile`` -- the optimized graph
  must hold no ConvTranspose any more -- and compared with ONNX Runtime;
* the suite's own ConvTranspose node cases, with their weights made initializers so that the
  rewrite applies, compiled and compared with the suite's expected outputs;
* float64 and float16 models, compiled, against onnx's reference evaluator;
* weights that are not constants leave the node as it is.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.passes import pipeline
from ember.passes.infer_shapes import infer_shapes
from ember.passes.lower_conv_transpose import lower_conv_transpose, plan_axis
from ember.passes.verify import verify_graph

RTOL, ATOL = 1e-4, 1e-5


# ---------------------------------------------------------------------- building models


def _model(x_shape, w_shape, attrs, *, bias=False, weight_input=False, bias_input=False,
           seed=0):
    """A one-node ConvTranspose model and the feeds for it (x, and W/B when they are inputs).

    Weights and inputs are small integers scaled by 1/8: exact in float32, so the oracle and
    ember agree to rounding of the sums only."""
    rng = np.random.default_rng(seed)
    group = attrs.get("group", 1)
    m = w_shape[1] * group

    def values(shape):
        return (rng.integers(-8, 9, size=shape) / 8).astype(np.float32)

    arrays = {"x": values(x_shape), "W": values(w_shape)}
    if bias:
        arrays["B"] = values((m,))
    graph_inputs = ["x"] + (["W"] if weight_input else []) + (["B"] if bias and bias_input else [])
    initializers = [numpy_helper.from_array(arrays[n], n) for n in arrays if n not in graph_inputs]
    node = helper.make_node("ConvTranspose", ["x", "W"] + (["B"] if bias else []), ["y"],
                            name="ct", **attrs)
    graph = helper.make_graph(
        [node], "convtranspose",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(arrays[n].shape))
         for n in graph_inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model, {n: arrays[n] for n in graph_inputs}


def _onnxruntime(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _rewritten(model):
    """The imported graph and a copy with the pass applied (shapes inferred, verified)."""
    graph = import_onnx(model)
    rewritten = copy.deepcopy(graph)
    changed = lower_conv_transpose(rewritten)
    infer_shapes(rewritten)
    verify_graph(rewritten, stage="after lower_conv_transpose")
    return graph, rewritten, changed


def _ops(graph):
    return [node.op for node in graph.nodes]


# ---------------------------------------------------------------------- configurations


def _case(rank, kernel, stride, dilation=1, pads=None, output_padding=0, group=1, batch=1,
          bias=True, sizes=(5, 4, 3), channels=(2, 3), **extra):
    """(x_shape, w_shape, attrs, bias) of a ConvTranspose with the same settings on every
    axis (``pads`` is (begin, end)); ``extra`` attributes override."""
    c, m = channels[0] * group, channels[1]
    attrs = {"strides": [stride] * rank, "dilations": [dilation] * rank}
    if pads is not None:
        attrs["pads"] = [pads[0]] * rank + [pads[1]] * rank
    if output_padding:
        attrs["output_padding"] = [output_padding] * rank
    if group != 1:
        attrs["group"] = group
    attrs.update(extra)
    return (batch, c) + tuple(sizes[:rank]), (c, m) + (kernel,) * rank, attrs, bias


def _grid():
    """The 2-D grid (every kernel/stride/dilation/pads/output_padding combination ONNX allows)
    plus 1-D and 3-D slices of it; group, batch and bias vary along with the others."""
    cases = {}
    for kernel, stride, dilation, pads, output_padding in itertools.product(
            (1, 2, 3, 4), (1, 2, 3), (1, 2), (None, (1, 1), (2, 0), (0, 3)), (0, 1, 2)):
        if output_padding >= stride:  # ONNX Runtime requires output_padding < stride
            continue
        smallest = 4  # of the spatial sizes (5, 4): its output must not be empty
        if (smallest - 1) * stride + output_padding + (kernel - 1) * dilation + 1 \
                - sum(pads or (0, 0)) < 1:
            continue
        index = len(cases)
        group, batch, bias = 1 + index % 2, 1 + (index // 2) % 2, index % 3 != 0
        name = (f"2d_k{kernel}_s{stride}_d{dilation}_p{''.join(map(str, pads or ()))}"
                f"_op{output_padding}_g{group}_n{batch}_{'b' if bias else 'nob'}")
        cases[name] = _case(2, kernel, stride, dilation, pads, output_padding, group, batch,
                            bias)
    for kernel, stride, dilation in itertools.product((1, 2, 3, 5), (1, 2, 3, 4), (1, 3)):
        cases[f"1d_k{kernel}_s{stride}_d{dilation}"] = _case(
            1, kernel, stride, dilation, (1, 0) if kernel > 2 else None,
            output_padding=1 if stride > 1 else 0, sizes=(7,))
    for kernel, stride in itertools.product((1, 2, 3), (1, 2, 3)):
        cases[f"3d_k{kernel}_s{stride}"] = _case(3, kernel, stride, pads=(1, 0),
                                                 group=2 if kernel == 2 else 1)
    return cases


SPECIAL = {
    # asymmetric and per-axis settings
    "2d_per_axis": ((1, 2, 5, 7), (2, 3, 3, 2),
                    {"strides": [2, 3], "pads": [1, 0, 0, 2], "output_padding": [1, 2],
                     "dilations": [1, 2]}, True),
    "2d_stride_only_h": ((2, 4, 6, 5), (4, 2, 3, 3),
                         {"strides": [2, 1], "pads": [0, 1, 1, 1], "group": 2}, True),
    "2d_kernel_lt_stride": ((1, 3, 4, 5), (3, 2, 2, 1), {"strides": [3, 3]}, True),
    "2d_kernel_lt_stride_pads": ((1, 3, 4, 5), (3, 2, 2, 2),
                                 {"strides": [3, 3], "pads": [1, 0, 0, 2]}, True),
    "2d_large_pads": ((1, 2, 6, 6), (2, 3, 5, 5), {"pads": [4, 3, 4, 4]}, True),
    # auto_pad and output_shape: the crop comes from shape inference's rules
    "2d_same_upper": ((1, 2, 5, 7), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
                      True),
    "2d_same_lower": ((1, 2, 5, 7), (2, 3, 4, 3), {"strides": [3, 2], "auto_pad": "SAME_LOWER"},
                      False),
    "2d_same_upper_odd_total": ((1, 2, 5, 6), (2, 3, 4, 4),
                                {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, True),
    "2d_valid": ((1, 2, 5, 6), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "VALID"}, True),
    "2d_output_shape": ((1, 2, 5, 7), (2, 3, 3, 3),
                        {"strides": [2, 2], "output_shape": [12, 16]}, True),
    "2d_output_shape_crops": ((1, 2, 5, 7), (2, 3, 3, 3),
                              {"strides": [2, 2], "output_shape": [10, 15]}, True),
    "2d_group_4_depthwise": ((2, 4, 5, 7), (4, 1, 3, 3),
                             {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1],
                              "group": 4}, True),
    "2d_upsample_k2s2": ((2, 8, 5, 7), (8, 4, 2, 2), {"strides": [2, 2]}, True),
    "2d_upsample_k4s4": ((1, 3, 3, 3), (3, 2, 4, 4), {"strides": [4, 4]}, False),
    "2d_explicit_kernel_shape": ((1, 2, 5, 5), (2, 3, 3, 3),
                                 {"kernel_shape": [3, 3], "strides": [2, 2]}, True),
    "3d_per_axis": ((1, 2, 3, 4, 5), (2, 2, 2, 3, 2),
                    {"strides": [1, 2, 3], "pads": [0, 1, 0, 1, 0, 1],
                     "output_padding": [0, 1, 2]}, True),
}

CASES = {**_grid(), **SPECIAL}


@pytest.mark.parametrize("name", list(CASES))
def test_rewritten_graph_matches_onnxruntime(name):
    x_shape, w_shape, attrs, bias = CASES[name]
    model, feeds = _model(x_shape, w_shape, attrs, bias=bias)
    expected = _onnxruntime(model, feeds)
    graph, rewritten, changed = _rewritten(model)
    assert changed == 1 and "ConvTranspose" not in _ops(rewritten)
    actual = ReferenceExecutor(rewritten).run(feeds)["y"]
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


COMPILED = {
    # the U-Net upsampling form: one 1x1 Conv + DepthToSpace
    "upsample_k2s2": _case(2, 2, 2, bias=False),
    "k3_s2_p11_op1_g2_n2": _case(2, 3, 2, pads=(1, 1), output_padding=1, group=2, batch=2),
    "k4_s2_p11": _case(2, 4, 2, pads=(1, 1)),
    "k3_s3_d2_p20_op2_n2": _case(2, 3, 3, 2, pads=(2, 0), output_padding=2, batch=2),
    "k1_s3_p03_op1": _case(2, 1, 3, pads=(0, 3), output_padding=1),
    "k1_s2_bias_fills": _case(2, 1, 2, output_padding=1, batch=2),
    "k4_s1_d2_p03_n2": _case(2, 4, 1, 2, pads=(0, 3), batch=2),
    "1d_k3_s2": CASES["1d_k3_s2_d1"],
    "1d_k5_s4_d3": CASES["1d_k5_s4_d3"],
    "3d_k3_s2": CASES["3d_k3_s2"],
    "3d_k2_s3": CASES["3d_k2_s3"],
    **{name: SPECIAL[name] for name in (
        "2d_per_axis", "2d_stride_only_h", "2d_kernel_lt_stride", "2d_kernel_lt_stride_pads",
        "2d_same_upper", "2d_same_lower", "2d_output_shape", "2d_output_shape_crops",
        "2d_group_4_depthwise")},
}


@pytest.mark.parametrize("name", list(COMPILED))
def test_compiled_model_matches_onnxruntime(name):
    x_shape, w_shape, attrs, bias = COMPILED[name]
    model, feeds = _model(x_shape, w_shape, attrs, bias=bias, seed=1)
    expected = _onnxruntime(model, feeds)
    module = ember.compile(model)
    actual = module(feeds["x"])
    assert "ConvTranspose" not in _ops(module.build.graph)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


def test_bias_that_is_an_input_is_added_after_the_interleave():
    model, feeds = _model((2, 2, 5, 6), (2, 3, 3, 3),
                          {"strides": [2, 2], "pads": [1, 0, 0, 1]}, bias=True, bias_input=True)
    expected = _onnxruntime(model, feeds)
    graph, rewritten, changed = _rewritten(model)
    assert changed == 1 and _ops(rewritten)[-1] == "Add"
    np.testing.assert_allclose(ReferenceExecutor(rewritten).run(feeds)["y"], expected,
                               rtol=RTOL, atol=ATOL)
    module = ember.compile(model)
    assert "ConvTranspose" not in _ops(module.build.graph)
    np.testing.assert_allclose(module.run(feeds)["y"], expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.float64, np.float16], ids=["float64", "float16"])
def test_other_float_types_are_lowered_too(dtype):
    """ONNX Runtime has no float64 ConvTranspose: onnx's reference evaluator is the oracle."""
    model, feeds = _model((1, 4, 6, 5), (4, 3, 3, 3),
                          {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
                          bias=True)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    for tensor in model.graph.initializer:
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(dtype),
                                                tensor.name))
    for info in [*model.graph.input, *model.graph.output]:
        info.type.tensor_type.elem_type = elem
    x = feeds["x"].astype(dtype)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    module = ember.compile(model)
    assert "ConvTranspose" not in _ops(module.build.graph)
    actual = module(x)
    assert actual.dtype == dtype
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


def test_weights_that_are_inputs_leave_the_node_alone():
    model, feeds = _model((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2]}, bias=True,
                          weight_input=True)
    graph, rewritten, changed = _rewritten(model)
    assert changed == 0 and _ops(rewritten) == ["ConvTranspose"]
    module = ember.compile(model)
    assert _ops(module.build.graph) == ["ConvTranspose"]
    np.testing.assert_allclose(module.run(feeds)["y"], _onnxruntime(model, feeds),
                               rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------- the shape of the rewrite


def test_kernel_equal_to_stride_is_one_pointwise_conv_and_depth_to_space():
    model, _ = _model((1, 8, 5, 7), (8, 4, 2, 2), {"strides": [2, 2]}, bias=True)
    graph, rewritten, _ = _rewritten(model)
    assert _ops(rewritten) == ["Conv", "DepthToSpace"]
    conv, shuffle = rewritten.nodes
    assert rewritten.constants[conv.inputs[1]].shape == (4 * 2 * 2, 8, 1, 1)
    assert rewritten.constants[conv.inputs[2]].shape == (4 * 2 * 2,)
    assert shuffle.attrs == {"blocksize": 2, "mode": "CRD"}
    assert shuffle.outputs == ["y"]


def test_overlapping_kernels_get_one_exact_conv_per_phase():
    model, _ = _model((1, 4, 6, 6), (4, 2, 3, 3),
                      {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]})
    graph, rewritten, _ = _rewritten(model)
    convs = [n for n in rewritten.nodes if n.op == "Conv"]
    # phase taps per axis: 1 and 2 -> kernels 1x1, 1x2, 2x1, 2x2: 9 taps, none wasted
    assert sorted(tuple(n.attrs["kernel_shape"]) for n in convs) == \
        [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert _ops(rewritten)[-2:] == ["Concat", "DepthToSpace"]


def test_phases_without_taps_are_the_bias_broadcast():
    # kernel 1 < stride 2: only one of the 4 phases has a tap; the others are bias only
    model, feeds = _model((2, 3, 4, 5), (3, 2, 1, 1), {"strides": [2, 2]}, bias=True)
    graph, rewritten, _ = _rewritten(model)
    assert _ops(rewritten).count("Conv") == 1 and _ops(rewritten).count("Expand") == 3
    np.testing.assert_allclose(ReferenceExecutor(rewritten).run(feeds)["y"],
                               _onnxruntime(model, feeds), rtol=RTOL, atol=ATOL)


def test_a_symbolic_batch_dim_keeps_the_stacked_layout():
    """Bias fills need the batch dim; without it every phase is a channel of one Conv."""
    model, feeds = _model((2, 3, 4, 5), (3, 2, 1, 1), {"strides": [2, 2]}, bias=True)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    graph, rewritten, changed = _rewritten(model)
    assert changed == 1 and _ops(rewritten) == ["Conv", "DepthToSpace", "Slice"]
    np.testing.assert_allclose(ReferenceExecutor(rewritten).run(feeds)["y"],
                               _onnxruntime(model, feeds), rtol=RTOL, atol=ATOL)


def test_many_phases_keep_the_stacked_layout():
    """Stride 3 in 2-D (9 phases) would need a 9-way Concat: one Conv it is."""
    model, _ = _model((1, 4, 6, 6), (4, 2, 4, 4), {"strides": [3, 3], "pads": [1, 1, 1, 1]})
    graph, rewritten, _ = _rewritten(model)
    assert _ops(rewritten)[:2] == ["Conv", "DepthToSpace"]


def test_one_dimensional_interleave_is_a_reshape_transpose_reshape():
    model, _ = _model((1, 2, 7), (2, 3, 2), {"strides": [2]})
    graph, rewritten, _ = _rewritten(model)
    assert _ops(rewritten) == ["Conv", "Reshape", "Transpose", "Reshape"]


def test_fresh_names_do_not_collide_with_existing_values():
    model, feeds = _model((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2]}, bias=True)
    # a second ConvTranspose reading the first, named so that the prefixes of the values
    # made for the two overlap
    second = helper.make_node("ConvTranspose", ["y", "W2"], ["z"], name="ct_conv",
                              strides=[1, 1])
    model.graph.node.append(second)
    model.graph.initializer.append(numpy_helper.from_array(
        np.full((3, 2, 2, 2), 0.25, np.float32), "W2"))
    model.graph.output[0].name = "z"
    graph, rewritten, changed = _rewritten(model)
    assert changed == 2
    names = [o for n in rewritten.nodes for o in n.outputs] + list(rewritten.constants)
    assert len(names) == len(set(names))
    np.testing.assert_allclose(ReferenceExecutor(rewritten).run(feeds)["z"],
                               _onnxruntime(model, feeds), rtol=RTOL, atol=ATOL)


def test_phase_taps_and_offsets():
    # kernel 3, stride 2, crop 1: even outputs (phase 0) take tap 1 at offset 0; odd ones
    # take taps 0 and 2 at offsets 1 and 0 (y[2v + 1] = x[v + 1] W[0] + x[v] W[2]).
    axis = plan_axis(stride=2, dilation=1, kernel=3, crop=1, in_size=5, out_size=10)
    assert axis.taps == (((1, 0),), ((0, 1), (2, 0)))
    assert axis.length == 5
    # kernel 1 < stride 3: phases 1 and 2 have no tap (bias only)
    assert plan_axis(3, 1, 1, 0, 4, 10).taps == (((0, 0),), (), ())


def test_the_pass_runs_before_the_cleanup_at_every_optimizing_level():
    for level in (1, 2):
        names = [p.name for p in pipeline.PIPELINES[level].passes]
        assert names.index("fold_constants") < names.index("lower_conv_transpose") < \
            names.index("simplify")
    assert "lower_conv_transpose" not in [p.name for p in pipeline.PIPELINES[0].passes]


# ---------------------------------------------------------------------- the suite's own cases


def _suite_cases():
    """The ONNX backend suite's ConvTranspose node cases, as its generator writes them
    (``onnx.backend.test.case.node.convtranspose``): name -> (node, inputs, outputs).
    Loading the generated suite instead would load every op's cases (seconds)."""
    from onnx.backend.test.case.node import convtranspose

    cases = {}

    def record(node, inputs, outputs, name, **_):
        cases[name] = (node, inputs, outputs)

    original = convtranspose.expect
    convtranspose.expect = record
    try:
        for attr in dir(convtranspose.ConvTranspose):
            if attr.startswith("export"):
                getattr(convtranspose.ConvTranspose, attr)()
    finally:
        convtranspose.expect = original
    return cases


SUITE = _suite_cases()


@pytest.mark.parametrize("name", sorted(SUITE))
def test_suite_case_with_constant_weights(name):
    """The backend suite feeds W (and B) as inputs, which the pass leaves alone; made
    initializers, every case must still give the suite's expected output once lowered."""
    node, inputs, outputs = SUITE[name]
    x, *constants = (np.asarray(a) for a in inputs)
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT,
                                       list(np.shape(outputs[0])))],
        initializer=[numpy_helper.from_array(a, n) for n, a in zip(node.input[1:], constants)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=10)
    onnx.checker.check_model(model)
    module = ember.compile(model)
    assert "ConvTranspose" not in _ops(module.build.graph)
    np.testing.assert_allclose(module(x), np.asarray(outputs[0]), rtol=RTOL, atol=ATOL)

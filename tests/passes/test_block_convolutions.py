"""Dense convolutions on channels blocked by the vector width (``passes/block_convolutions.py``)
and the product that runs them (a GEMM whose A is read in place through a table of offsets):
against ONNX Runtime on shapes no model names, the layout kept across elementwise ops and
pools, converted once per value that leaves the region, and the kernel checked against its
unscheduled loops by the loop interpreter."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.core.dtypes import DType
from ember.core.target import Target
from ember.frontend.onnx import import_onnx
from ember.ir.loop.functor import walk
from ember.ir.loop.stmt import Gemm
from ember.passes.block_convolutions import block_convolutions
from ember.schedule.pipeline import schedule_kernel

sys.path.insert(0, str(Path(__file__).parents[1] / "lower"))
sys.path.insert(0, str(Path(__file__).parents[1] / "schedule"))

from configs import kernel_arrays, kernel_space, random_config  # noqa: E402
from loop_interpreter import run_outputs  # noqa: E402

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(11)
LANES = Target.native().lanes_for(DType.FLOAT32)


def _model(nodes, inputs, initializers, outputs=("y",)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        [numpy_helper.from_array(a, n) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _against_ort(model: onnx.ModelProto, feeds: dict) -> ember.Module:
    module = ember.compile(model)
    ours = module.run(feeds)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for name, theirs in zip(names, session.run(None, feeds)):
        scale = max(1.0, float(np.abs(theirs).max()))
        np.testing.assert_allclose(ours[name], theirs, rtol=1e-4, atol=2e-5 * scale,
                                   err_msg=name)
    return module


def _ops(module: ember.Module) -> dict[str, int]:
    return module.build.graph.op_histogram()


def _randn(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# Shapes no model names: kernel sizes 1-5, strides 1-3, dilations, asymmetric pads, inputs
# of fewer channels than a vector (an image's three) and of several vectors, odd images.
CASES = [
    # batch, in, out, height, width, kernel, stride, dilation, pads
    (1, 3, LANES, 19, 23, 3, 1, 1, (1, 1, 1, 1)),
    (2, LANES, 2 * LANES, 11, 9, 3, 2, 1, (1, 0, 2, 1)),
    (3, 2 * LANES, LANES, 7, 7, 1, 1, 1, (0, 0, 0, 0)),
    (1, LANES, 3 * LANES, 13, 17, 5, 1, 2, (4, 4, 4, 4)),
    (2, 5, LANES, 30, 30, 7, 3, 1, (3, 2, 3, 2)),
    (1, 2 * LANES, 2 * LANES, 5, 40, 3, 1, 1, (0, 1, 0, 1)),
    (2, LANES, 2 * LANES, 6, 9, 1, 1, 1, (0, 0, 0, 0)),  # pixels merged: A one stride
]


@pytest.mark.parametrize("batch, cin, cout, height, width, kernel, stride, dilation, pads",
                         CASES)
def test_a_blocked_convolution_computes_what_onnx_runtime_does(
        batch, cin, cout, height, width, kernel, stride, dilation, pads):
    """The convolution of the case, then a Relu and a 1x1 convolution (a convolution is
    blocked when it chains to another)."""
    x, w, b = _randn(batch, cin, height, width), _randn(cout, cin, kernel, kernel), _randn(cout)
    nodes = [*_conv_case_nodes(kernel, stride, dilation, pads),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[1, 1])]
    weights = {"w": w, "b": b, "w2": _randn(LANES, cout, 1, 1)}
    module = _against_ort(_model(nodes, [("x", list(x.shape))], weights), {"x": x})
    ops = _ops(module)
    assert ops.get("ConvBlocked") == 2 and "Conv" not in ops
    gemms = [n for impl in module.build.kernels for n in walk(impl.func.body)
             if isinstance(n, Gemm)]
    # the image is read where it lies (through a table of its reduction offsets when they
    # are not one stride), nothing is packed at run time, the tile is one vector wide
    first = next(g for g in gemms if g.k == -(-cin // LANES) * min(cin, LANES) * kernel ** 2
                 or g.k == cin * kernel ** 2)
    assert first.a_gathered == (cin > LANES or kernel > 1)
    assert all(not g.knobs.pack_a and g.pack is None and g.knobs.nr == LANES for g in gemms)


def _conv_case_nodes(kernel, stride, dilation, pads, out="c"):
    return [helper.make_node("Conv", ["x", "w", "b"], [out], kernel_shape=[kernel, kernel],
                             strides=[stride, stride], dilations=[dilation, dilation],
                             pads=list(pads))]


def test_a_lone_convolution_keeps_nchw():
    """A convolution with no other one to share the layout with would pay both conversions
    for itself: it keeps its NCHW kernel."""
    x = _randn(1, LANES, 12, 12)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    module = _against_ort(_model(nodes, [("x", list(x.shape))],
                                 {"w": _randn(2 * LANES, LANES, 3, 3)}), {"x": x})
    assert "ConvBlocked" not in _ops(module)


def test_the_layout_stays_blocked_between_convolutions_and_converts_at_the_edges():
    """conv -> relu -> conv -> + residual -> relu -> max pool -> per-channel scale -> conv
    (stride 2) -> global average pool: one conversion in, one out (and one for the extra
    output that reads the middle of the region), all against ONNX Runtime."""
    c = 2 * LANES
    x = _randn(2, 3, 20, 20)
    weights = {"w1": _randn(c, 3, 3, 3), "w2": _randn(c, c, 3, 3), "w3": _randn(c, c, 3, 3),
               "w4": _randn(c, c, 3, 3), "scale": _randn(1, c, 1, 1),
               "shift": np.float32(0.5) * np.ones((1, 1, 1, 1), np.float32)}
    conv = lambda i, w, o, **a: helper.make_node(  # noqa: E731
        "Conv", [i, w], [o], kernel_shape=[3, 3], pads=[1, 1, 1, 1], **a)
    nodes = [conv("x", "w1", "a"), helper.make_node("Relu", ["a"], ["a_r"]),
             conv("a_r", "w2", "b"), helper.make_node("Relu", ["b"], ["b_r"]),
             conv("b_r", "w3", "c"), helper.make_node("Add", ["c", "a_r"], ["s"]),
             helper.make_node("Relu", ["s"], ["middle"]),
             helper.make_node("MaxPool", ["middle"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["p", "scale"], ["q"]),
             helper.make_node("Add", ["q", "shift"], ["q2"]),
             conv("q2", "w4", "d", strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["d"], ["y"])]
    model = _model(nodes, [("x", list(x.shape))], weights, outputs=("y", "middle"))
    module = _against_ort(model, {"x": x})
    ops = _ops(module)
    assert ops.get("ConvBlocked") == 4 and "Conv" not in ops
    # in: the image; out: the pooled result and the middle output
    assert ops.get("Transpose") == 3, ops
    assert ops.get("MaxPool") == 1 and ops.get("AveragePool") == 1


@pytest.mark.parametrize("stride, kernel", [(1, 3), (2, 3), (1, 5)])
def test_depthwise_convolutions_between_blocked_ones_run_blocked(stride, kernel):
    """An inverted residual block (1x1 expansion, Clip, depthwise, Clip, 1x1 projection,
    residual Add when the stride is one): the depthwise convolution reads the blocked
    expansion and runs as DepthwiseConvBlocked, with no conversion between them."""
    c, wide = LANES, 3 * LANES
    x = _randn(2, c, 13, 11)
    pad = kernel // 2
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["e"], kernel_shape=[1, 1]),
             helper.make_node("Clip", ["e", "lo", "hi"], ["e6"]),
             helper.make_node("Conv", ["e6", "wd", "bd"], ["d"], kernel_shape=[kernel, kernel],
                              strides=[stride, stride], pads=[pad] * 4, group=wide),
             helper.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
             helper.make_node("Conv", ["d6", "w2"], ["p" if stride == 1 else "y"],
                              kernel_shape=[1, 1])]
    if stride == 1:
        nodes.append(helper.make_node("Add", ["p", "x"], ["y"]))
    weights = {"w1": _randn(wide, c, 1, 1), "b1": _randn(wide),
               "wd": _randn(wide, 1, kernel, kernel), "bd": _randn(wide),
               "w2": _randn(c, wide, 1, 1), "lo": np.float32(0), "hi": np.float32(6)}
    module = _against_ort(_model(nodes, [("x", list(x.shape))], weights), {"x": x})
    ops = _ops(module)
    assert ops.get("ConvBlocked") == 2 and ops.get("DepthwiseConvBlocked") == 1, ops
    assert ops.get("Transpose") == 2 and "Conv" not in ops, ops


def test_channels_that_are_not_whole_vectors_are_padded_with_zero_channels():
    """1.5 vectors of channels (24 of AVX-512's 16 lanes) run as two, the extra channels zero:
    a projection to them, a residual Add, a depthwise convolution and a Clip on them, a
    convolution reading them, a per-channel scale, and two outputs that drop the padding --
    against ONNX Runtime; no op that could turn a zero channel into inf or NaN (a Div by a
    per-channel constant) runs on them."""
    c = LANES + LANES // 2
    x = _randn(2, 2 * LANES, 9, 10)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["p"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["p", "skip"], ["s"]),
             helper.make_node("Conv", ["s", "wd"], ["d"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], group=c),
             helper.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
             helper.make_node("Mul", ["d6", "scale"], ["m"]),
             helper.make_node("Conv", ["m", "w2"], ["y"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("Div", ["s", "divisor"], ["z"])]
    weights = {"w1": _randn(c, 2 * LANES, 1, 1), "b1": _randn(c), "wd": _randn(c, 1, 3, 3),
               "w2": _randn(2 * LANES, c, 3, 3), "scale": _randn(1, c, 1, 1),
               "divisor": np.abs(_randn(1, c, 1, 1)) + 1, "lo": np.float32(0),
               "hi": np.float32(6)}
    skip = _randn(2, c, 9, 10)
    model = _model(nodes, [("x", list(x.shape)), ("skip", list(skip.shape))], weights,
                   outputs=("y", "z", "d6"))
    module = _against_ort(model, {"x": x, "skip": skip})
    ops = _ops(module)
    assert ops.get("ConvBlocked") == 2 and ops.get("DepthwiseConvBlocked") == 1, ops
    assert ops.get("Div") == 1 and ops.get("Slice") == 2, ops  # z and d6 drop the padding


def test_sibling_convolutions_fused_horizontally_split_in_the_blocked_layout():
    """Two 1x1 convolutions of one value (a bottleneck's projection and shortcut) become one
    convolution and a Split (``fuse_horizontal``); the Split takes whole vectors of channels
    from the blocked result, so nothing converts in between."""
    c = LANES
    x = _randn(1, c, 10, 12)
    conv = lambda i, w, o, k: helper.make_node(  # noqa: E731
        "Conv", [i, w], [o], kernel_shape=[k, k], pads=[k // 2] * 4)
    nodes = [conv("x", "wa", "a", 3), helper.make_node("Relu", ["a"], ["ar"]),
             conv("ar", "wp", "p", 1), conv("ar", "wq", "q", 1),
             helper.make_node("Relu", ["p"], ["pr"]), conv("pr", "wp2", "p2", 3),
             helper.make_node("Add", ["p2", "q"], ["y"])]
    weights = {"wa": _randn(c, c, 3, 3), "wp": _randn(2 * c, c, 1, 1),
               "wq": _randn(c, c, 1, 1), "wp2": _randn(c, 2 * c, 3, 3)}
    module = _against_ort(_model(nodes, [("x", list(x.shape))], weights), {"x": x})
    ops = _ops(module)
    assert ops.get("Split") == 1 and ops.get("ConvBlocked") == 3, ops
    assert ops.get("Transpose") == 2, ops


def test_what_does_not_qualify_keeps_its_nchw_convolution():
    """Groups of less than a vector of channels, output channels that pad badly (one more
    than a vector), input channels that are neither whole vectors nor fewer than one, and a
    model input of dynamic size stay as they were -- each followed by a convolution that
    does qualify, so that only its shape keeps it out."""
    cases = [(2 * LANES, 2 * LANES, {"group": 4}), (LANES, LANES + 1, {}),
             (LANES + 1, LANES, {})]
    for cin, cout, attrs in cases:
        groups = attrs.get("group", 1)
        x, w = _randn(1, cin, 9, 9), _randn(cout, cin // groups, 3, 3)
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3],
                                  pads=[1, 1, 1, 1], **attrs),
                 helper.make_node("Conv", ["c", "w2"], ["y"], kernel_shape=[1, 1])]
        weights = {"w": w, "w2": _randn(LANES, cout, 1, 1)}
        module = _against_ort(_model(nodes, [("x", list(x.shape))], weights), {"x": x})
        ops = _ops(module)
        assert ops.get("Conv") == 2 and "ConvBlocked" not in ops, (cin, cout, attrs, ops)
    graph = import_onnx(_model([helper.make_node("Conv", ["x", "w"], ["c"],
                                                 kernel_shape=[3, 3]),
                                helper.make_node("Conv", ["c", "w2"], ["y"],
                                                 kernel_shape=[1, 1])],
                               [("x", ["n", LANES, 9, 9])],
                               {"w": _randn(LANES, LANES, 3, 3),
                                "w2": _randn(LANES, LANES, 1, 1)}))
    assert block_convolutions(graph, Target.native()) == 0


@pytest.mark.parametrize("groups, per_group, stride", [(2, LANES, 1), (4, LANES, 2),
                                                       (3, 2 * LANES, 1)])
def test_grouped_convolutions_of_whole_vectors_per_group_run_blocked(groups, per_group, stride):
    """A grouped 3x3 convolution between two 1x1 ones (a ResNeXt/RegNet block) whose groups
    are whole vectors of channels runs blocked, each group's product reading its own
    channel blocks -- against ONNX Runtime."""
    c = groups * per_group
    x = _randn(2, c, 11, 10)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "wg", "bg"], ["g"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], strides=[stride, stride], group=groups),
             helper.make_node("Relu", ["g"], ["gr"]),
             helper.make_node("Conv", ["gr", "w2"], ["y"], kernel_shape=[1, 1])]
    weights = {"w0": _randn(c, c, 1, 1), "wg": _randn(c, per_group, 3, 3), "bg": _randn(c),
               "w2": _randn(LANES, c, 1, 1)}
    module = _against_ort(_model(nodes, [("x", list(x.shape))], weights), {"x": x})
    ops = _ops(module)
    assert ops.get("ConvBlocked") == 3 and "Conv" not in ops, ops
    grouped, = [n for n in module.build.graph.nodes if n.attrs.get("group", 1) > 1]
    assert grouped.op == "ConvBlocked" and grouped.attrs["group"] == groups


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("seed", [None, 1, 6])  # (1 and 6 take the template, kc < k)
def test_the_blocked_kernel_matches_its_unscheduled_loops_in_the_interpreter(seed, groups):
    """The scheduled kernel (a Gemm reading its A through a walk of offsets; grouped, a
    product per group), under the default config and under random legal ones, computes
    what its unscheduled loops compute in the loop interpreter: the template's semantics,
    not only its C."""
    c = groups * LANES
    x = _randn(2, c, 6, 7)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3],
                              strides=[1, 2], pads=[1, 0, 1, 1], group=groups),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[1, 1])]
    module = ember.compile(_model(nodes, [("x", list(x.shape))],
                                  {"w": _randn(2 * c, LANES, 3, 3),
                                   "b": _randn(2 * c), "w2": _randn(LANES, 2 * c, 1, 1)}))
    graph, rng = module.build.graph, np.random.default_rng(seed)
    impl = next(impl for impl in module.build.kernels
                if any(n.op == "ConvBlocked" and n.attrs["strides"] == [1, 2] for n in impl.nodes))
    constants = frozenset(i for i, name in enumerate(impl.group.inputs)
                          if name in graph.constants)
    config = None if seed is None else random_config(
        impl.lowered, Target.native(), seed,
        space=lambda f, t, c: kernel_space(f, t, c, constants))
    scheduled = schedule_kernel(impl.lowered, Target.native(), config,
                                constant_params=constants, verify=True)
    gemms = [n for n in walk(scheduled.func.body) if isinstance(n, Gemm)]
    # (a random config may keep the plain loops: gemm0.template=False)
    assert all(gemm.a_gathered for gemm in gemms) and (gemms or seed is not None)
    arrays, packed = kernel_arrays(impl, graph, scheduled, rng)
    for got, want in zip(run_outputs(scheduled.func, packed), run_outputs(impl.lowered, arrays)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=str(config))


SANITIZED = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, sys.argv[1] + "/tests/passes")
    import numpy as np
    import ember
    from onnx import helper
    from test_block_convolutions import CASES, LANES, _model, _randn
    from ember.interp import ReferenceExecutor
    from ember.frontend.onnx import import_onnx
    for batch, cin, cout, height, width, kernel, stride, dilation, pads in CASES:
        x, w = _randn(batch, cin, height, width), _randn(cout, cin, kernel, kernel)
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[kernel, kernel],
                                  strides=[stride, stride], dilations=[dilation, dilation],
                                  pads=list(pads)),
                 helper.make_node("Conv", ["c", "w2"], ["y"], kernel_shape=[1, 1])]
        model = _model(nodes, [("x", list(x.shape))], {"w": w, "w2": _randn(LANES, cout, 1, 1)})
        module = ember.compile(model, sanitize=True)
        assert any(n.op == "ConvBlocked" for n in module.build.graph.nodes)
        expected = ReferenceExecutor(import_onnx(model)).run({"x": x})["y"]
        scale = max(1.0, float(np.abs(expected).max()))
        np.testing.assert_allclose(module(x), expected, rtol=1e-4, atol=2e-5 * scale)
    print("ok")
""")


def test_blocked_convolutions_are_clean_under_asan_and_ubsan(run_sanitized):
    assert run_sanitized(SANITIZED).strip().endswith("ok")


def test_webassembly_keeps_nchw_convolutions():
    """Blocked layouts are for native targets: in wasm runtimes the NCHW kernels are faster
    (passes/block_depthwise.py, blocked_layouts_pay), so a wasm32 build blocks nothing that a
    native build with the same 4 lanes (SSE2) blocks."""
    from ember.frontend.onnx import import_onnx
    from ember.passes.block_convolutions import block_convolutions
    from ember.passes.block_depthwise import block_depthwise_convolutions
    from ember.passes.pipeline import optimize

    c = 8
    weights = {"w1": _randn(c, c, 3, 3), "w2": _randn(c, c, 3, 3), "dw": _randn(c, 1, 3, 3)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "dw"], ["d"], kernel_shape=[3, 3], group=c,
                              pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["d", "w2"], ["y"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1])]
    model = _model(nodes, [("x", [1, c, 12, 12])], weights)
    counts = {}
    for name in ("x86_64", "wasm32"):
        graph = import_onnx(model)
        optimize(graph, 1)
        target = ember.Target.parse(name)
        counts[name] = (block_convolutions(graph, target),
                        block_depthwise_convolutions(graph, target))
    assert counts["x86_64"][0] == 2 and counts["wasm32"] == (0, 0), counts

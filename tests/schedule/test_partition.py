"""Loop partitioning (``ember.schedule.partition``): guarded kernels split around their borders
compute exactly what the unsplit kernels compute (both run in the reference interpreter on
random inputs), the middle part loses its guards, and the compiled models match ONNX Runtime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).parents[1] / "lower"))

from loop_interpreter import run_outputs  # noqa: E402

import ember  # noqa: E402
import ember.schedule.partition as partition  # noqa: E402
from ember.schedule.config import KernelConfig  # noqa: E402
from ember.ir.loop import For, walk  # noqa: E402
from ember.ir.loop.buffer import Buffer  # noqa: E402
from ember.ir.loop.expr import Binary, Select  # noqa: E402

RNG = np.random.default_rng(11)

# name -> (node, input shape): kernels whose borders are guarded in the loop IR
CASES = {
    "conv_same_upper": (helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3],
                                         auto_pad="SAME_UPPER"), [1, 2, 9, 11], (3, 2, 3, 3)),
    "conv_same_lower_stride2": (helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3],
                                                 auto_pad="SAME_LOWER", strides=[2, 2]),
                                [1, 2, 12, 13], (2, 2, 3, 3)),
    "depthwise_same": (helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3],
                                        auto_pad="SAME_UPPER", group=3), [1, 3, 10, 10],
                       (3, 1, 3, 3)),
    "avgpool_pads": (helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1], count_include_pad=0),
                     [1, 2, 9, 10], None),
    "maxpool_ceil": (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3],
                                      strides=[2, 2], ceil_mode=1), [1, 2, 12, 12], None),
    "pad": (helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant"), [1, 2, 8, 9],
            None),
}


def _model(name: str):
    node, x_shape, w_shape = CASES[name]
    initializers = []
    if w_shape is not None:
        initializers.append(helper.make_tensor(
            "w", TensorProto.FLOAT, w_shape, RNG.standard_normal(w_shape).astype(np.float32)
            .ravel().tolist()))
    if node.op_type == "Pad":
        initializers.append(helper.make_tensor("pads", TensorProto.INT64, [8],
                                               [0, 0, 1, 2, 0, 0, 2, 1]))
    graph = helper.make_graph(
        [node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, x_shape


def _guards(func) -> int:
    return sum(isinstance(n, Select) or (isinstance(n, Binary) and n.op in ("min", "max", "lt",
                                                                             "le", "gt", "ge"))
               for n in walk(func.body))


def _arrays(func, count: int) -> list[np.ndarray]:
    buffers = [p for p in func.params if isinstance(p, Buffer)][:count]
    return [RNG.standard_normal(b.shape).astype(b.dtype.numpy) if b.dtype.is_float
            else np.zeros(b.shape, b.dtype.numpy) for b in buffers]


@pytest.mark.parametrize("name", sorted(CASES))
def test_split_kernels_compute_what_the_guarded_ones_compute(name):
    """The kernels as scheduled without partitioning (every kernel's ``partition`` knob off),
    then partitioned here: the same outputs, bit for bit, in the interpreter; the middle
    loops hold fewer guards."""
    model, _ = _model(name)
    keys = {impl.workload_key for impl in ember.compile(model).build.kernels}
    module = ember.compile(model, kernel_configs={
        key: KernelConfig.of(partition=False) for key in keys})
    split_any = False
    for impl in module.build.kernels:
        func = impl.func
        split = partition.partition_guarded_loops(func)
        if split is func:
            continue
        split_any = True
        loops = [n for n in walk(split.body) if isinstance(n, For)]
        assert any(n.var.name.endswith(("_lo", "_hi")) for n in loops)
        inputs = _arrays(func, len(impl.group.inputs))
        for want, got in zip(run_outputs(func, inputs), run_outputs(split, inputs)):
            np.testing.assert_array_equal(got, want)
        middles = [n for n in loops if not n.var.name.endswith(("_lo", "_hi")) and
                   any(m.var.name.endswith(("_lo", "_hi")) for m in loops
                       if m.var.name.startswith(n.var.name + "_"))]
        assert middles and min(_guards(m) for m in middles) < _guards(func)
    assert split_any


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_partitioned_kernels_match_onnx_runtime(name):
    model, x_shape = _model(name)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    want, = ort.InferenceSession(model.SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(ember.compile(model)(x), want, rtol=1e-5, atol=1e-5)


def test_a_loop_whose_guards_never_settle_is_left_alone():
    """A 3x3 window over 4x4 outputs: only two rows (and columns) are clear of the borders,
    fewer than a middle part is worth."""
    tiny = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], auto_pad="SAME_UPPER")
    graph = helper.make_graph(
        [tiny], "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 3, 3], [1.0] * 9)])
    small = ember.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    names = [n.var.name for impl in small.build.kernels for n in walk(impl.func.body)
             if isinstance(n, For)]
    assert not any(name.endswith(("_lo", "_hi")) for name in names)


def test_a_pad_of_every_axis_does_not_grow_without_bound():
    """Six padded axes: each split triples the loop body, so splitting stops once a body
    holds MAX_BODY_LOOPS loops; the result is still the Pad."""
    node = helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant")
    graph = helper.make_graph(
        [node], "pad6", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5] * 6)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("pads", TensorProto.INT64, [12], [1] * 12)])
    module = ember.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    loops = [n for impl in module.build.kernels for n in walk(impl.func.body)
             if isinstance(n, For)]
    assert any(n.var.name.endswith(("_lo", "_hi")) for n in loops)
    assert len(loops) <= 3 * (partition.MAX_BODY_LOOPS + 1)
    x = RNG.standard_normal([5] * 6).astype(np.float32)
    np.testing.assert_array_equal(module(x), np.pad(x, 1))


def _concat_model():
    """Two Concats of 12 pieces each, through Reshapes, then joined along another axis: the
    piece tests of the outer Concat decide those of the inner ones once split."""
    pieces = [f"p{i}" for i in range(24)]
    shape = [2, 5]
    nodes = [helper.make_node("Concat", pieces[:12], ["a"], axis=0),
             helper.make_node("Concat", pieces[12:], ["b"], axis=0),
             helper.make_node("Reshape", ["a", "shape"], ["a4"]),
             helper.make_node("Reshape", ["b", "shape"], ["b4"]),
             helper.make_node("Concat", ["a4", "b4"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes, "concat", [helper.make_tensor_value_info(p, TensorProto.FLOAT, shape)
                          for p in pieces],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("shape", TensorProto.INT64, [4], [12, 1, 2, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {p: RNG.standard_normal(shape).astype(np.float32) for p in pieces}
    want = np.concatenate([np.concatenate([feeds[p] for p in pieces[:12]]).reshape(12, 1, 2, 5),
                           np.concatenate([feeds[p] for p in pieces[12:]]).reshape(12, 1, 2, 5)],
                          axis=1)
    return model, feeds, want


def test_concatenations_split_into_plain_copies():
    """A Concat tests per element which piece it is in (a select tree, every piece's load
    evaluated): split at the pieces' bounds, each part is a copy without a test, also
    through Reshapes and a Concat of Concats; the same result as numpy's, and as the
    unsplit kernel's in the interpreter."""
    model, feeds, want = _concat_model()
    module = ember.compile(model)
    np.testing.assert_array_equal(module.run(feeds)["y"], want)
    assert not any(isinstance(n, Select) for impl in module.build.kernels
                   for n in walk(impl.func.body))
    keys = {impl.workload_key for impl in module.build.kernels}
    unsplit = ember.compile(model, kernel_configs={
        key: KernelConfig.of(partition=False) for key in keys})
    for impl in unsplit.build.kernels:
        assert any(isinstance(n, Select) for n in walk(impl.func.body))
        inputs = _arrays(impl.func, len(impl.group.inputs))
        split = partition.partition_guarded_loops(impl.func)
        assert split is not impl.func
        for a, b in zip(run_outputs(impl.func, inputs), run_outputs(split, inputs)):
            np.testing.assert_array_equal(a, b)

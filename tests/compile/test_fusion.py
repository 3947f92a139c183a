"""Fused kernels: which nodes become one kernel, and that the kernel computes what they did.

Each case is a graph written as printed IR, compiled at an opt level; the test asserts the
kernel list (the ops of every kernel's fused group, in order) and compares the outputs with
ember's numpy reference executor running the unoptimized graph (an independent oracle: the
op references, not the compiled code).  ``tests/passes`` checks the rewrites themselves; this
file checks what fusion and lowering make of their results.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import ember
from ember.interp import ReferenceExecutor
from ember.ir.graph import Graph
from ember.ir.parser import parse_graph
from ember.passes.infer_shapes import infer_shapes

RNG = np.random.default_rng(7)


def _graph(text: str) -> Graph:
    return infer_shapes(parse_graph(text))


def _compile(text: str, opt_level: int = 2, tolerance: float = 2e-5):
    """Compile the graph; check its outputs against the reference on random inputs (to
    ``tolerance``, relative and absolute); return the kernel list as one ``+``-joined op
    string per kernel."""
    graph = _graph(text)
    module = ember.compile(copy.deepcopy(graph), opt_level=opt_level)
    feeds = {}
    for name in graph.inputs:
        vtype = graph.types[name]
        feeds[name] = RNG.standard_normal(tuple(vtype.shape)).astype(vtype.dtype.numpy)
    expected = ReferenceExecutor(graph).run(feeds)
    actual = module.run(feeds)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=tolerance, atol=tolerance,
                                   err_msg=name)
    build = module.build
    assert build.host_nodes == [], build.report()
    return ["+".join(n.op for n in impl.group.nodes) for impl in build.kernels], build


def test_a_pointwise_diamond_is_one_pass():
    # c has two readers (an output and the Tanh); the group reading it reads nothing else
    # that c's group does not (x): one kernel computes and stores both outputs
    kernels, _ = _compile("""
        graph g(%x: f32[4, 40], %y: f32[4, 40]) -> (%c: f32[4, 40], %h: f32[4, 40]) {
          %s = Sigmoid(%x)
          %m = Mul(%s, %y)
          %c = Add(%m, %y)
          %t = Tanh(%c)
          %o = Neg(%x)
          %h = Mul(%t, %o)
        }""")
    assert kernels == ["Sigmoid+Mul+Add+Tanh+Neg+Mul"], kernels
    # a reader of c that also reads another input stays a kernel of its own
    kernels, _ = _compile("""
        graph g(%x: f32[4, 40], %y: f32[4, 40], %z: f32[4, 40]) -> (%c: f32[4, 40],
                                                                    %h: f32[4, 40]) {
          %s = Sigmoid(%x)
          %c = Mul(%s, %y)
          %t = Tanh(%c)
          %o = Neg(%z)
          %h = Mul(%t, %o)
        }""")
    assert len(kernels) == 2, kernels


def test_gemm_bias_gelu_and_residual_add_are_one_kernel():
    kernels, build = _compile("""
        graph g(%x: f32[8, 32]) -> (%y: f32[8, 32]) {
          const %w: f32[32, 32] = random
          const %b: f32[32] = random
          %h = Gemm(%x, %w, %b) {transB=1}
          %a = Gelu(%h)
          %y = Add(%a, %x)
        }""")
    assert kernels == ["Gemm+Gelu+Add"]
    assert build.workspace_size == 0  # nothing between kernels, nothing in scratch


def test_gelu_written_out_after_a_matmul_is_one_kernel():
    # The erf form as exporters write it: recognized as Gelu, then fused as an epilogue.
    kernels, _ = _compile("""
        graph g(%x: f32[4, 16]) -> (%y: f32[4, 16]) {
          const %w: f32[16, 16] = random
          const %b: f32[16] = random
          const %sqrt2: f32[] = 1.4142135
          const %one: f32[] = 1.0
          const %half: f32[] = 0.5
          %m = MatMul(%x, %w)
          %h = Add(%m, %b)
          %d = Div(%h, %sqrt2)
          %e = Erf(%d)
          %p = Add(%e, %one)
          %q = Mul(%h, %p)
          %y = Mul(%q, %half)
        }""")
    assert kernels == ["MatMul+Add+Gelu"]


def test_softmax_is_one_kernel():
    kernels, _ = _compile("""
        graph g(%x: f32[6, 40]) -> (%y: f32[6, 40]) {
          %y = Softmax(%x) {axis=-1}
        }""")
    assert kernels == ["Softmax"]


@pytest.mark.parametrize("opt_level", [1, 2])
def test_softmax_written_out_is_one_kernel(opt_level):
    # O2 recognizes the composite; O1 fuses the small ops as they are.
    kernels, _ = _compile("""
        graph g(%x: f32[6, 40]) -> (%y: f32[6, 40]) {
          const %ax: i64[1] = -1
          %m = ReduceMax(%x, %ax) {keepdims=1}
          %s = Sub(%x, %m)
          %e = Exp(%s)
          %t = ReduceSum(%e, %ax) {keepdims=1}
          %y = Div(%e, %t)
        }""", opt_level)
    assert len(kernels) == 1
    assert kernels == (["Softmax"] if opt_level == 2 else
                       ["ReduceMax+Sub+Exp+ReduceSum+Div"])


@pytest.mark.parametrize("opt_level", [1, 2])
def test_layer_norm_written_out_is_one_kernel(opt_level):
    kernels, _ = _compile("""
        graph g(%x: f32[4, 8, 64]) -> (%y: f32[4, 8, 64]) {
          const %ax: i64[1] = -1
          const %two: f32[] = 2.0
          const %eps: f32[] = 1e-5
          const %gamma: f32[64] = random
          const %beta: f32[64] = random
          %mean = ReduceMean(%x, %ax) {keepdims=1}
          %d = Sub(%x, %mean)
          %sq = Pow(%d, %two)
          %var = ReduceMean(%sq, %ax) {keepdims=1}
          %ve = Add(%var, %eps)
          %sd = Sqrt(%ve)
          %n = Div(%d, %sd)
          %s = Mul(%n, %gamma)
          %y = Add(%s, %beta)
        }""", opt_level)
    assert len(kernels) == 1
    if opt_level == 2:
        assert kernels == ["LayerNormalization"]


def test_qkv_projections_are_one_gemm():
    kernels, build = _compile("""
        graph g(%x: f32[16, 32]) -> (%q: f32[16, 32], %k: f32[16, 32], %v: f32[16, 32]) {
          const %wq: f32[32, 32] = random
          const %wk: f32[32, 32] = random
          const %wv: f32[32, 32] = random
          const %bq: f32[32] = random
          const %bk: f32[32] = random
          const %bv: f32[32] = random
          %mq = MatMul(%x, %wq)
          %q = Add(%mq, %bq)
          %mk = MatMul(%x, %wk)
          %k = Add(%mk, %bk)
          %mv = MatMul(%x, %wv)
          %v = Add(%mv, %bv)
        }""")
    anchors = [k for k in kernels if "MatMul" in k or "Gemm" in k]
    assert len(anchors) == 1, kernels
    assert sum(node.op in ("MatMul", "Gemm") for node in build.graph.nodes) == 1


def test_conv_batchnorm_relu_are_one_kernel():
    kernels, _ = _compile("""
        graph g(%x: f32[1, 4, 10, 10]) -> (%y: f32[1, 8, 10, 10]) {
          const %w: f32[8, 4, 3, 3] = random
          const %scale: f32[8] = 1.5
          const %bias: f32[8] = random
          const %mean: f32[8] = random
          const %var: f32[8] = 2.0
          %c = Conv(%x, %w) {pads=[1, 1, 1, 1]}
          %n = BatchNormalization(%c, %scale, %bias, %mean, %var)
          %y = Relu(%n)
        }""")
    # the border becomes an explicit Pad (its own kernel: the conv reads it many times)
    assert kernels[-1] == "Conv+Relu" and len(kernels) <= 2, kernels


def test_silu_and_group_norm_chains_fuse():
    kernels, _ = _compile("""
        graph g(%x: f32[1, 8, 6, 6]) -> (%y: f32[1, 8, 6, 6]) {
          const %shape: i64[3] = [1, 2, -1]
          const %back: i64[4] = [1, 8, 6, 6]
          const %ones: f32[2] = 1.0
          const %zeros: f32[2] = 0.0
          const %gamma: f32[8, 1, 1] = random
          const %beta: f32[8, 1, 1] = random
          %r = Reshape(%x, %shape)
          %n = InstanceNormalization(%r, %ones, %zeros)
          %b = Reshape(%n, %back)
          %m = Mul(%b, %gamma)
          %a = Add(%m, %beta)
          %s = Sigmoid(%a)
          %y = Mul(%a, %s)
        }""", opt_level=1)
    assert len(kernels) == 1, kernels


def test_a_value_with_two_readers_is_written_once_and_not_fused_into_either():
    kernels, _ = _compile("""
        graph g(%x: f32[8, 16]) -> (%y: f32[8, 16], %z: f32[8, 16]) {
          const %w: f32[16, 16] = random
          %m = MatMul(%x, %w)
          %y = Relu(%m)
          %z = Sigmoid(%m)
        }""")
    assert kernels[0] == "MatMul" and len(kernels) >= 2, kernels


def test_opt_level_zero_keeps_one_kernel_per_node():
    kernels, _ = _compile("""
        graph g(%x: f32[8, 16]) -> (%y: f32[8, 16]) {
          %a = Neg(%x)
          %b = Exp(%a)
          %y = Add(%b, %x)
        }""", opt_level=0)
    assert kernels == ["Neg", "Exp", "Add"]


def test_gather_indices_are_not_computed_inside_the_kernel_that_checks_them():
    # Gather range-checks its indices before the kernel runs: a producer of the indices
    # must stay in an earlier kernel so the check sees the real values.
    kernels, _ = _compile("""
        graph g(%x: f32[10, 4], %i: f32[3]) -> (%y: f32[3, 4]) {
          %a = Abs(%i)
          %f = Floor(%a)
          %c = Cast(%f) {to=7}
          %y = Gather(%x, %c) {axis=0}
        }""", opt_level=1)
    assert kernels[-1] == "Gather" and len(kernels) == 2, kernels


def test_a_convolution_stores_into_the_padded_input_of_the_next_one():
    # The second convolution's padding (made explicit) joins the first one's kernel: the
    # first stores its result inside the padded buffer and fills the border, no Pad kernel.
    kernels, build = _compile("""
        graph g(%x: f32[2, 4, 9, 11]) -> (%y: f32[2, 6, 9, 13]) {
          const %w1: f32[8, 4, 3, 3] = random
          const %b1: f32[8] = random
          const %w2: f32[6, 8, 3, 3] = random
          %c = Conv(%x, %w1, %b1) {pads=[1, 1, 1, 1]}
          %r = Relu(%c)
          %y = Conv(%r, %w2) {pads=[1, 2, 1, 2]}
        }""")
    assert kernels[-2:] == ["Conv+Relu+Pad", "Conv"], kernels
    (func,) = [impl.func for impl in build.kernels if "Pad" in impl.group.nodes[-1].op
               and len(impl.group.nodes) == 3]
    assert "out0: f32[2, 8, 11, 15]" in str(func)  # the kernel writes the padded buffer


@pytest.mark.parametrize("value, mode, pads, kernel, joins", [
    ("2.5", "constant", [0, 0, 2, 0, 0, 0, 1, 3], 3, True),    # a fill other than 0
    ("", "constant", [0, 0, 0, 1, 0, 0, 0, 0], 3, True),       # one side of one axis
    ("", "constant", [0, 1, 0, 0, 0, 2, 0, 0], 3, True),       # channels too
    ("", "constant", [0, 0, 1, 1, 0, 0, 1, 1], 1, False),      # pointwise: a Pad kernel
    ("2.5", "constant", [0, 0, -1, 1, 0, 0, 1, 0], 3, False),  # a crop is not a border
    ("", "reflect", [0, 0, 1, 1, 0, 0, 1, 1], 3, False),       # copies of the input
    ("", "edge", [0, 0, 1, 1, 0, 0, 1, 1], 3, False),
])
def test_a_pad_joins_a_convolution_when_it_surrounds_it_with_one_value(value, mode, pads,
                                                                       kernel, joins):
    shape = [d + pads[i] + pads[i + 4] for i, d in enumerate((1, 4, 6, 7))]
    fill = f"const %v: f32[] = {value}" if value else ""
    half = kernel // 2
    kernels, _ = _compile(f"""
        graph g(%x: f32[1, 3, 6, 7]) -> (%y: f32{shape}) {{
          const %w: f32[4, 3, {kernel}, {kernel}] = random
          const %p: i64[8] = {pads}
          {fill}
          %c = Conv(%x, %w) {{pads=[{half}, {half}, {half}, {half}]}}
          %t = Pad(%c, %p{", %v" if value else ""}) {{mode="{mode}"}}
          %y = Neg(%t)
        }}""", opt_level=1)
    assert ("Conv+Pad" in kernels) is joins, kernels
    assert kernels[-1] == ("Neg" if joins else "Pad+Neg"), kernels


@pytest.mark.parametrize("size, joins", [(7, False), (16, True)])
def test_a_pointwise_convolution_stores_padded_when_its_output_is_large(size, joins,
                                                                         monkeypatch):
    # A 1x1 convolution leaves a small output's padding to a Pad kernel (cheaper than
    # storing run by run while the tensor is in cache) and stores a large one padded (the
    # Pad kernel would read and write it from memory); the threshold is scaled down here.
    import ember.passes.fuse as fuse

    monkeypatch.setattr(fuse, "POINTWISE_PADDED_STORE_BYTES", 4 * 4 * 10 * 10)
    kernels, _ = _compile(f"""
        graph g(%x: f32[1, 3, {size}, {size}]) -> (%y: f32[1, 4, {size + 2}, {size + 2}]) {{
          const %w: f32[4, 3, 1, 1] = random
          const %b: f32[4] = random
          const %p: i64[8] = [0, 0, 1, 1, 0, 0, 1, 1]
          %c = Conv(%x, %w, %b)
          %r = Relu(%c)
          %t = Pad(%r, %p)
          %y = Neg(%t)
        }}""", opt_level=1)
    assert kernels == (["Conv+Relu+Pad", "Neg"] if joins else ["Conv+Relu", "Pad+Neg"]), kernels


def test_nothing_joins_a_kernel_after_its_padded_store():
    # The Relu after the Pad would apply to the border too: it is a kernel of its own
    # (or joins whatever reads it), never the convolution's epilogue.
    kernels, _ = _compile("""
        graph g(%x: f32[1, 3, 8, 8]) -> (%y: f32[1, 4, 10, 10]) {
          const %w: f32[4, 3, 3, 3] = random
          const %p: i64[8] = [0, 0, 1, 1, 0, 0, 1, 1]
          const %v: f32[] = -1.0
          %c = Conv(%x, %w) {pads=[1, 1, 1, 1]}
          %t = Pad(%c, %p, %v)
          %y = Relu(%t)
        }""")
    assert kernels[-2:] == ["Conv+Pad", "Relu"], kernels


@pytest.mark.usefixtures("nchw_convolutions")
def test_a_padded_store_of_a_batch_of_images_per_row():
    # 16 output channels over 16-pixel rows and a batch of 3, padded for a max pool (NaN
    # never wins a maximum): the store moves from row to row of the padded buffer.
    kernels, _ = _compile("""
        graph g(%x: f32[3, 8, 16, 16]) -> (%y: f32[3, 16, 8, 8]) {
          const %w: f32[16, 8, 3, 3] = random
          %c = Conv(%x, %w) {pads=[1, 1, 1, 1]}
          %r = Relu(%c)
          %y = MaxPool(%r) {kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]}
        }""")
    assert "Conv+Relu+Pad" in kernels and kernels[-1] == "MaxPool", kernels


@pytest.mark.usefixtures("nchw_convolutions")  # 8 channels: a whole AVX2 vector
def test_a_small_cnn_of_windows_and_padded_stores_matches_the_reference():
    # Odd sizes, batch 3: a 5x5 depthwise convolution and a 3x3 max pool (short windows,
    # summed in registers), 3x3 convolutions storing into each other's padding, a 7x7
    # depthwise convolution (accumulated in its output) reading a padded store, and a
    # strided depthwise convolution testing its own borders.
    kernels, build = _compile("""
        graph g(%x: f32[3, 8, 35, 41]) -> (%y: f32[3, 8, 9, 11]) {
          const %w5: f32[8, 1, 5, 5] = random
          const %wa: f32[8, 8, 3, 3] = random
          const %ba: f32[8] = random
          const %wb: f32[8, 8, 3, 3] = random
          const %w7: f32[8, 1, 7, 7] = random
          const %w3: f32[8, 1, 3, 3] = random
          %d = Conv(%x, %w5) {group=8, pads=[2, 2, 2, 2]}
          %p = MaxPool(%d) {kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]}
          %a = Conv(%p, %wa, %ba) {pads=[1, 1, 1, 1]}
          %r = Relu(%a)
          %b = Conv(%r, %wb) {pads=[1, 1, 1, 1]}
          %s = Add(%b, %p)
          %t = Relu(%s)
          %u = Conv(%t, %w7) {group=8, pads=[3, 3, 3, 3]}
          %y = Conv(%u, %w3) {group=8, strides=[2, 2], pads=[1, 1, 1, 1]}
        }""", tolerance=1e-3)  # five layers of float32 sums in another order, values up to
    # ~50: numpy's float32 reference itself is up to 8e-3 from a float64 run of the graph
    # the strided one reads its input unpadded, testing the borders
    last = str(build.kernels[-1].func)
    assert "f32[3, 8, 18, 21]" in last and "f32[3, 8, 20, 23]" not in last, last
    assert "Conv+Relu+Pad" in kernels and "Conv+Add+Relu+Pad" in kernels, kernels

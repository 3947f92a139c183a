"""The GEMM template: which nests become a Gemm, and that the blocked, packed, register-tiled
code computes what numpy computes (float64 reference) for every layout and tail.

Shapes are chosen to hit every micro-kernel height (1..MR rows), a narrower last panel,
several reduction blocks, batch loops with and without a shared B, constant B (packed at
compile time) and run-time B (packed by the kernel), and fused epilogues.
"""

from __future__ import annotations

import math
import re
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.core.dtypes import DType
from ember.core.target import Target
from ember.ir.loop.functor import walk
from ember.ir.loop.stmt import Gemm
from ember.codegen.c_gemm import reduction_splits
from ember.schedule.gemm import (Prepack, default_knobs, register_tile,
                                 register_tile_columns)

RNG = np.random.default_rng(7)

# The im2col GEMM paths: convolutions the blocked layout does not take (groups, channels that
# pad badly, sizes known at run time) still run on them; tests/passes/test_block_convolutions.py
# has the blocked ones.
pytestmark = pytest.mark.usefixtures("nchw_convolutions")


def _model(nodes, inputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _gemms(module) -> list[Gemm]:
    return [n for impl in module.build.kernels for n in walk(impl.func.body)
            if isinstance(n, Gemm)]


def _check(model, feeds: dict, expected: np.ndarray, gemms: int = 1):
    module = ember.compile(model)
    out = module.run(feeds)["y"]
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5 * scale)
    assert len(_gemms(module)) == gemms, module.build.source[:2000]
    return module


def _randn(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("m,n,k", [(1, 64, 300), (5, 17, 60), (7, 33, 600), (13, 100, 64),
                                   (67, 40, 257), (128, 24, 1030)])
def test_matmul_with_constant_weight_matches_numpy(m, n, k):
    a, w = _randn(m, k), _randn(k, n)
    module = _check(_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [m, k])],
                           {"w": w}), {"x": a}, a.astype(np.float64) @ w)
    gemm, = _gemms(module)
    assert gemm.b_packed and gemm.pack is None  # the weight was packed at compile time


@pytest.mark.parametrize("m,k,n", [(1, 3, 1400), (1, 9, 600), (2, 130, 40), (3, 5, 600)])
def test_few_rows_split_their_reduction_into_partial_sums(m, k, n):
    """A tile of few accumulators keeps several partial sums each (consecutive terms to
    different ones, a tail to the first), added after the loop: a one-row product no longer
    waits for each multiply-add before the next; any K, fewer terms than sums too."""
    assert [reduction_splits(rows, vectors) for rows, vectors in
            [(1, 1), (1, 2), (2, 2), (3, 1), (4, 1), (4, 2), (12, 2)]] == [4, 4, 2, 3, 2, 1, 1]
    a, w = _randn(m, k), _randn(k, n)
    module = _check(_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [m, k])],
                           {"w": w}), {"x": a}, a.astype(np.float64) @ w)
    assert "_p1 +=" in module.build.source  # the second partial sum of an accumulator


@pytest.mark.parametrize("trans_a,trans_b", [(0, 1), (1, 0), (1, 1)])
def test_gemm_transposes_cost_nothing_at_run_time(trans_a, trans_b):
    m, n, k = 19, 70, 150
    a = _randn(k, m) if trans_a else _randn(m, k)
    w = _randn(n, k) if trans_b else _randn(k, n)
    bias = _randn(n)
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transA=trans_a, transB=trans_b,
                            alpha=0.5, beta=2.0)
    expected = 0.5 * ((a.T if trans_a else a).astype(np.float64) @ (w.T if trans_b else w)) \
        + 2.0 * bias
    module = _check(_model([node], [("x", list(a.shape))], {"w": w, "b": bias}),
                    {"x": a}, expected)
    assert _gemms(module)[0].b_packed


def test_fused_bias_and_activation_run_on_the_tile():
    a, w, bias = _randn(2, 45, 96), _randn(96, 80), _randn(80)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]),
             helper.make_node("Add", ["t", "b"], ["u"]),
             helper.make_node("Relu", ["u"], ["y"])]
    module = _check(_model(nodes, [("x", [2, 45, 96])], {"w": w, "b": bias}), {"x": a},
                    np.maximum(a.astype(np.float64) @ w + bias, 0))
    assert len(module.build.kernels) == 1
    gemm, = _gemms(module)
    assert gemm.finish is not None  # the epilogue is in the template, not a second pass


def test_residual_epilogue_reads_its_own_tile_position():
    a, w, r = _randn(37, 64), _randn(64, 50), _randn(37, 50)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]),
             helper.make_node("Add", ["t", "r"], ["y"])]
    _check(_model(nodes, [("x", [37, 64]), ("r", [37, 50])], {"w": w}), {"x": a, "r": r},
           a.astype(np.float64) @ w + r)


@pytest.mark.parametrize("shared_b", [False, True])
@pytest.mark.parametrize("n", [35, 32])
def test_batched_matmul_of_two_inputs_reads_b_in_place(shared_b, n):
    a = _randn(3, 2, 29, 40)
    b = _randn(40, n) if shared_b else _randn(3, 2, 40, n)
    module = _check(_model([helper.make_node("MatMul", ["x", "z"], ["y"])],
                           [("x", list(a.shape)), ("z", list(b.shape))], {}),
                    {"x": a, "z": b}, a.astype(np.float64) @ b)
    gemm, = _gemms(module)
    assert gemm.b_direct and not gemm.b_packed
    # only a partial last panel is copied (per batch element when B moves with the batch)
    assert (gemm.pack is not None) == (n % gemm.knobs.nr != 0)
    assert gemm.b_moves_with_batch == (not shared_b)


def test_pointwise_convolution_is_a_gemm_over_merged_pixels():
    x, w, bias = _randn(2, 24, 9, 11), _randn(40, 24, 1, 1), _randn(40)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[1, 1])]
    expected = np.einsum("nchw,oc->nohw", x.astype(np.float64), w[:, :, 0, 0]) + \
        bias[None, :, None, None]
    module = _check(_model(nodes, [("x", list(x.shape))], {"w": w, "b": bias}), {"x": x},
                    expected)
    gemm, = _gemms(module)
    assert gemm.n == 9 * 11  # H and W walk memory as one loop


def _conv_reference(x, w, stride, pads, dilation):
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (xp.shape[2] - dilation * (kh - 1) - 1) // stride + 1
    ow = (xp.shape[3] - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, m, oh, ow))
    for r in range(kh):
        for q in range(kw):
            patch = xp[:, :, r * dilation:r * dilation + stride * oh:stride,
                       q * dilation:q * dilation + stride * ow:stride]
            out += np.einsum("nchw,mc->nmhw", patch, w[:, :, r, q])
    return out


# Widths of 12 give output rows narrower than a 16-column panel (every panel is gathered
# column by column); widths of 40 and 75 give panels within one output row, copied as
# evenly spaced runs (stride 1, 2, and dilated), beside panels that span two rows; widths of
# 3, 6 and 21 give stride-1 runs of every length class the run copy moves differently (under
# 4 floats, 4-7, 8-15, 16 and more).
@pytest.mark.parametrize("batch,stride,pads,dilation,width", [(1, 1, [1, 1, 1, 1], 1, 12),
                                                              (2, 2, [1, 0, 2, 1], 1, 12),
                                                              (1, 1, [0, 0, 0, 0], 2, 12),
                                                              (1, 1, [1, 1, 1, 1], 1, 40),
                                                              (2, 2, [1, 0, 2, 1], 1, 75),
                                                              (1, 1, [0, 2, 0, 1], 2, 40),
                                                              (1, 1, [1, 1, 1, 1], 1, 3),
                                                              (1, 1, [1, 1, 1, 1], 1, 6),
                                                              (1, 1, [1, 1, 1, 1], 1, 21)])
def test_convolution_is_an_im2col_gemm_packed_at_run_time(batch, stride, pads, dilation, width):
    x, w, bias = _randn(batch, 8, 13, width), _randn(20, 8, 3, 3), _randn(20)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], kernel_shape=[3, 3],
                              strides=[stride, stride], pads=pads,
                              dilations=[dilation, dilation]),
             helper.make_node("Relu", ["t"], ["y"])]
    expected = np.maximum(_conv_reference(x, w, stride, pads, dilation) +
                          bias[None, :, None, None], 0)
    module = _check(_model(nodes, [("x", list(x.shape))], {"w": w, "b": bias}), {"x": x},
                    expected)
    gemm, = _gemms(module)
    assert gemm.k == 8 * 9 and len(gemm.b_k_dims) > 1  # B gathered as im2col
    assert gemm.a_packed  # the weights, in MR-row strips since compile time
    assert gemm.finish is not None


@pytest.mark.parametrize("width,narrow", [(7, True), (12, False), (6, True)])
def test_a_few_columns_left_over_take_a_narrower_micro_kernel(width, narrow):
    """A 7x7 image is 3 panels of 16 columns and one of 1: the last is multiplied with as
    many vectors as its columns need (49 % 16 = 1 -> one vector; 12x12 = 144 = 9 x 16 has
    no tail at all, 6x6 = 36 leaves 4)."""
    x, w, bias = _randn(2, 16, width, width), _randn(13, 16, 3, 3), _randn(13)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["t"], ["y"])]
    expected = np.maximum(_conv_reference(x, w, 1, [1, 1, 1, 1], 1) +
                          bias[None, :, None, None], 0)
    module = _check(_model(nodes, [("x", list(x.shape))], {"w": w, "b": bias}), {"x": x},
                    expected)
    gemm, = _gemms(module)
    lanes, nr = gemm.knobs.lanes, gemm.knobs.nr
    tail = gemm.columns % nr  # (the batch of 2 may be folded into the columns)
    narrow_width = -(-tail // lanes) * lanes
    micro_kernels = set(re.findall(r"ember_gemm_\w*?f32_\d+x(\d+)_", module.build.source))
    uses_narrow = str(narrow_width) in micro_kernels and 0 < narrow_width < nr
    assert uses_narrow == (0 < narrow_width < nr)
    assert str(nr) in micro_kernels
    if nr == 16 and lanes == 8:  # this machine's AVX2 tile: the cases above are chosen for it
        assert uses_narrow == narrow


def _check_with(model, feeds: dict, expected: np.ndarray, knobs: dict):
    """``_check`` of the model compiled with ``knobs`` set on the config of its one kernel
    with a matrix product; a knob ``gemm0.mc`` given as ``"strips:N"`` is N tiles high, as
    tall as the default tile makes them on this target."""
    impl, = [impl for impl in ember.compile(model).build.kernels
             if any(isinstance(n, Gemm) for n in walk(impl.func.body))]
    knobs = dict(knobs)
    if str(knobs.get("gemm0.mc", "")).startswith("strips:"):
        rows, _ = knobs.get("gemm0.tile", impl.config.get("gemm0.tile"))
        knobs["gemm0.mc"] = rows * int(knobs["gemm0.mc"].split(":")[1])
    module = ember.compile(model, kernel_configs={impl.workload_key: knobs})
    out = module.run(feeds)["y"]
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5 * scale)
    gemm, = _gemms(module)
    return module, gemm


@pytest.mark.parametrize("regime", ["copies", "one_element_at_a_time", "row_blocks"])
def test_im2col_panels_packed_by_their_task_or_up_front(regime, monkeypatch):
    """Each task packs its own panels of B when every panel belongs to one task (one block of
    rows; per batch element its own copy, or one element at a time); with several row blocks
    B is packed once up front.  All three give the convolution.  (The batch stays unfolded
    here: folded, it is one product, tested below.)"""
    import ember.schedule.gemm as gemm_schedule

    out_channels = 150 if regime == "row_blocks" else 20
    if regime == "one_element_at_a_time":
        monkeypatch.setattr(gemm_schedule, "ALL_COPIES_BYTES", 0)
    x, w = _randn(3, 8, 9, 40), _randn(out_channels, 8, 3, 3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    # (with no scratch for all copies there is none for the folded panels either: no knob)
    knobs = {} if regime == "one_element_at_a_time" else {"gemm0.fold_batch": False}
    if regime == "row_blocks":
        knobs["gemm0.mc"] = "strips:4"
    module, gemm = _check_with(_model(nodes, [("x", list(x.shape))], {"w": w}), {"x": x},
                               _conv_reference(x, w, 1, [1, 1, 1, 1], 1), knobs)
    copies = gemm.pack.shape[0]
    assert (copies, gemm.m > gemm.knobs.mc) == {"copies": (3, False),
                                                 "one_element_at_a_time": (1, False),
                                                 "row_blocks": (3, True)}[regime]
    assert gemm.knobs.pack_in_task == (regime != "row_blocks")


@pytest.mark.parametrize("batch,size,out_channels,knobs", [
    (3, 7, 20, {}),                                          # 49 columns per image
    (5, 3, 13, {"gemm0.nc": 32}),                            # tiles span up to 4 images
    (2, 9, 150, {"gemm0.mc": "strips:4"}),                   # row blocks: packed up front
    (4, 6, 24, {"gemm0.tile": (4, 16), "gemm0.mc": 8, "gemm0.kc": 64}),
])
def test_batch_folded_into_the_columns(batch, size, out_channels, knobs):
    """A small image's batch folded into the GEMM's columns: one product whose tiles span
    images, each tile's columns stored run by run to their image's output through the fused
    epilogue (bias, residual Add reading the output's own batch element, Relu), against a
    numpy convolution."""
    x, w = _randn(batch, 8, size, size), _randn(out_channels, 8, 3, 3)
    bias, skip = _randn(out_channels), _randn(batch, out_channels, size, size)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["t", "skip"], ["u"]),
             helper.make_node("Relu", ["u"], ["y"])]
    expected = np.maximum(_conv_reference(x, w, 1, [1, 1, 1, 1], 1) +
                          bias[None, :, None, None] + skip, 0)
    model = _model(nodes, [("x", list(x.shape)), ("skip", list(skip.shape))],
                   {"w": w, "b": bias})
    module, gemm = _check_with(model, {"x": x, "skip": skip}, expected,
                               {"gemm0.fold_batch": True, **knobs})
    assert gemm.knobs.fold_batch and gemm.columns == batch * size * size
    assert gemm.pack.shape[:2] == (1, -(-gemm.columns // gemm.knobs.nr))
    assert "folded into the columns" in module.build.source


@pytest.mark.parametrize("batch,height,width,knobs,folded", [
    (1, 11, 20, {}, False),                                   # runs of 20 over 16-wide tiles
    (1, 9, 40, {"gemm0.nc": 32, "gemm0.mc": "strips:1"}, False),  # tasks of one panel
    (3, 5, 6, {"gemm0.fold_batch": True}, True),              # runs end at rows and images
    (2, 4, 7, {"gemm0.fold_batch": True, "gemm0.tile": (4, 16), "gemm0.nc": 16}, True),
])
def test_a_convolution_stores_its_rows_into_a_padded_buffer(batch, height, width, knobs,
                                                            folded):
    """A convolution whose result the next one's explicit padding surrounds stores each row
    where the padded buffer has it: the output's columns lie in runs (``out_j_dims``), the
    task accumulates in a scratch and the epilogue (bias, residual Add, Relu) stores run by
    run, and the border holds the pad value -- against numpy's convolution and np.pad."""
    x, w = _randn(batch, 8, height, width), _randn(24, 8, 3, 3)
    bias, skip = _randn(24), _randn(batch, 24, height, width)
    pads = np.array([0, 0, 1, 2, 0, 0, 2, 1], dtype=np.int64)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["t", "skip"], ["u"]),
             helper.make_node("Relu", ["u"], ["r"]),
             helper.make_node("Pad", ["r", "pads", "fill"], ["y"])]
    expected = np.pad(np.maximum(_conv_reference(x, w, 1, [1, 1, 1, 1], 1) +
                                 bias[None, :, None, None] + skip, 0),
                      ((0, 0), (0, 0), (1, 2), (2, 1)), constant_values=0.25)
    model = _model(nodes, [("x", list(x.shape)), ("skip", list(skip.shape))],
                   {"w": w, "b": bias, "pads": pads, "fill": np.array(0.25, np.float32)})
    module, gemm = _check_with(model, {"x": x, "skip": skip}, expected, knobs)
    assert gemm.out_j_dims == ((height, width + 3), (width, 1)), gemm.out_j_dims
    assert gemm.n == height * width and gemm.knobs.fold_batch is folded
    assert ["+".join(n.op for n in impl.group.nodes) for impl in module.build.kernels] == \
        ["Pad", "Conv+Add+Relu+Pad"]  # the input's padding, and the padded store


def test_folding_is_the_default_for_small_images_only():
    """The heuristic folds a batch of 7x7 images, not of 32x32 ones (1,024 columns each); a
    batch of one has nothing to fold."""
    w = _randn(16, 8, 3, 3)
    folded = {}
    for batch, size in ((4, 7), (4, 32), (1, 7)):
        x = _randn(batch, 8, size, size)
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3],
                                  pads=[1, 1, 1, 1])]
        module = _check(_model(nodes, [("x", list(x.shape))], {"w": w}), {"x": x},
                        _conv_reference(x, w, 1, [1, 1, 1, 1], 1))
        gemm, = _gemms(module)
        folded[batch, size] = gemm.knobs.fold_batch
    assert folded == {(4, 7): True, (4, 32): False, (1, 7): False}


@pytest.mark.parametrize("batch,size,out_channels,padded,knobs", [
    (1, 7, 80, False, {}),                                    # 49 columns, 80 rows
    (1, 7, 70, True, {}),                                     # a short last strip, runs
    (2, 5, 96, False, {"gemm0.fold_batch": False, "gemm0.vector_rows": True,
                       "gemm0.tile": (16, 4), "gemm0.kc": 64, "gemm0.mc": 32}),
    (1, 6, 40, True, {"gemm0.vector_rows": True, "gemm0.nc": 12, "gemm0.kc": 64}),
])
def test_a_product_with_few_columns_turns_its_tile_around(batch, size, out_channels, padded,
                                                          knobs):
    """A convolution over a small image with many output channels runs with its rows along
    the vectors (``GemmKnobs.vector_rows``): the output channels fill the vectors, the few
    pixels are broadcast, the task's scratch holds the block column by column and the
    epilogue (bias, residual Add, Relu, and a padded store) writes it transposed -- against
    numpy's convolution, for short strips, several reduction blocks, several tasks and a
    batch of two."""
    x, w = _randn(batch, 8, size, size), _randn(out_channels, 8, 3, 3)
    bias, skip = _randn(out_channels), _randn(batch, out_channels, size, size)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["t", "skip"], ["u"]),
             helper.make_node("Relu", ["u"], ["r" if padded else "y"])]
    expected = np.maximum(_conv_reference(x, w, 1, [1, 1, 1, 1], 1) +
                          bias[None, :, None, None] + skip, 0)
    initializers = {"w": w, "b": bias}
    if padded:
        nodes.append(helper.make_node("Pad", ["r", "pads"], ["y"]))
        initializers["pads"] = np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64)
        expected = np.pad(expected, ((0, 0), (0, 0), (1, 1), (1, 1)))
    model = _model(nodes, [("x", list(x.shape)), ("skip", list(skip.shape))], initializers)
    module, gemm = _check_with(model, {"x": x, "skip": skip}, expected, knobs)
    assert gemm.knobs.vector_rows and gemm.a_packed and gemm.out_in_runs is padded
    assert gemm.knobs.mr % gemm.knobs.lanes == 0 and not gemm.knobs.fold_batch


def test_the_tile_turns_around_where_the_columns_waste_lanes_and_the_rows_do_not():
    """The heuristic turns the tile of a 512-channel convolution over a 7x7 image (49
    columns: 64 lanes) and of a constant matrix times a 20-column one, not over a 14x14
    image (196 columns: 208 lanes) nor with too few rows or a run-time A."""
    turned = {}
    for name, out_channels, size in (("7x7", 512, 7), ("14x14", 512, 14), ("few rows", 48, 7)):
        x, w = _randn(1, 16, size, size), _randn(out_channels, 16, 3, 3)
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3],
                                  pads=[1, 1, 1, 1])]
        module = _check(_model(nodes, [("x", list(x.shape))], {"w": w}), {"x": x},
                        _conv_reference(x, w, 1, [1, 1, 1, 1], 1))
        turned[name] = _gemms(module)[0].knobs.vector_rows
    a, b = _randn(100, 50), _randn(50, 20)
    for name, inputs, initializers in (("constant A", [("b", [50, 20])], {"a": a}),
                                       ("run-time A", [("a", [100, 50]), ("b", [50, 20])], {})):
        module = _check(_model([helper.make_node("MatMul", ["a", "b"], ["y"])], inputs,
                               initializers), {"a": a, "b": b} if not initializers else {"b": b},
                        a.astype(np.float64) @ b)
        turned[name] = _gemms(module)[0].knobs.vector_rows
    assert turned == {"7x7": True, "14x14": False, "few rows": False, "constant A": True,
                      "run-time A": False}


def test_a_shared_weight_matmul_batch_is_not_folded_when_a_moves():
    """Folding needs one A for every batch element: a batched product whose A differs per
    element (attention's scores) has no fold_batch knob at all."""
    a, b = _randn(4, 5, 24), _randn(4, 24, 40)
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    model = _model(nodes, [("a", list(a.shape)), ("b", list(b.shape))], {})
    module = _check(model, {"a": a, "b": b}, a @ b)
    impl, = module.build.kernels
    assert "gemm0.fold_batch" not in {knob.name for knob in impl.space}


@pytest.mark.parametrize("channels,out_channels,groups,batch", [
    (32, 32, 4, 1),   # ResNeXt-like: 8 channels in and out per group
    (24, 48, 8, 2),   # a channel multiplier of 2 per group, batch 2
    (8, 32, 8, 1),    # depthwise with a multiplier of 4: one input channel per group
])
def test_grouped_convolutions_take_the_template_per_group(channels, out_channels, groups,
                                                          batch):
    """A grouped convolution reads the input channels of output channel m's group, an index
    that divides m; the template's normal form splits that loop so that the groups become a
    batch of products, each multiplied on the template (against numpy, group by group)."""
    x = _randn(batch, channels, 10, 10)
    w = _randn(out_channels, channels // groups, 3, 3)
    bias = _randn(out_channels)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], group=groups),
             helper.make_node("Relu", ["t"], ["y"])]
    per_in, per_out = channels // groups, out_channels // groups
    expected = np.concatenate([
        _conv_reference(x[:, g * per_in:(g + 1) * per_in], w[g * per_out:(g + 1) * per_out],
                        1, [1, 1, 1, 1], 1) for g in range(groups)], axis=1)
    expected = np.maximum(expected + bias[None, :, None, None], 0)
    module = _check(_model(nodes, [("x", list(x.shape))], {"w": w, "b": bias}), {"x": x},
                    expected)
    gemm, = _gemms(module)
    assert gemm.m == per_out and gemm.k == per_in * 9
    assert math.prod(extent for _, extent in gemm.batch) == batch * groups


@pytest.mark.parametrize("in_place", [True, False])
def test_a_run_time_b_is_read_in_place_or_packed_as_the_config_says(in_place):
    """A run-time B with contiguous rows is read where it is (only a partial last panel is
    copied) or packed into panels, as knob ``b_in_place`` says; both give the product."""
    a, b = _randn(20, 48), _randn(48, 70)
    model = _model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                   [("a", list(a.shape)), ("b", list(b.shape))], {})
    _, gemm = _check_with(model, {"a": a, "b": b}, a.astype(np.float64) @ b,
                          {"gemm0.b_in_place": in_place})
    assert gemm.b_direct == in_place
    panels = -(-70 // gemm.knobs.nr)
    assert gemm.pack.shape[1] == (1 if in_place else panels)


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("width,stride", [(70, 1), (40, 2)])
def test_panels_within_an_output_row_are_read_where_they_lie(in_place, width, stride):
    """A stride-1 convolution's im2col panel within one output row is one run of the input's
    columns: with knob ``b_panels_in_place`` the task does not copy it, the micro-kernel reads
    its rows through the table of the reduction's offsets; the panels that span two rows (and
    every panel of a strided convolution) are still packed.  Both give the convolution."""
    x, w = _randn(1, 5, 9, width), _randn(24, 5, 3, 3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], strides=[stride, stride])]
    model = _model(nodes, [("x", list(x.shape))], {"w": w})
    expected = _conv_reference(x, w, stride, [1, 1, 1, 1], 1)
    module, gemm = _check_with(model, {"x": x}, expected,
                               {"gemm0.b_panels_in_place": in_place} if stride == 1 else {})
    # (the shared unit defines both forms of micro-kernel: look for a call)
    reads_in_place = re.search(r"_ind\((?!\s*long )", module.build.source) is not None
    assert reads_in_place == (in_place and stride == 1)
    assert gemm.knobs.b_panels_in_place == (in_place and stride == 1)


@pytest.mark.parametrize("out_channels", [16, 64])
def test_few_output_channels_over_narrow_rows_take_one_vector_tiles(out_channels):
    """A convolution with few output channels spends most of its time packing B; over rows
    one vector wide (narrower than the default tile's two vectors) a one-vector tile's panels
    each lie within a row and are read in place.  With many output channels the default tile
    stays.  Both against numpy."""
    lanes = Target.native().lanes_for(DType.FLOAT32)
    _, default_columns = register_tile_columns(Target.native())
    if default_columns <= lanes:
        pytest.skip("this target's default tile is one vector wide")
    x, w = _randn(2, 8, 6, lanes), _randn(out_channels, 8, 3, 3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    module = _check(_model(nodes, [("x", list(x.shape))], {"w": w}), {"x": x},
                    _conv_reference(x, w, 1, [1, 1, 1, 1], 1))
    gemm, = _gemms(module)
    narrow = out_channels <= 32
    assert gemm.knobs.nr == (lanes if narrow else default_columns)
    assert gemm.knobs.b_panels_in_place


def test_products_that_are_not_gemms_keep_their_loops():
    # a depthwise convolution pairs each output channel with one input channel: no shared
    # reduction, so no matrix product
    x, w = _randn(1, 8, 12, 12), _randn(8, 1, 3, 3)
    module = ember.compile(_model([helper.make_node("Conv", ["x", "w"], ["y"],
                                                    kernel_shape=[3, 3], group=8)],
                                  [("x", list(x.shape))], {"w": w}))
    assert not _gemms(module)


def test_prepack_layout_against_an_explicit_loop():
    k, n, nr = 5, 11, 8
    w = _randn(n, k)  # transposed weight: element (kk, j) at j*k + kk
    packed = Prepack(param=1, k=k, n=n, rs=1, cs=k, base=0, nr=nr).apply(w)
    assert packed.shape == (2, k, nr)
    for kk in range(k):
        for j in range(16):
            expected = w[j, kk] if j < n else 0.0
            assert packed[j // nr, kk, j % nr] == expected


@pytest.mark.parametrize("name", ["x86_64", "x86_64-avx2", "x86_64-avx512", "aarch64",
                                  "wasm32"])
def test_knobs_fit_the_target(name):
    target = Target.parse(name)
    lanes = target.lanes_for(ember.core.dtypes.DType.FLOAT32)
    mr, vectors = register_tile(target)
    assert mr * vectors + vectors + 1 <= (32 if lanes >= 16 else 16)  # fits the registers
    for shape in [(1, 1024, 784), (128, 3072, 768), (1024, 1024, 1024), (7, 9, 5)]:
        knobs = default_knobs(*shape, batch=1, target=target)
        assert knobs.nr == vectors * lanes and knobs.mc % knobs.mr == 0
        assert knobs.nc % knobs.nr == 0 and 1 <= knobs.kc <= shape[2]


SANITIZED = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import ember
    from ember.passes import pipeline
    pipeline.block_convolutions = lambda graph, target: 0  # the NCHW template's cases
    rng = np.random.default_rng(0)
    def model(nodes, inputs, inits):
        graph = helper.make_graph(nodes, "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(a, n) for n, a in inits.items()])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m
    ran = 0
    # (1 and 2 rows: micro-kernels with partial sums, a tail of terms to the first)
    for m, n, k in [(1, 20, 300), (7, 33, 600), (13, 17, 64), (1, 700, 7), (2, 40, 130)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["t"], transB=1),
                 helper.make_node("Relu", ["t"], ["y"])]
        module = ember.compile(model(nodes, [("x", [m, k])], {"w": w, "b": b}), sanitize=True)
        out = module.run({"x": a})["y"]
        assert np.allclose(out, np.maximum(a @ w.T + b, 0), rtol=1e-4, atol=1e-4)
        ran += 1
    # panels packed as evenly spaced runs, and gathered ones; stride 2 runs a batch of two
    # small images folded into the columns (tiles spanning both, stored run by run)
    for stride in (1, 2):
        x = rng.standard_normal((stride, 3, 7, 41)).astype(np.float32)  # each task packs
        w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
        conv = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3],
                                 strides=[stride, stride], pads=[1, 1, 1, 1])]
        module = ember.compile(model(conv, [("x", list(x.shape))], {"w": w}), sanitize=True)
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        oh, ow = (7 - 1) // stride + 1, (41 - 1) // stride + 1
        want = sum(np.einsum("nchw,mc->nmhw",
                             xp[:, :, r:r + stride * oh:stride, q:q + stride * ow:stride],
                             w[:, :, r, q]) for r in range(3) for q in range(3))
        assert np.allclose(module.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
        ran += 1
    # a convolution storing its rows into the padded buffer of the next one, unfolded
    # and with the batch folded
    for batch, size in ((1, 21), (3, 6)):
        x = rng.standard_normal((batch, 4, size, size)).astype(np.float32)
        w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
        b = rng.standard_normal(6).astype(np.float32)
        pads = np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64)
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], kernel_shape=[3, 3],
                                  pads=[1, 1, 1, 1]),
                 helper.make_node("Pad", ["t", "pads"], ["y"])]
        module = ember.compile(model(nodes, [("x", list(x.shape))],
                                     {"w": w, "b": b, "pads": pads}), sanitize=True)
        xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        want = np.pad(sum(np.einsum("nchw,mc->nmhw", xp[:, :, r:r + size, q:q + size],
                                    w[:, :, r, q]) for r in range(3) for q in range(3))
                      + b[None, :, None, None], ((0, 0), (0, 0), (1, 1), (1, 1)))
        assert np.allclose(module.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
        ran += 1
    # a product with few columns, its tile turned around: a short last strip of rows and
    # the padded store
    x = rng.standard_normal((1, 8, 7, 7)).astype(np.float32)
    w = rng.standard_normal((70, 8, 3, 3)).astype(np.float32)
    pads = np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64)
    nodes = [helper.make_node("Conv", ["x", "w"], ["t"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["t"], ["r"]), helper.make_node("Pad", ["r", "pads"], ["y"])]
    module = ember.compile(model(nodes, [("x", [1, 8, 7, 7])], {"w": w, "pads": pads}),
                           sanitize=True)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.pad(np.maximum(sum(np.einsum("nchw,mc->nmhw", xp[:, :, r:r + 7, q:q + 7],
                                           w[:, :, r, q]) for r in range(3) for q in range(3)),
                             0), ((0, 0), (0, 0), (1, 1), (1, 1)))
    assert np.allclose(module.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
    from ember.ir.loop.functor import walk
    from ember.ir.loop.stmt import Gemm
    assert [n.knobs.vector_rows for impl in module.build.kernels
            for n in walk(impl.func.body) if isinstance(n, Gemm)] == [True]
    ran += 1
    a = rng.standard_normal((2, 11, 40)).astype(np.float32)
    z = rng.standard_normal((2, 40, 19)).astype(np.float32)
    module = ember.compile(model([helper.make_node("MatMul", ["x", "z"], ["y"])],
                                 [("x", [2, 11, 40]), ("z", [2, 40, 19])], {}), sanitize=True)
    assert np.allclose(module.run({"x": a, "z": z})["y"], a @ z, rtol=1e-4, atol=1e-4)
    print("ran", ran + 1)
""")


def test_gemm_template_is_clean_under_asan_and_ubsan(run_sanitized):
    assert "ran 11" in run_sanitized(SANITIZED)

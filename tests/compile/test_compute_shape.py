"""Compiled data-movement ops (ember/ops/compute/shape.py) against the numpy references.

Moving data must not change it: integers and bools compare exactly, and float data movement is
exact too (the float tolerance only matters for Range's arithmetic).  The case/graph helpers
come from test_compute_elementwise.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from compute_cases import Case, build_graph
from test_compute_elementwise import RNG, check_cases, floats, integers
from test_compute_elementwise import fixed_seed  # noqa: F401  (autouse: seeds these tests too)

import ember
from ember.core.errors import EmberError


def ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def data_of(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == np.bool_:
        return RNG.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu":
        return integers(shape, dtype, -100, 100)
    return floats(shape, dtype)


DTYPES = [np.float32, np.int64, np.bool_, np.float16, np.uint8]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_layout_ops(dtype):
    x = data_of(dtype, (2, 3, 4))
    d2s = data_of(dtype, (2, 8, 3, 5))
    s2d = data_of(dtype, (2, 3, 4, 6))
    cases = [
        Case("Reshape", [x, ints(4, -1)], constants={1}),
        Case("Reshape", [x, ints(0, 0, -1, 1)], constants={1}),
        Case("Reshape", [x[:1, :1, :1], ints()], constants={1}),  # to a scalar
        Case("Flatten", [x], {"axis": 0}),
        Case("Flatten", [x], {"axis": -1}),
        Case("Squeeze", [x[:, :1], ints(1)], constants={1}),
        Case("Squeeze", [x[:1, :1]]),
        Case("Unsqueeze", [x, ints(-1, 0)], constants={1}),
        Case("Transpose", [x]),
        Case("Transpose", [x], {"perm": [1, 2, 0]}),
        Case("Expand", [x[:, :1], ints(3, 2, 5, 4)], constants={1}),
        Case("Expand", [x[:1, :, :1], ints(3, 1)], constants={1}),
        Case("Tile", [x, ints(2, 1, 3)], constants={1}),
        Case("Tile", [x, ints(0, 1, 2)], constants={1}),
        Case("DepthToSpace", [d2s], {"blocksize": 2, "mode": "DCR"}),
        Case("DepthToSpace", [d2s], {"blocksize": 2, "mode": "CRD"}),
        Case("SpaceToDepth", [s2d], {"blocksize": 2, "mode": "DCR"}),
        Case("SpaceToDepth", [s2d], {"blocksize": 2, "mode": "CRD"}),
        Case("Identity", [x]),
    ]
    check_cases(cases)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_join_cut_and_slice(dtype):
    x = data_of(dtype, (2, 3, 4))
    cases = [
        Case("Concat", [x, x[:, :1], x[:, :0], x], {"axis": 1}),
        Case("Concat", [x, data_of(dtype, (2, 3, 33))], {"axis": -1}),
        Case("Concat", [x[:1]], {"axis": 0}),
        Case("Split", [x], {"axis": 2}, outputs=3),  # parts 2, 1, 1
        Case("Split", [x, ints(1, 0, 2)], {"axis": 1}, constants={1}, outputs=3),
        Case("Split", [x], {"axis": -3, "num_outputs": 2}, outputs=2),
        Case("Slice", [x, ints(1, -1), ints(100, -100), ints(-1, 1), ints(1, -1)],
             constants={1, 2, 3, 4}),
        Case("Slice", [x, ints(0, 3), ints(2, 0), ints(0, 2)], constants={1, 2, 3}),
        Case("Slice", [x, ints(-3, 0), ints(-1, 4), ints(1, 2), ints(2, 3)],
             constants={1, 2, 3, 4}),
        Case("Slice", [x, ints(2), ints(1)], constants={1, 2}),  # empty
    ]
    check_cases(cases)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_], ids=lambda d: np.dtype(d).name)
def test_gathers_and_masks(dtype):
    x = data_of(dtype, (2, 3, 4))
    cases = [
        Case("Gather", [x, np.array([[0, -1], [1, 1]], np.int64)], {"axis": 1}),
        Case("Gather", [x, np.array([3, 0, -4], np.int32)], {"axis": 2}),
        Case("Gather", [x, np.array(-2, np.int64)], {"axis": -1}, constants={1}),
        Case("Gather", [x, np.array([1, -2], np.int64)], {"axis": 0}, constants={1}),
        Case("GatherElements", [x, integers((2, 2, 4), np.int64, -3, 2)], {"axis": 1}),
        Case("GatherElements", [x, integers((1, 3, 6), np.int32, -4, 3)], {"axis": -1}),
        Case("Trilu", [x], {"upper": 1}),
        Case("Trilu", [x, np.array(-1, np.int64)], {"upper": 0}),
        Case("Trilu", [x, np.array(2, np.int64)], {"upper": 1}, constants={1}),
        Case("EyeLike", [x[0]], {"k": 1}),
        Case("EyeLike", [x[0]], {"k": -2, "dtype": 9}),
        Case("EyeLike", [x[0]], {"k": 10}),
    ]
    check_cases(cases)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_], ids=lambda d: np.dtype(d).name)
def test_gather_nd(dtype):
    """Index tuples address leading dims (after batch_dims); negative components count from
    the end; constant tuples are checked at compile time, run-time ones before the kernel,
    each component against the dim it addresses."""
    x = data_of(dtype, (3, 3, 4))
    cases = [
        Case("GatherND", [x, integers((2, 5, 2), np.int64, -3, 2)]),
        Case("GatherND", [x, integers((4, 1), np.int32, -3, 2)]),
        Case("GatherND", [x, integers((2, 3), np.int64, -3, 2)], constants={1}),
        Case("GatherND", [data_of(dtype, (3, 5, 2)),
                          np.array([[[0, 1], [-1, 4]], [[2, 2], [1, -5]]], np.int64)],
             constants={1}),  # components of different sizes: checked at compile time
        Case("GatherND", [data_of(dtype, (3, 5, 2)),  # ... and at run time
                          np.array([[[0, 4], [-1, -5]], [[2, 2], [-3, 3]]], np.int64)]),
        Case("GatherND", [data_of(dtype, (2, 3, 5, 2)),  # a batch dim, then dims of 3 and 5
                          np.array([[[0, 4], [2, -5]], [[-3, 1], [1, 3]]], np.int32)],
             {"batch_dims": 1}),
        Case("GatherND", [x, integers((3, 2, 1), np.int64, -3, 2)], {"batch_dims": 1}),
        Case("GatherND", [x, integers((3, 3, 1), np.int64, -4, 3)], {"batch_dims": 2}),
    ]
    check_cases(cases)


def test_gather_nd_run_time_index_out_of_range():
    """A run-time index outside its dim is the node's error, as in the reference."""
    x = floats((3, 3))
    graph, _ = build_graph([Case("GatherND", [x, np.zeros((2, 2), np.int64)])])
    module = ember.compile(graph)
    assert module.build.host_nodes == []
    feeds = {"c0_in0": x, "c0_in1": np.array([[0, 1], [3, 0]], np.int64)}
    with pytest.raises(EmberError, match="GatherND"):
        module.run(feeds)


@pytest.mark.parametrize("tuples", [
    [[0, 4], [3, 0]],    # 3 is past the dim of 3, though the other component's dim has 5
    [[0, 4], [2, 5]],
    [[-4, 0], [0, 0]],
    [[0, -6], [0, 0]],
])
def test_gather_nd_run_time_components_are_checked_against_their_own_dims(tuples):
    """Each component of a run-time index tuple has its own range: a value that is valid for
    another component's dim is still the node's error."""
    x = floats((3, 5))
    valid = np.array([[2, -5], [-3, 4]], np.int64)
    graph, _ = build_graph([Case("GatherND", [x, valid])])
    module = ember.compile(graph)
    assert module.build.host_nodes == [], module.build.report()
    feeds = {"c0_in0": x, "c0_in1": valid}
    np.testing.assert_array_equal(module.run(feeds)[graph.outputs[0]], x[[2, -3], [-5, 4]])
    with pytest.raises(EmberError, match=r"GatherND.*component 0 of each 2-tuple .* \[-3, 3\), "
                                         r"component 1 .* \[-5, 5\)"):
        module.run({**feeds, "c0_in1": np.array(tuples, np.int64)})


def test_one_hot():
    cases = [
        Case("OneHot", [np.array([[0, -1, 3], [5, 2, -7]], np.int64), np.array(4, np.int64),
                        np.array([0.5, 3.0], np.float32)], {"axis": 1}, constants={1}),
        Case("OneHot", [np.array([0, 1.7, -3], np.float32), np.array(4, np.int64),
                        np.array([0, 3], np.int32)], constants={1}),
        Case("OneHot", [np.array([0, 1, 3, 200], np.uint8), np.array(4.0, np.float32),
                        np.array([False, True])], {"axis": 0}, constants={1}),
    ]
    check_cases(cases)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = floats((2, 3, 4))
    cases = [
        Case("Pad", [x, ints(0, 1, 2, 1, 0, 3)], {"mode": mode}, constants={1}),
        Case("Pad", [x, ints(0, 1, -1, 1, 2, -2)], {"mode": mode}, constants={1}),
        Case("Pad", [x, ints(2, 3), None, ints(-1)], {"mode": mode}, constants={1, 3}),
        Case("Pad", [integers((3, 5), np.int16), ints(1, 2, 2, 1)], {"mode": mode},
             constants={1}),
    ]
    if mode != "reflect":  # pads wider than the axis repeat the pattern
        cases.append(Case("Pad", [x, ints(0, 7, 9, 0, 8, 10)], {"mode": mode}, constants={1}))
    check_cases(cases)


def test_pad_fill_values_and_crops():
    x = floats((2, 3, 4))
    cases = [
        Case("Pad", [x, ints(0, 1, 2, 1, 0, 3), np.array(1.5, np.float32)], constants={1}),
        Case("Pad", [x, ints(0, 1, 2, 1, 0, 3), np.array([-2.5], np.float32)],
             constants={1, 2}),
        Case("Pad", [integers((3, 4), np.int32), ints(1, 1, 1, 1), np.array(7, np.int32)],
             constants={1}),
        Case("Pad", [x, ints(0, -2, 0, 0, -1, 0)], constants={1}),  # crop only
        Case("Pad", [x, ints(0, -3, 1, 0, 0, 0)], constants={1}),  # nothing left: all fill
    ]
    check_cases(cases)


def test_generators():
    """Range, ConstantOfShape and EyeLike as kernels (opt_level=0 keeps constant folding from
    evaluating them at compile time)."""
    cases = [
        Case("Range", [np.array(1.0, np.float32), np.array(5.0, np.float32),
                       np.array(0.3, np.float32)], constants={0, 1, 2}),
        Case("Range", [np.array(10, np.int32), np.array(-3, np.int32),
                       np.array(-4, np.int32)], constants={0, 1, 2}),
        Case("Range", [np.array(1.0, np.float16), np.array(5.0, np.float16),
                       np.array(0.3, np.float16)], constants={0, 1, 2}),
        Case("Range", [np.array(3, np.int64), np.array(3, np.int64), np.array(1, np.int64)],
             constants={0, 1, 2}),  # empty
        Case("ConstantOfShape", [ints(2, 3)], {"value": np.array([7], np.int32)},
             constants={0}),
        Case("ConstantOfShape", [ints(2, 3)], constants={0}),
        Case("ConstantOfShape", [ints(0, 3)], {"value": np.array([1.5], np.float16)},
             constants={0}),
        Case("ConstantOfShape", [ints(4)], {"value": np.array([True])}, constants={0}),
        Case("EyeLike", [floats((3, 4))], {"k": 1}),
    ]
    check_cases(cases, opt_level=0)

"""Shape and generator ops (Reshape ... Pad, ConstantOfShape, Range, EyeLike): symbolic shape
inference, folding of shape computations, edge cases the ONNX suite leaves out, errors and
upgrades of old opsets.  The oracle is numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from op_helpers import add_constants, ints, node_types, run_node

from ember.core.dims import sym
from ember.core.dtypes import DType
from ember.core.errors import ShapeError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.graph import Graph, Node
from ember.ir.types import TensorType, tensor
from ember.passes.infer_shapes import infer_shapes

F32, I64 = DType.FLOAT32, DType.INT64
INT_MAX = np.iinfo(np.int64).max


X4 = {"x": tensor(F32, "N", 512, 1, 1)}
X3 = {"x": tensor(F32, "N", 3, "S")}


# ----------------------------------------------------------------------------- Reshape


@pytest.mark.parametrize("target, expected", [
    (ints(0, -1), "f32[N, 512]"),
    (ints(-1, 512), "f32[N, 512]"),
    (ints(0, 16, -1), "f32[N, 16, 32]"),
    (ints(-1), "f32[512*N]"),
    (ints(0, 0, 1, 1, 1), "f32[N, 512, 1, 1, 1]"),
    (ints(-1, 3), "f32[?, 3]"),  # 512*N / 3 is not a polynomial: unknown, not a guess
])
def test_reshape_symbolic(target, expected):
    assert node_types("Reshape", X4, constants={"shape": target}) == [expected]


def test_reshape_through_folded_shape_computation():
    """Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) is N x 512, as exporters emit."""
    graph = Graph(inputs=["x"], outputs=["y"], types=dict(X4), nodes=[
        Node("Shape", ["x"], ["shape"], name="shape"),
        Node("Gather", ["shape", "zero"], ["n"], {"axis": 0}, name="gather"),
        Node("Unsqueeze", ["n", "axes"], ["n1"], name="unsqueeze"),
        Node("Concat", ["n1", "minus_one"], ["target"], {"axis": 0}, name="concat"),
        Node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ])
    add_constants(graph, {"zero": np.array(0, np.int64), "axes": ints(0),
                          "minus_one": ints(-1)})
    infer_shapes(graph)
    assert str(graph.types["target"]) == "i64[2]"
    assert str(graph.types["y"]) == "f32[N, 512]"


def _torchscript_style_reshape(x_type: TensorType) -> Graph:
    """Reshape(x, Concat(Slice(Shape(x), 0, Reshape(Mod(2, 3), [1])), [-1])): the
    TorchScript exporter computes nn.MultiheadAttention's targets with ops like Mod, Less or
    CumSum that are not shape ops."""
    graph = Graph(inputs=["x"], outputs=["y"], types={"x": x_type}, nodes=[
        Node("Mod", ["two", "three"], ["m"], name="mod"),
        Node("Reshape", ["m", "one"], ["end"], name="end"),
        Node("Shape", ["x"], ["shape"], name="shape"),
        Node("Slice", ["shape", "zero", "end"], ["lead"], name="slice"),
        Node("Concat", ["lead", "minus_one"], ["target"], {"axis": 0}, name="concat"),
        Node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ])
    add_constants(graph, {"two": ints(2), "three": ints(3), "one": ints(1), "zero": ints(0),
                          "minus_one": ints(-1)})
    return infer_shapes(graph)


def test_known_numbers_flow_through_any_op():
    """Values that are plain numbers fold through every op (Mod here), so the target, and so
    the Reshape, have static shapes; with symbols the shape ops still carry them."""
    static = _torchscript_style_reshape(tensor(F32, 6, 4, 8))
    assert str(static.types["end"]) == "i64[1]"
    assert str(static.types["lead"]) == "i64[2]"
    assert str(static.types["y"]) == "f32[6, 4, 8]"
    symbolic = _torchscript_style_reshape(tensor(F32, "N", 4, 8))
    assert str(symbolic.types["y"]) == "f32[N, 4, 8]"


def test_constant_folding_leaves_only_the_reshape():
    """With every type of the target computation known, one folding pass evaluates all of it
    (Shape of a static tensor, Mod, Slice, Concat): the Reshape gets a constant target."""
    from ember.passes.dce import eliminate_dead_code
    from ember.passes.fold_constants import fold_constants

    graph = _torchscript_style_reshape(tensor(F32, 6, 4, 8))
    assert fold_constants(graph) == 5
    eliminate_dead_code(graph)
    assert [node.op for node in graph.nodes] == ["Reshape"]
    assert graph.constants["target"].tolist() == [6, 4, -1]


def test_symbols_do_not_go_through_ops_written_for_numbers():
    """Mod(N, 2) of a symbolic N is not known (a reference written for numbers could take the
    symbol for a value), but once N is bound it is."""
    def mod_of_batch(x_type: TensorType) -> Graph:
        graph = Graph(inputs=["x"], outputs=["y"], types={"x": x_type}, nodes=[
            Node("Shape", ["x"], ["shape"], name="shape"),
            Node("Mod", ["shape", "two"], ["m"], name="mod"),
            Node("ConstantOfShape", ["m"], ["y"], name="fill"),
        ])
        add_constants(graph, {"two": ints(2)})
        return infer_shapes(graph)

    assert str(mod_of_batch(tensor(F32, "N", 3)).types["y"]) == "f32[?, ?]"
    assert str(mod_of_batch(tensor(F32, 5, 3)).types["y"]) == "f32[1, 1]"


def test_reshape_with_run_time_shape_and_unknown_rank():
    assert node_types("Reshape", {"x": tensor(F32, "N", 4), "s": tensor(I64, 3)}) == \
        ["f32[?, ?, ?]"]
    assert node_types("Reshape", {"x": TensorType(F32, None)},
                      constants={"shape": ints(0, 7, -1)}) == ["f32[?, 7, ?]"]


def test_reshape_allowzero():
    empty = np.zeros((0, 3), np.float32)
    assert run_node("Reshape", empty, ints(3, 0), allowzero=1).shape == (3, 0)
    assert run_node("Reshape", empty, ints(0, 3), allowzero=0).shape == (0, 3)
    with pytest.raises(ShapeError, match="both 0 and -1"):
        node_types("Reshape", X4, constants={"shape": ints(0, -1)}, allowzero=1)


@pytest.mark.parametrize("target, message", [
    (ints(5, -1), "cannot reshape"),
    (ints(-1, -1), "more than one -1"),
    (ints(2, 2, 2), "cannot reshape"),
    (ints(4, -2), "invalid dim"),
])
def test_reshape_errors_name_the_node(target, message):
    with pytest.raises(ShapeError, match=f"'n' \\(Reshape\\).*{message}"):
        node_types("Reshape", {"x": tensor(F32, 3, 4)}, constants={"shape": target})


# ----------------------------------------------------------------------------- layout ops


@pytest.mark.parametrize("op, attrs, constants, expected", [
    ("Flatten", {"axis": 2}, {}, "f32[3*N, S]"),
    ("Flatten", {"axis": -1}, {}, "f32[3*N, S]"),
    ("Flatten", {"axis": 0}, {}, "f32[1, 3*N*S]"),
    ("Transpose", {}, {}, "f32[S, 3, N]"),
    ("Transpose", {"perm": [0, 2, 1]}, {}, "f32[N, S, 3]"),
    ("Unsqueeze", {}, {"axes": ints(-1, 0)}, "f32[1, N, 3, S, 1]"),
    ("Shape", {}, {}, "i64[3]"),
    ("Shape", {"start": -2}, {}, "i64[2]"),
    ("Shape", {"start": 2, "end": 1}, {}, "i64[0]"),
    ("Size", {}, {}, "i64[]"),
    ("Tile", {}, {"repeats": ints(2, 1, 3)}, "f32[2*N, 3, 3*S]"),
    ("Expand", {}, {"shape": ints(2, 1, 1, 1)}, "f32[2, N, 3, S]"),
    ("Pad", {}, {"pads": ints(1, 0, 2, 1, 0, 2)}, "f32[N + 2, 3, S + 4]"),
    ("Pad", {}, {"pads": ints(-1, 1), "value": np.array(0, np.float32), "axes": ints(1)},
     "f32[N, 3, S]"),
    ("CenterCropPad", {"axes": [1, 2]}, {"shape": ints(2, 9)}, "f32[N, 2, 9]"),
])
def test_layout_ops_symbolic(op, attrs, constants, expected):
    assert node_types(op, X3, constants=constants, **attrs) == [expected]


def test_squeeze():
    x = {"x": tensor(F32, "N", 1, 3, 1)}
    assert node_types("Squeeze", x, constants={"axes": ints(-1, 1)}) == ["f32[N, 3]"]
    assert node_types("Squeeze", {"x": tensor(F32, 1, 3, 1)}) == ["f32[3]"]
    # Whether N is 1 decides the rank: unknown rather than guessed.
    assert node_types("Squeeze", x) == ["f32[*]"]
    with pytest.raises(ShapeError, match="cannot squeeze axis 2"):
        node_types("Squeeze", x, constants={"axes": ints(2)})


def test_block_rearrangements():
    x = {"x": tensor(F32, "N", 8, "H", "W")}
    assert node_types("DepthToSpace", x, blocksize=2) == ["f32[N, 2, 2*H, 2*W]"]
    assert node_types("SpaceToDepth", {"x": tensor(F32, "N", 3, 8, 4)}, blocksize=2,
                      mode="CRD") == ["f32[N, 12, 4, 2]"]
    with pytest.raises(ShapeError, match="multiple of blocksize"):
        node_types("DepthToSpace", x, blocksize=3)
    with pytest.raises(ShapeError, match="mode='XYZ'"):
        node_types("SpaceToDepth", {"x": tensor(F32, 1, 3, 8, 4)}, blocksize=2, mode="XYZ")


def test_expand_with_run_time_shape_keeps_dims_that_cannot_broadcast():
    inputs = {"x": tensor(F32, 3, 1), "shape": tensor(I64, 3)}
    assert node_types("Expand", inputs) == ["f32[?, 3, ?]"]
    with pytest.raises(ShapeError, match="cannot expand"):
        node_types("Expand", {"x": tensor(F32, 3, 2)}, constants={"shape": ints(4, 4)})


# ----------------------------------------------------------------------------- Concat, Split


def test_concat_symbolic_and_mismatch():
    inputs = {"a": tensor(F32, "N", 3), "b": tensor(F32, "N", 5), "c": tensor(F32, None, 1)}
    assert node_types("Concat", inputs, axis=1) == ["f32[N, 9]"]
    assert node_types("Concat", {"a": tensor(F32, "N", 3), "b": tensor(F32, "M", 3)},
                      axis=0) == ["f32[M + N, 3]"]
    with pytest.raises(ShapeError, match="differ in dim 1"):
        node_types("Concat", {"a": tensor(F32, 2, 3), "b": tensor(F32, 2, 4)}, axis=0)


@pytest.mark.parametrize("x, attrs, constants, expected", [
    (tensor(F32, "N", 6), {"axis": 1}, {"split": ints(1, 5)}, ["f32[N, 1]", "f32[N, 5]"]),
    (tensor(F32, 7), {"num_outputs": 3}, {}, ["f32[3]", "f32[3]", "f32[1]"]),
    (tensor(F32, "N", 2), {}, {}, ["f32[?, 2]", "f32[?, 2]"]),
])
def test_split_symbolic(x, attrs, constants, expected):
    assert node_types("Split", {"x": x}, outputs=len(expected), constants=constants,
                      **attrs) == expected


def test_split_of_even_symbolic_dim():
    assert node_types("Split", {"x": tensor(F32, 2, "S")}, outputs=2, axis=1,
                      constants={"s": ints(3, 4)}) == ["f32[2, 3]", "f32[2, 4]"]
    x = {"x": TensorType(F32, (sym("N") * 4, 2))}
    assert node_types("Split", x, outputs=2, num_outputs=2) == ["f32[2*N, 2]"] * 2


def test_split_errors_and_uneven_values():
    with pytest.raises(ShapeError, match="sums to 5"):
        node_types("Split", {"x": tensor(F32, 6)}, outputs=2, constants={"s": ints(2, 3)})
    parts = run_node("Split", np.arange(7, dtype=np.float32), outputs=3, num_outputs=3)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]


# ----------------------------------------------------------------------------- Slice


@pytest.mark.parametrize("starts, ends, axes, steps, expected", [
    (ints(1), ints(-1), ints(1), None, "f32[N, 1, S]"),
    (ints(0), ints(INT_MAX), ints(2), None, "f32[N, 3, S]"),  # the whole symbolic dim
    (ints(0), ints(INT_MAX), ints(2), ints(2), "f32[N, 3, ?]"),  # ceil(S/2): not a polynomial
    (ints(-1), ints(-INT_MAX), ints(0), ints(-1), "f32[N, 3, S]"),  # a flip
    (ints(1), ints(INT_MAX), ints(0), None, "f32[?, 3, S]"),  # max(N-1, 0): unknown
    (ints(-1), ints(-INT_MAX), ints(1), ints(-1), "f32[N, 3, S]"),
    (ints(10, 0), ints(-10, 2), None, ints(-2, 1), "f32[?, 2, S]"),
])
def test_slice_symbolic(starts, ends, axes, steps, expected):
    constants = {"starts": starts, "ends": ends}
    if axes is not None:
        constants["axes"] = axes
    elif steps is not None:
        constants["axes"] = np.arange(len(starts), dtype=np.int64)
    if steps is not None:
        constants["steps"] = steps
    assert node_types("Slice", X3, constants=constants) == [expected]


def test_slice_of_even_symbolic_dim_by_step():
    x = {"x": TensorType(F32, (sym("N") * 2 + 1,))}
    constants = {"s": ints(0), "e": ints(INT_MAX), "a": ints(0), "t": ints(2)}
    assert node_types("Slice", x, constants=constants) == ["f32[N + 1]"]


def test_slice_with_run_time_bounds_and_errors():
    inputs = {"x": tensor(F32, "N", 3, "S"), "s": tensor(I64, 1), "e": tensor(I64, 1)}
    assert node_types("Slice", inputs) == ["f32[?, 3, S]"]
    inputs["axes"] = tensor(I64, 1)
    assert node_types("Slice", inputs) == ["f32[?, ?, ?]"]
    with pytest.raises(ShapeError, match="steps .* contain 0"):
        node_types("Slice", X3, constants={"s": ints(0), "e": ints(1), "a": ints(0), "t": ints(0)})
    with pytest.raises(ShapeError, match="repeat an axis"):
        node_types("Slice", X3, constants={"s": ints(0, 0), "e": ints(1, 1), "a": ints(0, -3)})


def test_slice_matches_numpy_with_negative_steps_and_clamping():
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    got = run_node("Slice", x, ints(-1, 10, 1), ints(-INT_MAX, -10, INT_MAX), ints(0, 1, 2),
                   ints(-1, -2, 3))
    np.testing.assert_array_equal(got, x[::-1, 3::-2, 1::3])


# ----------------------------------------------------------------------------- Pad


def test_pad_modes_match_numpy():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    pads = ints(1, 2, 2, 1)
    widths = [(1, 2), (2, 1)]
    for mode in ("reflect", "edge", "wrap"):
        np.testing.assert_array_equal(run_node("Pad", x, pads, mode=mode),
                                      np.pad(x, widths, mode=mode))
    padded = run_node("Pad", x, pads, np.array(-7, np.int32))
    np.testing.assert_array_equal(padded, np.pad(x, widths, constant_values=-7))
    assert padded.dtype == np.int32


def test_pad_negative_pads_crop_and_axes():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    # axis -1: crop 1 in front; axis 0: pad 2 in front, crop 1 at the end.
    got = run_node("Pad", x, ints(-1, 2, 0, -1), np.array(9, np.float32), ints(-1, 0))
    np.testing.assert_array_equal(got, np.pad(x[:2, 1:], [(2, 0), (0, 0)], constant_values=9))


def test_pad_strings_and_errors():
    words = np.array([["a", "b"]], dtype=object)
    assert run_node("Pad", words, ints(0, 1, 0, 0)).tolist() == [["", "a", "b"]]
    with pytest.raises(ShapeError, match="reflect pads"):
        run_node("Pad", np.zeros((2, 2), np.float32), ints(0, 2, 0, 0), mode="reflect")
    with pytest.raises(ShapeError, match="mode='circular'"):
        node_types("Pad", X3, constants={"pads": ints(0, 0, 0, 0, 0, 0)}, mode="circular")
    with pytest.raises(ShapeError, match="2 values per padded axis"):
        node_types("Pad", X3, constants={"pads": ints(0, 0)})


# ----------------------------------------------------------------------------- generators


def test_generators_use_known_values():
    graph = Graph(inputs=["x"], outputs=["c", "r", "e"], types=dict(X3), nodes=[
        Node("Shape", ["x"], ["shape"], name="shape"),
        Node("ConstantOfShape", ["shape"], ["c"], {"value": np.array([1], np.int32)}, name="c"),
        Node("Gather", ["shape", "two"], ["s"], {"axis": 0}, name="gather"),
        Node("Range", ["zero", "s", "one"], ["r"], name="range"),
        Node("EyeLike", ["m"], ["e"], {"dtype": TensorProto.BOOL, "k": 1}, name="eye"),
    ])
    add_constants(graph, {"two": np.array(2, np.int64), "zero": np.array(0, np.int64),
                           "one": np.array(1, np.int64), "m": np.zeros((2, 5), np.float16)})
    infer_shapes(graph)
    assert [str(graph.types[n]) for n in ("c", "r", "e")] == ["i32[N, 3, S]", "i64[S]",
                                                              "bool[2, 5]"]


@pytest.mark.parametrize("start, limit, delta", [(1, 10, 3), (10, -2, -4), (5, 5, 1), (0, 3, -1)])
def test_range_lengths_match_numpy(start, limit, delta):
    constants = {"a": np.array(start, np.int32), "b": np.array(limit, np.int32),
                 "c": np.array(delta, np.int32)}
    expected = np.arange(start, limit, delta, dtype=np.int32)
    assert node_types("Range", {}, constants=constants) == [f"i32[{len(expected)}]"]
    got = run_node("Range", *constants.values())
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == np.int32


def test_range_float16_accumulates_in_stash_type():
    got = run_node("Range", np.array(2040, np.float16), np.array(2060, np.float16),
                   np.array(1, np.float16))
    np.testing.assert_array_equal(got, np.arange(2040, 2060, dtype=np.float32).astype(np.float16))
    with pytest.raises(ShapeError, match="delta must not be 0"):
        run_node("Range", np.array(0, np.int64), np.array(3, np.int64), np.array(0, np.int64))


def test_constant_of_shape_errors():
    with pytest.raises(ShapeError, match="negative dim"):
        node_types("ConstantOfShape", {}, constants={"s": ints(2, -1)})
    with pytest.raises(ShapeError, match="exactly one element"):
        node_types("ConstantOfShape", {}, constants={"s": ints(2)}, value=np.zeros(2, np.float32))


# ----------------------------------------------------------------------------- upgrades


def _import_and_run(node, inputs: dict[str, np.ndarray], opset: int, outputs: int = 1):
    infos = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
             for n, v in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output]
    model = helper.make_model(helper.make_graph([node], "g", infos, outs),
                              opset_imports=[helper.make_opsetid("", opset)])
    graph = import_onnx(model)
    result = ReferenceExecutor(graph).run(inputs)
    return graph, [result[o] for o in node.output]


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def test_upgrade_slice_1():
    node = helper.make_node("Slice", ["x"], ["y"], starts=[1, 0], ends=[INT_MAX, -1], axes=[1, 2])
    graph, (y,) = _import_and_run(node, {"x": X}, opset=9)
    np.testing.assert_array_equal(y, X[:, 1:, :-1])
    assert str(graph.types["y"]) == "f32[2, 2, 3]"


def test_upgrade_pad_2_and_split_2():
    node = helper.make_node("Pad", ["x"], ["y"], pads=[0, 1, 0, 0, 0, 2], value=1.5)
    _, (y,) = _import_and_run(node, {"x": X}, opset=2)
    np.testing.assert_array_equal(y, np.pad(X, [(0, 0), (1, 0), (0, 2)], constant_values=1.5))
    node = helper.make_node("Split", ["x"], ["a", "b"], axis=2, split=[1, 3])
    _, (a, b) = _import_and_run(node, {"x": X}, opset=2)
    np.testing.assert_array_equal(b, X[:, :, 1:])


def test_upgrade_split_13_equal_parts_and_reshape_concat_topk_1():
    node = helper.make_node("Split", ["x"], ["a", "b"], axis=2)
    graph, (a, _) = _import_and_run(node, {"x": X}, opset=13)
    assert graph.nodes[0].attrs["num_outputs"] == 2
    np.testing.assert_array_equal(a, X[:, :, :2])
    node = helper.make_node("Reshape", ["x"], ["y"], shape=[0, -1])
    _, (y,) = _import_and_run(node, {"x": X}, opset=1)
    assert y.shape == (2, 12)
    node = helper.make_node("Concat", ["x", "x"], ["y"])
    _, (y,) = _import_and_run(node, {"x": X}, opset=1)
    assert y.shape == (2, 6, 4)  # Concat-1's default axis is 1
    node = helper.make_node("TopK", ["x"], ["v", "i"], k=2)
    _, (v, i) = _import_and_run(node, {"x": X}, opset=1)
    np.testing.assert_array_equal(i, np.broadcast_to([3, 2], (2, 3, 2)))


def test_upgrade_tile_1():
    node = helper.make_node("Tile", ["x", "tiles", "axis"], ["y"])
    inputs = {"x": X, "tiles": np.array(3, np.float32), "axis": np.array(1, np.float32)}
    _, (y,) = _import_and_run(node, inputs, opset=1)
    np.testing.assert_array_equal(y, np.tile(X, (1, 3, 1)))


def test_reference_runs_on_symbolic_values():
    """The references folding uses work on object arrays of ints and symbols."""
    from ember.ops import get_op
    from ember.ops.registry import RefContext

    n = sym("N")
    value = np.array([n, 3, 224], dtype=object)

    def call(op: str, *args, **attrs):
        opdef = get_op(op)
        node = Node(op, [], ["out"], attrs, name="fold")
        return opdef.reference(RefContext(node, opdef, lambda *a: []), *args,
                               **opdef.resolve_attrs(node))

    assert call("Slice", value, ints(1), ints(INT_MAX)).tolist() == [3, 224]
    assert call("Concat", value[:1], ints(-1), axis=0).tolist() == [n, -1]
    assert call("Unsqueeze", call("Squeeze", value[:1], ints(0)), ints(0)).tolist() == [n]
    assert call("Reshape", value, ints(3, 1)).shape == (3, 1)
    with pytest.raises(ShapeError, match="symbolic value N"):
        call("ConstantOfShape", value)

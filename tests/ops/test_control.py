"""Control flow (If, Loop, Scan and the Scan-8 upgrade), sequences and optionals: symbolic shape
inference through bodies, loop-carried values whose shape changes, run-time results against
plain-numpy oracles, and the errors a user gets for inconsistent graphs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from ember.core.dtypes import DType
from ember.core.errors import EmberError, ShapeError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor
from ember.ir.graph import Graph, Node
from ember.ir.types import OptionalType, SequenceType, TensorType, ValueType, tensor
from ember.passes.infer_shapes import infer_shapes

F32 = DType.FLOAT32
I64 = DType.INT64
SCALAR_I64 = TensorType(I64, ())
SCALAR_BOOL = TensorType(DType.BOOL, ())


def _body(name: str, inputs: dict[str, ValueType | None], outputs: list[str],
          nodes: list[Node], constants: dict[str, np.ndarray] | None = None) -> Graph:
    types = {k: v for k, v in inputs.items() if v is not None}
    constants = dict(constants or {})
    for key, value in constants.items():
        types[key] = TensorType(DType.from_numpy(value.dtype), value.shape)
    return Graph(name=name, inputs=list(inputs), outputs=outputs, nodes=nodes, types=types,
                 constants=constants)


def _graph(inputs: dict[str, ValueType], outputs: list[str], nodes: list[Node],
           constants: dict[str, np.ndarray] | None = None) -> Graph:
    return infer_shapes(_body("main", inputs, outputs, nodes, constants))


def _types(graph: Graph) -> list[str]:
    return [str(graph.types.get(name)) for name in graph.outputs]


def _run(graph: Graph, **feeds):
    result = ReferenceExecutor(graph).run(feeds)
    return [result[name] for name in graph.outputs]


def _add(a: str, b: str, out: str) -> Node:
    return Node("Add", [a, b], [out], name=f"add_{out}")


# ----------------------------------------------------------------------------- If


def _if_graph(cond: ValueType | None = SCALAR_BOOL,
              constants: dict[str, np.ndarray] | None = None) -> Graph:
    then_branch = _body("then", {}, ["t"], [_add("x", "x", "t")])
    else_branch = _body("else", {}, ["e"], [_add("z", "z", "e")])
    inputs = {"x": tensor(F32, "N", 3), "z": tensor(F32, "N", 4)}
    if cond is not None:
        inputs["c"] = cond
    return _graph(inputs, ["y"],
                  [Node("If", ["c"], ["y"], {"then_branch": then_branch,
                                             "else_branch": else_branch}, name="if")],
                  constants)


def test_if_joins_the_shapes_of_its_branches():
    graph = _if_graph()
    assert _types(graph) == ["f32[N, ?]"]
    then_branch = graph.nodes[0].attrs["then_branch"]
    assert str(then_branch.types["t"]) == "f32[N, 3]"  # the body is typed in place
    x, z = np.ones((2, 3), np.float32), np.ones((2, 4), np.float32)
    assert _run(graph, x=x, z=z, c=np.array(False))[0].shape == (2, 4)


def test_if_with_a_constant_condition_takes_one_branch():
    graph = _if_graph(cond=None, constants={"c": np.array(True)})
    assert _types(graph) == ["f32[N, 3]"]


def test_if_branches_of_different_dtypes_are_an_error():
    then_branch = _body("then", {}, ["t"], [_add("x", "x", "t")])
    else_branch = _body("else", {}, ["e"], [_add("k", "k", "e")])
    with pytest.raises(ShapeError, match="'if'.*then_branch"):
        _graph({"x": tensor(F32, 3), "k": tensor(I64, 3), "c": SCALAR_BOOL}, ["y"],
               [Node("If", ["c"], ["y"], {"then_branch": then_branch,
                                          "else_branch": else_branch}, name="if")])


# ----------------------------------------------------------------------------- Loop


def _loop_graph(trip_input: bool, cond_input: bool) -> Graph:
    """v <- v + w (v starts as [1], w is [3]: v's shape changes in the first iteration);
    s <- s + s keeps its symbolic shape; the scan output stacks s."""
    body = _body("body", {"i": SCALAR_I64, "c": SCALAR_BOOL, "v": None, "s": None},
                 ["c", "v2", "s2", "s2"], [_add("v", "w", "v2"), _add("s", "s", "s2")])
    inputs: dict[str, ValueType] = {"v0": tensor(F32, 1), "w": tensor(F32, 3),
                                    "s0": tensor(F32, "N", 2)}
    constants = {}
    if trip_input:
        inputs["m"] = SCALAR_I64
    else:
        constants["m"] = np.array(4, np.int64)
    if cond_input:
        inputs["cond"] = SCALAR_BOOL
    loop = Node("Loop", ["m", "cond" if cond_input else "", "v0", "s0"], ["vf", "sf", "scan"],
                {"body": body}, name="loop")
    return _graph(inputs, ["vf", "sf", "scan"], [loop], constants)


def test_loop_carried_value_whose_shape_changes_gets_an_unknown_dim():
    graph = _loop_graph(trip_input=True, cond_input=True)
    assert _types(graph) == ["f32[?]", "f32[N, 2]", "f32[?, N, 2]"]
    body = graph.nodes[0].attrs["body"]
    assert str(body.types["v"]) == "f32[?]"  # the body was re-typed with the widened type
    vf, sf, scan = _run(graph, v0=np.array([1.0], np.float32),
                        w=np.array([1.0, 2.0, 3.0], np.float32), s0=np.ones((2, 2), np.float32),
                        m=np.array(3, np.int64), cond=np.array(True))
    np.testing.assert_array_equal(vf, [4.0, 7.0, 10.0])
    np.testing.assert_array_equal(sf, np.full((2, 2), 8.0))
    np.testing.assert_array_equal(scan[:, 0, 0], [2.0, 4.0, 8.0])


def test_loop_with_constant_trip_count_knows_the_scan_length():
    graph = _loop_graph(trip_input=False, cond_input=False)
    assert _types(graph)[2] == "f32[4, N, 2]"


def test_loop_with_zero_iterations_returns_initial_values_and_empty_scans():
    graph = _loop_graph(trip_input=True, cond_input=False)
    vf, sf, scan = _run(graph, v0=np.array([5.0], np.float32), w=np.zeros(3, np.float32),
                        s0=np.ones((3, 2), np.float32), m=np.array(0, np.int64))
    np.testing.assert_array_equal(vf, [5.0])
    assert scan.shape == (0, 3, 2) and scan.dtype == np.float32  # N bound by s0


def test_loop_without_trip_count_or_condition_is_an_error():
    body = _body("body", {"i": SCALAR_I64, "c": SCALAR_BOOL}, ["c", "i"], [])
    graph = _graph({}, ["scan"], [Node("Loop", ["", ""], ["scan"], {"body": body},
                                       name="forever")])
    with pytest.raises(EmberError, match="'forever'.*never end"):
        _run(graph)


# ----------------------------------------------------------------------------- Scan


def _scan_graph(x_type: TensorType, **attrs) -> Graph:
    body = _body("body", {"acc": None, "x_t": None}, ["acc2", "acc2"],
                 [_add("acc", "x_t", "acc2")])
    return _graph({"acc0": tensor(F32, "N"), "x": x_type}, ["accf", "ys"],
                  [Node("Scan", ["acc0", "x"], ["accf", "ys"],
                        {"body": body, "num_scan_inputs": 1, **attrs}, name="scan")])


def test_scan_infers_symbolic_lengths_and_output_axes():
    assert _types(_scan_graph(tensor(F32, "T", "N"))) == ["f32[N]", "f32[T, N]"]
    assert _types(_scan_graph(tensor(F32, "N", "T"), scan_input_axes=[1],
                              scan_output_axes=[-1])) == ["f32[N]", "f32[N, T]"]


def test_scan_reverse_input_and_prepended_output_match_numpy():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    graph = _scan_graph(tensor(F32, 4, 3), scan_input_directions=[1],
                        scan_output_directions=[1])
    final, ys = _run(graph, acc0=np.zeros(3, np.float32), x=x)
    np.testing.assert_array_equal(final, x.sum(axis=0))
    np.testing.assert_array_equal(ys, np.cumsum(x[::-1], axis=0)[::-1])


def test_scan_inputs_of_different_lengths_are_an_error():
    body = _body("body", {"a": None, "b": None}, ["o"], [_add("a", "b", "o")])
    with pytest.raises(ShapeError, match="'scan'.*different lengths"):
        _graph({"x": tensor(F32, 4, 2), "y": tensor(F32, 5, 2)}, ["ys"],
               [Node("Scan", ["x", "y"], ["ys"], {"body": body, "num_scan_inputs": 2},
                     name="scan")])


def _scan8_model(with_lengths: bool, reverse: bool):
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "a"], ["s2"]), helper.make_node("Add", ["s2", "a"], ["o"])],
        "body", [vi("s", TensorProto.FLOAT, [2]), vi("a", TensorProto.FLOAT, [2])],
        [vi("s2", TensorProto.FLOAT, [2]), vi("o", TensorProto.FLOAT, [2])])
    attrs = {"directions": [1]} if reverse else {}
    node = helper.make_node("Scan", ["lens" if with_lengths else "", "s0", "x"], ["sf", "y"],
                            body=body, num_scan_inputs=1, **attrs)
    inputs = [vi("s0", TensorProto.FLOAT, ["B", 2]), vi("x", TensorProto.FLOAT, ["B", 4, 2])]
    if with_lengths:
        inputs.insert(0, vi("lens", TensorProto.INT64, ["B"]))
    graph = helper.make_graph([node], "g", inputs, [vi("sf", TensorProto.FLOAT, None),
                                                     vi("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])


@pytest.mark.parametrize("reverse", [False, True])
def test_scan8_batch_and_sequence_lens_match_a_per_entry_oracle(reverse):
    graph = import_onnx(_scan8_model(with_lengths=True, reverse=reverse))
    assert "Loop" in graph.op_histogram() and "Scan" in graph.op_histogram()
    rng = np.random.default_rng(0)
    s0 = rng.normal(size=(3, 2)).astype(np.float32)
    x = rng.normal(size=(3, 4, 2)).astype(np.float32)
    lens = np.array([4, 1, 3], np.int64)
    sf, y = _run(graph, lens=lens, s0=s0, x=x)
    for b, length in enumerate(lens):
        state = s0[b].copy()
        steps = range(length - 1, -1, -1) if reverse else range(length)
        for k, t in enumerate(steps):
            state = state + x[b, t]
            np.testing.assert_allclose(y[b, k], state + x[b, t], rtol=1e-6)
        np.testing.assert_allclose(sf[b], state, rtol=1e-6)
    assert y.shape == x.shape


def test_scan8_without_lengths_keeps_the_batch_symbolic():
    graph = import_onnx(_scan8_model(with_lengths=False, reverse=False))
    assert _types(graph) == ["f32[B, 2]", "f32[B, 4, 2]"]


# ----------------------------------------------------------------------------- sequences


def test_split_to_sequence_element_types():
    def elem(split: np.ndarray | None, **attrs) -> str:
        constants = {"split": split} if split is not None else {}
        node = Node("SplitToSequence", ["x"] + list(constants), ["seq"], attrs, name="split")
        return _types(_graph({"x": tensor(F32, "N", 6)}, ["seq"], [node], constants))[0]

    assert elem(np.array(2, np.int64), axis=1) == "seq<f32[N, 2]>"
    assert elem(np.array(4, np.int64), axis=1) == "seq<f32[N, ?]>"  # last chunk is smaller
    assert elem(np.array([3, 3], np.int64), axis=1) == "seq<f32[N, 3]>"
    assert elem(np.array([1, 5], np.int64), axis=1) == "seq<f32[N, ?]>"
    assert elem(None, axis=1, keepdims=0) == "seq<f32[N]>"
    assert elem(None, axis=0) == "seq<f32[1, 6]>"


def test_sequence_construct_joins_element_shapes_and_concat_leaves_the_axis_unknown():
    nodes = [Node("SequenceConstruct", ["a", "b"], ["seq"], name="construct"),
             Node("ConcatFromSequence", ["seq"], ["cat"], {"axis": 0}, name="cat"),
             Node("ConcatFromSequence", ["seq"], ["stack"], {"axis": -1, "new_axis": 1},
                  name="stack")]
    graph = _graph({"a": tensor(F32, "N", 3), "b": tensor(F32, "M", 3)},
                   ["seq", "cat", "stack"], nodes)
    assert _types(graph) == ["seq<f32[?, 3]>", "f32[?, 3]", "f32[?, 3, ?]"]
    seq, cat, stack = _run(graph, a=np.ones((2, 3), np.float32), b=np.zeros((2, 3), np.float32))
    assert len(seq) == 2 and cat.shape == (4, 3) and stack.shape == (2, 3, 2)


def test_sequence_ops_do_not_modify_their_input_list():
    nodes = [Node("SequenceInsert", ["seq", "t", "pos"], ["inserted"], name="insert"),
             Node("SequenceErase", ["inserted"], ["erased"], name="erase"),
             Node("SequenceAt", ["erased", "last"], ["at"], name="at"),
             Node("SequenceLength", ["erased"], ["n"], name="len")]
    graph = _graph({"seq": SequenceType(tensor(F32, 2)), "t": tensor(F32, 2)},
                   ["inserted", "erased", "at", "n"], nodes,
                   {"pos": np.array(0, np.int64), "last": np.array(-1, np.int64)})
    assert _types(graph) == ["seq<f32[2]>", "seq<f32[2]>", "f32[2]", "i64[]"]
    original = [np.zeros(2, np.float32), np.ones(2, np.float32)]
    inserted, erased, at, n = _run(graph, seq=original, t=np.full(2, 7, np.float32))
    assert len(original) == 2 and len(inserted) == 3 and len(erased) == 2 and n == 2
    np.testing.assert_array_equal(at, [0.0, 0.0])  # [7, 0, 1] minus its last element


def test_sequence_position_out_of_range_is_an_error():
    graph = _graph({"seq": SequenceType(tensor(F32, 2))}, ["at"],
                   [Node("SequenceAt", ["seq", "pos"], ["at"], name="at")],
                   {"pos": np.array(2, np.int64)})
    with pytest.raises(ShapeError, match="'at'.*position 2 is out of range"):
        _run(graph, seq=[np.zeros(2, np.float32)] * 2)


def test_sequence_construct_of_mixed_dtypes_is_an_error():
    with pytest.raises(ShapeError, match="'construct'.*one element type"):
        _graph({"a": tensor(F32, 2), "b": tensor(I64, 2)}, ["seq"],
               [Node("SequenceConstruct", ["a", "b"], ["seq"], name="construct")])


def test_sequence_map_pairs_sequence_elements_with_tensors():
    body = _body("body", {"e": None, "t": None}, ["o"], [_add("e", "t", "o")])
    graph = _graph({"seq": SequenceType(tensor(F32, "N")), "t": tensor(F32, "N")}, ["out"],
                   [Node("SequenceMap", ["seq", "t"], ["out"], {"body": body}, name="map")])
    assert _types(graph) == ["seq<f32[N]>"]
    (out,) = _run(graph, seq=[np.ones(2, np.float32), np.zeros(2, np.float32)],
                  t=np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(np.stack(out), [[2.0, 3.0], [1.0, 2.0]])


# ----------------------------------------------------------------------------- optionals


def test_optionals_tell_an_empty_value_from_a_present_one():
    nodes = [Node("Optional", [], ["empty"], {"type": tensor(F32, 3)}, name="empty"),
             Node("Optional", ["x"], ["full"], name="full"),
             Node("OptionalHasElement", ["empty"], ["has_empty"], name="has_empty"),
             Node("OptionalHasElement", ["full"], ["has_full"], name="has_full"),
             Node("OptionalHasElement", [""], ["has_none"], name="has_none"),
             Node("OptionalGetElement", ["full"], ["got"], name="get")]
    outputs = ["empty", "has_empty", "has_full", "has_none", "got"]
    graph = _graph({"x": tensor(F32, "N")}, outputs, nodes)
    assert _types(graph) == ["opt<f32[3]>", "bool[]", "bool[]", "bool[]", "f32[N]"]
    empty, has_empty, has_full, has_none, got = _run(graph, x=np.ones(4, np.float32))
    assert empty is None and not has_empty and has_full and not has_none
    assert got.shape == (4,)


def test_optional_get_element_of_an_empty_optional_is_an_error():
    graph = _graph({"o": OptionalType(tensor(F32, 3))}, ["v"],
                   [Node("OptionalGetElement", ["o"], ["v"], name="get")])
    with pytest.raises(ShapeError, match="'get'.*empty"):
        _run(graph, o=None)

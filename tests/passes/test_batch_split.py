"""The batch-split analysis: which graphs keep the samples of their batch apart.

The oracle is the graph's own semantics, run by the numpy reference executor: for a graph the
analysis accepts, running a batch of 5 as blocks of 2, 2 and 1 (``run_in_blocks``) must give
exactly the outputs of running it whole.  For the graphs it refuses because an op really mixes
samples, the same block run gives something else -- so each refusal below is a real hazard,
not just caution -- and the reason names the node.
"""

from __future__ import annotations

import numpy as np
import pytest

from ember.interp.reference import ReferenceExecutor
from ember.ir.parser import parse_graph
from ember.passes.batch_split import (BatchSplit, NotSeparable, analyze_batch_split,
                                      analyze_batch_split_at)
from ember.passes.infer_shapes import infer_shapes
from ember.runtime.blocks import plan_blocks, run_in_blocks

BLOCKS = (2, 2, 1)

SEPARABLE = {
    "mlp": """
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 3]) {
          const %w1: f32[4, 5] = [[0.1, 0.2, 0.3, 0.4, 0.5], [0.5, 0.4, 0.3, 0.2, 0.1],
                                  [1.0, -1.0, 0.5, -0.5, 0.2], [0.3, 0.3, -0.3, 0.1, 0.0]]
          const %b1: f32[5] = [0.1, -0.1, 0.2, 0.0, 0.3]
          const %w2: f32[3, 5] = [[1.0, 0.5, 0.0, -0.5, 1.0], [0.2, 0.2, 0.2, 0.2, 0.2],
                                  [-1.0, 0.0, 1.0, 0.0, -1.0]]
          %h = Gemm(%x, %w1, %b1)
          %r = Relu(%h)
          %z = Gemm(%r, %w2) {transB=1}
          %y = Softmax(%z) {axis=1}
        }""",
    "cnn": """
        graph main(%x: f32[N, 2, 5, 5]) -> (%y: f32[N, 2]) {
          const %w: f32[3, 2, 3, 3] = [[[[0.1, 0.2, 0.3], [0.0, 0.1, 0.0], [0.3, 0.2, 0.1]],
                                        [[0.5, 0.0, -0.5], [0.1, 0.1, 0.1], [0.0, 0.2, 0.0]]],
                                       [[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
                                        [[0.2, 0.2, 0.2], [0.2, 0.2, 0.2], [0.2, 0.2, 0.2]]],
                                       [[[-0.1, 0.0, 0.1], [0.0, 0.0, 0.0], [0.1, 0.0, -0.1]],
                                        [[0.3, 0.1, 0.3], [0.1, 0.3, 0.1], [0.3, 0.1, 0.3]]]]
          const %scale: f32[3] = [1.0, 0.5, 2.0]
          const %bias: f32[3] = [0.0, 0.1, -0.1]
          const %mean: f32[3] = [0.1, 0.0, 0.2]
          const %var: f32[3] = [1.0, 2.0, 0.5]
          const %fc: f32[2, 3] = [[1.0, -1.0, 0.5], [0.25, 0.5, 0.75]]
          %c = Conv(%x, %w) {pads=[1, 1, 1, 1]}
          %b = BatchNormalization(%c, %scale, %bias, %mean, %var)
          %r = Relu(%b)
          %p = MaxPool(%r) {kernel_shape=[2, 2], strides=[2, 2]}
          %g = GlobalAveragePool(%p)
          %f = Flatten(%g)
          %y = Gemm(%f, %fc) {transB=1}
        }""",
    "attention": """
        graph main(%x: f32[N, 3, 4]) -> (%y: f32[N, 3, 4]) {
          const %wq: f32[4, 4] = [[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1],
                                  [0.0, 1.0, 0.0, -1.0], [0.5, 0.5, -0.5, -0.5]]
          const %zero: i64[] = 0
          const %tail: i64[3] = [3, 2, 2]
          const %flat: i64[3] = [0, 3, 4]
          const %axes: i64[1] = [0]
          const %gamma: f32[4] = [1.0, 2.0, 0.5, 1.0]
          %q = MatMul(%x, %wq)
          %shape = Shape(%x)
          %n = Gather(%shape, %zero)
          %n1 = Unsqueeze(%n, %axes)
          %target = Concat(%n1, %tail) {axis=0}
          %heads = Reshape(%q, %target)
          %t = Transpose(%heads) {perm=[0, 2, 1, 3]}
          %kt = Transpose(%heads) {perm=[0, 2, 3, 1]}
          %s = MatMul(%t, %kt)
          %a = Softmax(%s) {axis=-1}
          %o = MatMul(%a, %t)
          %back = Transpose(%o) {perm=[0, 2, 1, 3]}
          %merged = Reshape(%back, %flat)
          %y = LayerNormalization(%merged, %gamma) {axis=-1}
        }""",
    "embedding_and_positions": """
        graph main(%ids: i64[N, 3]) -> (%y: f32[N, 2]) {
          const %table: f32[5, 2] = [[0.0, 1.0], [1.0, 0.0], [0.5, 0.5], [2.0, -1.0],
                                     [-0.5, 3.0]]
          const %pos: f32[1, 3, 2] = [[[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]]
          const %one: i64[1] = [1]
          const %axes: i64[1] = [1]
          %e = Gather(%table, %ids) {axis=0}
          %shape = Shape(%ids)
          %n = Slice(%shape, %one, %one)
          %full = Shape(%e)
          %p = Expand(%pos, %full)
          %sum = Add(%e, %p)
          %y = ReduceMean(%sum, %axes) {keepdims=0}
        }""",
    "layout_along_other_axes": """
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 8], %z: f32[N, 8]) {
          const %starts: i64[1] = [1]
          const %ends: i64[1] = [3]
          const %axes: i64[1] = [1]
          const %pads: i64[4] = [0, 1, 0, 1]
          const %reps: i64[2] = [1, 2]
          %s = Slice(%x, %starts, %ends, %axes)
          %p = Pad(%x, %pads)
          %y = Concat(%s, %p) {axis=1}
          %c = CumSum(%x, %axes)
          %z = Tile(%c, %reps)
        }""",
}

# transformers' padding-mask idiom through torch.export: mask[arange(N)[:, None, None], kv]
SAMPLE_INDEX = """
        graph main(%mask: i64[N, 3]) -> (%y: i64[N, 1, 3]) {
          const %zero: i64[] = 0
          const %one: i64[] = 1
          const %ax1: i64[1] = [1]
          const %ax2: i64[1] = [2]
          const %ax0: i64[1] = [0]
          const %three: i64[1] = [3]
          const %one1: i64[1] = [1]
          const %kv: i64[1, 3, 1] = [[[0], [2], [1]]]
          %shape = Shape(%mask)
          %n = Gather(%shape, %zero)
          %i = Range(%zero, %n, %one)
          %i2 = Unsqueeze(%i, %ax1)
          %i3 = Unsqueeze(%i2, %ax2)
          %neg = Less(%i3, %zero)
          %wrapped = Add(%i3, %n)
          %idx = Where(%neg, %wrapped, %i3)
          %n1 = Unsqueeze(%n, %ax0)
          %shape3 = Concat(%n1, %three, %one1) {axis=0}
          %rows = Expand(%idx, %shape3)
          %kvs = Expand(%kv, %shape3)
          %pairs = Concat(%rows, %kvs) {axis=-1}
          %g = GatherND(%mask, %pairs)
          %y = Unsqueeze(%g, %ax1)
        }"""
SEPARABLE["sample_index_gather"] = SAMPLE_INDEX


def _flat_index(rows: int, stride: int, offsets: str) -> str:
    """The TorchScript exporter's form of the padding-mask read: Gather(Flatten(mask),
    i*stride + offsets) on a mask of ``rows`` values per sample."""
    return f"""
        graph main(%mask: i64[N, {rows}]) -> (%y: i64[N, 1, {len(offsets.split(','))}]) {{
          const %zero: i64[] = 0
          const %one: i64[] = 1
          const %ax0: i64[1] = [0]
          const %ax1: i64[1] = [1]
          const %stride: i64[1] = [{stride}]
          const %kv: i64[{len(offsets.split(','))}] = [{offsets}]
          %shape = Shape(%mask)
          %n = Gather(%shape, %zero)
          %i = Range(%zero, %n, %one)
          %i2 = Unsqueeze(%i, %ax1)
          %scaled = Mul(%i2, %stride)
          %kv2 = Unsqueeze(%kv, %ax0)
          %flat = Add(%scaled, %kv2)
          %fm = Flatten(%mask) {{axis=2}}
          %g = Gather(%fm, %flat) {{axis=0}}
          %y = Transpose(%g) {{perm=[0, 2, 1]}}
        }}"""


SEPARABLE["flat_sample_index_gather"] = _flat_index(3, 3, "2, 0, 1")

# core ATen's SDPA decomposition: the batch moved off axis 0 around a layout copy, then back
SEPARABLE["batch_moved_and_back"] = """
        graph main(%x: f32[N, 2, 3, 4]) -> (%y: f32[N, 3, 2, 4]) {
          %t = Transpose(%x) {perm=[2, 0, 1, 3]}
          %c = Identity(%t)
          %r = Relu(%c)
          %back = Transpose(%r) {perm=[1, 2, 0, 3]}
          %y = Transpose(%back) {perm=[0, 2, 1, 3]}
        }"""

# attention written with einsum: a projection by a weight, then scores of each sample's own
# tokens
SEPARABLE["einsum_attention"] = """
        graph main(%x: f32[N, 3, 4]) -> (%y: f32[N, 3, 3]) {
          const %w: f32[4, 4] = [[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1],
                                 [1.0, -1.0, 0.5, -0.5], [0.0, 0.5, 0.0, -0.5]]
          %q = Einsum(%x, %w) {equation="bqd,de->bqe"}
          %s = Einsum(%q, %x) {equation="bqd,bkd->bqk"}
          %y = Softmax(%s) {axis=2}
        }"""

# the dynamo exporter's broadcast of index ranges through Max, read only for its shape
SEPARABLE["index_ranges_read_for_their_shape"] = """
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 4]) {
          const %zero: i64[] = 0
          const %one: i64[] = 1
          const %axes: i64[1] = [1]
          const %columns: i64[1, 4] = [[0, 1, 2, 3]]
          %shape = Shape(%x)
          %n = Gather(%shape, %zero)
          %i = Range(%zero, %n, %one)
          %rows = Unsqueeze(%i, %axes)
          %both = Max(%rows, %columns)
          %target = Shape(%both)
          %e = Expand(%x, %target)
          %y = Relu(%e)
        }"""

# graph, the op that mixes samples (named in the reason)
MIXING = {
    "softmax_over_the_batch": ("""
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 4]) {
          %y = Softmax(%x) {axis=0}
        }""", "Softmax"),
    "concat_along_the_batch": ("""
        graph main(%x: f32[N, 4]) -> (%y: f32[2*N, 4]) {
          %d = Add(%x, %x)
          %y = Concat(%x, %d) {axis=0}
        }""", "Concat"),
    "mean_over_the_batch": ("""
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 4]) {
          const %axes: i64[1] = [0]
          %m = ReduceMean(%x, %axes) {keepdims=1}
          %y = Sub(%x, %m)
        }""", "ReduceMean"),
    "cumsum_along_the_batch": ("""
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 4]) {
          const %axis: i64[] = 0
          %y = CumSum(%x, %axis)
        }""", "CumSum"),
    "gram_matrix": ("""
        graph main(%x: f32[N, 4]) -> (%y: f32[4, 4]) {
          %t = Transpose(%x) {perm=[1, 0]}
          %y = MatMul(%t, %x)
        }""", "MatMul.*batch is at axis 1"),
    "first_sample_subtracted": ("""
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 4]) {
          const %zero: i64[] = 0
          %first = Gather(%x, %zero) {axis=0}
          %y = Sub(%x, %first)
        }""", "Gather"),
    "scaled_by_the_batch_size": ("""
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 4]) {
          const %zero: i64[] = 0
          %shape = Shape(%x)
          %n = Gather(%shape, %zero)
          %f = Cast(%n) {to=1}
          %y = Mul(%x, %f)
        }""", "Mul"),
    # flat indices whose stride is not the data's rows per sample read other samples' rows
    "flat_index_with_another_stride": (_flat_index(4, 3, "0, 1, 2"), "Gather"),
    # a negative offset wraps around to the last row of the whole tensor
    "flat_index_below_the_sample": (_flat_index(3, 3, "-1, 0, 1"), "Add"),
    "sample_index_as_data": ("""
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 4]) {
          const %zero: i64[] = 0
          const %one: i64[] = 1
          const %axes: i64[1] = [1]
          %shape = Shape(%x)
          %n = Gather(%shape, %zero)
          %i = Range(%zero, %n, %one)
          %f = Cast(%i) {to=1}
          %col = Unsqueeze(%f, %axes)
          %y = Add(%x, %col)
        }""", "Cast"),
    "rows_picked_by_batch_indices": ("""
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 4]) {
          const %starts: i64[1] = [0]
          const %ends: i64[1] = [1]
          const %axes: i64[1] = [1]
          const %nothing: f32[] = 0.0
          %first = Slice(%x, %starts, %ends, %axes)
          %zeros = Mul(%first, %nothing)
          %rows = Cast(%zeros) {to=7}
          %y = GatherND(%x, %rows)
        }""", "GatherND"),
    "max_pool_indices": ("""
        graph main(%x: f32[N, 1, 2, 2]) -> (%y: f32[N, 1, 1, 1], %i: i64[N, 1, 1, 1]) {
          %y, %i = MaxPool(%x) {kernel_shape=[2, 2]}
        }""", "MaxPool"),
    "batch_moved_then_reduced_across": ("""
        graph main(%x: f32[N, 2, 4]) -> (%y: f32[N, 2, 4]) {
          %t = Transpose(%x) {perm=[1, 0, 2]}
          %s = Softmax(%t) {axis=1}
          %y = Transpose(%s) {perm=[1, 0, 2]}
        }""", "Softmax"),
    "einsum_over_the_batch": ("""
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 4]) {
          %g = Einsum(%x, %x) {equation="bi,bj->ij"}
          %y = Einsum(%x, %g) {equation="bi,ij->bj"}
        }""", "Einsum"),
    "batch_size_as_an_output": ("""
        graph main(%x: f32[N, 4]) -> (%y: f32[N, 4], %s: i64[2]) {
          %y = Relu(%x)
          %s = Shape(%x)
        }""", "output 's'"),
}


# the same idiom reading the row of the previous sample (index i - 1) instead
MIXING["the_previous_sample_read"] = (SAMPLE_INDEX.replace(
    "%idx = Where(%neg, %wrapped, %i3)",
    "%idx0 = Where(%neg, %wrapped, %i3)\n          %idx = Sub(%idx0, %one)"), "Expand")


def _graph(text: str):
    return infer_shapes(parse_graph(text))


def _inputs(graph, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    feeds = {}
    for name in graph.inputs:
        vtype = graph.types[name]
        shape = tuple(batch if not isinstance(d, int) else d for d in vtype.shape)
        if vtype.dtype.numpy == np.int64:
            feeds[name] = rng.integers(0, 5, size=shape).astype(np.int64)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _whole_and_blocks(graph, split: BatchSplit):
    executor = ReferenceExecutor(graph)
    feeds = _inputs(graph, sum(BLOCKS))
    whole = executor.run(feeds)
    blocks = run_in_blocks(feeds, split.inputs, split.batch_outputs,
                           [(size, executor.run) for size in BLOCKS],
                           output_axes=dict(split.output_axes))
    return whole, blocks


def test_an_output_with_its_batch_moved_is_joined_along_that_axis() -> None:
    graph = _graph("""
        graph main(%x: f32[N, 4, 3]) -> (%y: f32[4, N, 3], %z: f32[N, 4, 3]) {
          %y = Transpose(%x) {perm=[1, 0, 2]}
          %z = Relu(%x)
        }""")
    split = analyze_batch_split(graph)
    assert split.batch_outputs == ("y", "z") and split.output_axes == (("y", 1),)
    whole, blocks = _whole_and_blocks(graph, split)
    for output in ("y", "z"):
        np.testing.assert_allclose(blocks[output], whole[output], rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(SEPARABLE))
def test_a_separable_graph_gives_the_same_outputs_block_by_block(name: str) -> None:
    graph = _graph(SEPARABLE[name])
    split = analyze_batch_split(graph)
    assert split.symbol == "N" and split.inputs == (graph.inputs[0],)
    assert set(split.batch_outputs) == set(graph.outputs)
    whole, blocks = _whole_and_blocks(graph, split)
    for output in graph.outputs:
        np.testing.assert_allclose(blocks[output], whole[output], rtol=1e-6, atol=1e-6,
                                   err_msg=f"{name}: output {output}")


@pytest.mark.parametrize("name", sorted(MIXING))
def test_a_graph_that_mixes_samples_is_refused_by_name(name: str) -> None:
    text, culprit = MIXING[name]
    graph = _graph(text)
    with pytest.raises(NotSeparable, match=culprit):
        analyze_batch_split(graph)
    # and the refusal is warranted: run block by block, some output differs
    batch_inputs = tuple(n for n in graph.inputs)
    batch_outputs = tuple(n for n in graph.outputs
                          if not isinstance(graph.types[n].shape[0], int))
    whole, blocks = _whole_and_blocks(graph, BatchSplit("N", batch_inputs, batch_outputs))
    assert any(blocks[o].shape != whole[o].shape or not np.allclose(blocks[o], whole[o])
               for o in graph.outputs), f"{name}: blocks agree with the whole batch"


def test_inputs_that_carry_the_batch_elsewhere_are_refused() -> None:
    graph = _graph("""
        graph main(%x: f32[N, 4], %m: f32[4, N]) -> (%y: f32[N, 4]) {
          %t = Transpose(%m) {perm=[1, 0]}
          %y = Add(%x, %t)
        }""")
    with pytest.raises(NotSeparable, match="input 'm'"):
        analyze_batch_split(graph)


def test_a_static_graph_has_no_batch_to_split() -> None:
    with pytest.raises(NotSeparable, match="no input has a symbolic batch"):
        analyze_batch_split(_graph("""
            graph main(%x: f32[2, 4]) -> (%y: f32[2, 4]) {
              %y = Relu(%x)
            }"""))


def test_inputs_without_the_batch_go_whole_to_every_block() -> None:
    graph = _graph("""
        graph main(%x: f32[N, 4], %bias: f32[4]) -> (%y: f32[N, 4], %b2: f32[4]) {
          %y = Add(%x, %bias)
          %b2 = Mul(%bias, %bias)
        }""")
    split = analyze_batch_split(graph)
    assert split.inputs == ("x",) and split.batch_outputs == ("y",)
    executor = ReferenceExecutor(graph)
    feeds = {"x": np.arange(20, dtype=np.float32).reshape(5, 4),
             "bias": np.array([1, 2, 3, 4], dtype=np.float32)}
    blocks = run_in_blocks(feeds, split.inputs, split.batch_outputs,
                           [(size, executor.run) for size in BLOCKS])
    np.testing.assert_array_equal(blocks["y"], feeds["x"] + feeds["bias"])
    np.testing.assert_array_equal(blocks["b2"], feeds["bias"] ** 2)


# Each token minus the sequence's first: ``x[:, :1]`` has 1 token only when S >= 1, so with S
# symbolic its shape is unknown and the graph cannot be analysed; with S bound it can.
FIRST_TOKEN = """
    graph main(%x: f32[N, S, 4]) -> (%y: f32[N, S, 4]) {
      const %zero: i64[1] = [0]
      const %one: i64[1] = [1]
      %first = Slice(%x, %zero, %one, %one)
      %y = Sub(%x, %first)
    }"""


def test_binding_the_other_dims_decides_what_their_symbols_hide() -> None:
    graph = _graph(FIRST_TOKEN)
    with pytest.raises(NotSeparable, match="no known shape"):
        analyze_batch_split(graph)
    split = analyze_batch_split_at(graph, {"x": (5, 6, 4)})
    assert split == BatchSplit("N", ("x",), ("y",))
    executor = ReferenceExecutor(graph)
    feeds = {"x": np.random.default_rng(0).standard_normal((5, 6, 4)).astype(np.float32)}
    blocks = run_in_blocks(feeds, split.inputs, split.batch_outputs,
                           [(size, executor.run) for size in BLOCKS])
    np.testing.assert_allclose(blocks["y"], feeds["x"] - feeds["x"][:, :1], rtol=1e-6)
    assert graph.types["first"].shape[1] is None  # binding left the graph itself symbolic


def test_binding_the_other_dims_still_refuses_a_mix() -> None:
    """The first token averaged over the batch: bound or not, samples are mixed."""
    graph = _graph(FIRST_TOKEN.replace(
        "%y = Sub(%x, %first)",
        "%mean = ReduceMean(%first, %zero) {keepdims=1}\n      %y = Sub(%x, %mean)"))
    with pytest.raises(NotSeparable, match="ReduceMean"):
        analyze_batch_split_at(graph, {"x": (5, 6, 4)})
    executor = ReferenceExecutor(graph)
    x = np.random.default_rng(1).standard_normal((5, 6, 4)).astype(np.float32)
    blocks = run_in_blocks({"x": x}, ("x",), ("y",), [(size, executor.run) for size in BLOCKS])
    assert not np.allclose(blocks["y"], executor.run({"x": x})["y"])


@pytest.mark.parametrize("batch, sizes, expected", [
    (33, [16, 1], [16, 16, 1]), (16, [16], [16]), (5, [4, 2, 1], [4, 1]),
    (3, [4, 1], [1, 1, 1]), (7, [4, 2], None), (0, [4, 1], []),
])
def test_block_plans_use_the_largest_blocks_first(batch, sizes, expected) -> None:
    assert plan_blocks(batch, sizes) == expected


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("layout", [0, 1])
def test_recurrent_layers_keep_each_sample_apart(op: str, layout: int) -> None:
    """A recurrent layer runs each sample's sequence alone: with layout 0 its input has the
    batch second (a Transpose moves it there), the zero initial state is a fill shaped by the
    batch, and its outputs carry the batch at axis 2 (Y) and 1 (Y_h) until moved back."""
    from onnx import TensorProto, helper, numpy_helper

    from ember.frontend.onnx import import_onnx

    rng = np.random.default_rng(3)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) / 2, name)
             for name, shape in (("W", (1, gates * 4, 3)), ("R", (1, gates * 4, 4)))]
    inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("first", [0]), ("one", [1]), ("one_unit", [1]), ("hidden", [4]),
               ("axes", [0]))]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "first", "one"], ["n"])]
    states = ["one_unit", "n", "hidden"] if layout == 0 else ["n", "one_unit", "hidden"]
    nodes += [helper.make_node("Concat", states, ["state_shape"], axis=0),
              helper.make_node("ConstantOfShape", ["state_shape"], ["h0"])]
    sequence = "x"
    if layout == 0:
        nodes.append(helper.make_node("Transpose", ["x"], ["steps_first"], perm=[1, 0, 2]))
        sequence = "steps_first"
    nodes.append(helper.make_node(op, [sequence, "W", "R", "", "", "h0"], ["y_all", "y_h"],
                                  hidden_size=4, layout=layout))
    if layout == 0:  # Y (steps, 1, N, 4) and Y_h (1, N, 4): the batch back in front
        nodes += [helper.make_node("Transpose", ["y_all"], ["y"], perm=[2, 0, 1, 3]),
                  helper.make_node("Transpose", ["y_h"], ["last"], perm=[1, 0, 2])]
    else:
        nodes += [helper.make_node("Identity", ["y_all"], ["y"]),
                  helper.make_node("Identity", ["y_h"], ["last"])]
    graph = helper.make_graph(nodes, "recurrent",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             ["N", 5, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("last", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)],
                              ir_version=10)
    imported = import_onnx(model)
    split = analyze_batch_split(imported)
    assert set(split.batch_outputs) == {"y", "last"}
    whole, blocks = _whole_and_blocks(imported, split)
    for output in ("y", "last"):
        np.testing.assert_allclose(blocks[output], whole[output], rtol=1e-6, atol=1e-6)

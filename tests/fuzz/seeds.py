"""The seed models that the model mutators start from, and the fixed inputs they run on.

Mutating real, valid models (rather than generating random graphs) keeps every mutant one
step away from something ember handles today, which is where robustness bugs hide: the
importer, shape inference and code generation all run up to the point of the damage.  Each
seed covers a different part of ember (dense layers, convolutions, shape arithmetic, control
flow, model-local functions) plus the bundled model; every seed is checked with
``onnx.checker`` when it is built, so a mutant's problems are the mutator's doing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ember

BUNDLED_MODEL = Path(ember.__file__).resolve().parent / "models" / "tinynet.onnx"
OPSET = 17


@dataclass(frozen=True, eq=False)
class Seed:
    """A valid model and inputs it runs on (name -> array); the oracle uses the same inputs."""

    name: str
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray] = field(hash=False)

    def serialized(self) -> bytes:
        return self.model.SerializeToString()


def _weights(rng: np.random.Generator, name: str, *shape: int,
             scale: float = 0.3) -> TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(graph: onnx.GraphProto, **kwargs) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="ember-fuzz", **kwargs)
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def mlp() -> Seed:
    """Gemm + Relu + MatMul + Add + Softmax, with value_info on the intermediates so that the
    dims and dtype mutators find declared types inside the graph, not only at its edges."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["h_relu"], name="relu"),
        helper.make_node("MatMul", ["h_relu", "w2"], ["z"], name="fc2"),
        helper.make_node("Add", ["z", "b2"], ["logits"], name="bias"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[_weights(rng, "w1", 16, 8), _weights(rng, "b1", 16),
                     _weights(rng, "w2", 16, 4), _weights(rng, "b2", 4)],
        value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 16]),
                    helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 4])])
    feeds = {"x": np.random.default_rng(11).standard_normal((2, 8)).astype(np.float32)}
    return Seed("mlp", _model(graph), feeds)


def convnet() -> Seed:
    """Conv + BatchNormalization + Relu + MaxPool + Conv + GlobalAveragePool + Flatten."""
    rng = np.random.default_rng(2)
    channels = 4
    bn = [numpy_helper.from_array(values.astype(np.float32), name) for name, values in (
        ("bn.scale", rng.uniform(0.5, 1.5, channels)), ("bn.bias", rng.standard_normal(channels)),
        ("bn.mean", rng.standard_normal(channels) * 0.1),
        ("bn.var", rng.uniform(0.5, 1.5, channels)))]
    nodes = [
        helper.make_node("Conv", ["x", "conv1.w", "conv1.b"], ["c1"], name="conv1",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn.scale", "bn.bias", "bn.mean",
                                                "bn.var"], ["c1_bn"], name="bn", epsilon=1e-5),
        helper.make_node("Relu", ["c1_bn"], ["c1_relu"], name="relu"),
        helper.make_node("MaxPool", ["c1_relu"], ["p1"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2.w"], ["c2"], name="conv2", kernel_shape=[3, 3],
                         strides=[1, 1], pads=[0, 0, 0, 0]),
        helper.make_node("GlobalAveragePool", ["c2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["y"], name="flatten", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])],
        initializer=[_weights(rng, "conv1.w", channels, 3, 3, 3),
                     _weights(rng, "conv1.b", channels), *bn,
                     _weights(rng, "conv2.w", 6, channels, 3, 3)],
        value_info=[helper.make_tensor_value_info("p1", TensorProto.FLOAT, [1, channels, 4, 4])])
    feeds = {"x": np.random.default_rng(12).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    return Seed("convnet", _model(graph), feeds)


def shapes() -> Seed:
    """Transpose, Slice, Gather with constant indices, Concat, and the shape arithmetic of
    exported transformers (Shape -> Gather -> Unsqueeze -> Concat -> Reshape), whose constant
    index and shape tensors the ``const`` mutator corrupts."""
    rng = np.random.default_rng(3)

    def ints(name: str, values: list[int] | int) -> TensorProto:
        return numpy_helper.from_array(np.array(values, dtype=np.int64), name)

    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], name="transpose", perm=[0, 2, 1]),
        helper.make_node("Slice", ["xt", "slice.starts", "slice.ends", "slice.axes"], ["xs"],
                         name="slice"),
        helper.make_node("Gather", ["xs", "gather.indices"], ["xg"], name="gather", axis=2),
        helper.make_node("Gather", ["table", "row.indices"], ["rows"], name="lookup", axis=0),
        helper.make_node("Concat", ["xg", "rows"], ["cat"], name="concat", axis=0),
        helper.make_node("Shape", ["cat"], ["cat_shape"], name="shape"),
        helper.make_node("Gather", ["cat_shape", "dim0"], ["batch"], name="take_batch", axis=0),
        helper.make_node("Unsqueeze", ["batch", "unsqueeze.axes"], ["batch1"], name="unsqueeze"),
        helper.make_node("Concat", ["batch1", "minus_one"], ["new_shape"], name="shape_concat",
                         axis=0),
        helper.make_node("Reshape", ["cat", "new_shape"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes, "shapes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        initializer=[ints("slice.starts", [1]), ints("slice.ends", [3]), ints("slice.axes", [1]),
                     ints("gather.indices", [2, 0]), _weights(rng, "table", 5, 2, 2),
                     ints("row.indices", [4]), ints("dim0", 0),
                     ints("unsqueeze.axes", [0]), ints("minus_one", [-1])])
    feeds = {"x": np.random.default_rng(13).standard_normal((2, 3, 4)).astype(np.float32)}
    return Seed("shapes", _model(graph), feeds)


def branch() -> Seed:
    """An If whose branches read an outer value (implicit input) and compute differently; the
    condition is computed in the graph so that both the cond edge and the branches can be
    mutated."""
    then_graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["then_out"], name="then_add")], "then_branch",
        [], [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [2, 3])],
        initializer=[numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")])
    else_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["else_out"], name="else_mul")], "else_branch",
        [], [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [2, 3])],
        initializer=[numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], name="sum", keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"], name="positive"),
        helper.make_node("If", ["cond"], ["chosen"], name="if", then_branch=then_graph,
                         else_branch=else_graph),
        helper.make_node("Tanh", ["chosen"], ["y"], name="tanh"),
    ]
    graph = helper.make_graph(
        nodes, "branch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")])
    feeds = {"x": np.random.default_rng(14).standard_normal((2, 3)).astype(np.float32)}
    return Seed("branch", _model(graph), feeds)


def function() -> Seed:
    """A model-local function with an attribute parameter (``ref_attr_name``), called twice
    with different attribute values, so inlining, attribute binding and renaming all run."""
    body = [
        helper.make_node("Constant", [], ["alpha"], name="alpha",
                         value_float=0.0),
        helper.make_node("Mul", ["X", "alpha"], ["scaled"], name="scale"),
        helper.make_node("Tanh", ["scaled"], ["Y"], name="tanh"),
    ]
    # The Constant's value comes from the call's "alpha" attribute.
    body[0].attribute[0].ref_attr_name = "alpha"
    scaled_tanh = helper.make_function(
        "local", "ScaledTanh", ["X"], ["Y"], body,
        opset_imports=[helper.make_opsetid("", OPSET)], attributes=["alpha"])
    nodes = [
        helper.make_node("ScaledTanh", ["x"], ["a"], name="call1", domain="local", alpha=0.5),
        helper.make_node("ScaledTanh", ["a"], ["b"], name="call2", domain="local", alpha=2.0),
        helper.make_node("Relu", ["b"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "function",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("local", 1)],
                              producer_name="ember-fuzz", functions=[scaled_tanh])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    feeds = {"x": np.random.default_rng(15).standard_normal((3, 4)).astype(np.float32)}
    return Seed("function", model, feeds)


def tinynet() -> Seed:
    """The bundled model (dynamic batch ``N``, run with N=2)."""
    model = onnx.load(str(BUNDLED_MODEL))
    feeds = {"input": np.random.default_rng(16).standard_normal((2, 3, 32, 32))
             .astype(np.float32)}
    return Seed("tinynet", model, feeds)


BUILDERS = {"mlp": mlp, "convnet": convnet, "shapes": shapes, "branch": branch,
            "function": function, "tinynet": tinynet}


@lru_cache(maxsize=None)
def seed(name: str) -> Seed:
    return BUILDERS[name]()


def all_seeds() -> list[Seed]:
    return [seed(name) for name in BUILDERS]

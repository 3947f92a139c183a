"""Builds ember/models/tinynet.onnx, the bundled default model (deterministic random weights).

A small image classifier with the ops real CNNs use: Conv + BatchNormalization + Relu, a
residual Add, MaxPool, GlobalAveragePool, Flatten and Gemm, with a dynamic batch dimension
``N`` (input ``N x 3 x 32 x 32``, output ``N x 10``).

    python tools/make_tinynet.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = Path(__file__).resolve().parent.parent / "ember" / "models" / "tinynet.onnx"


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, *shape: int, scale: float = 0.2) -> str:
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def conv_bn_relu(x: str, cin: int, cout: int, name: str, stride: int = 1,
                     relu: bool = True) -> str:
        w = weight(f"{name}.w", cout, cin, 3, 3, scale=(2.0 / (cin * 9)) ** 0.5)
        nodes.append(helper.make_node("Conv", [x, w], [f"{name}.conv"], name=f"{name}.conv",
                                      kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                      strides=[stride, stride]))
        inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, cout).astype(np.float32),
                                             f"{name}.gamma"))
        inits.append(numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32),
                                             f"{name}.beta"))
        inits.append(numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32),
                                             f"{name}.mean"))
        inits.append(numpy_helper.from_array(rng.uniform(0.5, 1.5, cout).astype(np.float32),
                                             f"{name}.var"))
        nodes.append(helper.make_node(
            "BatchNormalization",
            [f"{name}.conv", f"{name}.gamma", f"{name}.beta", f"{name}.mean", f"{name}.var"],
            [f"{name}.bn"], name=f"{name}.bn", epsilon=1e-5))
        if not relu:
            return f"{name}.bn"
        nodes.append(helper.make_node("Relu", [f"{name}.bn"], [f"{name}.out"],
                                      name=f"{name}.relu"))
        return f"{name}.out"

    x = conv_bn_relu("input", 3, 16, "stem")
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], name="pool", kernel_shape=[2, 2],
                                  strides=[2, 2]))
    y = conv_bn_relu("pool", 16, 16, "block.a")
    y = conv_bn_relu(y, 16, 16, "block.b", relu=False)
    nodes.append(helper.make_node("Add", ["pool", y], ["block.sum"], name="block.add"))
    nodes.append(helper.make_node("Relu", ["block.sum"], ["block.out"], name="block.relu"))
    z = conv_bn_relu("block.out", 16, 32, "down", stride=2)
    nodes.append(helper.make_node("GlobalAveragePool", [z], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1))
    weight("fc.w", 10, 32, scale=0.25)
    weight("fc.b", 10, scale=0.1)
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc",
                                  transB=1))
    graph = helper.make_graph(
        nodes, "tinynet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="ember-tools")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(), OUT)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")

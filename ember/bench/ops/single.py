"""A configuration as a runnable one-node ONNX model, its FLOPs, and the torch contender.

The node's constant inputs (weights, bias) become initializers with seeded random values of
the same shape -- constant weights let both runtimes pre-pack them, as they do inside the
model -- and the other inputs graph inputs.  For MatMul/Gemm, torch's matmul (MKL or oneDNN
underneath, reported as "mkl") is the BLAS baseline.
"""

from __future__ import annotations

import importlib.util
import zlib
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ember.bench.ops.configs import OpConfig
from ember.bench.peers import Prepared

# The opset and IR version of the single-op models: these four ops have not changed since
# opset 13, and every ONNX Runtime this bench supports reads IR 8.
OPSET = 17
IR_VERSION = 8
# Role names of the inputs, by position, used for the single-op models' inputs.
INPUT_ROLES = {"MatMul": ("A", "B"), "Gemm": ("A", "B", "C"), "Conv": ("X", "W", "B"),
               "ConvTranspose": ("X", "W", "B")}


@dataclass
class SingleOp:
    """A configuration as a runnable one-node model: ``feeds`` are its graph inputs,
    ``constants`` the values of its initializers (the torch contender needs them too)."""

    config: OpConfig
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    constants: dict[str, np.ndarray]
    input_names: list[str]  # by input position
    output_name: str = "Y"


def build_single_op(config: OpConfig, seed: int | None = None) -> SingleOp:
    """The configuration as a checked one-node ONNX model with seeded standard-normal data
    (the seed defaults to one derived from the configuration, so reruns see the same
    numbers)."""
    if config.dtype != TensorProto.FLOAT:
        raise ValueError(f"{config.summary()}: only float32 configurations can be built")
    roles = INPUT_ROLES[config.op]
    rng = np.random.default_rng(_seed(config) if seed is None else seed)
    names, graph_inputs, initializers = [], [], []
    feeds: dict[str, np.ndarray] = {}
    constants: dict[str, np.ndarray] = {}
    for position, shape in enumerate(config.shapes):
        if shape is None:
            names.append("")
            continue
        name = roles[position]
        names.append(name)
        array = rng.standard_normal(shape, dtype=np.float32)
        if config.constant[position]:
            constants[name] = array
            initializers.append(numpy_helper.from_array(array, name))
        else:
            feeds[name] = array
            graph_inputs.append(helper.make_tensor_value_info(name, config.dtype, shape))
    node = helper.make_node(config.op, names, ["Y"], name=config.op.lower(),
                            **dict(config.attributes))
    graph = helper.make_graph([node], f"single_{config.op.lower()}", graph_inputs,
                              [helper.make_tensor_value_info("Y", config.dtype, None)],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION, producer_name="ember bench --ops")
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model)
    return SingleOp(config, model, feeds, constants, names)


def _seed(config: OpConfig) -> int:
    return zlib.crc32(repr(config).encode())


def single_op_flops(single: SingleOp) -> int | None:
    """The op's FLOPs by ember's cost rules (a multiply-add is two; a bias adds one per
    output), so the GFLOP/s here and in ``ember profile`` agree."""
    from ember.frontend.onnx import import_onnx
    from ember.ops.cost import estimate_flops

    total = estimate_flops(import_onnx(single.model)).total
    return total if isinstance(total, int) else None


def torch_matmul_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def prepare_torch_matmul(single: SingleOp, threads: int) -> Prepared:
    """MatMul / Gemm with torch's matmul (MKL or oneDNN underneath: the BLAS baseline), its
    constants converted once, as a runtime holding pre-loaded weights would."""
    import torch

    config = single.config
    if config.op not in ("MatMul", "Gemm"):
        raise ValueError(f"the torch matmul contender runs MatMul and Gemm, not {config.op}")
    torch.set_num_threads(threads)
    tensors = {name: torch.from_numpy(array) for name, array in single.constants.items()}
    names = single.input_names

    def operand(position: int, feeds: Mapping[str, np.ndarray]) -> Any:
        name = names[position]
        return tensors[name] if name in tensors else torch.from_numpy(feeds[name])

    if config.op == "MatMul":
        def compute(feeds: Mapping[str, np.ndarray]) -> Any:
            return torch.matmul(operand(0, feeds), operand(1, feeds))
    else:
        alpha, beta = config.attribute("alpha"), config.attribute("beta")
        trans_a, trans_b = config.attribute("transA"), config.attribute("transB")
        has_bias = len(names) > 2 and bool(names[2])

        def compute(feeds: Mapping[str, np.ndarray]) -> Any:
            a, b = operand(0, feeds), operand(1, feeds)
            a, b = (a.t() if trans_a else a), (b.t() if trans_b else b)
            if has_bias:
                return torch.addmm(operand(2, feeds), a, b, beta=beta, alpha=alpha)
            product = torch.mm(a, b)
            return product if alpha == 1.0 else product * alpha

    def run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            return [compute(feeds).numpy()]

    return Prepared(run)

"""Compiled code's OpenMP threads coexist with ONNX Runtime's and PyTorch's in one process.

ember's kernels use OpenMP (libgomp with gcc), PyTorch uses its own OpenMP runtime and ONNX
Runtime its own thread pool.  Running them alternately and concurrently in one process must
neither deadlock nor change anyone's results; ember's thread count is adjustable per module.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

M, K, N = 96, 256, 320  # big enough that the kernels take their parallel loops


def _model() -> tuple[onnx.ModelProto, np.ndarray]:
    w = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])],
                              initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model, w


def _expected(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0)


@pytest.fixture(scope="module")
def setup():
    model, w = _model()
    module = ember.compile(model)
    assert module.build.host_nodes == []
    assert any("omp" in line for line in module.build.source.splitlines() if "pragma" in line)
    return model, w, module


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_thread_count_does_not_change_results(setup, threads):
    _, w, module = setup
    x = np.random.default_rng(threads).standard_normal((M, K)).astype(np.float32)
    module.set_num_threads(threads)
    try:
        np.testing.assert_allclose(module(x), _expected(x, w), rtol=1e-4, atol=1e-3)
    finally:
        module.set_num_threads(0)  # back to the default (all cores)


def test_alternating_and_concurrent_with_onnxruntime_and_torch(setup):
    import onnxruntime
    import torch

    model, w, module = setup
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((M, K)).astype(np.float32) for _ in range(6)]
    torch_w = torch.from_numpy(w)

    for x in inputs:  # alternate in one thread
        expected = _expected(x, w)
        np.testing.assert_allclose(module(x), expected, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=1e-4,
                                   atol=1e-3)
        np.testing.assert_allclose(torch.relu(torch.from_numpy(x) @ torch_w).numpy(), expected,
                                   rtol=1e-4, atol=1e-3)

    errors: list[BaseException] = []

    def worker(run) -> None:
        try:
            for _ in range(15):
                for x in inputs:
                    np.testing.assert_allclose(run(x), _expected(x, w), rtol=1e-4, atol=1e-3)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [
        threading.Thread(target=worker, args=(module,)),
        threading.Thread(target=worker, args=(lambda x: session.run(None, {"x": x})[0],)),
        threading.Thread(target=worker,
                         args=(lambda x: torch.relu(torch.from_numpy(x) @ torch_w).numpy(),)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a runtime deadlocked"
    assert not errors, errors[0]

"""A caller's input array is read where it lies, at any address its element type allows.

numpy places a large array 16 or 32 bytes past a page boundary, so when the kernels assumed
64-byte aligned inputs the runtime copied every such input on every call.  Kernels now promise
64-byte alignment only of the workspace and the weights blob (``element_aligned`` parameters,
``input_alignment`` in the library's signature); libraries built before that still get an
aligned copy.  The oracle is ONNX Runtime on the same model and input.
"""

from __future__ import annotations

import re
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.codegen.c import kernel_unit
from ember.runtime.errors import ModelLoadError
from ember.runtime.signature import LEGACY_INPUT_ALIGNMENT, parse_signature

ort = pytest.importorskip("onnxruntime")


def conv_relu_gemm() -> onnx.ModelProto:
    """A model whose first kernels vectorize over the input: a 3x3 convolution, a ReLU and
    a Gemm over the flattened features."""
    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w", (8, 4, 3, 3)), ("b", (8,)), ("g", (8 * 10 * 10, 5)))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "g"], ["y"]),
             helper.make_node("Add", ["x", "x"], ["twice"])]
    graph = helper.make_graph(
        nodes, "aligned", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5]),
         helper.make_tensor_value_info("twice", TensorProto.FLOAT, [2, 4, 10, 10])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def at_offset(array: np.ndarray, offset: int) -> np.ndarray:
    """A copy of ``array`` whose data starts ``offset`` bytes past a 64-byte boundary."""
    raw = np.zeros(array.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    placed = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    placed[...] = array
    assert placed.ctypes.data % 64 == offset
    return placed


@pytest.fixture(scope="module")
def model_and_reference():
    model = conv_relu_gemm()
    x = np.random.default_rng(4).standard_normal((2, 4, 10, 10)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return model, x, session.run(None, {"x": x})


def test_kernels_reading_a_model_input_do_not_assume_its_alignment(model_and_reference):
    model, _, _ = model_and_reference
    build = ember.compile(model).build  # a static model compiles at once
    assumed = set(re.findall(r"(\w+) = __builtin_assume_aligned\(\1, 64\)", build.source))
    assert assumed, "workspace and weight buffers keep their 64-byte promise"
    readers = [impl for impl in build.kernels if "x" in impl.inputs]
    assert len(readers) >= 2  # the convolution and the Add
    for impl in readers:
        position = impl.inputs.index("x")
        assert position in impl.func.attr("element_aligned", ()), impl.func.name
        text = kernel_unit(impl.func, build.target).unit.source
        param = impl.func.params[position].name
        assert f"{param} = __builtin_assume_aligned" not in text, text
        assert re.search(r"out0 = __builtin_assume_aligned\(out0, 64\)", text), text
    assert build.signature["input_alignment"] == 1


@pytest.mark.parametrize("offset", [4, 16, 32])
def test_an_input_off_a_64_byte_boundary_is_read_in_place(model_and_reference, offset,
                                                          monkeypatch):
    model, x, expected = model_and_reference
    module = ember.compile(model)
    module(x)  # build first
    placed = at_offset(x, offset)
    passed = []
    _, runtime = module._last
    ember_run = runtime._run_entry

    def spy(inputs, outputs, *rest):
        passed.append(inputs[0])  # the address ember_run reads the input at
        return ember_run(inputs, outputs, *rest)

    monkeypatch.setattr(runtime, "_run_entry", spy)
    y, twice = module(placed)
    assert passed == [placed.ctypes.data]  # no copy
    np.testing.assert_allclose(y, expected[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(twice, expected[1])


def test_a_library_without_input_alignment_still_gets_aligned_copies(model_and_reference,
                                                                     tmp_path):
    model, x, expected = model_and_reference
    module = ember.compile(model)
    module.save(tmp_path / "artifact")
    runtime = ember.load(tmp_path / "artifact")
    assert runtime._input_alignment == 1
    runtime._input_alignment = LEGACY_INPUT_ALIGNMENT  # as a library from before the field
    placed = at_offset(x, 16)
    spec = runtime.inputs[0]
    copied = runtime._input_array(spec, placed)
    assert copied is not placed and copied.ctypes.data % 64 == 0
    np.testing.assert_allclose(runtime(placed)[0], expected[0], rtol=1e-4, atol=1e-4)

    legacy = (b'{"abi": 1, "inputs": [], "outputs": [], "workspace_size": 0, '
              b'"weights_size": 0, "weights": [], "host_nodes": []}')
    assert parse_signature(legacy, "old.so").input_alignment == LEGACY_INPUT_ALIGNMENT
    for bad in (b"0", b"3", b"true", b"8192"):
        with pytest.raises(ModelLoadError, match="input_alignment"):
            parse_signature(legacy[:-1] + b', "input_alignment": ' + bad + b"}", "bad.so")


SANITIZED_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, sys.argv[1] + "/tests/runtime")
    import numpy as np
    import ember
    from test_input_alignment import at_offset, conv_relu_gemm

    module = ember.compile(conv_relu_gemm(), sanitize=True)
    x = np.random.default_rng(4).standard_normal((2, 4, 10, 10)).astype(np.float32)
    reference = module(at_offset(x, 0))
    for offset in (4, 8, 36):
        for got, want in zip(module(at_offset(x, offset)), reference):
            np.testing.assert_array_equal(got, want)
    print("ok")
""")


def test_unaligned_inputs_are_clean_under_asan_and_ubsan(run_sanitized):
    assert run_sanitized(SANITIZED_CHILD).strip().endswith("ok")

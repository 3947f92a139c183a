"""One build for every size of a sequence length (ember.dynamic_dims): a module compiled once
serves many sizes, checked against ONNX Runtime; a size that breaks a guard gets a build of
its own with the guard named; a size that escapes the trace refuses the build."""

import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.runtime.dims_model import RuntimeDimsModel

ort = pytest.importorskip("onnxruntime")
HIDDEN = 32


@pytest.fixture(autouse=True)
def runtime_dims_on(monkeypatch):
    """Builds over run-time dims are the default (``EMBER_RUNTIME_DIMS`` unset)."""
    monkeypatch.delenv("EMBER_RUNTIME_DIMS", raising=False)


def rows_model() -> onnx.ModelProto:
    """Softmax over S, LayerNorm and Softmax over the hidden axis, ReduceMean over S."""
    gain = numpy_helper.from_array(np.linspace(0.5, 1.5, HIDDEN).astype(np.float32), "g")
    bias = numpy_helper.from_array(np.linspace(-1, 1, HIDDEN).astype(np.float32), "b")
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=1),
             helper.make_node("Mul", ["p", "x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "g", "b"], ["y"], axis=-1),
             helper.make_node("Softmax", ["y"], ["z"], axis=-1),
             helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=0)]
    graph = helper.make_graph(
        nodes, "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", HIDDEN])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", "S", HIDDEN]),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N", HIDDEN])], [gain, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8   # what every ONNX Runtime reads
    return model


def attention_model() -> onnx.ModelProto:
    """Single-head self-attention with a residual LayerNorm: GEMMs whose M, N and K (S) vary."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(
        (rng.standard_normal((HIDDEN, HIDDEN)) * 0.2).astype(np.float32), f"w{i}")
        for i in range(3)]
    gain = numpy_helper.from_array(np.ones(HIDDEN, np.float32), "g")
    bias = numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["q"]),
             helper.make_node("MatMul", ["x", "w1"], ["k"]),
             helper.make_node("MatMul", ["x", "w2"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"]),
             helper.make_node("Add", ["o", "x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "g", "b"], ["y"], axis=-1),
             helper.make_node("ReduceMean", ["y"], ["m"], axes=[1], keepdims=0)]
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", HIDDEN]),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, ["N", HIDDEN])],
        weights + [gain, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8   # what every ONNX Runtime reads
    return model


def shape_arithmetic_model() -> onnx.ModelProto:
    """How exporters compute with shapes: a Reshape target built from Shape and Concat (with a
    -1), Range up to the length, and the length itself used as data (a scale)."""
    def ints(name: str, values: list[int]) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.int64), name)

    constants = [ints("zero", [0]), ints("two", [2]), ints("one", [1]),
                 ints("heads", [2, -1]), ints("axis1", [1]),
                 numpy_helper.from_array(np.array(0, np.int64), "start"),
                 numpy_helper.from_array(np.array(1, np.int64), "step"),
                 numpy_helper.from_array(np.array(1, np.int64), "length_at")]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "zero", "two"], ["lead"]),
             helper.make_node("Concat", ["lead", "heads"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["split"]),
             helper.make_node("Transpose", ["split"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Gather", ["shape", "length_at"], ["length"], axis=0),
             helper.make_node("Range", ["start", "length", "step"], ["positions"]),
             helper.make_node("Unsqueeze", ["positions", "axis1"], ["column"]),
             helper.make_node("Cast", ["column"], ["offsets"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["t", "offsets"], ["shifted"]),
             helper.make_node("Mul", ["length", "two"], ["twice"]),
             helper.make_node("Cast", ["twice"], ["scale"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["shifted", "scale"], ["y"])]
    graph = helper.make_graph(
        nodes, "shapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "S", HIDDEN // 2])],
        constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8   # what every ONNX Runtime reads
    return model


def test_shapes_computed_from_the_length_keep_it_as_a_run_time_size():
    model = shape_arithmetic_model()
    session = ort.InferenceSession(model.SerializeToString())
    module = ember.compile(model)
    for length in (5, 7, 4, 6):
        _check(module, session, 2, length)
        assert isinstance(module._last[1], RuntimeDimsModel), module.last_refusal
    assert len(module.build_reasons) == 1, module.build_reasons


def _check(module, session, batch: int, length: int) -> None:
    x = np.random.default_rng(batch * 1000 + length).standard_normal(
        (batch, length, HIDDEN)).astype(np.float32)
    outputs = module(x)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    for got, want in zip(outputs, session.run(None, {"x": x}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("build", [rows_model, attention_model])
def test_one_build_serves_every_size_of_a_class(build):
    model = build()
    session = ort.InferenceSession(model.SerializeToString())
    module = ember.compile(model)
    for length in (5, 7, 4, 6):   # one class of sizes: [4, 7]
        _check(module, session, 2, length)
    assert len(module.build_reasons) == 1, module.build_reasons
    assert isinstance(module._last[1], RuntimeDimsModel)


def test_sizes_seen_before_skip_the_guards(monkeypatch):
    """The guards of a traced build are checked once per set of sizes: a call at sizes seen
    before reuses the binding (for a CNN with traced image sizes the guards cost 8x its
    kernels), and other sizes are still checked."""
    from ember.core.traced import SizeTrace

    checked = []
    original = SizeTrace.failed_guard

    def counting(trace, dims):
        checked.append(tuple(dims))
        return original(trace, dims)

    monkeypatch.setattr(SizeTrace, "failed_guard", counting)
    model = attention_model()
    session = ort.InferenceSession(model.SerializeToString())
    module = ember.compile(model)
    _check(module, session, 2, 4)  # the build (its tracing checks sizes of its own)
    checked.clear()
    for length in (5, 5, 7, 5, 7, 6, 4, 6):
        _check(module, session, 2, length)
    assert sorted(checked) == [(5,), (6,), (7,)], checked  # each set of sizes once
    assert len(module.build_reasons) == 1, module.build_reasons


def test_sizes_across_classes_and_batches_match_onnx_runtime():
    model = attention_model()
    session = ort.InferenceSession(model.SerializeToString())
    module = ember.compile(model)
    sizes = [(2, 5), (3, 9), (1, 17), (2, 33), (2, 40), (1, 64), (2, 100), (3, 12), (2, 30)]
    for batch, length in sizes:
        _check(module, session, batch, length)
    assert len(module.build_reasons) < len(sizes) + 3   # sizes share builds
    traced = [reason for reason in module.build_reasons if "guard" in reason]
    assert traced and all(" is outside " in reason and "this build covers" in reason
                          for reason in traced)


def test_a_size_that_breaks_a_guard_gets_its_own_build_and_says_which():
    model = rows_model()
    session = ort.InferenceSession(model.SerializeToString())
    module = ember.compile(model)
    _check(module, session, 2, 5)
    _check(module, session, 2, 1)   # a length of 1 broadcasts: the code differs
    # in the user's terms: the lengths the first build covers, then the guard itself
    assert "S=1 is outside 4..7, the sizes of S this build covers" in \
        module.build_reasons[-1], module.build_reasons[-1]
    assert "the guard 'S != 1'" in module.build_reasons[-1]
    assert "ops/shape_infer.py" in module.build_reasons[-1]   # the compiler line that decided
    _check(module, session, 2, 6)   # back in the first build's class
    assert len(module.build_reasons) == 2


def test_with_batch_blocks_every_build_says_which_size_needed_it():
    """Batch block sizes and builds for every sequence length together: a new batch size is a
    block, a length outside the traced class names the guard it breaks and gets one more
    build for every length."""
    model = attention_model()
    session = ort.InferenceSession(model.SerializeToString())
    module = ember.compile(model)
    assert module.batch_split is not None, module.batch_split_reason
    for batch, length in ((2, 5), (3, 5), (2, 7), (4, 7), (3, 6), (2, 9), (3, 12)):
        _check(module, session, batch, length)
    reasons = module.build_reasons
    assert reasons[:2] == ["the first call",
                           "new N=1 (compiled for 2); a block size the batch runs in"], reasons
    assert reasons[2].startswith("new S=9 (compiled for 5); the build for every size does not "
                                 "serve them: S=9 is outside 4..7, the sizes of S this build "
                                 "covers (the guard '"), reasons
    assert reasons[2].endswith("; one build for every size of S"), reasons
    # S=12 in a batch of 3 runs on blocks of 2 and 1, each served by a build for every S
    assert len(reasons) <= 4, reasons


def test_a_batch_that_mixes_samples_gets_one_build_for_every_size():
    """A softmax over the batch keeps it out of blocks; the batch is then a run-time dim
    like any other."""
    weight = numpy_helper.from_array(
        np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Softmax", ["h"], ["y"], axis=0)],
        "mixes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString())
    module = ember.compile(model)
    assert module.batch_split is None
    for batch in (4, 5, 7, 6, 9):
        x = np.random.default_rng(batch).standard_normal((batch, 6)).astype(np.float32)
        np.testing.assert_allclose(module(x), session.run(None, {"x": x})[0], rtol=1e-5,
                                   atol=1e-6)
        assert isinstance(module._last[1], RuntimeDimsModel)
    assert len(module.build_reasons) == 2, module.build_reasons
    assert "N=9 is outside " in module.build_reasons[1], module.build_reasons[1]


def test_a_size_read_as_a_plain_number_refuses_the_build(monkeypatch, caplog):
    """The safety net: were the memory plan to read a size with int(), the trace is refused
    with the line named, and the module compiles a specialization per size instead."""
    import ember.passes.memory_plan as memory_plan

    monkeypatch.setattr(memory_plan, "class_bound", lambda size: int(size))
    model = rows_model()
    session = ort.InferenceSession(model.SerializeToString())
    module = ember.compile(model)
    _check(module, session, 2, 5)
    _check(module, session, 2, 6)
    assert not isinstance(module._last[1], RuntimeDimsModel)
    assert "is read as a plain number at passes/memory_plan.py" in module.last_refusal
    assert "sizes other than the batch are compiled into the code" in module.build_reasons[-1]


def test_runtime_dims_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("EMBER_RUNTIME_DIMS", "0")
    model = rows_model()
    session = ort.InferenceSession(model.SerializeToString())
    module = ember.compile(model)
    _check(module, session, 2, 5)
    _check(module, session, 2, 6)
    assert len(module.build_reasons) == 2 and module.runtime_dims_reason == \
        "EMBER_RUNTIME_DIMS is 0"
    assert not isinstance(module._last[1], RuntimeDimsModel)


def test_a_traced_module_saves_an_artifact_of_the_shapes_asked_for(tmp_path):
    """An artifact holds one length: a module that ran two refuses to drop one silently
    (tests/frontend/test_torch_save_lengths.py) and saves the one ``input_shapes`` names."""
    model = rows_model()
    session = ort.InferenceSession(model.SerializeToString())
    module = ember.compile(model)
    _check(module, session, 2, 5)
    _check(module, session, 2, 6)
    with pytest.raises(ember.EmberError, match=r"keep only the last call's \(x\[2, 6, "):
        module.save(tmp_path / "artifact")
    module.save(tmp_path / "artifact", input_shapes={"x": (2, 6, HIDDEN)})
    x = np.random.default_rng(0).standard_normal((2, 6, HIDDEN)).astype(np.float32)
    loaded = ember.load(tmp_path / "artifact")
    for got, want in zip(loaded(x), session.run(None, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


SANITIZED_CHILD = textwrap.dedent("""
    import os
    import sys
    os.environ["EMBER_RUNTIME_DIMS"] = "1"
    sys.path.insert(0, sys.argv[1] + "/tests/compile")
    import numpy as np
    import ember
    from ember.runtime.dims_model import RuntimeDimsModel
    from test_runtime_dims import attention_model, rows_model, shape_arithmetic_model

    for build in (rows_model, attention_model, shape_arithmetic_model):
        module = ember.compile(build(), sanitize=True)
        for length in (5, 7, 4, 6, 16, 20):
            x = np.random.default_rng(length).standard_normal((2, length, 32))
            outputs = module(x.astype(np.float32))
            assert all(np.isfinite(o).all() for o in outputs)
            assert isinstance(module._last[1], RuntimeDimsModel), (length, module.last_refusal)
    print("ok")
""")


def test_traced_builds_are_clean_under_asan_and_ubsan(run_sanitized):
    """Run-time extents, strides and workspace offsets at several sizes of two classes."""
    assert run_sanitized(SANITIZED_CHILD).strip().endswith("ok")

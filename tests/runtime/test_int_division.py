"""Integer Div and Mod by zero are run-time errors naming the node; INT_MIN / -1 is defined.

C leaves both undefined.  ONNX Runtime reports an integer division by zero as an error (and
dies of SIGFPE on INT_MIN / -1 for 32- and 64-bit types), numpy returns 0 with a warning.
ember's compiled model checks the divisor before the kernel runs -- the same channel as
Gather's index checks -- and fails with an ``ExecutionError`` that names the op and the node,
also when the divisor is computed by another node, in a loaded artifact, and in the reference
executor.  ``INT_MIN / -1`` wraps to INT_MIN and ``INT_MIN % -1`` is 0, as numpy and the ONNX
reference give.  Results are checked against numpy (and ONNX Runtime where it does not fail),
and the kernels run clean under AddressSanitizer and UBSan.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ember
import ember.runtime
from ember.core.errors import ExecutionError
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor

ONNX_TYPE = {np.int8: TensorProto.INT8, np.int16: TensorProto.INT16,
             np.int32: TensorProto.INT32, np.int64: TensorProto.INT64,
             np.uint8: TensorProto.UINT8, np.uint32: TensorProto.UINT32,
             np.uint64: TensorProto.UINT64}
OPS = [("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})]


def _model(op: str, attrs: dict, dtype, shape_a=(6,), shape_b=(6,), constant_b=None):
    elem = ONNX_TYPE[dtype]
    inputs = [helper.make_tensor_value_info("a", elem, list(shape_a))]
    initializers = []
    if constant_b is None:
        inputs.append(helper.make_tensor_value_info("b", elem, list(shape_b)))
    else:
        initializers.append(numpy_helper.from_array(np.asarray(constant_b, dtype), "b"))
    graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"], name="the_div", **attrs)],
                              "intdiv", inputs, [helper.make_tensor_value_info("y", elem, None)],
                              initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _numpy(op: str, attrs: dict, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C's truncating division and remainder (fmod=1), numpy's floor remainder (fmod=0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with np.errstate(all="ignore"):
            if op == "Div":
                quotient = np.trunc(a.astype(np.float64) / b.astype(np.float64))
                exact = (a - np.fmod(a, b)) // b   # exact for 64-bit too
                return np.where(np.abs(quotient) < 2 ** 52, quotient.astype(a.dtype),
                                exact.astype(a.dtype)).astype(a.dtype)
            return (np.fmod if attrs.get("fmod") else np.mod)(a, b).astype(a.dtype)


def _assert_names_the_node(error: BaseException, op: str) -> None:
    message = str(error)
    assert f"{op}: integer division by zero in node 'the_div'" in message, message


@pytest.mark.parametrize("op,attrs", OPS, ids=["Div", "Mod-floor", "Mod-fmod"])
@pytest.mark.parametrize("dtype", list(ONNX_TYPE), ids=lambda t: t.__name__)
def test_a_zero_divisor_is_an_error_naming_the_node(op, attrs, dtype):
    model = _model(op, attrs, dtype)
    module = ember.compile(model)
    a = np.array([7, 100, 3, 9, 12, 5], dtype)
    b = np.array([2, 7, 1, 4, 5, 3], dtype)
    np.testing.assert_array_equal(module(a, b), _numpy(op, attrs, a, b))
    zero = b.copy()
    zero[3] = 0
    with pytest.raises(ExecutionError) as info:
        module(a, zero)
    _assert_names_the_node(info.value, op)
    with pytest.raises(ExecutionError) as info:  # the reference executor says the same
        ReferenceExecutor(import_onnx(model)).run({"a": a, "b": zero})
    _assert_names_the_node(info.value, op)
    np.testing.assert_array_equal(module(a, b), _numpy(op, attrs, a, b))  # still usable


def test_onnxruntime_also_refuses_a_zero_divisor():
    """The oracle for "an error, not a value" (in a child: ORT may also die of a signal)."""
    script = textwrap.dedent("""
        import sys, numpy as np, onnxruntime as ort
        from onnx import TensorProto, helper
        graph = helper.make_graph([helper.make_node("Div", ["a", "b"], ["y"])], "g",
            [helper.make_tensor_value_info(n, TensorProto.INT32, [3]) for n in "ab"],
            [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                                  ir_version=8)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        try:
            session.run(None, {"a": np.array([1, 2, 3], np.int32),
                               "b": np.array([1, 0, 1], np.int32)})
        except Exception as error:
            print("refused:", error)
        else:
            print("returned a value")
    """)
    pytest.importorskip("onnxruntime")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert "returned a value" not in result.stdout
    assert result.returncode != 0 or "division by zero" in result.stdout, result.stdout


def test_a_computed_divisor_inside_a_fused_kernel_is_checked():
    """d = b - c feeds the Div: fusion keeps it out of the Div's kernel, so that the value the
    check reads exists; the error names the Div (and the results match numpy otherwise)."""
    elem = TensorProto.INT32
    graph = helper.make_graph(
        [helper.make_node("Sub", ["b", "c"], ["d"], name="diff"),
         helper.make_node("Add", ["a", "one"], ["a1"], name="plus_one"),
         helper.make_node("Div", ["a1", "d"], ["q"], name="the_div"),
         helper.make_node("Mul", ["q", "q"], ["y"], name="square")], "fused",
        [helper.make_tensor_value_info(n, elem, [2, 5]) for n in "abc"],
        [helper.make_tensor_value_info("y", elem, None)],
        initializer=[numpy_helper.from_array(np.array(1, np.int32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    module = ember.compile(model)
    rng = np.random.default_rng(0)
    a = rng.integers(-1000, 1000, (2, 5), dtype=np.int32)
    b = rng.integers(-50, 50, (2, 5), dtype=np.int32)
    c = np.where(b == 7, 8, 7).astype(np.int32)  # b - c is never 0
    q = _numpy("Div", {}, a + 1, b - c)
    np.testing.assert_array_equal(module(a, b, c), q * q)
    np.testing.assert_array_equal(module(a, b, c), ReferenceEvaluator(model).run(
        None, {"a": a, "b": b, "c": c})[0])
    c_zero = c.copy()
    c_zero[1, 2] = b[1, 2]
    with pytest.raises(ExecutionError) as info:
        module(a, b, c_zero)
    _assert_names_the_node(info.value, "Div")


def test_a_broadcast_divisor_is_checked(tmp_path):
    model = _model("Div", {}, np.int64, shape_a=(3, 4), shape_b=(1, 4))
    module = ember.compile(model)
    a = np.arange(12, dtype=np.int64).reshape(3, 4) - 6
    b = np.array([[3, -2, 5, 1]], np.int64)
    np.testing.assert_array_equal(module(a, b), _numpy("Div", {}, a, b))
    with pytest.raises(ExecutionError, match="in node 'the_div'"):
        module(a, np.array([[3, -2, 0, 1]], np.int64))
    # a saved artifact carries the check, and the runtime alone reports it the same way
    loaded = ember.runtime.load(module.save(tmp_path / "div.ember"))
    np.testing.assert_array_equal(loaded(a, b), _numpy("Div", {}, a, b))
    with pytest.raises(ember.EmberError) as info:
        loaded(a, np.array([[0, -2, 5, 1]], np.int64))
    _assert_names_the_node(info.value, "Div")


def test_a_constant_zero_divisor_fails_when_the_node_runs():
    model = _model("Div", {}, np.int32, constant_b=[1, 2, 0, 4, 5, 6])
    module = ember.compile(model)
    with pytest.raises(ExecutionError) as info:
        module(np.arange(6, dtype=np.int32))
    _assert_names_the_node(info.value, "Div")


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64],
                         ids=lambda t: t.__name__)
def test_int_min_divided_by_minus_one_wraps_as_numpy(dtype):
    low = np.iinfo(dtype).min
    a = np.array([low, low, low + 1, 7, -7, low], dtype)
    b = np.array([-1, 1, -1, -1, 2, 3], dtype)
    for op, attrs in OPS:
        model = _model(op, attrs, dtype)
        got = ember.compile(model)(a, b)
        np.testing.assert_array_equal(got, _numpy(op, attrs, a, b), err_msg=f"{op} {attrs}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(
                None, {"a": a, "b": b})[0], err_msg=f"{op} {attrs} vs the ONNX reference")
    assert _numpy("Div", {}, a, b)[0] == low  # wraps, as numpy's // does


SANITIZED = textwrap.dedent("""
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[1] + "/tests/runtime")
    import ember
    from ember.core.errors import ExecutionError
    from test_int_division import OPS, _model, _numpy
    for dtype in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64):
        info = np.iinfo(dtype)
        a = np.array([info.min, info.max, info.min, 7, 0, info.max], dtype)
        b = np.array([-1 if info.min else 1, -1 if info.min else 3, 1, 2, 5, 1], dtype)
        zero = b.copy()
        zero[2] = 0
        for op, attrs in OPS:
            module = ember.compile(_model(op, attrs, dtype), sanitize=True)
            assert np.array_equal(module(a, b), _numpy(op, attrs, a, b)), (op, attrs, dtype)
            try:
                module(a, zero)
            except ExecutionError as error:
                assert "integer division by zero in node 'the_div'" in str(error)
            else:
                raise AssertionError(f"{op} {attrs} {dtype}: no error for a zero divisor")
    print("ok")
""")


def test_division_kernels_are_clean_under_asan_and_ubsan(run_sanitized):
    assert run_sanitized(SANITIZED).strip().endswith("ok")

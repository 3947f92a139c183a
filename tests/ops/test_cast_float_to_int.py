"""Cast of NaN, infinities and out-of-range floats to integer types.

ONNX leaves these undefined and C makes the conversion undefined behaviour.  ember defines it
as x86-64's scalar conversions do (``ember.ops.cast.float_to_integer``), which is what ONNX
Runtime gives on x86: the oracle here is onnxruntime itself, element by element.  For
float -> uint32, ONNX Runtime's vectorized loop and its scalar tail disagree with each other,
so its scalar path (one-element tensors) is the oracle there.  The compiled kernels run clean
under UBSan with float-cast-overflow (which GCC's ``undefined`` group leaves out), and a
negative control shows that flag catches a bare C conversion of NaN.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    __import__("platform").machine() not in ("x86_64", "AMD64"),
    reason="the oracle is ONNX Runtime's x86 conversion")

SOURCES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
           np.float16: TensorProto.FLOAT16}
TARGETS = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
           "uint16": TensorProto.UINT16, "int32": TensorProto.INT32,
           "uint32": TensorProto.UINT32, "int64": TensorProto.INT64,
           "uint64": TensorProto.UINT64}
SPECIAL = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, -1.5, 127.9, 128.0, -129.0,
           255.9, 256.0, -300.7, 300.7, 32767.5, 65535.5, 65536.0, 2.0 ** 31, -2.0 ** 31,
           -2.0 ** 31 - 1, 3e9, 2.0 ** 32, 5e9, -1e10, 1e10, 2.0 ** 63, -2.0 ** 63, 2.5e19,
           -1e19, 1.8e19, 2.0 ** 64, 1e30, -1e30]


def _values(dtype) -> np.ndarray:
    rng = np.random.default_rng(0)
    wide = np.concatenate([SPECIAL, rng.uniform(-3e19, 3e19, 40), rng.uniform(-7e4, 7e4, 40),
                           rng.standard_normal(20) * 1e9])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # float16 overflows to inf: fine
        return wide.astype(dtype)


def _model(source, target: str, length: int):
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TARGETS[target], name="to_int")], "cast",
        [helper.make_tensor_value_info("x", SOURCES[source], [length])],
        [helper.make_tensor_value_info("y", TARGETS[target], [length])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _onnxruntime(source, target: str, x: np.ndarray) -> np.ndarray:
    """ONNX Runtime's result; for uint32 one element at a time (its scalar path)."""
    if target != "uint32":
        session = ort.InferenceSession(_model(source, target, len(x)).SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]
    session = ort.InferenceSession(_model(source, target, 1).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"x": x[i:i + 1]})[0] for i in range(len(x))])


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("source", list(SOURCES), ids=lambda t: t.__name__)
def test_cast_of_special_and_out_of_range_floats_matches_onnxruntime(source, target):
    x = _values(source)
    want = _onnxruntime(source, target, x)
    model = _model(source, target, len(x))
    for level in (0, 2):
        np.testing.assert_array_equal(ember.compile(model, opt_level=level)(x), want,
                                      err_msg=f"compiled at opt level {level}")
    np.testing.assert_array_equal(ReferenceExecutor(import_onnx(model)).run({"x": x})["y"],
                                  want, err_msg="ember's reference")


def test_nan_to_int32_is_int_min_not_zero():
    """The finding: NaN and infinities became 0; on x86 they are the "integer indefinite"."""
    x = np.array([np.nan, np.inf, -np.inf, 7.9], np.float32)
    got = ember.compile(_model(np.float32, "int32", 4))(x)
    np.testing.assert_array_equal(got, [-2 ** 31, -2 ** 31, -2 ** 31, 7])
    np.testing.assert_array_equal(got, _onnxruntime(np.float32, "int32", x))


SANITIZED = textwrap.dedent("""
    import sys, warnings
    import numpy as np
    sys.path.insert(0, sys.argv[1] + "/tests/ops")
    warnings.simplefilter("ignore")
    import ember
    from test_cast_float_to_int import SOURCES, TARGETS, _model, _values
    for source in SOURCES:
        x = _values(source)
        for target in TARGETS:
            y = ember.compile(_model(source, target, len(x)), sanitize=True)(x)
            np.save(f"{sys.argv[2]}/{source.__name__}_{target}.npy", y)
    print("ok")
""")


def test_casts_are_clean_under_ubsan_with_float_cast_overflow(run_sanitized, tmp_path):
    assert run_sanitized(SANITIZED, str(tmp_path)).strip().endswith("ok")
    for source in SOURCES:
        for target in TARGETS:
            np.testing.assert_array_equal(
                np.load(tmp_path / f"{source.__name__}_{target}.npy"),
                _onnxruntime(source, target, _values(source)))


def test_the_sanitizer_catches_a_bare_conversion_of_nan(tmp_path):
    """Negative control: the flags ember builds sanitized code with do report (int)NaN."""
    from ember.core.target import Target
    from ember.toolchain import ToolchainError, compile_shared, sanitizer_preload

    try:
        preload = sanitizer_preload()
    except ToolchainError as error:
        pytest.skip(f"no ASan runtime: {error}")
    source = ('__attribute__((visibility("default"))) int ember_to_int(double x) '
              '{ return (int)x; }\n')
    library = compile_shared(source, Target.native(), opt_level=1, sanitize=True)
    script = (f"import ctypes; lib = ctypes.CDLL({str(library)!r}); "
              f"lib.ember_to_int.argtypes = [ctypes.c_double]; "
              f"print(lib.ember_to_int(float('nan')))")
    env = dict(os.environ, LD_PRELOAD=preload, ASAN_OPTIONS="detect_leaks=0",
               UBSAN_OPTIONS="halt_on_error=1")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert "outside the range of representable values" in result.stderr, result.stderr[-2000:]

"""ONNX backend-suite cases exported for wasm32-wasi and run in wasmtime, compared with the
suite's expected outputs by the suite's own rule (rtol/atol of each case).

A sample across op families -- elementwise, activations, softmax, convolutions and their
transposes, pools, GEMM/MatMul, normalizations, gathers and scatters, shapes, integer
arithmetic, recurrent-free control of indices -- that compiles without numpy fallbacks.
`tools/conformance_wasm.py` runs every node case (on this machine: 890 pass, 0 wrong; the
rest are not exportable: fallback nodes, non-tensor inputs, unsupported ops)."""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "conformance"))
os.environ.setdefault("ONNX_HOME", str(ROOT / ".onnx_home"))

CASES = [
    "test_abs", "test_add_bcast", "test_sigmoid", "test_tanh", "test_exp", "test_erf",
    "test_softmax_axis_1", "test_logsoftmax_axis_1", "test_gelu_default_1", "test_hardswish",
    "test_mish", "test_prelu_broadcast", "test_conv_with_strides_and_asymmetric_padding",
    "test_convtranspose", "test_convtranspose_pads", "test_maxpool_2d_pads",
    "test_averagepool_2d_strides", "test_globalaveragepool", "test_gemm_default_matrix_bias",
    "test_gemm_default_scalar_bias", "test_matmul_3d", "test_einsum_batch_matmul",
    "test_layer_normalization_4d_axis1", "test_batchnorm_epsilon", "test_instancenorm_example",
    "test_group_normalization_example", "test_gather_0", "test_gather_elements_0",
    "test_scatter_elements_with_axis", "test_transpose_all_permutations_3",
    "test_concat_3d_axis_1", "test_depthtospace_example", "test_where_example",
    "test_argmax_default_axis_example", "test_mod_mixed_sign_int64", "test_div_uint8",
    "test_equal", "test_not_2d", "test_max_example", "test_pow_bcast_scalar",
]

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("ziglang") is None,
                       reason="wasm32 exports compile with the ziglang package (make installs "
                              "it)"),
    pytest.mark.skipif(importlib.util.find_spec("wasmtime") is None,
                       reason="running wasm needs the wasmtime package (make installs it)"),
]


def _cases() -> dict:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {case.name: case for case in load_model_tests(kind="node")
                if case.name in CASES}


@pytest.fixture(scope="module")
def suite_cases() -> dict:
    return _cases()


@pytest.mark.parametrize("name", CASES)
def test_suite_case_through_wasm(name, suite_cases, tmp_path):
    from backend_harness import run_wasm_case

    status, detail = run_wasm_case(suite_cases[name], str(tmp_path))
    assert status == "pass", detail

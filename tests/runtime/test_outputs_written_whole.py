"""The runtime hands ``ember_run`` uninitialized output buffers: every element must be written.

Output arrays are allocated without zeroing (a memset of the whole output on every call cost
as much as a small kernel).  That is only sound if each compiled model writes every element
of every output.  Here the output buffers are filled with all-ones bytes (NaN for floats, -1
for integers, true for booleans) before the run, and ONNX suite cases covering the kernel
families -- accumulations, reductions, scatters, pads, concatenations, index ops, copies of
inputs and constants to outputs -- must still match the suite's expected outputs.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import ember
from ember.runtime import model as runtime_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from backend_harness import compare_outputs, data_sets  # noqa: E402

CASES = re.compile(
    r"^test_(conv_with_strides_padding|basic_conv_with_padding|convtranspose|"
    r"maxpool_2d_pads|averagepool_2d_pads|globalaveragepool|matmul_3d|gemm_all_attributes|"
    r"reduce_sum_keepdims_random|reduce_max_do_not_keepdims_random|argmax_keepdims_random|"
    r"softmax_axis_0|layer_normalization_4d_axis0|scatter_elements_with_axis|"
    r"scatternd|gather_elements_0|gather_1|pad_.*constant|concat_3d_axis_1|identity|"
    r"transpose_all_permutations_0|expand_dim_changed|tile|slice|cumsum_1d|trilu_lower|"
    r"where_example|equal|cast_FLOAT_to_FLOAT16|onehot_with_axis|range_float_type_positive_"
    r"delta|constantofshape_int_zeros|resize_upsample_scales_nearest|depthtospace_crd_mode|"
    r"top_k|lrn|instancenorm_epsilon|einsum_batch_matmul|split_equal_parts_1d_opset18)$")


@pytest.fixture
def poisoned_outputs(monkeypatch):
    allocate = runtime_model._output_buffer

    def poisoned(nbytes, dtype, shape):
        array, address = allocate(nbytes, dtype, shape)
        array.view(np.uint8)[...] = 0xFF
        return array, address

    monkeypatch.setattr(runtime_model, "_output_buffer", poisoned)


def test_every_output_element_is_written(poisoned_outputs):
    from onnx.backend.test.loader import load_model_tests

    ran = []
    for case in load_model_tests(kind="node"):
        if not CASES.match(case.name):
            continue
        model, sets = data_sets(case)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = ember.compile(model)
        for inputs, expected in sets:
            outputs = module.run(dict(zip(module.input_names, inputs)))
            compare_outputs(expected, [outputs[n] for n in module.output_names],
                            case.rtol, case.atol)
        ran.append(case.name)
    assert len(ran) >= 30, ran


def test_the_poison_is_seen_when_an_output_is_not_written(poisoned_outputs, monkeypatch):
    """The negative control: a run that writes nothing leaves the poison visible."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    module = ember.compile(helper.make_model(graph))
    module(np.ones(4, np.float32))
    _, runtime = module._last
    monkeypatch.setattr(runtime, "_run_entry", lambda *args: 0)  # ember_run writing nothing
    assert np.isnan(runtime(np.ones(4, np.float32))).all()

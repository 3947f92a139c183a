"""ONNX suite cases compiled with -fsanitize=address,undefined run cleanly.

The generated C must be free of undefined behaviour and out-of-bounds accesses (in
``ember_run`` and in ``ember_run_profiled``, which the profiler calls).  A child process
(with the ASan runtime preloaded, as a sanitized library inside a normal Python requires)
compiles a broad selection of node cases with ``sanitize=True``, runs them and compares with
the suite's expected outputs.  Any sanitizer report aborts the child, failing the test.
"""

from __future__ import annotations

import textwrap


# A spread of kernels: convolution and pooling with padding, matrix products, reductions,
# indexing with negative indices, scatters, sorts, integer division, casts, normalizations,
# broadcasting.
CASES = (
    r"^test_(conv_with_strides_padding|convtranspose$|basic_conv_with_padding|"
    r"maxpool_2d_pads|averagepool_2d_pads_count_include_pad|globalaveragepool$|"
    r"matmul_3d|gemm_all_attributes|reduce_sum_keepdims_random|reduce_max_do_not_keepdims_random|"
    r"argmax_negative_axis_keepdims_random|softmax_axis_0|logsoftmax_large_number|"
    r"layer_normalization_4d_axis_negative_2|batchnorm_example|instancenorm_epsilon|"
    r"gather_negative_indices|gather_elements_negative_indices|gathernd_example_float32|"
    r"slice_neg_steps|pad_.*constant|"
    r"concat_3d_axis_negative_1|transpose_all_permutations_3|expand_dim_changed|tile$|"
    r"div_int8|mod_mixed_sign_int32|cast_FLOAT_to_FLOAT16|cast_FLOAT16_to_FLOAT|"
    r"where_long_example|clip_default_int8_inbounds|sigmoid$|gelu_tanh_2|"
    r"bitshift_right_uint16|cumsum_2d_negative_axis|depthtospace_crd_mode_example|"
    r"trilu_lower_neg|"
    # writes at positions read from data: scatters, a sort by rank, running products
    r"scatter_elements_with_negative_indices|scatter_elements_with_duplicate_indices|"
    r"scatternd_add|scatternd_max_with_element_indices|tensorscatter_circular|"
    r"top_k_smallest|top_k_same_values_2d|cumprod_2d_axis_1)$"
)

CHILD = textwrap.dedent("""
    import re, sys, warnings
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, sys.argv[1] + "/tests/conformance")
    warnings.simplefilter("ignore")
    from onnx.backend.test.loader import load_model_tests
    from backend_harness import compare_outputs, data_sets
    import ember

    pattern = re.compile(sys.argv[2])
    ran = 0
    for case in load_model_tests(kind="node"):
        if not pattern.search(case.name):
            continue
        model, sets = data_sets(case)
        module = ember.compile(model, sanitize=True)
        for inputs, expected in sets:
            feeds = dict(zip(module.input_names, inputs))
            outputs = module.run(feeds)
            compare_outputs(expected, [outputs[n] for n in module.output_names],
                            case.rtol, case.atol)
            module.profile(feeds, repeat=1, warmup=0)  # ember_run_profiled, sanitized too
        ran += 1
    print("ran", ran)
""")


def test_conformance_cases_are_clean_under_asan_and_ubsan(run_sanitized):
    output = run_sanitized(CHILD, CASES, timeout=900)
    ran = int(output.split("ran")[-1].strip())
    assert ran >= 30, output


# Rows long enough for the lane-parallel reductions (ember.schedule.reductions), with a tail:
# the suite's cases reduce rows of a few elements, which stay scalar.
LONG_ROWS_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from onnx import TensorProto, helper
    import ember

    def model(op, length):
        axes = [helper.make_tensor("axes", TensorProto.INT64, [1], [1])]
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0) if op != "Softmax" \\
            else helper.make_node("Softmax", ["x"], ["y"], axis=-1)
        out = [3, length] if op == "Softmax" else [3]
        graph = helper.make_graph(
            [node], "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, length])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
            axes if op != "Softmax" else [])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])

    # 141: a few vectors of twice the lanes of AVX2 (16) and of AVX-512 (32), plus a tail
    x = np.random.default_rng(0).standard_normal((3, 141)).astype(np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    want = {"ReduceSum": x.sum(axis=1), "ReduceMax": x.max(axis=1),
            "ReduceMin": x.min(axis=1), "Softmax": e / e.sum(axis=1, keepdims=True)}
    for op, expected in want.items():
        module = ember.compile(model(op, 141), sanitize=True)
        assert "_lanes[" in module.build.units.kernels[0].source, op
        np.testing.assert_allclose(module(x), expected, rtol=1e-5, atol=1e-5, err_msg=op)
        module.profile({"x": x}, repeat=1, warmup=0)
    print("ran", len(want))
""")


def test_lane_parallel_reductions_are_clean_under_asan_and_ubsan(run_sanitized):
    assert "ran 4" in run_sanitized(LONG_ROWS_CHILD)


# GatherND tuples whose components address dims of different sizes (5 and 3): the entry
# checks every other value against each dim (a strided scan), then the kernel gathers.
INDEX_TUPLES_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from onnx import TensorProto, helper
    import ember
    from ember.core.errors import EmberError

    node = helper.make_node("GatherND", ["x", "idx"], ["y"])
    graph = helper.make_graph(
        [node], "cells", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3, 2]),
                          helper.make_tensor_value_info("idx", TensorProto.INT64, [7, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 2])])
    module = ember.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                           sanitize=True)
    x = np.arange(30, dtype=np.float32).reshape(5, 3, 2)
    idx = np.array([[4, 2], [-5, -3], [0, 0], [3, -1], [-1, 1], [2, 2], [1, 0]], np.int64)
    np.testing.assert_array_equal(module(x, idx), x[idx[:, 0], idx[:, 1]])
    refused = 0
    for row, bad in ((6, [1, 3]), (0, [5, 0]), (6, [0, -4]), (3, [-6, 0])):
        wrong = idx.copy()
        wrong[row] = bad
        try:
            module(x, wrong)
        except EmberError:
            refused += 1
    module.profile({"x": x, "idx": idx}, repeat=1, warmup=0)
    print("refused", refused)
""")


def test_strided_index_checks_are_clean_under_asan_and_ubsan(run_sanitized):
    assert "refused 4" in run_sanitized(INDEX_TUPLES_CHILD)


# TopK of long lines through chunks (ember.ops.compute.reduce._top_k_by_chunks): gathers at
# chosen positions, a partial last chunk, NaN, both orders.
CHUNKED_TOP_K_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    import ember
    from ember.frontend.onnx import import_onnx
    from ember.interp import ReferenceExecutor

    x = np.round(np.random.default_rng(1).standard_normal((3, 1000)) * 2).astype(np.float32)
    x[1, ::7] = np.nan
    ran = 0
    for largest, k in ((1, 8), (0, 3)):  # (each a kernel of dozens of loop nests)
        node = helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=largest)
        graph = helper.make_graph(
            [node], "top", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1000])],
            [helper.make_tensor_value_info("v", TensorProto.FLOAT, [3, k]),
             helper.make_tensor_value_info("i", TensorProto.INT64, [3, k])],
            [numpy_helper.from_array(np.array([k], np.int64), "k")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        module = ember.compile(model, sanitize=True)
        assert module.build.host_nodes == []
        expected = ReferenceExecutor(import_onnx(model)).run({"x": x})
        outputs = module.run({"x": x})
        for name in ("v", "i"):
            np.testing.assert_array_equal(outputs[name], expected[name])
        module.profile({"x": x}, repeat=1, warmup=0)
        ran += 1
    print("ran", ran)
""")



def test_chunked_top_k_is_clean_under_asan_and_ubsan(run_sanitized):
    assert "ran 2" in run_sanitized(CHUNKED_TOP_K_CHILD)

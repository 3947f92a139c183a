"""``ember bench --ops``: configuration extraction, single-op models, the row checks, the
table and the flag -- on models built with onnx.helper (no torch, no zoo export)."""

import argparse
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

import ember
from ember.bench import ops
from ember.bench.cli import add_bench_parser
from ember.bench.ops import (ConfigUse, OpConfig, OpResult, build_single_op, extract_configs,
                             run_op, single_op_flops)
from ember.bench.ops.report import (ops_json, print_ops_problems, render_ops_table,
                                    sorted_by_zoo_time, summary_line)
from ember.bench.peers import Prepared
from ember.bench.report import write_json
from ember.bench.runner import Settings
from ember.bench.timing import Series

M, K, N = 4, 8, 6  # the MatMuls: [M, K] @ [K, N]
IMAGE, C_IN, C_OUT = 10, 3, 5  # the Conv: 3x3, stride 2, pads 1, with bias

FAST = Settings(rounds=2, warmup=0, budget_seconds=None)


def _model(dynamic_batch: bool = False) -> onnx.ModelProto:
    """Two identical MatMuls (one fed by a Relu, so its shape must be inferred), one Conv,
    and with ``dynamic_batch`` a third MatMul whose batch is symbolic."""
    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.standard_normal(shape, dtype=np.float32), name)
               for name, shape in (("W", (K, N)), ("CW", (C_OUT, C_IN, 3, 3)),
                                   ("CB", (C_OUT,)))]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h1"], name="mm1"),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("MatMul", ["r", "W"], ["h2"], name="mm2"),
             helper.make_node("Conv", ["img", "CW", "CB"], ["c"], name="conv",
                              pads=[1, 1, 1, 1], strides=[2, 2])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K]),
              helper.make_tensor_value_info("img", TensorProto.FLOAT,
                                            [1, C_IN, IMAGE, IMAGE])]
    outputs = ["h1", "h2", "c"]
    if dynamic_batch:
        nodes.append(helper.make_node("MatMul", ["d", "W"], ["h3"], name="mm_dynamic"))
        inputs.append(helper.make_tensor_value_info("d", TensorProto.FLOAT, ["batch", K]))
        outputs.append("h3")
    graph = helper.make_graph(nodes, "toy", inputs,
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in outputs], initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _configs() -> tuple[ConfigUse, ConfigUse]:
    extraction = extract_configs([("toy", _model())])
    matmul, conv = extraction.configs
    return matmul, conv


# --------------------------------------------------------------------------- extraction


def test_identical_nodes_are_one_configuration_with_their_count():
    extraction = extract_configs([("toy", _model())])
    assert not extraction.skipped
    matmul, conv = extraction.configs
    assert matmul.config.op == "MatMul" and matmul.count == 2 and matmul.uses == {"toy": 2}
    assert matmul.config.shapes == ((M, K), (K, N))
    assert matmul.config.constant == (False, True)
    assert matmul.config.summary() == f"MatMul {M}x{K} @ {K}x{N}"
    assert conv.config.op == "Conv" and conv.count == 1
    assert conv.config.shapes == ((1, C_IN, IMAGE, IMAGE), (C_OUT, C_IN, 3, 3), (C_OUT,))
    assert conv.config.constant == (False, True, True)
    assert conv.config.attribute("kernel_shape") == (3, 3)  # the default, filled in
    assert conv.config.summary() == f"Conv 3x3/s2 {C_IN}->{C_OUT} @ {IMAGE}x{IMAGE}"


def test_counts_add_up_over_models():
    extraction = extract_configs([("a", _model()), ("b", _model())])
    matmul = extraction.configs[0]
    assert matmul.uses == {"a": 2, "b": 2} and matmul.count == 4
    assert matmul.where() in ("a 2, b 2", "b 2, a 2")


def test_nodes_without_static_shapes_are_skipped_and_counted():
    extraction = extract_configs([("toy", _model(dynamic_batch=True))])
    assert [use.count for use in extraction.configs] == [2, 1]
    (skipped,) = extraction.skipped
    assert skipped.node == "mm_dynamic" and "static" in skipped.reason
    assert extraction.skipped_by_model() == {"toy": 1}


def test_shapes_onnx_cannot_infer_come_from_embers_inference():
    """The TorchScript exporter computes BERT's Expand shapes with Where, which ONNX's data
    propagation does not evaluate; ember's inference does."""
    inits = [numpy_helper.from_array(np.ones((K, N), np.float32), "W"),
             numpy_helper.from_array(np.array([True, False]), "cond"),
             numpy_helper.from_array(np.array([3, K], np.int64), "rows"),
             numpy_helper.from_array(np.array([1, 1], np.int64), "ones")]
    nodes = [helper.make_node("Where", ["cond", "rows", "ones"], ["shape"]),  # [3, 1]
             helper.make_node("Expand", ["x", "shape"], ["wide"]),
             helper.make_node("MatMul", ["wide", "W"], ["y"])]
    graph = helper.make_graph(nodes, "expand",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    assert None in ops.value_types(model)["wide"][1]  # ONNX alone loses the rows
    extraction = extract_configs([("toy", model)])
    assert not extraction.skipped
    assert [use.config.shapes for use in extraction.configs] == [((3, K), (K, N))]


def test_spelled_out_defaults_are_the_same_configuration():
    """One exporter writes transA=0, alpha=1; the other leaves them out."""
    weight = numpy_helper.from_array(np.ones((N, K), np.float32), "W")
    nodes = [helper.make_node("Gemm", ["x", "W"], ["y1"], transB=1),
             helper.make_node("Gemm", ["x", "W"], ["y2"], transB=1, transA=0, alpha=1.0)]
    graph = helper.make_graph(nodes, "gemms",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in ("y1", "y2")], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (gemm,) = extract_configs([("toy", model)]).configs
    assert gemm.count == 2
    assert gemm.config.summary() == f"Gemm transB {M}x{K} -> {N} no-bias"


def test_flops_are_two_per_multiply_add():
    matmul, conv = _configs()
    assert single_op_flops(build_single_op(matmul.config)) == 2 * M * N * K
    out = IMAGE // 2  # 3x3, stride 2, pads 1
    macs = C_OUT * out * out * C_IN * 3 * 3
    assert single_op_flops(build_single_op(conv.config)) == 2 * macs + C_OUT * out * out


# --------------------------------------------------------------------------- single-op models


@pytest.mark.parametrize("which", ["matmul", "conv"])
def test_single_op_model_agrees_across_onnxruntime_and_ember(which):
    use = dict(zip(("matmul", "conv"), _configs()))[which]
    single = build_single_op(use.config)
    initializers = {t.name for t in single.model.graph.initializer}
    assert initializers == set(single.constants) and set(single.feeds).isdisjoint(initializers)
    assert [n.op_type for n in single.model.graph.node] == [use.config.op]

    session = ort.InferenceSession(single.model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (want,) = session.run(None, single.feeds)
    got = ember.compile(single.model).run(single.feeds)[single.output_name]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    if which == "matmul":  # and both are right, by numpy
        np.testing.assert_allclose(want, single.feeds["A"] @ single.constants["B"],
                                   rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_run_op_measures_and_checks_each_contender(tmp_path):
    matmul, _ = _configs()
    result = run_op(matmul, FAST, tmp_path / "op.onnx", with_mkl=False)
    assert not result.failed, result.errors
    assert result.agreement["ember"].ok and not result.mismatch
    assert set(result.series) == {"ember", "onnxruntime"}
    assert all(len(series.samples_ms) == 2 for series in result.series.values())
    assert result.flops == 2 * M * N * K and result.ratio > 0


class WrongEmber:
    """Stands in for ember: ORT's numbers plus one, so the check must catch it."""

    def prepare(self, workload):
        session = ort.InferenceSession(workload.onnx_path, providers=["CPUExecutionProvider"])
        return Prepared(lambda feeds: [o + 1.0 for o in session.run(None, dict(feeds))])


class BrokenEmber:
    def prepare(self, workload):
        raise RuntimeError("no kernel for this\nsecond line")


def test_a_mismatch_is_reported_in_the_row(monkeypatch, tmp_path):
    monkeypatch.setattr(ops.run, "EmberPeer", WrongEmber)
    matmul, _ = _configs()
    result = run_op(matmul, FAST, tmp_path / "op.onnx", with_mkl=False)
    assert result.mismatch and not result.agreement["ember"].ok
    assert result.median_ms("ember") is not None  # still timed
    text = _rendered([result])
    assert "ember ≠ ORT" in text and "differs from ORT" in text


def test_a_failure_is_reported_and_ort_still_timed(monkeypatch, tmp_path):
    monkeypatch.setattr(ops.run, "EmberPeer", BrokenEmber)
    matmul, _ = _configs()
    result = run_op(matmul, FAST, tmp_path / "op.onnx", with_mkl=False)
    assert result.errors["ember"].startswith("prepare: RuntimeError: no kernel")
    assert result.median_ms("onnxruntime") is not None and result.ratio is None
    text = _rendered([result])
    assert "ember prepare failed" in text and "second line" in text


def test_torch_matmul_agrees_with_onnxruntime(tmp_path):
    pytest.importorskip("torch")
    matmul, _ = _configs()
    result = run_op(matmul, FAST, tmp_path / "op.onnx", with_mkl=True)
    assert result.agreement["mkl"].ok and result.median_ms("mkl") is not None


# --------------------------------------------------------------------------- report, flag


def _fake_result(summary_op: str, count: int, ember_ms: float, ort_ms: float) -> OpResult:
    config = OpConfig("MatMul", ((count, K), (K, N)), (False, True), ())
    result = OpResult(ConfigUse(config, {"toy": count}), summary_op, flops=2 * count * K * N)
    result.series = {"ember": Series([ember_ms] * 4), "onnxruntime": Series([ort_ms] * 4)}
    return result


def _rendered(results, **kwargs) -> str:
    console = Console(record=True, width=250)
    console.print(render_ops_table(results, FAST, **kwargs))
    console.print(summary_line(results))
    print_ops_problems(results, console)
    return console.export_text()


def test_table_sorts_by_zoo_time_marks_slow_rows_and_counts_them(tmp_path):
    results = [_fake_result("fast", 1, ember_ms=1.0, ort_ms=2.0),     # 2.0x, zoo 2 ms
               _fake_result("slow", 10, ember_ms=2.0, ort_ms=1.0),    # 0.5x, zoo 10 ms
               _fake_result("close", 3, ember_ms=1.0, ort_ms=0.9)]    # 0.9x, zoo 2.7 ms
    assert [r.summary for r in sorted_by_zoo_time(results)] == ["slow", "close", "fast"]
    text = _rendered(results, peak_gflops=100.0)
    assert text.index("slow") < text.index("close") < text.index("fast")
    assert "0.50x ◀" in text and "2.00x" in text and "% peak" in text
    assert "1 at >= 1.0x ORT, 2 at >= 0.8x, 1 below 0.8x" in text

    extraction = ops.Extraction([r.use for r in results])
    path = tmp_path / "ops.json"
    write_json(ops_json(results, extraction, FAST, [], peak_gflops=100.0), path)
    payload = json.loads(path.read_text())
    assert payload["mode"] == "ops"
    assert [row["summary"] for row in payload["ops"]] == ["slow", "close", "fast"]
    assert payload["ops"][0]["below_mark"] and payload["ops"][0]["ort_over_ember"] == 0.5


def test_the_ops_flag_parses():
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--ops", "--peak", "--models", "mlp", "--batch", "1",
                              "16"])
    assert args.ops and args.peak and args.batch == [1, 16]
    defaults = parser.parse_args(["bench"])
    assert not defaults.ops and not defaults.peak

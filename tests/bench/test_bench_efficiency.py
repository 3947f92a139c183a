"""`ember bench --peak` on whole models: the FLOPs of a model, counted by hand, and the
table and JSON that divide them by each contender's median and by the measured peak."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ember.bench.efficiency import Machine, gflops_per_second, model_flops
from ember.cli import main
from ember.profile.peak import Peak


def test_model_flops_count_a_multiply_add_as_two(tmp_path):
    """MatMul 2x3 @ 3x4: 2*3*4 multiply-adds per row pair, 48 FLOPs; a 3x3 conv of 3
    channels into 4 over 5x5 (padded): 100 outputs of 27 multiply-adds, 5400 FLOPs."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "k")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Conv", ["image", "k"], ["z"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "work",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 5, 5])], inits)
    path = tmp_path / "work.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), path)
    assert model_flops(path) == 48 + 5400


def test_gflops_and_the_peak_they_are_shared_of():
    assert gflops_per_second(3 * 10**9, 1500.0) == pytest.approx(2.0)
    assert gflops_per_second(None, 1.0) is None and gflops_per_second(10, None) is None
    machine = Machine(Peak(100.0, 20.0, 2, 8), Peak(120.0, 18.0, 2, 8))
    # the higher measurement of each: a busy moment must not raise anyone's share
    assert machine.fma_gflops == 120.0 and machine.bandwidth_gbs == 20.0


def test_bench_peak_reports_each_contenders_share(tmp_path, zoo_cache, capsys, monkeypatch):
    measured = iter([Peak(200.0, 30.0, 2, 8), Peak(100.0, 40.0, 2, 8)])
    monkeypatch.setattr("ember.profile.peak.measure_peak", lambda threads=None: next(measured))
    out = tmp_path / "bench.json"
    status = main(["bench", "--quick", "--peak", "--models", "mlp", "--exporter",
                   "torchscript", "--peers", "ember", "torch", "--rounds", "2", "--warmup",
                   "0", "--json", str(out), "--cache-dir", str(zoo_cache)])
    assert status == 0
    printed = capsys.readouterr().out
    assert "% of the FMA peak" in printed and "200.0 / 100.0 GFLOP/s" in printed
    payload = json.loads(out.read_text())
    assert payload["peak"]["fma_gflops"] == 200.0 and payload["peak"]["bandwidth_gbs"] == 40.0
    (count,) = payload["flops_per_call"]
    # the tiny MLP, 32-64-64-10 at batch 1: its three Linear layers are 2 * 6784 FLOPs, and
    # the bias adds, GELUs and softmax a few per element of 138 outputs
    matmuls = 2 * (32 * 64 + 64 * 64 + 64 * 10)
    assert matmuls < count["flops"] < matmuls + 30 * 138, count
    torch_ms = payload["results"][0]["contenders"]["torch"]["timing"]["median_ms"]
    gflops = count["flops"] / (torch_ms * 1e-3) / 1e9
    assert f"{gflops:.1f} ({100 * gflops / 200.0:.0f}%)" in printed

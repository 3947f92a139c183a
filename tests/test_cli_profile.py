"""The per-kernel profiler: ``Module.profile``, the ``Profile`` it returns and ``ember
profile``.

The model (x[batch, K] -> MatMul -> TopK as a numpy fallback -> Relu) has one compiled
kernel whose FLOPs and bytes are worked out here from the shapes, one host step and one more
kernel.  The peak is a made-up one wherever the test is about arithmetic (a measurement
would be slow and noisy); one test measures a real one at tiny sizes.  That the profiled run
computes what a run computes is tests/runtime/test_profiling.py's to check.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from rich.console import Console

import ember
import ember.profile
from ember.cli import main
from ember.codegen.c import kernel_symbol
from ember.profile import Peak, Profile, build_profile, measure_peak

M, K, N = 5, 12, 600  # (a TopK over lines of 600: a numpy fallback)
STEP_FIELDS = {"index", "kind", "kernel", "ops", "nodes", "seconds", "share", "flops",
               "uncounted_ops", "gflops_per_second", "bytes", "gbytes_per_second",
               "peak_fraction", "bandwidth_fraction", "bound"}
FAKE_PEAK = Peak(fma_gflops=100.0, bandwidth_gbs=10.0, threads=2, lanes=8)


@pytest.fixture(scope="module")
def module(profiled_model):
    return ember.compile(profiled_model(M, K, N))


@pytest.fixture(scope="module")
def profile(module) -> Profile:
    x = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
    return module.profile({"x": x}, repeat=15, warmup=1)


def _run(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, out, err


# ---------------------------------------------------------------------- Module.profile


def test_one_row_per_step_named_as_the_build_names_them(module, profile):
    impls = module.build.impls
    assert [step.index for step in profile.steps] == [impl.index for impl in impls] == [0, 1, 2]
    assert [step.kind for step in profile.steps] == [impl.kind for impl in impls]
    assert [step.kind for step in profile.steps] == ["kernel", "host", "kernel"]
    for step, impl in zip(profile.steps, impls):
        assert step.kernel == (kernel_symbol(impl.func) if impl.func is not None else None)
        assert step.ops == tuple(node.op for node in impl.nodes)
        assert step.nodes == tuple(node.name for node in impl.nodes)
    assert profile.steps[1].label == "numpy TopK"
    assert profile.inputs == {"x": (M, K)} and profile.repeat == 15


def test_times_are_positive_and_add_up_to_at_most_the_whole_call(profile):
    assert all(step.seconds > 0 for step in profile.steps)
    assert profile.total_seconds == pytest.approx(sum(s.seconds for s in profile.steps))
    assert profile.total_seconds <= profile.call_seconds * 1.5
    assert sum(step.share for step in profile.steps) == pytest.approx(1.0)


def test_flops_and_bytes_of_the_matmul_come_from_its_shapes(profile, profiled_model):
    matmul = next(step for step in profile.steps if step.ops == ("MatMul",))
    assert matmul.flops == 2 * M * N * K
    assert matmul.bytes == 4 * (M * K + K * N + M * N)  # x and w read, h written
    assert matmul.gflops_per_second == pytest.approx(2 * M * N * K / matmul.seconds / 1e9)
    assert matmul.gbytes_per_second == pytest.approx(matmul.bytes / matmul.seconds / 1e9)
    topk = profile.steps[1]
    assert topk.uncounted == ("TopK",) and topk.flops == 0  # no FLOPs rule: not guessed
    top = profiled_model.top_k
    assert topk.bytes == 4 * M * N + 8 + 4 * M * top + 8 * M * top  # h, k -> values, indices
    relu = profile.steps[2]
    assert relu.flops == M * top and relu.uncounted == ()


def test_shares_of_a_peak_and_the_bound_are_the_larger_share(profiled_model):
    build = ember.compile(profiled_model(M, K, N)).build
    # at 1e-4 s the MatMul (72,000 FLOPs, 41,040 bytes) reaches 0.72% of the fake FMA peak
    # and 4.1% of its bandwidth: memory-bound
    flops, moved = 2 * M * K * N, 4 * (M * K + K * N + M * N)
    profile = build_profile(build.graph, build.impls, [1e-4, 1e-3, 1e-9], 2e-3, repeat=3,
                            warmup=0, peak=FAKE_PEAK)
    matmul, topk, relu = profile.steps
    assert matmul.peak_fraction == pytest.approx(flops / 1e-4 / 1e9 / 100)
    assert matmul.bandwidth_fraction == pytest.approx(moved / 1e-4 / 1e9 / 10)
    assert matmul.bound == "memory"
    compute_bound = build_profile(build.graph, build.impls, [1e-4, 1e-3, 1e-9], 2e-3,
                                  repeat=3, warmup=0,
                                  peak=Peak(fma_gflops=1.0, bandwidth_gbs=1e6, threads=1,
                                            lanes=8))
    assert compute_bound.steps[0].bound == "compute"
    assert topk.peak_fraction == 0.0 and topk.bound == "memory"
    assert profile.overhead_seconds == pytest.approx(2e-3 - (1e-4 + 1e-3 + 1e-9))
    assert [step.index for step in profile.by_time()] == [1, 0, 2]
    assert [step.index for step in profile.by_time(top=1)] == [1]
    with pytest.raises(ValueError, match="2 step time"):
        build_profile(build.graph, build.impls, [1e-7, 1e-6], 1e-5, repeat=1, warmup=0)


def test_the_table_lists_the_slowest_first_with_a_total(profile):
    console = Console(width=240, record=True, markup=False, highlight=False)
    console.print(profile.table(top=2))
    text = console.export_text()
    assert "total (3 steps)" in text and "Showing the 2 slowest of 3 steps" in text
    slowest = profile.by_time()
    assert text.index(slowest[0].label) < text.index(slowest[1].label)
    assert slowest[2].label not in text
    assert "% FMA peak" not in text  # no peak, no peak columns


def test_to_json_has_every_field(profile):
    data = json.loads(profile.to_json())
    assert {"model", "inputs", "repeat", "warmup", "threads", "peak", "total_seconds",
            "call_seconds", "overhead_seconds", "total_flops", "total_bytes",
            "steps"} <= set(data)
    assert len(data["steps"]) == 3 and all(set(s) == STEP_FIELDS for s in data["steps"])
    assert data["steps"][0]["flops"] == 2 * M * N * K and data["inputs"] == {"x": [M, K]}


def test_measure_peak_at_tiny_sizes():
    peak = measure_peak(1, iterations=2000, triad_elements=1 << 12, rounds=1)
    assert peak.threads == 1 and peak.lanes in (8, 16)
    assert peak.fma_gflops > 0 and peak.bandwidth_gbs > 0


# ---------------------------------------------------------------------- ember profile


def test_profile_command_prints_the_table_and_writes_json(profiled_model, tmp_path, capsys,
                                                          monkeypatch):
    path = tmp_path / "model.onnx"
    onnx.save(profiled_model(M, K, N), path)
    monkeypatch.setattr(ember.profile, "measure_peak", lambda threads=None: FAKE_PEAK)
    status, out, err = _run(capsys, "profile", path, "--repeat", 5, "--warmup", 1, "--top", 2,
                            "--threads", 1, "--peak", "--json", tmp_path / "out.json")
    assert status == 0, err
    assert "3 nodes in 2 compiled kernels" in out
    assert "total (3 steps)" in out and "Showing the 2 slowest of 3 steps" in out
    assert "% FMA peak" in out and "bound" in out and "steps sum to" in out
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["threads"] == 1 and data["peak"]["fma_gflops"] == 100.0
    assert [s["kind"] for s in data["steps"]] == ["kernel", "host", "kernel"]
    assert all(set(s) == STEP_FIELDS and s["seconds"] > 0 for s in data["steps"])
    assert data["steps"][0]["bound"] in ("compute", "memory")
    assert data["total_seconds"] <= data["call_seconds"] * 1.5


@pytest.mark.parametrize("options, shape", [
    ((), [1, K]),  # unbound: 1, with a note
    (("--batch", 3), [3, K]),
    (("--dim", "B=4"), [4, K]),
    (("--shape", "x=2,12"), [2, K]),
    (("--batch", 3, "--shape", "x=2x12"), [2, K]),  # --shape wins
])
def test_profile_command_sizes_the_inputs(profiled_model, tmp_path, capsys, options,
                                          shape):
    path = tmp_path / "model.onnx"
    onnx.save(profiled_model("B", K, N), path)
    status, out, err = _run(capsys, "profile", path, "--repeat", 1, "--warmup", 0, *options,
                            "--json", tmp_path / "out.json")
    assert status == 0, err
    assert json.loads((tmp_path / "out.json").read_text())["inputs"] == {"x": shape}
    assert ("note: profiling with B=1" in out) == (not options)


@pytest.mark.parametrize("options, message", [
    (("--shape", "x=2"), "--shape x: 1 dimension(s) given, input 'x' has 2"),
    (("--shape", "x=2,5"), "--shape x: dimension 1 is 12 in the model, 5 given"),
    (("--shape", "nope=1"), "--shape names 'nope', which is not an input"),
    (("--dim", "Q=1"), "--dim names unknown dimension(s) ['Q']"),
])
def test_profile_command_refuses_shapes_the_model_cannot_take(profiled_model, tmp_path, capsys,
                                                              options, message):
    path = tmp_path / "model.onnx"
    onnx.save(profiled_model("B", K, N), path)
    status, out, err = _run(capsys, "profile", path, *options)
    assert status == 2 and out == ""
    assert err.startswith("error: ") and message in err


def test_batch_of_a_model_without_a_batch_dimension_is_refused(profiled_model, tmp_path,
                                                                capsys):
    path = tmp_path / "model.onnx"
    onnx.save(profiled_model(M, K, N), path)
    status, _, err = _run(capsys, "profile", path, "--batch", 3)
    assert status == 2 and "no input has a symbolic leading dimension" in err
    status, _, err = _run(capsys, "profile", path, "--batch", M, "--repeat", 1)
    assert status == 0, err  # the fixed batch is the one asked for

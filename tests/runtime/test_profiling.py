"""``ember_run_profiled`` times every step of ``ember_run`` and computes the same thing.

The model has a compiled MatMul, a TopK that runs as a numpy fallback (a host step) and a
compiled Relu, so both kinds of step are timed.  The oracles are the ordinary run's outputs
(bit for bit: the same kernels run), the build's list of steps, and FLOPs and bytes worked
out here from the shapes.  No test asserts on speed: times only have to be positive and add
up to no more than the whole call (loosely: both are medians of separate samples).
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper

import ember
import ember.runtime
from artifact_tools import read_manifest, refresh_digests
from ember.codegen.c import kernel_symbol
from ember.core.errors import ExecutionError, InputError, ModelLoadError
from ember.core.target import Target
from ember.runtime.signature import parse_signature
from ember.toolchain import build_library_from_units

M, K, N = 5, 12, 600  # (a TopK over lines of 600: a numpy fallback)
X = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
REPEAT = 15


@pytest.fixture(scope="module")
def module(profiled_model):
    return ember.compile(profiled_model(M, K, N))


@pytest.fixture
def artifact(module, tmp_path):
    return module.save(tmp_path / "profiled.ember")


# ---------------------------------------------------------------------- the runtime


def test_every_step_is_timed_and_the_outputs_are_those_of_a_run(artifact):
    model = ember.load(artifact)
    assert model.supports_profiling and model.steps == 3
    times = model.profile({"x": X}, repeat=REPEAT, warmup=1)
    assert times.samples.shape == (REPEAT, 3) and times.repeat == REPEAT
    assert (times.step_seconds > 0).all(), times.step_seconds
    assert times.total_seconds <= times.call_seconds * 1.5, (times.total_seconds,
                                                             times.call_seconds)
    expected = model.run({"x": X})
    assert list(times.outputs) == ["y", "indices"]
    for name, value in expected.items():
        np.testing.assert_array_equal(times.outputs[name], value)


def test_profile_takes_inputs_as_run_does_and_checks_its_counts(artifact):
    model = ember.load(artifact)
    times = model.profile([X], repeat=1, warmup=0)
    assert times.samples.shape == (1, 3)
    with pytest.raises(InputError, match="missing input"):
        model.profile({}, repeat=1)
    with pytest.raises(InputError, match="has shape"):
        model.profile({"x": X[:2]}, repeat=1)
    for bad in ({"repeat": 0}, {"repeat": 1.5}, {"warmup": -1}, {"repeat": True}):
        with pytest.raises(InputError, match="repeat|warmup"):
            model.profile({"x": X}, **bad)


def test_a_failing_step_fails_the_profiled_run_as_it_fails_a_run(tmp_path):
    node = helper.make_node("Gather", ["data", "idx"], ["out"], axis=0, name="pick_rows")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [4, 3]),
                      helper.make_tensor_value_info("idx", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    loaded = ember.runtime.load(ember.compile(model).save(tmp_path / "gather.ember"))
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    with pytest.raises(ExecutionError, match=r"'pick_rows' \(Gather\) got an index out of "
                                             r"range: input 'idx' must lie in \[-4, 4\)"):
        loaded.profile({"data": data, "idx": np.array([0, 4], np.int64)}, repeat=1)
    times = loaded.profile({"data": data, "idx": np.array([3, -4], np.int64)}, repeat=1)
    np.testing.assert_array_equal(times.outputs["out"], data[[3, -4]])


def test_a_library_from_before_profiling_runs_but_says_it_cannot_be_profiled(module, artifact):
    """An artifact saved by an older ember: no ember_run_profiled, no step count."""
    entry, *kernels = module.build.units.sources()
    entry = entry[:entry.index("\n#if defined(CLOCK_MONOTONIC)")] + "\n"
    entry = re.sub(r',\\"steps\\":\d+', "", entry)
    assert "ember_run_profiled" not in entry and "steps" not in entry
    library = build_library_from_units([entry, *kernels], Target.native())
    shutil.copyfile(library.path, artifact / "model.so")
    refresh_digests(artifact)
    model = ember.load(artifact)
    np.testing.assert_array_equal(model(X)[1], module(X)[1])
    assert not model.supports_profiling and model.steps is None
    with pytest.raises(ExecutionError, match="cannot be profiled: its library has no "
                                             "ember_run_profiled .* compile and save the "
                                             "model again"):
        model.profile({"x": X}, repeat=1)


def test_the_signature_counts_the_steps_and_the_manifest_is_unchanged(module, artifact):
    assert module.build.signature["steps"] == len(module.build.impls) == 3
    assert "steps" not in read_manifest(artifact)  # the library says it, not the manifest


def _signature(**changes) -> bytes:
    base = {"abi": 1, "inputs": [], "outputs": [], "workspace_size": 0, "weights_size": 0,
            "weights": [], "host_nodes": [{"index": 2, "inputs": [], "outputs": []}]}
    return json.dumps({**base, **changes}).encode()


def test_a_step_count_the_library_cannot_mean_is_refused():
    assert parse_signature(_signature(), "lib").steps is None  # an older library
    assert parse_signature(_signature(steps=3), "lib").steps == 3
    for bad in (2, -1, "3", True, 1 << 40):
        with pytest.raises(ModelLoadError, match="field 'steps'"):
            parse_signature(_signature(steps=bad), "lib")


# ---------------------------------------------------------------------- the entry point


def _function(source: str, name: str) -> str:
    start = source.index(f"int32_t {name}(")
    return source[start:source.index("\n}\n", start)]


def test_ember_run_has_no_timing_and_both_entry_points_run_the_same_steps(module):
    source = module.build.source
    plain, profiled = _function(source, "ember_run"), _function(source, "ember_run_profiled")
    assert "clock" not in plain and "step_seconds" not in plain
    timing = ("clock", "step_seconds")
    body = [line for line in profiled.splitlines()[1:] if not any(t in line for t in timing)]
    assert body == plain.splitlines()[1:]  # the same lines, but for the timing
    for index in range(3):
        assert f"step_seconds[{index}] = em_lap(&em_clock);" in profiled
    symbols = [kernel_symbol(impl.func) for impl in module.build.impls if impl.func]
    for symbol in symbols:
        assert plain.count(f"{symbol}(") == profiled.count(f"{symbol}(") == 1

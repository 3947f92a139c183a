"""Schedules as data: a kernel's config decides its schedule, reproducibly.

Oracles: numpy (the compiled model's outputs), the unscheduled kernel run by the loop
interpreter, and the generated C itself (a config must change it; the same config must give
the same text; a replayed trace must give the same kernel).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parents[1] / "lower"))

from configs import kernel_arrays, kernel_space, random_config  # noqa: E402
from loop_interpreter import CASES, run_outputs  # noqa: E402

import ember  # noqa: E402
from ember.core.target import Target  # noqa: E402
from ember.driver import BuildOptions, build_graph  # noqa: E402
from ember.frontend.onnx import import_onnx  # noqa: E402
from ember.ir.loop.printer import format_func  # noqa: E402
from ember.schedule.config import KernelConfig, ScheduleConfigError  # noqa: E402
from ember.schedule.pipeline import LOOP_STAGES, propose_config, schedule_kernel  # noqa: E402
from ember.schedule.primitives import Trace  # noqa: E402

TARGET = Target.parse("x86_64-avx2")


def _randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def conv_model(channels: int = 16, width: int = 12, prefix: str = "", head_out: int = 24,
               dtype: int = TensorProto.FLOAT) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """Conv 3x3 (pads 1) + bias + Relu, then a MatMul head, with every node and value name
    prefixed by ``prefix``; returns the model, its input and numpy's output."""
    rng = np.random.default_rng(29)
    x, w, b = _randn(rng, 1, 8, width, width), _randn(rng, channels, 8, 3, 3) * 0.2, \
        _randn(rng, channels)
    head = _randn(rng, width, head_out) * 0.2
    p = prefix
    nodes = [helper.make_node("Conv", [f"{p}x", f"{p}w", f"{p}b"], [f"{p}t"],
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1], name=f"{p}conv"),
             helper.make_node("Relu", [f"{p}t"], [f"{p}r"], name=f"{p}relu"),
             helper.make_node("MatMul", [f"{p}r", f"{p}h"], [f"{p}y"], name=f"{p}head")]
    graph = helper.make_graph(
        nodes, f"{p}g", [helper.make_tensor_value_info(f"{p}x", dtype, list(x.shape))],
        [helper.make_tensor_value_info(f"{p}y", dtype, None)],
        [numpy_helper.from_array(w, f"{p}w"), numpy_helper.from_array(b, f"{p}b"),
         numpy_helper.from_array(head, f"{p}h")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = sum(np.einsum("oc,nchw->nohw", w[:, :, kh, kw],
                         padded[:, :, kh:kh + width, kw:kw + width])
               for kh in range(3) for kw in range(3))
    return model, x, np.maximum(conv + b[None, :, None, None], 0) @ head


def _gemm_kernel(module):
    """The convolution's kernel (a GEMM with an im2col B)."""
    kernel, = (impl for impl in module.build.kernels if impl.nodes[0].op == "Conv")
    return kernel


def _compile(model, **configs):
    return ember.compile(model, target=TARGET, dynamic_batch=False, **configs)


# ----------------------------------------------------------------------------- the seam
@pytest.mark.usefixtures("nchw_convolutions")
def test_a_config_changes_the_generated_code_and_the_same_config_reproduces_it():
    model, x, expected = conv_model()
    default = _compile(model)
    kernel = _gemm_kernel(default)
    knobs = kernel.config.as_dict()
    tile_knob, = (k for k in kernel.space if k.name == "gemm0.tile")
    other_tile = next(t for t in tile_knob.choices if t != knobs["gemm0.tile"])
    config = KernelConfig.of({"gemm0.tile": other_tile,
                              "gemm0.pack_a": not knobs["gemm0.pack_a"]})
    chosen = _compile(model, kernel_configs={kernel.workload_key: config})
    again = _compile(model, kernel_configs={kernel.workload_key: config})
    assert chosen.build.source != default.build.source
    assert chosen.build.source == again.build.source
    applied = _gemm_kernel(chosen).config.as_dict()
    assert {k: applied[k] for k in config.as_dict()} == config.as_dict()
    assert set(applied) == set(knobs)  # (blocks that follow the tile take its defaults)
    assert f"tile {other_tile[0]}x{other_tile[1]}" in chosen.build.source
    # the other kernels kept the default schedule
    assert [i.config for i in chosen.build.kernels if i.nodes[0].op != "Conv"] == \
        [i.config for i in default.build.kernels if i.nodes[0].op != "Conv"]
    for module in (default, chosen):
        np.testing.assert_allclose(module(x), expected, rtol=1e-4, atol=1e-4)


def test_the_proposed_config_is_the_default_schedule_and_names_every_knob():
    for case in CASES.values():
        func = case().lower()
        default = schedule_kernel(func, TARGET)
        proposed = propose_config(func, TARGET)
        assert set(proposed.as_dict()) == {k.name for k in default.space}
        again = schedule_kernel(func, TARGET, proposed)
        assert format_func(again.func) == format_func(default.func)
        assert again.trace.to_json() == default.trace.to_json()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_trace_replays_the_kernel_it_scheduled(name, seed):
    """A trace (through JSON, as a database stores it) applied to the unscheduled kernel
    gives the same kernel, for the default schedule and for random configs; and the
    scheduled kernel computes what the unscheduled one computes."""
    case = CASES[name]()
    func = case.lower()
    config = random_config(func, TARGET, seed, space=kernel_space)
    scheduled = schedule_kernel(func, TARGET, config, verify=True)
    replayed = Trace.from_json(scheduled.trace.to_json()).replay(func, TARGET).func
    assert format_func(replayed) == format_func(scheduled.func)
    results = run_outputs(scheduled.func, case.arrays)
    case.check(results)


def test_bad_configs_are_refused_naming_the_knob():
    func = CASES["conv"]().lower()
    with pytest.raises(ScheduleConfigError, match=r"knob\(s\) \[.nest9.vectorize.\] that this kernel does not have"):
        schedule_kernel(func, TARGET, KernelConfig.of({"nest9.vectorize": True}))
    with pytest.raises(ScheduleConfigError, match="'nest1.parallel' cannot be 'sideways'"):
        schedule_kernel(func, TARGET, KernelConfig.of({"nest1.parallel": "sideways"}))
    with pytest.raises(ScheduleConfigError, match="JSON object"):
        KernelConfig.from_json("[1, 2]")
    config = KernelConfig.of({"nest1.register_tile": (4, 8), "partition": False})
    assert KernelConfig.from_json(config.to_json()) == config


def test_every_loop_stage_is_timed_and_can_show_its_ir():
    func = CASES["conv"]().lower()
    stages = schedule_kernel(func, TARGET, keep_ir=True, verify=True).stages
    assert [s.name for s in stages] == ["lower"] + [stage.name for stage in LOOP_STAGES]
    assert [stage.name for stage in LOOP_STAGES] == [
        "gemm_template", "fuse_row_nests", "schedule_nests", "rfactor_reductions",
        "simplify_indices", "partition_guarded_loops", "hoist_invariant_loads",
        "hoist_invariant_divisions"]
    assert all(s.seconds >= 0 and s.ir.startswith("func conv(") for s in stages)
    nests = next(s for s in stages if s.name == "schedule_nests")
    assert nests.changed and "parallel for" in nests.ir or "vectorized for" in nests.ir
    assert [s.name for s in schedule_kernel(func, TARGET, opt_level=0).stages][0] == \
        "fuse_row_nests"


# ----------------------------------------------------------------------------- workload keys
def _keys(model, target: Target = TARGET) -> dict[str, str]:
    # built, not loaded: the other machine's code need not run on this one
    build = build_graph(import_onnx(model), options=BuildOptions(target=target))
    return {impl.nodes[0].op: impl.workload_key for impl in build.kernels}


@pytest.mark.usefixtures("nchw_convolutions")
def test_workload_keys_name_structure_not_names():
    base = _keys(conv_model()[0])
    assert len(set(base.values())) == len(base) >= 2  # the conv (+ relu), the head (a pad)
    # every node and value renamed: the same keys
    assert _keys(conv_model(prefix="renamed_")[0]) == base
    # the same convolution in another model (another head): the conv's key is shared
    other = _keys(conv_model(head_out=40)[0])
    assert other["Conv"] == base["Conv"] and other["MatMul"] != base["MatMul"]
    # another shape, another machine: other keys
    assert _keys(conv_model(width=10)[0])["Conv"] != base["Conv"]
    assert _keys(conv_model()[0], Target.parse("x86_64-avx512"))["Conv"] != base["Conv"]


def test_workload_keys_change_with_the_element_type():
    def relu(dtype: int) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])], "g",
            [helper.make_tensor_value_info("x", dtype, [4, 64])],
            [helper.make_tensor_value_info("y", dtype, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model

    f32, f64 = _keys(relu(TensorProto.FLOAT)), _keys(relu(TensorProto.DOUBLE))
    assert f32["Relu"] != f64["Relu"]
    assert _keys(relu(TensorProto.FLOAT)) == f32


# ----------------------------------------------------------------------------- the safety net
def _nets() -> dict[str, tuple[onnx.ModelProto, int]]:
    """Small models whose kernels cover every loop stage: an im2col GEMM with an epilogue, a
    weight-packed MatMul, a padded pool, a softmax (row reductions), a LayerNorm."""
    rng = np.random.default_rng(5)
    conv, _, _ = conv_model(channels=8, width=6)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 6, 20])
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("MatMul", ["p", "w"], ["m"]),
             helper.make_node("Softmax", ["m"], ["s"], axis=-1),
             helper.make_node("LayerNormalization", ["s", "g", "b"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(_randn(rng, 20, 40), "w"),
         numpy_helper.from_array(_randn(rng, 40), "g"),
         numpy_helper.from_array(_randn(rng, 40), "b")])
    mixed = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mixed.ir_version = 8
    return {"conv": (conv, 3), "mixed": (mixed, 3)}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("net", ["conv", "mixed"])
def test_every_kernel_under_random_configs_matches_its_unscheduled_form(net, seed):
    """The tuner's safety net: each kernel of a compiled model, scheduled with every knob at
    a random legal value (GEMM template and blockings included), computes in the loop
    interpreter what the kernel as lowered computes, on the same random data (constant
    operands packed as the build packs them)."""
    model, _ = _nets()[net]
    module = _compile(model)
    graph, rng = module.build.graph, np.random.default_rng(seed)
    for impl in module.build.kernels:
        constants = frozenset(i for i, name in enumerate(impl.group.inputs)
                              if name in graph.constants)
        config = random_config(impl.lowered, TARGET, seed,
                               space=lambda f, t, c: kernel_space(f, t, c, constants))
        scheduled = schedule_kernel(impl.lowered, TARGET, config, constant_params=constants,
                                    verify=True)
        arrays, packed = kernel_arrays(impl, graph, scheduled, rng)
        want = run_outputs(impl.lowered, arrays)
        got = run_outputs(scheduled.func, packed)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5,
                                       err_msg=f"{impl.func.name} with {config}")

"""A model's kernels compile as translation units of their own, cached one by one.

Equal kernels -- twice in one model, or in two models -- are one unit and one object; a cached
object that does not verify is rebuilt, never linked; the kernels stay internal to the library.
"""

from __future__ import annotations

import ctypes
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.core.target import Target
from ember.toolchain import (CacheWarning, CompileCache, ToolchainError,
                             build_library_from_units, compile_jobs, stats)
from ember.toolchain.units import OBJECT_SUFFIX


def _relu_model(name: str, width: int, branches: int):
    """``branches`` Relu+Mul kernels of the same code over inputs x0, x1, ... (not fusable:
    every branch is an output)."""
    nodes, inputs, outputs = [], [], []
    for b in range(branches):
        nodes += [helper.make_node("Relu", [f"x{b}"], [f"r{b}"], name=f"{name}_relu{b}"),
                  helper.make_node("Mul", [f"r{b}", f"r{b}"], [f"y{b}"], name=f"{name}_sq{b}")]
        inputs.append(helper.make_tensor_value_info(f"x{b}", TensorProto.FLOAT, [width]))
        outputs.append(helper.make_tensor_value_info(f"y{b}", TensorProto.FLOAT, [width]))
    graph = helper.make_graph(nodes, name, inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_equal_kernels_are_one_unit_and_the_library_runs_them_all(cache_dir):
    module = ember.compile(_relu_model("twice", 37, 3))
    build = module.build
    assert len(build.kernels) == 3
    assert len(build.units.kernels) == 1, "three kernels of the same code are one unit"
    assert len(set(build.units.links.values())) == 1
    xs = {f"x{b}": np.linspace(-2, 2, 37, dtype=np.float32) * (b + 1) for b in range(3)}
    outputs = module(**xs)
    for b in range(3):
        expected = np.maximum(xs[f"x{b}"], 0) ** 2
        np.testing.assert_allclose(outputs[b], expected, rtol=1e-6)


def test_a_second_model_reuses_the_objects_of_the_kernels_it_shares(cache_dir):
    ember.compile(_relu_model("first", 53, 1))
    compiled, hits = stats.objects_compiled, stats.object_hits
    second = ember.compile(_relu_model("second", 53, 2))  # other names, same kernel code
    assert stats.object_hits - hits == 1, "the shared kernel's object comes from the cache"
    assert stats.objects_compiled - compiled == 1, "only the new entry unit is compiled"
    x = np.arange(-26, 27, dtype=np.float32)
    np.testing.assert_array_equal(second(x0=x, x1=-x)[1], np.maximum(-x, 0) ** 2)


def test_kernels_are_internal_and_the_thread_controls_exported(cache_dir):
    module = ember.compile(_relu_model("hidden", 8, 1))
    library = ctypes.CDLL(str(module.build.library))
    link, = set(module.build.units.links.values())
    assert not hasattr(library, link), "a kernel symbol leaked out of the library"
    library.ember_set_num_threads(1)
    assert library.ember_get_num_threads() == 1


def test_a_broken_cached_object_is_rebuilt_not_linked(tmp_path):
    cache = CompileCache(tmp_path / "cache")
    entry = ('#include <stdint.h>\n__attribute__((visibility("default"))) int32_t '
             'ember_answer(void);\nint32_t ember_part(void);\n'
             'int32_t ember_answer(void) { return ember_part() + 1; }\n')
    part = "#include <stdint.h>\nint32_t ember_part(void) { return 41; }\n"
    first = build_library_from_units([entry, part], Target.native(), cache=cache)
    assert ctypes.CDLL(str(first.path)).ember_answer() == 42
    objects = sorted(cache.root.glob(f"*{OBJECT_SUFFIX}"))
    assert len(objects) == 2
    for obj in objects:
        obj.write_bytes(obj.read_bytes()[:64])  # truncated
    for library in cache.root.glob("*.so"):
        library.unlink()  # so that the objects are needed again
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = stats.objects_compiled
        again = build_library_from_units([entry, part], Target.native(), cache=cache)
    assert stats.objects_compiled - compiled == 2
    assert sum(issubclass(w.category, CacheWarning) for w in caught) == 2
    assert ctypes.CDLL(str(again.path)).ember_answer() == 42


def test_a_unit_submitted_early_and_listed_twice_is_compiled_and_linked_once(tmp_path):
    """UnitBuild compiles a unit as soon as it is submitted; link() takes the final list,
    where the shared GEMM unit of several kernels (or any unit) may appear more than once."""
    from ember.toolchain.units import UnitBuild, UnitSource

    cache = CompileCache(tmp_path / "cache")
    entry = ('#include <stdint.h>\n__attribute__((visibility("default"))) int32_t '
             'ember_answer(void);\nint32_t ember_part(void);\n'
             'int32_t ember_answer(void) { return ember_part() + 1; }\n')
    part = UnitSource("#include <stdint.h>\nint32_t ember_part(void) { return 41; }\n")
    compiled = stats.objects_compiled
    with UnitBuild(Target.native(), cache=cache) as build:
        build.submit(part)
        build.submit(part)
        library = build.link([entry, part, part])
    assert stats.objects_compiled - compiled == 2
    assert ctypes.CDLL(str(library.path)).ember_answer() == 42


def test_a_unit_that_does_not_compile_names_its_source(tmp_path):
    cache = CompileCache(tmp_path / "cache")
    good = "int ember_fine(void) { return 1; }\n"
    bad = "int ember_broken(void) { return undeclared_name; }\n"
    with pytest.raises(ToolchainError, match="undeclared_name") as error:
        build_library_from_units([good, bad], Target.native(), cache=cache)
    assert error.value.source_path is not None
    assert "undeclared_name" in error.value.source_path.read_text()


def test_compile_jobs_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("EMBER_COMPILE_JOBS", "3")
    assert compile_jobs() == 3
    for wrong in ("zero", "0", "-2"):
        monkeypatch.setenv("EMBER_COMPILE_JOBS", wrong)
        with pytest.raises(ToolchainError, match="EMBER_COMPILE_JOBS"):
            compile_jobs()
    monkeypatch.delenv("EMBER_COMPILE_JOBS")
    assert compile_jobs() >= 1


def test_only_units_calling_the_fast_float_math_get_its_flags(cache_dir):
    """A kernel calling the fast erf is compiled with ``-fno-trapping-math`` (so GCC
    vectorizes it) and still gives erf; a Relu kernel keeps the library's flags."""
    from math import erf

    from ember.codegen.c_fast_math import UNIT_FLAGS

    nodes = [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Relu", ["x"], ["r"])]
    graph = helper.make_graph(
        nodes, "erf_and_relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [67])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [67]) for n in ("e", "r")])
    module = ember.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    flags = {"em_erff(" in unit.source: unit.flags for unit in module.build.units.kernels}
    assert flags == {True: UNIT_FLAGS, False: ()}
    x = np.linspace(-4, 4, 67, dtype=np.float32)
    e, r = module(x)
    np.testing.assert_allclose(e, [erf(v) for v in x.astype(np.float64)], rtol=1e-6,
                               atol=1e-7)
    np.testing.assert_array_equal(r, np.maximum(x, 0))


# Output columns of the second layer: at least 4 panels of the widest register tile (AVX-512's
# 32 columns), so that both GEMMs pack A on AVX2 and AVX-512 machines alike.
OUTPUTS = 128
# Rows of A: more than any register tile's (so A is packed) yet few enough that each product
# stays one task's work with four panels or more (a product shared among threads has narrower
# tasks, which do not pack A)
ROWS = 13


def _two_linears_model(name: str, width: int):
    """Two Gemm+Relu layers of different widths (two kernels, A packed at run time)."""
    rng = np.random.default_rng(3)
    weights = {"w1": rng.standard_normal((width, 40)).astype(np.float32),
               "w2": rng.standard_normal((OUTPUTS, width)).astype(np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2"], ["y"], transB=1)]
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, OUTPUTS])],
        [numpy_helper.from_array(w, n) for n, w in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weights


def test_gemm_kernels_call_one_shared_unit_of_micro_kernels(cache_dir):
    """Every GEMM over a packed A calls the micro-kernels of one shared unit instead of
    compiling its own; a second model links the same object from the cache."""
    model, weights = _two_linears_model("first", 128)
    module = ember.compile(model)
    shared = [u for u in module.build.units.kernels if u.symbol.startswith("ember_gemm_shared_")]
    gemms = [u for u in module.build.units.kernels if "ember_gemm_packed_f32_" in u.source
             and u not in shared]
    assert len(shared) == 1 and len(gemms) == 2
    assert all("EMBER_INTERNAL void ember_gemm_packed_f32_" in u.source and
               "_Pragma" not in u.source for u in gemms), "kernels declare, not define, them"
    x = np.random.default_rng(4).standard_normal((ROWS, 40)).astype(np.float32)
    want = np.maximum(x.astype(np.float64) @ weights["w1"].T, 0) @ weights["w2"].T
    np.testing.assert_allclose(module(x), want, rtol=1e-4, atol=1e-4)
    hits = stats.object_hits
    other, _ = _two_linears_model("second", 160)
    second = ember.compile(other)
    assert shared[0] in second.build.units.kernels
    assert stats.object_hits > hits, "the shared unit's object comes from the cache"

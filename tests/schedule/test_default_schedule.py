"""The default schedule: which loops it parallelizes, fuses, reorders and vectorizes (printed
Expected IR), and that the scheduled kernels compute the same results (executed by the
reference interpreter, which also checks that parallel and vectorized loops have independent
iterations)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "lower"))

from loop_interpreter import CASES, expect, run_outputs  # noqa: E402

from configs import random_config  # noqa: E402
from ember.core.dtypes import DType  # noqa: E402
from ember.core.target import Target  # noqa: E402
from ember.ir.compute import (compute, const_like, placeholder, reduce_axis,  # noqa: E402
                              reduce_sum)
from ember.ir.loop import For, ForKind, verify_func, walk  # noqa: E402
from ember.lower import lower_compute  # noqa: E402
from ember.schedule.config import ScheduleConfigError, Decisions, KernelConfig  # noqa: E402
from ember.schedule.default import default_schedule  # noqa: E402

F32 = DType.FLOAT32
TARGET = Target.parse("x86_64")


def kinds(func) -> dict[str, ForKind]:
    return {n.var.name: n.kind for n in walk(func.body) if isinstance(n, For)}


def scheduled(func, **knobs):
    """``func`` scheduled with the given knobs (the rest by the heuristic): the paths of the
    schedule that pay only on large kernels, on kernels small enough to interpret."""
    return default_schedule(func, TARGET, Decisions(KernelConfig.of(knobs), kernel=func.name))


# ----------------------------------------------------------------------------- printed IR
def test_small_matmul_moves_the_reduction_out_and_vectorizes_the_output_loop():
    expect(default_schedule(CASES["matmul"]().lower(), TARGET), """
        func matmul(a: f32[5, 7], b: f32[7, 9], out0: f32[5, 9]) {
          vectorized for i0_i1_f in [0, 45) @accumulation=init {
            out0[((i0_i1_f // 9) * 9) + (i0_i1_f %% 9)] = 0.0f
          }
          for i2 in [0, 5) @accumulation=update {
            for i4 in [0, 7) @reduce=True @accumulate_init=0.0f {
              vectorized for i3 in [0, 9) {
                out0[(i2 * 9) + i3] = out0[(i2 * 9) + i3] + (a[(i2 * 7) + i4] * b[(i4 * 9) + i3])
              }
            }
          }
        }
    """)


def test_large_matmul_runs_its_rows_in_parallel():
    a, b = placeholder((64, 32), F32, "a"), placeholder((32, 48), F32, "b")
    k = reduce_axis(32, "k")
    c = compute((64, 48), lambda i, j: reduce_sum(a[i, k] * b[k, j], k), "mm")
    expect(default_schedule(lower_compute("mm", [a, b], [c]), TARGET), """
        func mm(a: f32[64, 32], b: f32[32, 48], out0: f32[64, 48]) {
          vectorized for i0_i1_f in [0, 3072) @accumulation=init {
            out0[((i0_i1_f // 48) * 48) + (i0_i1_f %% 48)] = 0.0f
          }
          parallel for i2 in [0, 64) @accumulation=update {
            for i4 in [0, 32) @reduce=True @accumulate_init=0.0f {
              vectorized for i3 in [0, 48) {
                out0[(i2 * 48) + i3] = out0[(i2 * 48) + i3] + (a[(i2 * 32) + i4] * b[(i4 * 48) + i3])
              }
            }
          }
        }
    """)  # noqa: E501


def test_wide_accumulation_iterates_column_blocks_outermost():
    a, b = placeholder((5, 7), F32, "a"), placeholder((7, 16), F32, "b")
    k = reduce_axis(7, "k")
    c = compute((5, 16), lambda i, j: reduce_sum(a[i, k] * b[k, j], k), "mm")
    func = scheduled(lower_compute("mm", [a, b], [c]), **{
        "nest0.coalesce": False, "nest0.parallel_loops": 1, "nest1.column_block": 4,
        "nest1.parallel": "outer"})
    assert kinds(func) == {"i0": ForKind.PARALLEL, "i1": ForKind.VECTORIZED,
                           "i3_o_i2_f": ForKind.PARALLEL, "i4": ForKind.SERIAL,
                           "i3_i": ForKind.VECTORIZED}
    assert list(kinds(func)) == ["i0", "i1", "i3_o_i2_f", "i4", "i3_i"]
    rng = np.random.default_rng(3)
    xs, ys = rng.standard_normal((5, 7)).astype(np.float32), \
        rng.standard_normal((7, 16)).astype(np.float32)
    np.testing.assert_allclose(run_outputs(func, [xs, ys])[0], xs @ ys, rtol=1e-5, atol=1e-5)


def test_outer_loops_are_fused_until_there_are_enough_parallel_iterations():
    x = placeholder((4, 3, 2731), F32, "x")
    y = compute((4, 3, 2731), lambda i, j, k: x[i, j, k] + const_like(1, F32), "inc")
    expect(scheduled(lower_compute("inc3", [x], [y]), **{"nest0.coalesce": False}), """
        func inc3(x: f32[4, 3, 2731], out0: f32[4, 3, 2731]) {
          parallel for i0_i1_f in [0, 12) {
            vectorized for i2 in [0, 2731) {
              out0[(((i0_i1_f // 3) * 8193) + ((i0_i1_f %% 3) * 2731)) + i2] = x[(((i0_i1_f // 3) * 8193) + ((i0_i1_f %% 3) * 2731)) + i2] + 1.0f
            }
          }
        }
    """)  # noqa: E501


def test_loops_that_every_access_walks_as_one_are_merged():
    """An elementwise nest whose accesses are contiguous across its loops becomes one loop
    (split into parallel chunks); a broadcast operand keeps the loops it does not walk
    apart."""
    x, b = placeholder((4, 3, 2731), F32, "x"), placeholder((3, 1), F32, "b")
    y = compute((4, 3, 2731), lambda i, j, k: x[i, j, k] + const_like(1, F32), "inc")
    func = default_schedule(lower_compute("inc3", [x], [y]), TARGET)
    assert kinds(func) == {"i0_i1_f_i2_f_o": ForKind.PARALLEL,
                           "i0_i1_f_i2_f_i": ForKind.VECTORIZED,
                           "i0_i1_f_i2_f_t": ForKind.VECTORIZED}
    z = compute((4, 3, 2731), lambda i, j, k: x[i, j, k] + b[j, 0], "shift")
    func = default_schedule(lower_compute("shift", [x, b], [z]), TARGET)
    assert [n.extent.value for n in walk(func.body) if isinstance(n, For)] == [12, 2731]
    data, bias = np.arange(4 * 3 * 2731, dtype=np.float32).reshape(4, 3, 2731), \
        np.array([[1.0], [2.0], [3.0]], np.float32)
    np.testing.assert_array_equal(run_outputs(func, [data, bias])[0], data + bias[None])


def test_flat_loop_is_split_into_parallel_chunks_with_a_vectorized_tail():
    n = 32768 + 37
    x = placeholder((n,), F32, "x")
    y = compute((n,), lambda i: x[i] * const_like(2, F32), "twice")
    func = default_schedule(lower_compute("twice", [x], [y]), TARGET)
    expect(func, """
        func twice(x: f32[32805], out0: f32[32805]) {
          parallel for i0_o in [0, 32) {
            vectorized for i0_i in [0, 1024) {
              out0[(i0_o * 1024) + i0_i] = x[(i0_o * 1024) + i0_i] * 2.0f
            }
          }
          vectorized for i0_t in [0, 37) {
            out0[32768 + i0_t] = x[32768 + i0_t] * 2.0f
          }
        }
    """)
    data = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    np.testing.assert_array_equal(run_outputs(func, [data])[0], data * 2)


def test_row_reductions_keep_their_accumulator_loop_serial():
    expect(default_schedule(CASES["softmax"]().lower(), TARGET), """
        func softmax(x: f32[5, 11], out0: f32[5, 11], scratch0: f32[5], scratch1: f32[5]) {
          for i0 in [0, 5) {
            alloc t0: f32[1] local
            t0[0] = -inff
            for i1 in [0, 11) {
              t0[0] = max(t0[0], x[(i0 * 11) + i1])
            }
            scratch0[i0] = t0[0]
          }
          for i2 in [0, 5) {
            vectorized for i3 in [0, 11) {
              out0[(i2 * 11) + i3] = exp((x[(i2 * 11) + i3] - scratch0[i2]))
            }
          }
          for i4 in [0, 5) {
            alloc t1: f32[1] local
            t1[0] = 0.0f
            for i5 in [0, 11) {
              t1[0] = t1[0] + out0[(i4 * 11) + i5]
            }
            scratch1[i4] = t1[0]
          }
          for i6 in [0, 5) {
            vectorized for i7 in [0, 11) {
              out0[(i6 * 11) + i7] = out0[(i6 * 11) + i7] / scratch1[i6]
            }
          }
        }
    """)


@pytest.mark.parametrize("shape", [(40000,), (200, 200), (8,)])
def test_reduction_to_a_scalar_is_neither_parallel_nor_vectorized(shape):
    """Every iteration of these loops updates the one accumulator: running them in parallel
    races, and vectorizing them breaks the independence the C code asserts (the default
    schedule used to do both)."""
    x = placeholder(shape, F32, "x")
    axes = [reduce_axis(d, "r") for d in shape]
    y = compute((), lambda: reduce_sum(x[tuple(axes)], axes), "total")
    func = default_schedule(lower_compute("total", [x], [y]), TARGET)
    assert set(kinds(func).values()) == {ForKind.SERIAL}
    if shape == (8,):
        data = np.arange(8, dtype=np.float32)
        assert run_outputs(func, [data])[0] == 28


def test_scalar_reduction_stays_serial_as_one_loop():
    func = CASES["total"]().lower()
    with pytest.raises(ScheduleConfigError, match="chunk"):
        scheduled(func, **{"nest0.chunk": 8})  # its iterations are not independent
    expect(scheduled(func), """
        func total(x: f32[4, 8], out0: f32[]) {
          alloc t0: f32[1] local
          t0[0] = 0.0f
          for i0_i1_f in [0, 32) {
            t0[0] = t0[0] + x[((i0_i1_f // 8) * 8) + (i0_i1_f %% 8)]
          }
          out0[0] = t0[0]
        }
    """)


def test_conv_accumulation_fuses_its_outer_loops_for_threads():
    func = scheduled(CASES["conv"]().lower(), **{
        "nest0.coalesce": False, "nest1.parallel": "outer", "nest2.coalesce": False})
    assert kinds(func) == {
        "i0": ForKind.SERIAL, "i1": ForKind.SERIAL, "i2": ForKind.SERIAL,
        "i3": ForKind.VECTORIZED,                                            # init
        "i4_i5_f_i6_f": ForKind.PARALLEL, "i8": ForKind.SERIAL, "i9": ForKind.SERIAL,
        "i10": ForKind.SERIAL, "i7": ForKind.VECTORIZED,                     # accumulation
        "i11": ForKind.SERIAL, "i12": ForKind.SERIAL, "i13": ForKind.SERIAL,
        "i14": ForKind.VECTORIZED,                                           # bias epilogue
    }
    assert list(kinds(func)) == ["i0", "i1", "i2", "i3", "i4_i5_f_i6_f", "i8", "i9", "i10",
                                 "i7", "i11", "i12", "i13", "i14"]


def test_flat_loop_split_in_parallel_chunks():
    x = placeholder((69,), F32, "x")
    y = compute((69,), lambda i: x[i] - const_like(1, F32), "dec")
    func = scheduled(lower_compute("dec", [x], [y]), **{"nest0.chunk": 8})
    expect(func, """
        func dec(x: f32[69], out0: f32[69]) {
          parallel for i0_o in [0, 8) {
            vectorized for i0_i in [0, 8) {
              out0[(i0_o * 8) + i0_i] = x[(i0_o * 8) + i0_i] - 1.0f
            }
          }
          vectorized for i0_t in [0, 5) {
            out0[64 + i0_t] = x[64 + i0_t] - 1.0f
          }
        }
    """)
    data = np.arange(69, dtype=np.float32)
    np.testing.assert_array_equal(run_outputs(func, [data])[0], data - 1)


# ----------------------------------------------------------------------------- semantics
@pytest.mark.parametrize("config", ["default", "random0", "random1", "random2"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_default_schedule_preserves_results(name, config):
    """The heuristic's schedule and schedules with every knob at a random legal value
    compute what the unscheduled kernel computes."""
    case = CASES[name]()
    func = case.lower()
    chosen = KernelConfig() if config == "default" else \
        random_config(func, TARGET, seed=int(config[-1]))
    scheduled = default_schedule(func, TARGET, Decisions(chosen, kernel=func.name))
    verify_func(scheduled)
    assert scheduled.params == func.params and scheduled.name == func.name
    results = run_outputs(scheduled, case.arrays)  # raises on dependent parallel iterations
    case.check(results)
    for got, want in zip(results, run_outputs(func, case.arrays)):
        np.testing.assert_array_equal(got, want)  # same operations in the same order


def test_copies_of_outputs_are_vectorized():
    x = placeholder((3, 5), F32, "x")
    func = default_schedule(lower_compute("ident", [x], [x]), TARGET)
    expect(func, """
        func ident(x: f32[3, 5], out0: f32[3, 5]) {
          vectorized for i0 in [0, 15) {
            out0[i0] = x[i0]
          }
        }
    """)
    data = np.arange(15, dtype=np.float32).reshape(3, 5)
    np.testing.assert_array_equal(run_outputs(func, [data])[0], data)

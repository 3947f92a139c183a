"""Register tiling of accumulation nests (``Schedule.cache_accumulator``): printed IR, results
of tiled kernels in the reference interpreter against numpy (and bit-identical to the untiled
nest), odd shapes with peeled tails, traces, errors, and the default schedule's use of it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "lower"))

from loop_interpreter import CASES, run_outputs  # noqa: E402

from ember.core.dtypes import DType  # noqa: E402
from ember.core.target import Target  # noqa: E402
from ember.ir.compute import compute, placeholder, reduce_axis, reduce_sum  # noqa: E402
from ember.ir.loop import Allocate, verify_func, walk  # noqa: E402
from ember.lower import lower_compute  # noqa: E402
from ember.schedule import Schedule, ScheduleError, Trace  # noqa: E402
from ember.schedule.config import Decisions, KernelConfig  # noqa: E402
from ember.schedule.default import default_schedule  # noqa: E402

F32 = DType.FLOAT32


def matmul(m: int, k: int, n: int):
    a, b = placeholder((m, k), F32, "a"), placeholder((k, n), F32, "b")
    r = reduce_axis(k, "k")
    c = compute((m, n), lambda i, j: reduce_sum(a[i, r] * b[r, j], r), "mm")
    rng = np.random.default_rng(m * 10000 + k * 100 + n)
    arrays = [rng.standard_normal((m, k)).astype(np.float32),
              rng.standard_normal((k, n)).astype(np.float32)]
    return lower_compute("mm", [a, b], [c]), arrays


def check_tiled(func, s: Schedule, arrays, reference) -> None:
    verify_func(s.func)
    got = run_outputs(s.func, arrays)  # also checks vectorized loops are independent
    want = run_outputs(func, arrays)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)  # same terms, same order per element
    np.testing.assert_allclose(got[0], reference, rtol=1e-4, atol=1e-4)
    assert s.trace.replay(func).func == s.func
    assert Trace.from_json(s.trace.to_json()).replay(func).func == s.func


# ----------------------------------------------------------------------------- printed IR
def test_printed_tile_of_a_small_matmul():
    func, _ = matmul(4, 3, 8)
    s = Schedule(func)
    s.reorder("i2", "i4", "i3")
    assert s.cache_accumulator("i2", "i3", 2, 4) == ("i2_o", "i3_o")
    assert str(s.func) == textwrap.dedent("""
        func mm(a: f32[4, 3], b: f32[3, 8], out0: f32[4, 8]) {
          for i0 in [0, 4) @accumulation=init {
            for i1 in [0, 8) {
              out0[(i0 * 8) + i1] = 0.0f
            }
          }
          for i2_o in [0, 2) @tiled=True {
            for i3_o in [0, 2) {
              alloc out0_acc: f32[2, 4] local
              unrolled for i2_l in [0, 2) {
                vectorized for i3_l in [0, 4) {
                  out0_acc[(i2_l * 4) + i3_l] = out0[(((i2_o * 2) + i2_l) * 8) + ((i3_o * 4) + i3_l)]
                }
              }
              for i4 in [0, 3) @reduce=True @accumulate_init=0.0f {
                unrolled for i2_i in [0, 2) {
                  vectorized for i3_i in [0, 4) {
                    out0_acc[(i2_i * 4) + i3_i] = out0_acc[(i2_i * 4) + i3_i] + (a[(((i2_o * 2) + i2_i) * 3) + i4] * b[(i4 * 8) + ((i3_o * 4) + i3_i)])
                  }
                }
              }
              unrolled for i2_s in [0, 2) {
                vectorized for i3_s in [0, 4) {
                  out0[(((i2_o * 2) + i2_s) * 8) + ((i3_o * 4) + i3_s)] = out0_acc[(i2_s * 4) + i3_s]
                }
              }
            }
          }
        }
    """).strip()  # noqa: E501
    assert str(s.trace) == "reorder('i2', 'i4', 'i3')\ncache_accumulator('i2', 'i3', 2, 4, False)"


def test_fused_passes_start_the_tile_at_the_initial_value():
    # With fuse_passes the init pass over the output disappears: the tile starts at 0.
    func, _ = matmul(4, 3, 8)
    s = Schedule(func)
    s.reorder("i2", "i4", "i3")
    s.cache_accumulator("i2", "i3", 2, 4, fuse_passes=True)
    text = str(s.func)
    assert "@accumulation=init" not in text
    assert "out0_acc[(i2_l * 4) + i3_l] = 0.0f" in text
    assert "= out0[" not in text  # the output is written once, never read back


@pytest.mark.parametrize("rows,cols", [(2, 4), (3, 3), (1, 5)])
def test_fused_passes_apply_the_epilogue_to_the_tile_before_the_store(rows, cols):
    case = CASES["conv"]()  # convolution + bias: init, update and epilogue passes
    func = case.lower()
    s = Schedule(func)
    s.reorder("i4", "i6", "i5", "i8", "i9", "i10", "i7")
    s.cache_accumulator("i5", "i7", rows, cols, fuse_passes=True)
    verify_func(s.func)
    text = str(s.func)
    assert "@accumulation=init" not in text and "@accumulation=epilogue" not in text
    case.check(run_outputs(s.func, case.arrays))
    assert s.trace.replay(func).func == s.func


# ----------------------------------------------------------------------------- semantics
@pytest.mark.parametrize("m,k,n", [(7, 29, 13), (1, 5, 9), (6, 4, 32), (5, 3, 4), (13, 1, 7)])
@pytest.mark.parametrize("rows,cols", [(4, 8), (6, 32), (1, 1), (3, 5), (2, 40)])
def test_tiled_matmul_matches_numpy(m, k, n, rows, cols):
    func, arrays = matmul(m, k, n)
    s = Schedule(func)
    s.reorder("i2", "i4", "i3")
    s.cache_accumulator("i2", "i3", rows, cols)
    assert any(isinstance(x, Allocate) for x in walk(s.func.body))
    check_tiled(func, s, arrays, arrays[0] @ arrays[1])


@pytest.mark.parametrize("rows,cols", [(2, 4), (3, 3), (1, 5)])
def test_tiled_conv_with_bias_epilogue(rows, cols):
    case = CASES["conv"]()
    func = case.lower()
    s = Schedule(func)
    # nest: n i4, o i5, h i6, v i7, reduce c i8, kh i9, kw i10; rows over o, columns over v
    s.reorder("i4", "i6", "i5", "i8", "i9", "i10", "i7")
    s.cache_accumulator("i5", "i7", rows, cols)
    verify_func(s.func)
    got = run_outputs(s.func, case.arrays)
    case.check(got)
    for g, w in zip(got, run_outputs(func, case.arrays)):
        np.testing.assert_array_equal(g, w)
    assert s.trace.replay(func).func == s.func


def test_errors_leave_the_function_unchanged():
    func, _ = matmul(4, 3, 8)
    s = Schedule(func)
    with pytest.raises(ScheduleError, match="reduction loops between"):
        s.cache_accumulator("i2", "i3", 2, 4)  # i3 directly inside i2: no reduction between
    s.reorder("i2", "i4", "i3")
    before = s.func
    with pytest.raises(ScheduleError, match="positive"):
        s.cache_accumulator("i2", "i3", 0, 4)
    with pytest.raises(ScheduleError, match="no loop named"):
        s.cache_accumulator("nope", "i3", 2, 4)
    assert s.func == before and len(s.trace.steps) == 1


# ----------------------------------------------------------------------------- default schedule
@pytest.mark.parametrize("m,k,n", [(7, 29, 13), (1, 16, 40), (13, 16, 100), (64, 9, 33)])
@pytest.mark.parametrize("target", ["x86_64", "x86_64-avx512"])
def test_register_tiles_where_a_row_loop_exists(m, k, n, target):
    """Every tile the config space offers computes the product, bit for bit as untiled; a
    single row has no row loop to tile (the knob offers no tile)."""
    func, arrays = matmul(m, k, n)
    tiles = _tile_choices(func, Target.parse(target))
    assert bool(tiles) == (m >= 2)
    tile = tiles[len(tiles) // 2] if tiles else ()
    scheduled = default_schedule(func, Target.parse(target), Decisions(KernelConfig.of({
        "nest1.register_tile": tile,
        **({"nest1.parallel": "row_tiles"} if m // tile[0] >= 2 else {})} if tile else {})))
    verify_func(scheduled)
    tiled = any(isinstance(x, Allocate) for x in walk(scheduled.body))
    assert tiled == (m >= 2)  # a single row has no row loop to tile
    got = run_outputs(scheduled, arrays)[0]
    np.testing.assert_array_equal(got, run_outputs(func, arrays)[0])
    np.testing.assert_allclose(got, arrays[0] @ arrays[1], rtol=1e-4, atol=1e-4)


def test_conv_rows_tile_over_output_channels():
    case = CASES["conv"]()
    func = case.lower()
    target = Target.parse("x86_64")
    tile = _tile_choices(func, target)[0]
    scheduled = default_schedule(func, target, Decisions(KernelConfig.of({
        "nest1.register_tile": tile, "nest1.parallel": "outer"})))
    verify_func(scheduled)
    assert "cache_accumulator" not in str(scheduled)  # (the trace is not printed)
    assert any(isinstance(x, Allocate) for x in walk(scheduled.body))
    got = run_outputs(scheduled, case.arrays)
    case.check(got)
    for g, w in zip(got, run_outputs(func, case.arrays)):
        np.testing.assert_array_equal(g, w)


def _tile_choices(func, target):
    """The register tiles the config space offers the accumulation nest (nest 1)."""
    decisions = Decisions()
    default_schedule(func, target, decisions)
    knob, = (k for k in decisions.space if k.name == "nest1.register_tile")
    return [c for c in knob.choices if c]

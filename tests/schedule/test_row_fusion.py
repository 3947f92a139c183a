"""Row fusion and invariant loads: which nests become one loop over their rows (printed
IR), that the fused kernels compute what the unfused ones do (the loop interpreter on
random data, and numpy), and what must stay apart."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1] / "lower"))

from loop_interpreter import CASES, run_outputs  # noqa: E402

from ember.core.dtypes import DType  # noqa: E402
from ember.core.target import Target  # noqa: E402
from ember.ir.compute import (compute, const_like, placeholder, reduce_axis,  # noqa: E402
                              reduce_sum)
from ember.ir.loop import For, ForKind, walk  # noqa: E402
from ember.ir.loop.expr import Select  # noqa: E402
from ember.lower import lower_compute  # noqa: E402
from ember.schedule.config import Decisions, KernelConfig  # noqa: E402
from ember.schedule.hoist import hoist_invariant_loads  # noqa: E402
from ember.schedule.pipeline import schedule_kernel  # noqa: E402
from ember.schedule.primitives import Schedule  # noqa: E402
from ember.schedule.row_fusion import fuse_row_nests  # noqa: E402

F32 = DType.FLOAT32
TARGET = Target.parse("x86_64-avx2")


def _fused(func, **knobs):
    schedule = Schedule(func, TARGET)
    decisions = Decisions(KernelConfig.of(knobs), kernel=func.name)
    fuse_row_nests(schedule, decisions)
    return schedule, decisions


def _top_loops(func) -> int:
    body = func.body
    statements = body.stmts if hasattr(body, "stmts") else (body,)
    return sum(1 for s in statements if isinstance(s, For))


def test_softmax_stages_become_one_loop_over_rows():
    case = CASES["softmax"]()
    func = case.lower()
    assert _top_loops(func) == 4  # max, exp, sum, quotient
    schedule, decisions = _fused(func)
    assert _top_loops(schedule.func) == 1
    assert [k.name for k in decisions.space] == ["rows0.fuse"]
    assert "fuse_nests" in str(schedule.trace)
    results = run_outputs(schedule.func, case.arrays)
    case.check(results)
    for got, want in zip(results, run_outputs(func, case.arrays)):
        np.testing.assert_array_equal(got, want)  # the same operations in the same order
    off, _ = _fused(func, **{"rows0.fuse": False})
    assert _top_loops(off.func) == 4


def test_a_row_that_reads_its_neighbours_statistic_stays_apart():
    """s[r] is read at row r + 1: fused, row r would read it before it is written."""
    x = placeholder((6, 16), F32, "x")
    k = reduce_axis(16, "k")
    s = compute((6,), lambda r: reduce_sum(x[r, k], k), "s")
    y = compute((6, 16), lambda r, j: x[r, j] - s[(r + 1) % 6], "y")
    func = lower_compute("shifted", [x], [y])
    schedule, decisions = _fused(func)
    assert not decisions.space and _top_loops(schedule.func) == _top_loops(func)
    data = np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32)
    want = data - np.roll(data.sum(axis=1), -1)[:, None]
    np.testing.assert_allclose(run_outputs(schedule_kernel(func, TARGET).func, [data])[0],
                               want, rtol=1e-5, atol=1e-5)


def test_fused_rows_run_in_parallel_and_their_inner_loops_vectorized():
    func = CASES["softmax"]().lower()
    scheduled = schedule_kernel(func, TARGET, verify=True).func
    loops = [n for n in walk(scheduled.body) if isinstance(n, For)]
    assert loops[0].kind is ForKind.PARALLEL
    assert any(l.kind is ForKind.VECTORIZED for l in loops[1:])


def test_invariant_loads_of_a_vectorized_loop_are_read_once_before_it():
    x, s = placeholder((4, 32), F32, "x"), placeholder((4,), F32, "s")
    zero = const_like(0, F32)
    y = compute((4, 32), lambda r, j: x[r, j] / s[r], "y")
    guarded = compute((4, 32), lambda r, j: Select(x[r, j].gt(zero), s[r], zero), "g")
    for out, hoisted in ((y, True), (guarded, False)):
        func = lower_compute("div", [x, s], [out])
        schedule = Schedule(func)
        schedule.vectorize(schedule.loops()[-1])
        result = hoist_invariant_loads(schedule.func)
        assert ("let ld0: f32 = s[i0]" in str(result)) == hoisted, str(result)
        data = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
        scale = np.array([1.0, 2.0, -3.0, 0.5], np.float32)
        np.testing.assert_array_equal(run_outputs(result, [data, scale])[0],
                                      run_outputs(func, [data, scale])[0])

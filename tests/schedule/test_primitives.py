"""Schedule primitives: the rewritten loop nests (printed Before/Expected), their results
(executed by the reference interpreter, which also checks that parallel and vectorized loops
have independent iterations), traces, and errors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "lower"))

from loop_interpreter import CASES, IndependenceError, expect, run_outputs  # noqa: E402

from ember.core.dtypes import DType  # noqa: E402
from ember.ir.loop import (INDEX, Allocate, Buffer, Const, For, ForKind, Load,  # noqa: E402
                           PrimFunc, Seq, Store, Var, verify_func, walk)
from ember.schedule import Schedule, ScheduleError, Step, Trace  # noqa: E402
from ember.schedule.primitives import expr_uses, loop_nests, perfect_chain  # noqa: E402

F32 = DType.FLOAT32


def increment(start: int = 0, extent: int = 10, kind: ForKind = ForKind.SERIAL) -> PrimFunc:
    x, y = Buffer("x", F32, (16,)), Buffer("y", F32, (16,))
    i = Var("i")
    return PrimFunc("inc", (x, y), For(i, Const(start, INDEX), Const(extent, INDEX), kind,
                                       Store(y, i, Load(x, i) + Const(1.0, F32))))


INC_BEFORE = """
    func inc(x: f32[16], y: f32[16]) {
      for i in [0, 10) {
        y[i] = x[i] + 1.0f
      }
    }
"""


# ----------------------------------------------------------------------------- printed IR
def test_split_with_a_guarded_tail():
    s = Schedule(increment())
    expect(s.func, INC_BEFORE)
    assert s.split("i", 4) == ("i_o", "i_i")
    expect(s.func, """
        func inc(x: f32[16], y: f32[16]) {
          for i_o in [0, 3) {
            for i_i in [0, 4) {
              if ((i_o * 4) + i_i) < 10 {
                y[(i_o * 4) + i_i] = x[(i_o * 4) + i_i] + 1.0f
              }
            }
          }
        }
    """)


def test_split_with_a_peeled_tail():
    s = Schedule(increment())
    assert s.split("i", 4, tail="peel") == ("i_o", "i_i")
    expect(s.func, """
        func inc(x: f32[16], y: f32[16]) {
          for i_o in [0, 2) {
            for i_i in [0, 4) {
              y[(i_o * 4) + i_i] = x[(i_o * 4) + i_i] + 1.0f
            }
          }
          for i_t in [0, 2) {
            y[8 + i_t] = x[8 + i_t] + 1.0f
          }
        }
    """)


@pytest.mark.parametrize("tail", ["guard", "peel"])
def test_split_by_a_divisor_needs_no_tail(tail):
    s = Schedule(increment())
    s.split("i", 5, tail=tail)
    expect(s.func, """
        func inc(x: f32[16], y: f32[16]) {
          for i_o in [0, 2) {
            for i_i in [0, 5) {
              y[(i_o * 5) + i_i] = x[(i_o * 5) + i_i] + 1.0f
            }
          }
        }
    """)


def test_split_keeps_the_start_and_the_kind_of_the_outer_loop():
    s = Schedule(increment(start=2, extent=7, kind=ForKind.PARALLEL))
    s.split("i", 3, tail="peel")
    expect(s.func, """
        func inc(x: f32[16], y: f32[16]) {
          parallel for i_o in [0, 2) {
            for i_i in [0, 3) {
              y[2 + ((i_o * 3) + i_i)] = x[2 + ((i_o * 3) + i_i)] + 1.0f
            }
          }
          for i_t in [0, 1) {
            y[8 + i_t] = x[8 + i_t] + 1.0f
          }
        }
    """)


def test_split_by_more_than_the_extent():
    s = Schedule(increment())
    s.split("i", 16)
    expect(s.func, """
        func inc(x: f32[16], y: f32[16]) {
          for i_o in [0, 1) {
            for i_i in [0, 16) {
              if ((i_o * 16) + i_i) < 10 {
                y[(i_o * 16) + i_i] = x[(i_o * 16) + i_i] + 1.0f
              }
            }
          }
        }
    """)
    s = Schedule(increment())
    outer, inner = s.split("i", 16, tail="peel")
    s.vectorize(inner)  # the returned loops exist even though they run zero times
    expect(s.func, """
        func inc(x: f32[16], y: f32[16]) {
          for i_o in [0, 0) {
            vectorized for i_i in [0, 16) {
              y[(i_o * 16) + i_i] = x[(i_o * 16) + i_i] + 1.0f
            }
          }
          for i_t in [0, 10) {
            y[i_t] = x[i_t] + 1.0f
          }
        }
    """)


def copy_2d() -> PrimFunc:
    x, y = Buffer("x", F32, (15,)), Buffer("y", F32, (15,))
    i, j = Var("i"), Var("j")
    return PrimFunc("copy2", (x, y), For(
        i, Const(0, INDEX), Const(5, INDEX), ForKind.SERIAL,
        For(j, Const(0, INDEX), Const(3, INDEX), ForKind.SERIAL,
            Store(y, i * 3 + j, Load(x, i * 3 + j)))))


def test_peeled_tail_gets_fresh_loop_names():
    """The tail copies the loop body; its inner loops are renamed so that loop names stay
    unique (with the copy keeping the name 'j', splitting 'j' afterwards replaced both loops
    by the main one, whose body uses 'i_o' and 'i_i': out of scope in the tail)."""
    s = Schedule(copy_2d())
    s.split("i", 2, tail="peel")
    s.split("j", 2)
    s.vectorize("j_p")
    expect(s.func, """
        func copy2(x: f32[15], y: f32[15]) {
          for i_o in [0, 2) {
            for i_i in [0, 2) {
              for j_o in [0, 2) {
                for j_i in [0, 2) {
                  if ((j_o * 2) + j_i) < 3 {
                    y[(((i_o * 2) + i_i) * 3) + ((j_o * 2) + j_i)] = x[(((i_o * 2) + i_i) * 3) + ((j_o * 2) + j_i)]
                  }
                }
              }
            }
          }
          for i_t in [0, 1) {
            vectorized for j_p in [0, 3) {
              y[((4 + i_t) * 3) + j_p] = x[((4 + i_t) * 3) + j_p]
            }
          }
        }
    """)  # noqa: E501
    verify_func(s.func)
    data = np.arange(15, dtype=np.float32)
    np.testing.assert_array_equal(run_outputs(s.func, [data])[0], data)
    # names are never reused, even after the loop that had one is gone
    s.split("j_p", 2, tail="peel")
    s.split("i_o", 1, tail="peel")
    s.split("i_i", 1, tail="peel")
    assert len(s.loops()) == len(set(s.loops()))
    np.testing.assert_array_equal(run_outputs(s.func, [data])[0], data)


def test_primitives_do_not_create_a_loop_name_that_exists():
    x = Buffer("x", F32, (16,))
    i, i_o = Var("i"), Var("i_o")
    func = PrimFunc("two", (x,), Seq((
        For(i, Const(0, INDEX), Const(8, INDEX), ForKind.SERIAL, Store(x, i, Const(0.0, F32))),
        For(i_o, Const(0, INDEX), Const(8, INDEX), ForKind.SERIAL,
            Store(x, i_o + 8, Const(1.0, F32))))))
    s = Schedule(func)
    _unchanged_after_error(s, lambda: s.split("i", 4),
                           "two: split of loop 'i' would create loop 'i_o', which already exists")


MATMUL_BEFORE = """
    func matmul(a: f32[5, 7], b: f32[7, 9], out0: f32[5, 9]) {
      for i0 in [0, 5) @accumulation=init {
        for i1 in [0, 9) {
          out0[(i0 * 9) + i1] = 0.0f
        }
      }
      for i2 in [0, 5) @accumulation=update {
        for i3 in [0, 9) {
          for i4 in [0, 7) @reduce=True @accumulate_init=0.0f {
            out0[(i2 * 9) + i3] = out0[(i2 * 9) + i3] + (a[(i2 * 7) + i4] * b[(i4 * 9) + i3])
          }
        }
      }
    }
"""


def test_reorder_moves_the_reduction_loop_outwards():
    s = Schedule(CASES["matmul"]().lower())
    expect(s.func, MATMUL_BEFORE)
    s.reorder("i2", "i4", "i3")
    expect(s.func, """
        func matmul(a: f32[5, 7], b: f32[7, 9], out0: f32[5, 9]) {
          for i0 in [0, 5) @accumulation=init {
            for i1 in [0, 9) {
              out0[(i0 * 9) + i1] = 0.0f
            }
          }
          for i2 in [0, 5) @accumulation=update {
            for i4 in [0, 7) @reduce=True @accumulate_init=0.0f {
              for i3 in [0, 9) {
                out0[(i2 * 9) + i3] = out0[(i2 * 9) + i3] + (a[(i2 * 7) + i4] * b[(i4 * 9) + i3])
              }
            }
          }
        }
    """)


def test_fuse_and_loop_kinds():
    s = Schedule(CASES["matmul"]().lower())
    assert s.fuse("i2", "i3") == "i2_i3_f"
    s.parallel("i2_i3_f")
    s.vectorize("i1")
    s.unroll("i4")
    s.parallel("i0")
    expect(s.func, """
        func matmul(a: f32[5, 7], b: f32[7, 9], out0: f32[5, 9]) {
          parallel for i0 in [0, 5) @accumulation=init {
            vectorized for i1 in [0, 9) {
              out0[(i0 * 9) + i1] = 0.0f
            }
          }
          parallel for i2_i3_f in [0, 45) @accumulation=update {
            unrolled for i4 in [0, 7) @reduce=True @accumulate_init=0.0f {
              out0[((i2_i3_f // 9) * 9) + (i2_i3_f %% 9)] = out0[((i2_i3_f // 9) * 9) + (i2_i3_f %% 9)] + (a[((i2_i3_f // 9) * 7) + i4] * b[(i4 * 9) + (i2_i3_f %% 9)])
            }
          }
        }
    """)  # noqa: E501
    assert str(s.trace) == "\n".join([
        "fuse('i2', 'i3')", "parallel('i2_i3_f')", "vectorize('i1')", "unroll('i4')",
        "parallel('i0')"])


def test_queries():
    s = Schedule(CASES["softmax"]().lower())
    assert s.loops() == [f"i{n}" for n in range(8)]
    assert s.get_loop("i3").extent == Const(11, INDEX)
    nests = loop_nests(s.func.body)
    assert [n.var.name for n in nests] == ["i0", "i2", "i4", "i6"]
    assert [loop.var.name for loop in perfect_chain(nests[1])] == ["i2", "i3"]
    assert [loop.var.name for loop in perfect_chain(nests[0])] == ["i0"]  # body: Allocate


# ----------------------------------------------------------------------------- semantics
def _independent(loop: For) -> bool:
    private = {n.buffer for n in walk(loop.body) if isinstance(n, Allocate)}
    return all(expr_uses(n.index, loop.var) for n in walk(loop.body)
               if isinstance(n, Store) and n.buffer not in private)


def _chains(s: Schedule) -> list[list[str]]:
    return [[loop.var.name for loop in perfect_chain(nest)] for nest in loop_nests(s.func.body)]


def split_every_loop(factor: int, tail: str):
    def apply(s: Schedule) -> None:
        for name in s.loops():
            s.split(name, factor, tail)
    return apply


def reverse_every_nest(s: Schedule) -> None:
    for chain in _chains(s):
        if len(chain) > 1:
            s.reorder(*reversed(chain))


def fuse_every_nest(s: Schedule) -> None:
    for chain in _chains(s):
        name = chain[0]
        for following in chain[1:]:
            name = s.fuse(name, following)


def annotate(s: Schedule) -> None:
    """Parallel outer and vectorized inner loops where iterations are independent; unrolled
    everything else."""
    for nest in loop_nests(s.func.body):
        chain = perfect_chain(nest)
        if _independent(nest):
            s.parallel(nest.var.name)
        if len(chain) > 1 and _independent(chain[-1]):
            s.vectorize(chain[-1].var.name)
    for name in s.loops():
        if s.get_loop(name).kind is ForKind.SERIAL:
            s.unroll(name)


def combined(s: Schedule) -> None:
    """Move reductions out of the innermost output loop, split it with a peeled tail and
    vectorize it, fuse the outer loops and run them in parallel."""
    for nest in loop_nests(s.func.body):
        chain = perfect_chain(nest)
        reduce = [loop for loop in chain if dict(loop.annotations).get("reduce")]
        spatial = [loop for loop in chain if loop not in reduce]
        if reduce:
            s.reorder(*[loop.var.name for loop in spatial[:-1] + reduce + spatial[-1:]])
        inner = spatial[-1]
        if _independent(inner):
            _, vector = s.split(inner.var.name, 4, tail="peel")
            s.vectorize(vector)
        outer = spatial[:-1] if len(spatial) > 1 else []
        if len(outer) >= 2:
            fused = s.fuse(outer[0].var.name, outer[1].var.name)
            s.parallel(fused)
        elif outer and _independent(outer[0]):
            outer_o, _ = s.split(outer[0].var.name, 2)  # guarded
            s.parallel(outer_o)


RECIPES = {
    "split-guard": (split_every_loop(3, "guard"), True),
    "split-peel": (split_every_loop(4, "peel"), True),
    "split-guard-wide": (split_every_loop(16, "guard"), True),
    "split-peel-wide": (split_every_loop(16, "peel"), True),
    "reorder": (reverse_every_nest, False),  # reverses the order of several reductions
    "fuse": (fuse_every_nest, True),
    "annotate": (annotate, True),
    "combined": (combined, True),
}


@pytest.fixture(scope="module")
def lowered():
    """Each case lowered and executed once without a schedule."""
    result = {}
    for name, make in CASES.items():
        case = make()
        func = case.lower()
        result[name] = (case, func, run_outputs(func, case.arrays))
    return result


# Recipes that find no loop they apply to in a case (rms has no fusable or reorderable
# perfect nest; total reduces to a scalar, so combined finds no output loop to split).
NOT_APPLICABLE = {("rms", "fuse"), ("rms", "reorder"), ("total", "combined")}


@pytest.mark.parametrize("case_name,recipe", [
    (case, recipe) for case in sorted(CASES) for recipe in sorted(RECIPES)
    if (case, recipe) not in NOT_APPLICABLE])
def test_schedules_preserve_results(lowered, case_name, recipe):
    case, func, unscheduled = lowered[case_name]
    apply, exact = RECIPES[recipe]
    s = Schedule(func)
    apply(s)
    assert s.trace.steps, f"{recipe} no longer applies to {case_name}"
    verify_func(s.func)
    results = run_outputs(s.func, case.arrays)  # checks parallel/vectorized independence
    case.check(results)
    if exact:  # each output element is computed by the same operations in the same order
        for got, want in zip(results, unscheduled):
            np.testing.assert_array_equal(got, want)
    # the trace reproduces the schedule, also through JSON
    assert s.trace.replay(func).func == s.func
    restored = Trace.from_json(s.trace.to_json())
    assert restored.steps == s.trace.steps
    assert restored.replay(func).func == s.func
    assert str(restored) == str(s.trace)


def test_the_interpreter_rejects_a_parallel_reduction():
    """The oracle's independence check is what makes 'annotate' meaningful."""
    case = CASES["rms"]()
    s = Schedule(case.lower())
    s.vectorize("i1")  # t0[0] = t0[0] + ...: every iteration updates the accumulator
    with pytest.raises(IndependenceError, match="vectorized loop 'i1'"):
        run_outputs(s.func, case.arrays)
    s = Schedule(CASES["matmul"]().lower())
    s.parallel("i4")
    with pytest.raises(IndependenceError, match="parallel loop 'i4'"):
        run_outputs(s.func, CASES["matmul"]().arrays)


# ----------------------------------------------------------------------------- traces
def test_trace_json_round_trip():
    trace = Trace([Step("split", ("i", 4, "peel")), Step("reorder", ("a", "b", "c")),
                   Step("fuse", ("a", "b")), Step("vectorize", ("i_i",))])
    text = trace.to_json()
    assert text == ('[["split", ["i", 4, "peel"]], ["reorder", ["a", "b", "c"]], '
                    '["fuse", ["a", "b"]], ["vectorize", ["i_i"]]]')
    assert Trace.from_json(text) == trace
    assert Trace.from_json(Trace().to_json()) == Trace()


def test_replay_is_independent_of_the_original_schedule():
    func = CASES["conv"]().lower()
    s = Schedule(func)
    combined(s)
    first = s.trace.replay(func)
    second = Trace.from_json(s.trace.to_json()).replay(func)
    assert first.func == second.func == s.func
    assert first.trace.steps == s.trace.steps
    assert s.func != func  # replay started from the unscheduled function


# ----------------------------------------------------------------------------- errors
def _unchanged_after_error(s: Schedule, action, message: str) -> None:
    before, steps = s.func, list(s.trace.steps)
    with pytest.raises(ScheduleError, match=message):
        action()
    assert s.func == before and s.trace.steps == steps


def test_unknown_loops_are_named():
    s = Schedule(CASES["matmul"]().lower())
    known = "loops: i0, i1, i2, i3, i4"
    for action in (lambda: s.split("zz", 4), lambda: s.fuse("zz", "i3"),
                   lambda: s.parallel("zz"), lambda: s.vectorize("zz"),
                   lambda: s.unroll("zz"), lambda: s.get_loop("zz")):
        _unchanged_after_error(s, action, rf"matmul: no loop named 'zz' \({known}\)")
    _unchanged_after_error(s, lambda: s.reorder("i2", "zz"), "no loop named 'zz'")
    _unchanged_after_error(s, lambda: s.reorder("zz"), "no loop named 'zz'")


def test_reorder_needs_perfectly_nested_loops():
    s = Schedule(CASES["rms"]().lower())  # i0 { alloc; init; for i1 ...; store }
    _unchanged_after_error(s, lambda: s.reorder("i1", "i0"),
                           r"reorder: loops \('i1', 'i0'\) are not perfectly nested in rms")
    s = Schedule(CASES["matmul"]().lower())
    _unchanged_after_error(s, lambda: s.reorder("i4", "i2"),  # i3 is between them
                           r"loops \('i4', 'i2'\) are not perfectly nested")
    _unchanged_after_error(s, lambda: s.reorder("i0", "i2"),  # different nests
                           r"loops \('i0', 'i2'\) are not perfectly nested")


def test_fuse_needs_directly_nested_loops():
    s = Schedule(CASES["matmul"]().lower())
    _unchanged_after_error(s, lambda: s.fuse("i2", "i4"), "fuse: 'i4' is not directly inside 'i2'")
    _unchanged_after_error(s, lambda: s.fuse("i3", "i2"), "fuse: 'i2' is not directly inside 'i3'")
    _unchanged_after_error(s, lambda: s.fuse("i1", "i2"), "fuse: 'i2' is not directly inside 'i1'")


def test_split_arguments_are_checked():
    s = Schedule(increment())
    _unchanged_after_error(s, lambda: s.split("i", 0),
                           "inc: split of loop 'i': the factor must be positive, got 0")
    _unchanged_after_error(s, lambda: s.split("i", 5, tail="mask"),  # 5 divides 10
                           "inc: split of loop 'i': unknown tail policy 'mask'")
    _unchanged_after_error(s, lambda: s.split("i", 3, tail="mask"),
                           "split of loop 'i': unknown tail policy 'mask'")


def test_loops_with_symbolic_extents_cannot_be_split_or_fused():
    n = Var("n")
    x = Buffer("x", F32, (64,))
    i, j = Var("i"), Var("j")
    body = For(i, Const(0, INDEX), n, ForKind.SERIAL,
               For(j, Const(0, INDEX), Const(8, INDEX), ForKind.SERIAL,
                   Store(x, i * 8 + j, Const(0.0, F32))))
    s = Schedule(PrimFunc("sym", (x, n), body))
    _unchanged_after_error(s, lambda: s.split("i", 4), "sym: loop 'i' has a non-constant extent")
    _unchanged_after_error(s, lambda: s.fuse("i", "j"), "sym: loop 'i' has a non-constant extent")
    s.split("j", 4)  # the inner loop is fine
    s.parallel("i")
    assert s.loops() == ["i", "j_o", "j_i"]

"""Traced sizes (ember.core.traced): arithmetic stays traced, decisions become guards, the C
expressions compute what Python computes, and reads that escape the trace are recorded."""

import subprocess

import pytest

from ember.core.traced import (C_HELPERS, Guard, SizeExpr, SizeTrace, TracedInt, as_size,
                               class_bound, exact_quotient, expr_of, is_traced, may_be_nonzero, plain,
                               size_class, tracing)


def _trace(**samples: int) -> SizeTrace:
    return SizeTrace(tuple(samples), tuple(samples.values()))


def test_arithmetic_stays_traced_and_evaluates_like_python():
    trace = _trace(S=5, N=3)
    s, n = trace.symbol("S"), trace.symbol("N")
    value = (2 * s + 1) * n - s // 2 + (n * 7) % s
    assert is_traced(value)
    assert plain(value) == (2 * 5 + 1) * 3 - 5 // 2 + (3 * 7) % 5
    for dims in [(5, 3), (1, 1), (17, 4), (64, 2)]:
        S, N = dims
        assert value.expr.evaluate(dims) == (2 * S + 1) * N - S // 2 + (N * 7) % S
    quotient, remainder = divmod(s, 3)
    assert (plain(quotient), plain(remainder)) == (1, 2) and is_traced(remainder)
    assert str(-s) == "(INT64_C(0) - em_dims[0])"
    # identities of 0 and 1 fold away, constants fold to plain ints
    assert expr_of(s * 1) == s.expr and expr_of(s + 0) == s.expr
    assert not is_traced(s * 0) and s * 0 == 0


def test_sums_and_quotients_are_brought_to_one_form():
    """Shape arithmetic of exporters (a Reshape's -1, ``0 - (0 - S)`` of a negated slice
    bound) must come out as the size it is, or the build is refused for an unreadable size."""
    trace = _trace(S=5, N=3)
    s, n = trace.symbol("S"), trace.symbol("N")
    assert expr_of(0 - (0 - s)) == s.expr and expr_of((s + 1) - 1) == s.expr
    assert expr_of(2 * s - s) == s.expr and expr_of(s * n + n * s) == expr_of(2 * (n * s))
    heads = (2 * n * s * 32) // (n * s * 16)   # a Reshape's -1 beside two run-time dims
    assert heads == 4 and not is_traced(heads)
    assert not is_traced(n * s - s * n) and not is_traced((3 * s) // s)
    kept = (3 * s * n + 2) // (s * n)          # not a product: stays a floor division
    assert is_traced(kept)
    samples = [(5, 3), (1, 1), (17, 4), (64, 2), (7, 9)]
    for value, python in [
        ((6 * s * n) // (4 * s), lambda S, N: (6 * S * N) // (4 * S)),
        ((-6 * s * n) // (4 * n), lambda S, N: (-6 * S * N) // (4 * N)),
        ((3 * s + 4 * n - 2 * s) - (n + 1), lambda S, N: (3 * S + 4 * N - 2 * S) - (N + 1)),
        (kept, lambda S, N: (3 * S * N + 2) // (S * N)),
    ]:
        for dims in samples:
            assert expr_of(value).evaluate(dims) == python(*dims), (value, dims)


def test_exact_quotients_are_decided_on_the_expressions():
    """Divisibility of sizes is decided for every size, without a guard: 32*S divides by 16*S
    and by 16, never by 128, even at S = 8 where the numbers divide."""
    trace = _trace(S=8, N=3)
    s, n = trace.symbol("S"), trace.symbol("N")
    with tracing(trace):
        assert exact_quotient(32 * s, 16 * s) == 2 and not is_traced(exact_quotient(32 * s, 16 * s))
        quotient = exact_quotient(32 * s * n, 16 * n)
        assert is_traced(quotient) and quotient.expr == expr_of(2 * s)
        assert exact_quotient(32 * s, 128) is None and exact_quotient(16 * s, 32 * s) is None
        assert exact_quotient(s + 1, s) is None and exact_quotient(s * n, n * s) == 1
        assert (exact_quotient(12, 4), exact_quotient(12, 5), exact_quotient(3, 0)) == (3, None,
                                                                                       None)
    assert not trace.guards
    assert expr_of((s * 32) // 32) == s.expr and is_traced((s * 6) // 4)


def test_decisions_record_guards_that_hold_for_the_sample():
    trace = _trace(S=5)
    s = trace.symbol("S")
    with tracing(trace):
        assert s > 1 and s != 1 and not s == 4 and plain(min(s, 16)) == 5
        if s % 2:
            pass
    described = {str(g) for g in trace.guards}
    assert {"S > 1", "S != 1", "S != 4", "(S % 2) != 0"} <= described
    assert trace.failed_guard((5,)) is None and trace.failed_guard((7,)) is None
    assert str(trace.failed_guard((4,))) == "S != 4"
    broken = trace.failed_guard((6,))
    assert str(broken) == "(S % 2) != 0" and broken.where.endswith("test_traced.py:" +
                                                                   broken.where.split(":")[-1])
    # outside a trace nothing is recorded
    outside = _trace(S=5)
    assert outside.symbol("S") > 1 and not outside.guards


def test_plain_reads_are_recorded_with_the_line_that_made_them():
    trace = _trace(S=9)
    s = trace.symbol("S")
    with tracing(trace):
        assert int(s * 2) == 18
        assert float(s) == 9.0
        assert plain(s) == 9 and as_size(s) is s  # the sanctioned reads record nothing
    assert len(trace.plain_reads) == 2  # int() and float(), on two lines
    assert all("test_traced.py:" in where for where in trace.plain_reads)


def test_size_class_plans_for_the_top_of_a_power_of_two_class():
    trace = _trace(S=5)
    s = trace.symbol("S")
    with tracing(trace):
        assert size_class(s) == 7
        assert size_class(12) == 12  # a plain size is itself
    assert trace.failed_guard((4,)) is None and trace.failed_guard((7,)) is None
    assert trace.failed_guard((3,)) is not None and trace.failed_guard((8,)) is not None
    for sample, top in [(1, 1), (2, 3), (16, 31), (31, 31), (32, 63)]:
        with tracing(_trace(S=sample)) as t:
            assert size_class(t.symbol("S")) == top


def test_class_bound_is_the_size_at_the_top_of_every_class():
    trace = _trace(S=5, N=2)
    s, n = trace.symbol("S"), trace.symbol("N")
    with tracing(trace):
        nbytes = s * n * 4
        assert class_bound(nbytes) == 7 * 3 * 4
    for dims in [(4, 2), (7, 3), (5, 3)]:
        assert trace.failed_guard(dims) is None
        assert nbytes.expr.evaluate(dims) <= 7 * 3 * 4
    assert trace.failed_guard((8, 2)) is not None


def test_may_be_nonzero_keeps_code_for_a_run_time_remainder():
    s = _trace(S=8).symbol("S")
    assert may_be_nonzero(s % 4)          # zero for the sample, not for S=9
    assert may_be_nonzero(3) and not may_be_nonzero(0)


def test_guards_compare_by_condition_not_by_line():
    a = Guard(SizeExpr.symbol(0, "S"), ">", SizeExpr.const(1), "x.py:1")
    b = Guard(SizeExpr.symbol(0, "S"), ">", SizeExpr.const(1), "y.py:2")
    assert a == b and hash(a) == hash(b)


def test_traced_int_pickles_and_copies_with_its_expression():
    import copy
    import pickle

    s = _trace(S=6).symbol("S") * 3
    for other in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s), copy.copy(s)):
        assert isinstance(other, TracedInt) and other.expr == s.expr and plain(other) == 18


FLOOR_PROGRAM = r"""
#include <stdint.h>
#include <stdio.h>
%s
int main(void) {
  const int64_t values[] = {-17, -16, -5, -1, 0, 1, 5, 16, 17};
  const int64_t divisors[] = {-16, -3, -1, 1, 3, 16};
  for (int i = 0; i < 9; ++i)
    for (int j = 0; j < 6; ++j)
      printf("%%lld %%lld\n", (long long)EM_FLOORDIV(values[i], divisors[j]),
             (long long)EM_FLOORMOD(values[i], divisors[j]));
  return 0;
}
"""


def test_c_floor_helpers_agree_with_python(tmp_path):
    """The printed expressions divide as Python does (C truncates toward zero)."""
    source = tmp_path / "floor.c"
    source.write_text(FLOOR_PROGRAM % C_HELPERS)
    binary = tmp_path / "floor"
    subprocess.run(["cc", "-std=c11", "-fsanitize=undefined", "-fno-sanitize-recover=all",
                    "-o", str(binary), str(source)], check=True)
    got = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    expected = "".join(f"{a // b} {a % b}\n" for a in (-17, -16, -5, -1, 0, 1, 5, 16, 17)
                       for b in (-16, -3, -1, 1, 3, 16))
    assert got == expected


def test_expressions_print_as_c_over_the_dims_array():
    trace = _trace(S=5, N=2)
    s, n = trace.symbol("S"), trace.symbol("N")
    assert f"{s * n + 3}" == "((em_dims[1] * em_dims[0]) + INT64_C(3))"  # by name: N * S
    assert f"{s // 4}" == "EM_FLOORDIV(em_dims[0], INT64_C(4))"
    assert f"{s:d}" == "5" and repr(s + 1) == "6<(S + 1)>"


@pytest.mark.parametrize("value", [0, 7, -3])
def test_as_size_of_plain_values_is_an_int(value):
    import numpy as np

    got = as_size(np.int64(value))
    assert type(got) is int and got == value

"""Properties of the generated C text and the errors of code generation."""

from __future__ import annotations

import pytest
from codegen_cases import case_mixed_nodes, case_row_sum, case_vector_tail

from ember.codegen import CModule, CodegenError, generate_c
from ember.core.dtypes import DType
from ember.core.errors import EmberError
from ember.core.target import Target
from ember.ir.loop import (Allocate, Broadcast, Buffer, Call, Const, For, ForKind, LetStmt, Load,
                           PrimFunc, Ramp, Store, Var, const)

F32 = DType.FLOAT32


def kernel(body_of, *buffers: Buffer, name: str = "k") -> PrimFunc:
    return PrimFunc(name, buffers, body_of(*buffers))


def generate(*funcs: PrimFunc, target: Target | None = None) -> str:
    return generate_c(CModule(list(funcs), target or Target.native()))


def vec_call(name: str, lanes: int, n_args: int, dtype: DType = F32) -> PrimFunc:
    x, y = Buffer("x", dtype, (64,)), Buffer("y", dtype, (64,))
    v = Load(x, Ramp(const(0), const(1), lanes))
    return PrimFunc("k", (x, y), Store(y, Ramp(const(0), const(1), lanes),
                                       Call(name, (v,) * n_args, dtype, lanes)))


def test_kernel_shape():
    source = generate(case_row_sum(64).func, case_vector_tail(64).func, case_mixed_nodes(64).func)
    assert "static void row_sum(const float* restrict x, float* restrict out)" in source
    assert "x = __builtin_assume_aligned(x, 64);" in source
    # the PARALLEL loop's body is outlined and handed to ember's thread pool
    assert "static void em_par0_row_sum(void *em_context, int64_t em_begin, int64_t em_end)" \
        in source
    assert "em_parallel_for(em_par0_row_sum, &em_par0, " in source
    assert "pragma omp" not in source
    assert "#pragma GCC unroll 48" in source
    assert "float acc[16] __attribute__((aligned(64)));" in source
    assert "typedef float em_f32x16 __attribute__((vector_size(64)));" in source


def test_vectorized_loops_assert_independence():
    x = Buffer("x", F32, (8,))
    i = Var("i")
    func = PrimFunc("k", (x,), For(i, const(0), const(8), ForKind.VECTORIZED,
                                   Store(x, i, Load(x, i) * Const(2.0, F32))))
    source = generate(func)
    assert "#pragma GCC ivdep" in source and "vectorize(assume_safety)" in source


def test_noalias_attribute_drops_restrict():
    func = case_vector_tail(64).func
    relaxed = PrimFunc(func.name, func.params, func.body, (("noalias", False),))
    assert "restrict" not in generate(relaxed).split("void vector_tail")[1].split("{")[0]


def test_target_intrinsics_are_checked_against_the_target():
    fma16 = vec_call("x86.fmadd", 16, 3)
    with pytest.raises(CodegenError, match=r"avx512f.*x86_64"):
        generate(fma16, target=Target.parse("x86_64-avx2"))
    assert "_mm256_fmadd_ps" in generate(vec_call("x86.fmadd", 8, 3),
                                         target=Target.parse("x86_64-avx2"))
    with pytest.raises(CodegenError, match="needs an aarch64 target"):
        generate(vec_call("arm.fmla", 4, 3), target=Target.parse("x86_64"))
    arm = generate(vec_call("arm.fmla", 4, 3), target=Target.parse("aarch64"))
    assert "#include <arm_neon.h>" in arm and "vfmaq_f32((float32x4_t)" in arm
    with pytest.raises(CodegenError, match="x86.fmadd takes"):
        generate(vec_call("x86.fmadd", 8, 2), target=Target.parse("x86_64-avx2"))


@pytest.mark.parametrize("name", ["gelu", "x86.nonsense", "vector.reduce_median"])
def test_unknown_intrinsics_fail_at_generation(name):
    with pytest.raises(CodegenError, match="unknown"):
        generate(vec_call(name, 8, 1))


def test_unsupported_and_malformed_ir_is_rejected():
    f8 = Buffer("x", DType.FLOAT8E4M3FN, (4,))
    with pytest.raises(CodegenError, match="no representation for f8e4m3fn"):
        generate(PrimFunc("k", (f8,), Store(f8, const(0), Load(f8, const(1)))))
    x = Buffer("x", DType.INT8, (4,))
    with pytest.raises(CodegenError, match="does not fit i8"):
        generate(PrimFunc("k", (x,), Store(x, const(0), Const(300, DType.INT8))))
    y = Buffer("y", F32, (16,))
    v = Var("v", F32)
    vector_let = LetStmt(v, Load(y, Ramp(const(0), const(1), 16)), Store(y, const(0), v))
    with pytest.raises(CodegenError, match="binds a vector"):
        generate(PrimFunc("k", (y,), vector_let))
    big = Buffer("scratch", F32, (1 << 20,), scope="local")
    with pytest.raises(CodegenError, match="arena"):
        generate(PrimFunc("k", (y,), Allocate(big, Store(y, const(0), Load(big, const(0))))))
    with pytest.raises(CodegenError, match="collide"):
        generate(PrimFunc("a.b", (y,), Store(y, const(0), Load(y, const(1)))),
                 PrimFunc("a.b", (y,), Store(y, const(0), Load(y, const(1)))))
    assert issubclass(CodegenError, EmberError)


def test_shadowing_lets_get_distinct_c_names():
    """let x = 1 in (let x = x + 1 in y[0] = x): C must not see the inner x in its own init."""
    y = Buffer("y", DType.INT64, (1,))
    x = Var("x")
    body = LetStmt(x, const(1), LetStmt(x, x + 1, Store(y, const(0), x)))
    source = generate(PrimFunc("k", (y,), body))
    assert "const int64_t x = INT64_C(1);" in source
    assert "const int64_t x_1 = em_add_i64(x, INT64_C(1));" in source
    assert "y[INT64_C(0)] = x_1;" in source


def test_broadcast_plus_ramp_is_a_contiguous_access():
    x = Buffer("x", F32, (4, 16))
    y = Buffer("y", F32, (16,))
    row = Var("row")
    index = Broadcast(row * 16, 16) + Ramp(const(0), const(1), 16)
    source = generate(PrimFunc("k", (x, y, row), Store(y, Ramp(const(0), const(1), 16),
                                                       Load(x, index))))
    assert "gather" not in source and "em_vload_f32x16(x + (" in source

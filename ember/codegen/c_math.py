"""Intrinsic calls: math functions, cross-lane reductions and target instructions.

Math intrinsics (``MATH_INTRINSICS`` of the loop IR) map to C99 ``<math.h>``: the ``f``-suffixed
function for f32 (and for f16/bf16, computed in float and rounded once to the narrow type), the
plain one for f64.  Accuracy, as maximum error in ulp of the result type, sampled on glibc 2.36
x86_64 (glibc documents its bounds in the manual's "Known Maximum Errors in Math Functions"):

    exact (IEEE-specified)   sqrt, fabs, floor, ceil, trunc, round (half away from zero),
                             nearbyint (half to even), fmod, copysign, isnan, isinf
    < 1 ulp                  exp, log, pow, expm1, log1p, sin, cos, tan, asin, acos, atan,
                             erf, cosh, acosh (f64)
    < 2 ulp                  tanh, sinh, asinh, atanh, atan2
    rsqrt = 1/sqrt(x)        < 1.5 ulp (two correctly rounded steps)
    sigmoid = 1/(1+exp(-x))  < 2.5 ulp (f64)

except that float ``exp``, ``tanh``, ``erf`` and ``sigmoid`` use ember's own vectorizable
functions (``codegen/c_fast_math.py``, 1-3 ulp, documented there): libm's calls keep the loops
around them scalar.
    f16/bf16                 the float function rounded once to the narrow type: 0.5 ulp
                             plus the float error (~2^-22 relative), i.e. correctly rounded
                             except near ties

Special functions (``SPECIAL_INTRINSICS``: lgamma, digamma, polygamma, erfinv, ndtri, erfcx,
Bessel and Airy functions, zeta, incomplete gamma, orthogonal polynomials) are C helpers of
``c_special.py``, added to the module's helpers when a kernel calls them; float kernels compute
them in double and round once (the polynomials excepted: PyTorch's recurrences in the compute
type).  Their accuracy is tabulated there: 1e-15 to 2e-14 relative for most, 8e-13 for the
incomplete gamma, 1e-12 absolute for Ai(x) near x = -7.

No ``-ffast-math``: NaN and infinities propagate as IEEE 754 says; ``-ffp-contract=fast`` may
fuse ``a * b + c`` of kernel arithmetic into one FMA (more accurate, not bit-identical to numpy).
Integer ``fabs`` is a wrapping absolute value; other math on integers is an error.

Other calls:

* ``vector.reduce_{add,mul,min,max,and,or,xor}(v)`` folds the lanes of ``v`` in lane order
  with the IR semantics of that binary op (so f16 sums round at every step);
* ``fma(a, b, c)`` is C's correctly rounded ``fma``; ``prefetch(load[, rw, locality])`` (in an
  Evaluate) is ``__builtin_prefetch`` of the loaded address;
* ``x86.*``, ``arm.*``, ``wasm.*`` are target instructions from :data:`TARGET_INTRINSICS`,
  checked against the target's architecture and features.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.core.dtypes import DType
from ember.core.target import Target
from ember.codegen import c_special
from ember.codegen.c_fast_math import FAST_FLOAT_FUNCTIONS, fast_float_call
from ember.codegen.c_helpers import HelperSet
from ember.codegen.c_types import CodegenError
from ember.ir.loop.expr import MATH_INTRINSICS, SPECIAL_INTRINSICS

# name -> number of arguments; the C function is the name (+ ``f`` for float) unless spelled
_LIBM_ARITY = {name: 1 for name in MATH_INTRINSICS - SPECIAL_INTRINSICS} | {
    "pow": 2, "fmod": 2, "atan2": 2, "copysign": 2, "fma": 3} | c_special.SPECIAL_ARITY
_C_SPELLING = {"rsqrt": "({one} / sqrt{f}({0}))",
               "sigmoid": "({one} / ({one} + exp{f}(-({0}))))",
               "isnan": "(isnan({0}) != 0)", "isinf": "(isinf({0}) != 0)"}
MATH_FUNCTIONS = frozenset(_LIBM_ARITY)
BOOL_RESULT = frozenset({"isnan", "isinf"})
REDUCTIONS = {"vector.reduce_add": "add", "vector.reduce_mul": "mul",
              "vector.reduce_min": "min", "vector.reduce_max": "max",
              "vector.reduce_and": "bitand", "vector.reduce_or": "bitor",
              "vector.reduce_xor": "bitxor"}


def math_arity(name: str) -> int:
    return _LIBM_ARITY[name]


def math_call(name: str, compute_ctype: str, args: list[str], helpers: HelperSet) -> str:
    """C code of math function ``name`` on ``args`` evaluated in ``float`` or ``double``.

    Special functions call C helpers, which are added to ``helpers`` (the translation unit's
    helper set)."""
    if len(args) != _LIBM_ARITY[name]:
        raise CodegenError(f"math intrinsic '{name}' takes {_LIBM_ARITY[name]} argument(s), "
                           f"got {len(args)}")
    if name in SPECIAL_INTRINSICS:
        return c_special.special_call(helpers, name, compute_ctype, args)
    f = "f" if compute_ctype == "float" else ""
    if f and name in FAST_FLOAT_FUNCTIONS:  # vectorizable (codegen/c_fast_math.py)
        return fast_float_call(helpers, name, args)
    if name in _C_SPELLING:
        return _C_SPELLING[name].format(*args, f=f, one=f"1.0{f}")
    return f"{name}{f}({', '.join(args)})"


# --------------------------------------------------------------------------- target intrinsics
@dataclass(frozen=True)
class TargetIntrinsic:
    """One target instruction: the C intrinsic, its argument/result C types (vector types of
    the same size as ember's vectors, converted by cast) and what the target must have."""

    c_name: str
    result: tuple[DType, int]
    args: tuple[tuple[DType, int], ...]
    c_result: str
    c_args: tuple[str, ...]
    features: tuple[str, ...]
    header: str
    doc: str


def _fma_x86(dtype: DType, lanes: int, width: int) -> TargetIntrinsic:
    prefix = {128: "_mm", 256: "_mm256", 512: "_mm512"}[width]
    suffix = "ps" if dtype is DType.FLOAT32 else "pd"
    ctype = f"__m{width}" + ("" if dtype is DType.FLOAT32 else "d")
    return TargetIntrinsic(f"{prefix}_fmadd_{suffix}", (dtype, lanes), ((dtype, lanes),) * 3,
                           ctype, (ctype,) * 3, ("avx512f",) if width == 512 else ("fma",),
                           "immintrin.h", "a * b + c, one rounding")


def _dpbusd(width: int) -> TargetIntrinsic:
    lanes = width // 32
    feats = ("avx512_vnni",) if width == 512 else ("avx512_vnni", "avx512vl")
    ctype = f"__m{width}i"
    return TargetIntrinsic(
        f"_mm{width}_dpbusd_epi32", (DType.INT32, lanes),
        ((DType.INT32, lanes), (DType.UINT8, lanes * 4), (DType.INT8, lanes * 4)),
        ctype, (ctype,) * 3, feats, "immintrin.h",
        "acc + sum of 4 adjacent u8*i8 products per i32 lane (wrapping)")


TARGET_INTRINSICS: dict[tuple[str, DType, int], TargetIntrinsic] = {
    **{("x86.fmadd", DType.FLOAT32, w // 32): _fma_x86(DType.FLOAT32, w // 32, w)
       for w in (128, 256, 512)},
    **{("x86.fmadd", DType.FLOAT64, w // 64): _fma_x86(DType.FLOAT64, w // 64, w)
       for w in (128, 256, 512)},
    ("x86.vpdpbusd", DType.INT32, 16): _dpbusd(512),
    ("x86.vpdpbusd", DType.INT32, 8): _dpbusd(256),
    ("arm.fmla", DType.FLOAT32, 4): TargetIntrinsic(
        "vfmaq_f32", (DType.FLOAT32, 4), ((DType.FLOAT32, 4),) * 3, "float32x4_t",
        ("float32x4_t",) * 3, ("neon",), "arm_neon.h", "acc + a * b, one rounding"),
    ("arm.sdot", DType.INT32, 4): TargetIntrinsic(
        "vdotq_s32", (DType.INT32, 4), ((DType.INT32, 4), (DType.INT8, 16), (DType.INT8, 16)),
        "int32x4_t", ("int32x4_t", "int8x16_t", "int8x16_t"), ("dotprod",), "arm_neon.h",
        "acc + sum of 4 adjacent i8*i8 products per i32 lane"),
    ("wasm.dot_i16x8", DType.INT32, 4): TargetIntrinsic(
        "wasm_i32x4_dot_i16x8", (DType.INT32, 4), ((DType.INT16, 8), (DType.INT16, 8)),
        "v128_t", ("v128_t", "v128_t"), ("simd128",), "wasm_simd128.h",
        "sum of adjacent i16*i16 products per i32 lane"),
}
_PREFIX_ARCH = {"x86": "x86_64", "arm": "aarch64", "wasm": "wasm32"}


def is_target_intrinsic(name: str) -> bool:
    return name.split(".", 1)[0] in _PREFIX_ARCH and "." in name


def target_intrinsic(name: str, dtype: DType, lanes: int,
                     arg_types: list[tuple[DType, int]], target: Target) -> TargetIntrinsic:
    """The table entry for a target call, after checking that ``target`` can run it."""
    entry = TARGET_INTRINSICS.get((name, dtype, lanes))
    if entry is None:
        known = sorted({f"{n}:{d}x{l}" for n, d, l in TARGET_INTRINSICS})
        raise CodegenError(f"unknown target intrinsic {name} returning {dtype}x{lanes}; "
                           f"known: {', '.join(known)}")
    arch = _PREFIX_ARCH[name.split(".", 1)[0]]
    if target.arch != arch:
        raise CodegenError(f"intrinsic {name} needs an {arch} target, not {target.arch}")
    missing = [f for f in entry.features if f not in target.features]
    if missing:
        raise CodegenError(f"intrinsic {name} ({entry.c_name}) needs CPU feature(s) "
                           f"{missing} that target {target} lacks")
    if tuple(arg_types) != entry.args:
        expected = ", ".join(f"{d}x{l}" for d, l in entry.args)
        got = ", ".join(f"{d}x{l}" for d, l in arg_types)
        raise CodegenError(f"intrinsic {name} takes ({expected}), got ({got})")
    return entry

"""Vectorizable float32 exp, tanh, erf and sigmoid for generated kernels.

glibc's ``expf``/``tanhf``/``erff`` are accurate but opaque calls: a loop that calls them stays
scalar, and softmax, GELU, SiLU or a tanh activation then run far below memory speed.  The
functions here are always inlined and branch-free (every choice is a conditional
expression between values computed on every path, the power of two is built from the
exponent bits), so once inlined GCC and Clang vectorize the loop around them with the
target's SIMD width (a call inside one arm of a conditional is control flow, and kept the
loop scalar) -- provided the unit is compiled with ``UNIT_FLAGS``, which the kernel units
that call them are.  NaN propagates, infinities and
overflow give what IEEE 754 says, and the results stay within a few ulp:

    em_expf      Cody-Waite reduction r = x - n ln 2 (ln 2 in two parts), Cephes' degree-6
                 polynomial for exp(r) on |r| <= ln2/2, 2^n applied as two powers of two (so
                 subnormal results round once)                        max error 1 ulp
    em_tanhf     |x| < 0.625: x + x^3 P(x^2) (Cephes' tanhf); else 1 - 2 / (exp(2|x|) + 1)
                 with the sign of x                                      max error 2 ulp
    em_erff      |x| < 1: x P(x^2); 1 <= |x| < 3.925: 1 - exp(-x^2) Q(|x|); +-1 beyond
                 (erfc(3.925) is below half an ulp of 1). P (degree 7) and Q (degree 12) are
                 least-squares fits of erf(x)/x and erfc(x) exp(x^2) in relative error at
                 Chebyshev nodes, computed with mpmath at 40 digits  max error 3 ulp
    em_sigmoidf  1 / (1 + e) for x >= 0, e / (1 + e) below, e = exp(-|x|) (so the tiny
                 results of very negative x keep their precision)      max error 3 ulp

(errors: measured against float64 numpy/``math`` over 2^20 points per function by
``tests/codegen/test_fast_math.py``, which asserts these bounds).  Double precision keeps
libm.
"""

from __future__ import annotations

from ember.codegen.c_helpers import HelperSet

# The C math intrinsics these functions replace for float (f16/bf16 compute in float too).
FAST_FLOAT_FUNCTIONS = {"exp": "em_expf", "tanh": "em_tanhf", "erf": "em_erff",
                        "sigmoid": "em_sigmoidf"}

_ERF_SMALL = (1.128379225730896, -0.37612637877464294, 0.11283783614635468,
              -0.02686547487974167, 0.005221138708293438, -0.0008485438302159309,
              0.00011274735152255744, -9.689733815321233e-06)
_ERFC_SCALED = (0.9718371033668518, -0.959410548210144, 0.5433672070503235,
                -0.014725180342793465, -0.2977409362792969, 0.3147876560688019,
                -0.18881064653396606, 0.07581966370344162, -0.021108577027916908,
                0.004039362072944641, -0.0005083012511022389, 3.793141877395101e-05,
                -1.2729610716633033e-06)


def _horner(coefficients: tuple[float, ...], var: str) -> str:
    """``c0 + v (c1 + v (c2 + ...))`` as C float literals (exact float32 values)."""
    text = f"{coefficients[-1]!r}f"
    for c in reversed(coefficients[:-1]):
        text = f"({text} * {var} + {c!r}f)"
    return text


# The C of each function and of what it builds on, in dependency order.  Only the functions a
# kernel calls go into its translation unit (``fast_float_call``).
_DEFINITIONS: dict[str, tuple[tuple[str, ...], str]] = {
    # always inlined: in a large kernel (several fused loop nests) GCC's inlining budget ran
    # out and left a call in a loop, which kept it scalar (a fused softmax ran 5x slower)
    "EM_FAST_INLINE": ((), """\
#if defined(__GNUC__)
#define EM_FAST_INLINE static inline __attribute__((always_inline))
#else
#define EM_FAST_INLINE static inline
#endif"""),
    "em_f32_bits": (("EM_FAST_INLINE",), """\
typedef union { float f; int32_t i; } em_f32_bits;"""),
    "em_pow2i": (("em_f32_bits",), """\
EM_FAST_INLINE float em_pow2i(int32_t n) {  /* 2^n for n in [-126, 127] */
  em_f32_bits b; b.i = (n + 127) * 8388608; return b.f;
}
"""),
    "em_expf": (("em_pow2i",), """\
EM_FAST_INLINE float em_expf(float x) {
  const float xc = x >= -104.0f ? (x <= 89.0f ? x : 89.0f) : -104.0f;  /* NaN -> -104 */
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round */
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t k = (int32_t)n, half = k / 2;
  const float y = p * em_pow2i(half) * em_pow2i(k - half);
  return x == x ? y : x;
}
"""),
    "em_tanhf": (("em_expf",), """\
EM_FAST_INLINE float em_tanhf(float x) {
  const float a = fabsf(x), z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = a != 0.0f ? x + x * z * p : x;  /* keeps -0 (a fused x*z*p + x would not) */
  const float e = em_expf(2.0f * (a < 20.0f ? a : 20.0f));  /* 1.0f from |x| > 9.01 */
  const float big = copysignf(1.0f - 2.0f / (e + 1.0f), x);
  return a < 0.625f ? small : (x == x ? big : x);
}
"""),
    "em_erff": (("em_expf",), f"""\
EM_FAST_INLINE float em_erff(float x) {{
  const float a = fabsf(x), z = x * x;
  const float small = x * {_horner(_ERF_SMALL, "z")};
  const float q = {_horner(_ERFC_SCALED, "a")};
  const float tail = 1.0f - em_expf(-z) * q;  /* computed always: selects, not branches */
  const float big = copysignf(a < 3.925f ? tail : 1.0f, x);
  return a < 1.0f ? small : (x == x ? big : x);
}}
"""),
    "em_sigmoidf": (("em_expf",), """\
EM_FAST_INLINE float em_sigmoidf(float x) {  /* e / (1 + e) with e = exp(-|x|) <= 1 */
  const float e = em_expf(-fabsf(x)), s = 1.0f / (1.0f + e);
  return x >= 0.0f ? s : e * s;
}
"""),
}

# Flags a translation unit that calls these functions is compiled with.  Under the default
# -ftrapping-math GCC keeps a loop around them scalar: after jump threading through the
# range clamps, some paths multiply constants that overflow, which "could trap", so the loop
# is not if-converted.  The flag only says that no code looks at the floating-point
# exception flags (ember's kernels never do): every result stays bit for bit the same.  It
# is given per unit, not globally, because it made GCC keep the Clip epilogues of small-K
# GEMMs scalar (MobileNetV2 1.6x slower when it was global).
UNIT_FLAGS = ("-fno-trapping-math",)


def fast_float_call(helpers: HelperSet, name: str, args: list[str]) -> str:
    """C calling the fast float version of math function ``name`` (a key of
    ``FAST_FLOAT_FUNCTIONS``) on ``args``; its definition joins ``helpers``."""
    function = FAST_FLOAT_FUNCTIONS[name]
    _need(helpers, function)
    return f"{function}({', '.join(args)})"


def uses_fast_float(helpers: HelperSet) -> bool:
    """Whether a unit with these helpers calls any of the functions here."""
    return any(function in helpers for function in FAST_FLOAT_FUNCTIONS.values())


def _need(helpers: HelperSet, name: str) -> str:
    return helpers.need_with_deps(name, lambda n: (_DEFINITIONS[n][1], _DEFINITIONS[n][0]))


def source() -> str:
    """Every function, in one text (for tests and readers)."""
    helpers = HelperSet()
    for function in FAST_FLOAT_FUNCTIONS.values():
        _need(helpers, function)
    return helpers.source()

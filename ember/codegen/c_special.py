"""C helpers of the special-function intrinsics (``SPECIAL_INTRINSICS`` of the loop IR).

Each intrinsic is one ``static`` C function, emitted into a module's helpers only when a kernel
calls it (with the internal functions it calls).  They are pure functions of their arguments:
no global mutable state (``signgam`` is never touched), so they are safe in OpenMP loops; every
loop has a constant bound; degrees and orders arriving as floats are range-checked before any
conversion to an integer.

Two kinds:

* **double helpers** (everything but the polynomials) compute in double whatever the kernel's
  type; a float kernel converts its arguments to double and rounds the result once.  They are
  written from the mathematics (power series, asymptotic expansions, continued fractions,
  trapezoidal rules on integral representations; the methods are named at each function) and
  follow PyTorch's definitions at the edges of the domain (poles, negative arguments,
  infinities), which SciPy shares, except where PyTorch's value is an artifact of its
  evaluation (noted at the op, ``ember/ops/special.py``).
* **typed helpers** (the orthogonal polynomials) compute in the kernel's compute type
  (``float`` or ``double``), with PyTorch's recurrences and branches, so that a float32 result
  overflows (PyTorch then returns NaN) exactly when PyTorch's does.

Accuracy: maximum error in float64, measured against mpmath at 40 digits (or SciPy where it
is exact enough) on a few thousand points per function, from poles and zeros to the ends of the
double range; "rel" is the relative error, "abs" the absolute error where |value| < 1 (near
zeros).  ``tests/compile/test_compute_special.py`` asserts them (against SciPy, whose own error
is larger in places, or mpmath)::

    lgamma            1e-15 rel, 3e-15 abs (near the zeros at 1, 2 and on the negative axis)
    digamma           2e-15 rel, 3e-15 abs (near its zeros; reflection for x < 0)
    polygamma n >= 1  2e-14 rel (through the Hurwitz zeta)
    erfinv, ndtri     4e-16 rel (Halley's method on libm's erf/erfc from Winitzki's start)
    erfcx             5e-16 rel
    I0 I1 I0e I1e     2e-15 rel (series for |x| <= 20, asymptotic expansion beyond)
    K0 K1 K0e K1e     1e-15 rel (series for x <= 1, trapezoidal rule on the integral of
                      exp(-x cosh t) cosh(nu t) up to 30, asymptotic expansion beyond)
    J0 J1 Y0 Y1       4e-16 abs (series for x <= 4, Miller's backward recurrence with the
                      Neumann series of Y up to 25, Hankel's expansion beyond)
    spherical j0      sin(x) / x: libm's sin and one division
    Ai                1.1e-12 abs for -7.5 < x < -6.5 (where the Maclaurin series and the
                      asymptotic expansion meet), 2e-13 rel for x > 0, 1e-15 abs elsewhere
    zeta              1e-14 rel (Euler-Maclaurin summation; results below 1e-300 lose bits)
    igamma, igammac   8e-13 rel (series, Legendre's continued fraction, a small-a series for
                      Q; Temme's uniform expansion for a > 20000)
    polynomials       PyTorch's recurrences in the compute type

A float32 result adds its own rounding (half an ulp of float) to these.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import comb, factorial
from string import Template

from ember.codegen.c_helpers import HelperSet
from ember.codegen.c_types import CodegenError
from ember.ir.loop.expr import SPECIAL_INTRINSICS


# --------------------------------------------------------------------------- constants
def _bernoulli(count: int) -> list[Fraction]:
    """The Bernoulli numbers B_0 .. B_{count-1} (B_1 = -1/2), exactly."""
    numbers: list[Fraction] = []
    for m in range(count):
        numbers.append(Fraction(1) if m == 0 else
                       -sum(comb(m + 1, k) * numbers[k] for k in range(m)) / (m + 1))
    return numbers


_B = _bernoulli(26)


def _c_doubles(values: list[Fraction] | list[float]) -> str:
    return ", ".join(repr(float(v)) for v in values)


# lgamma(x) ~ (x - 1/2) log x - x + log(2 pi)/2 + sum B_2k / (2k (2k - 1) x^(2k-1))
_STIRLING = [_B[2 * k] / (2 * k * (2 * k - 1)) for k in range(1, 9)]
# digamma(x) ~ log x - 1/(2x) - sum B_2k / (2k x^2k)
_DIGAMMA_TAIL = [_B[2 * k] / (2 * k) for k in range(1, 8)]
# Euler-Maclaurin corrections of the Hurwitz zeta: B_2j / (2j)!
_EULER_MACLAURIN = [_B[2 * j] / factorial(2 * j) for j in range(1, 13)]
# lgamma(2 + z) = (1 - euler_gamma) z + sum_{k>=2} (-1)^k (zeta(k) - 1) / k z^k, for k = 2..29
# (values computed with mpmath at 40 digits)
_LGAMMA_2P = [
    0.3224670334241132, -0.0673523010531981, 0.020580808427784546, -0.007385551028673986,
    0.0028905103307415234, -0.001192753911703261, 0.0005096695247430425,
    -0.00022315475845357939, 9.945751278180853e-05, -4.492623673813314e-05,
    2.050721277567069e-05, -9.439488275268397e-06, 4.374866789907488e-06,
    -2.039215753801366e-06, 9.55141213040742e-07, -4.492469198764566e-07,
    2.1207184805554665e-07, -1.0043224823968099e-07, 4.7698101693639804e-08,
    -2.2711094608943164e-08, 1.0838659214896955e-08, -5.183475041970047e-09,
    2.4836745438024785e-09, -1.1921401405860912e-09, 5.731367241678862e-10,
    -2.7595228851242334e-10, 1.330476437424449e-10, -6.4229645638381e-11,
]

_PI = "3.141592653589793"
_EULER = "0.5772156649015329"  # Euler's gamma

# --------------------------------------------------------------------------- double helpers
# name -> (C source, the helpers it calls)
_DOUBLE: dict[str, tuple[str, tuple[str, ...]]] = {}


def _define(name: str, source: str, *deps: str) -> None:
    _DOUBLE[name] = (source.strip(), deps)


_define("em_sp_sinpi", f"""
static double em_sp_sinpi(double x) {{ /* sin(pi x), reduced exactly: x = n/2 + r, |r| <= 1/4 */
  if (isnan(x) || isinf(x)) return x - x;
  if (fabs(x) >= 4503599627370496.0) return copysign(0.0, x); /* |x| >= 2^52: an integer */
  const double n = nearbyint(2.0 * x), r = x - 0.5 * n, m = n - 4.0 * floor(0.25 * n);
  const double s = sin({_PI} * r), c = cos({_PI} * r);
  return m == 0.0 ? s : m == 1.0 ? c : m == 2.0 ? -s : -c;
}}""")

_define("em_sp_cospi", f"""
static double em_sp_cospi(double x) {{ /* cos(pi x), reduced as em_sp_sinpi */
  if (isnan(x) || isinf(x)) return x - x;
  if (fabs(x) >= 4503599627370496.0) return fmod(x, 2.0) == 0.0 ? 1.0 : -1.0;
  const double n = nearbyint(2.0 * x), r = x - 0.5 * n, m = n - 4.0 * floor(0.25 * n);
  const double s = sin({_PI} * r), c = cos({_PI} * r);
  return m == 0.0 ? c : m == 1.0 ? -s : m == 2.0 ? -c : s;
}}""")

_define("em_sp_lgamma2p", f"""
static double em_sp_lgamma2p(double z) {{ /* lgamma(2 + z) for |z| <= 1/2, z exact */
  static const double c[{len(_LGAMMA_2P)}] = {{{_c_doubles(_LGAMMA_2P)}}};
  double p = 0.0;
  for (int k = {len(_LGAMMA_2P) - 1}; k >= 0; --k) p = p * z + c[k];
  return z * (0.42278433509846713 + z * p); /* 1 - euler_gamma */
}}""")

_define("em_sp_lgamma_positive", """
static double em_sp_lgamma_positive(double x) { /* x > 0, finite */
  if (x < 0.5) return em_sp_lgamma2p(x) - log(x) - log1p(x);
  if (x < 1.5) return em_sp_lgamma2p(x - 1.0) - log(x);
  if (x < 2.5) return em_sp_lgamma2p(x - 2.0);
  if (x < 13.0) { /* down to [1.5, 2.5): lgamma(x) = lgamma(x - m) + log((x-1)...(x-m)) */
    double product = 1.0;
    for (int k = 0; k < 11 && x >= 2.5; ++k) { x -= 1.0; product *= x; }
    return em_sp_lgamma2p(x - 2.0) + log(product);
  }
  return (x - 0.5) * log(x) - x + 0.9189385332046728 + em_sp_stirling(x); /* log(2 pi)/2 */
}""", "em_sp_lgamma2p", "em_sp_stirling")

_define("em_sp_stirling", f"""
static double em_sp_stirling(double x) {{ /* lgamma(x) - (x - 1/2) log x + x - log(2 pi)/2, x >= 10 */
  static const double c[{len(_STIRLING)}] = {{{_c_doubles(_STIRLING)}}};
  const double r = 1.0 / x, r2 = r * r;
  double series = 0.0;
  for (int k = {len(_STIRLING) - 1}; k >= 0; --k) series = series * r2 + c[k];
  return r * series;
}}""")

_define("em_lgamma", """
static double em_lgamma(double x) { /* log|gamma(x)|, reentrant: no global sign variable */
  if (isnan(x)) return x;
  if (isinf(x)) return INFINITY;
  if (x <= 0.0 && x == floor(x)) return INFINITY;
  if (x > 0.0) return em_sp_lgamma_positive(x);
  /* reflection: gamma(x) gamma(1 - x) = pi / sin(pi x) */
  return 1.1447298858494002 - log(fabs(em_sp_sinpi(x))) - em_sp_lgamma_positive(1.0 - x);
}""", "em_sp_sinpi", "em_sp_lgamma_positive")

_define("em_sp_lgamma1p", """
static double em_sp_lgamma1p(double a) { /* lgamma(1 + a) for 0 <= a < 1, accurate for tiny a */
  return a < 0.5 ? em_sp_lgamma2p(a) - log1p(a) : em_sp_lgamma2p(a - 1.0);
}""", "em_sp_lgamma2p")

_define("em_sp_digamma_positive", f"""
static double em_sp_digamma_positive(double x) {{ /* x > 0 */
  if (isinf(x)) return x;
  double shift = 0.0; /* psi(x) = psi(x + 1) - 1/x, up to x >= 10 */
  for (int k = 0; k < 10 && x < 10.0; ++k) {{ shift -= 1.0 / x; x += 1.0; }}
  static const double c[{len(_DIGAMMA_TAIL)}] = {{{_c_doubles(_DIGAMMA_TAIL)}}};
  const double r2 = 1.0 / (x * x);
  double tail = 0.0;
  for (int k = {len(_DIGAMMA_TAIL) - 1}; k >= 0; --k) tail = tail * r2 + c[k];
  return shift + log(x) - 0.5 / x - r2 * tail;
}}""")

_define("em_digamma", f"""
static double em_digamma(double x) {{
  if (isnan(x)) return x;
  if (x == 0.0) return copysign(INFINITY, -x); /* PyTorch and SciPy: -inf at +0, +inf at -0 */
  if (x < 0.0) {{
    if (x == floor(x)) return NAN; /* poles, and -inf */
    /* reflection: psi(1 - x) - psi(x) = pi cot(pi x) */
    return em_sp_digamma_positive(1.0 - x) - {_PI} * em_sp_cospi(x) / em_sp_sinpi(x);
  }}
  return em_sp_digamma_positive(x);
}}""", "em_sp_sinpi", "em_sp_cospi", "em_sp_digamma_positive")

_define("em_sp_zeta_positive", f"""
static double em_sp_zeta_positive(double s, double q) {{ /* Hurwitz zeta, s > 1, q > 0 */
  if (isinf(q)) return 0.0;
  if (isinf(s)) return q < 1.0 ? INFINITY : q == 1.0 ? 1.0 : 0.0;
  /* zeta <= q^-s (1 + q / (s - 1)): zero when that underflows */
  if (-s * log(q) + log1p(q / (s - 1.0)) < -760.0) return 0.0;
  /* sum the first terms directly, up to a >= max(10, 0.8 s + 20) where the Euler-Maclaurin
     corrections converge fast; stop early if the direct sum has converged */
  const double start = fmax(10.0, 0.8 * s + 20.0);
  double sum = 0.0, a = q;
  for (int k = 0; k < 10000 && a < start; ++k) {{
    const double term = pow(a, -s);
    sum += term;
    if (k > 0 && term <= 1e-17 * sum) return sum;
    a = q + (double)(k + 1);
  }}
  static const double c[{len(_EULER_MACLAURIN)}] = {{{_c_doubles(_EULER_MACLAURIN)}}};
  const double power = pow(a, -s);
  sum += pow(a, 1.0 - s) / (s - 1.0) + 0.5 * power; /* a^(1-s) may be normal where a^-s is not */
  double factor = s * power / a; /* s (s+1) ... (s+2j-2) a^(-s-2j+1) */
  for (int j = 0; j < {len(_EULER_MACLAURIN)}; ++j) {{
    const double term = c[j] * factor;
    sum += term;
    if (fabs(term) <= 1e-17 * fabs(sum)) break;
    factor *= (s + 2.0 * j + 1.0) * (s + 2.0 * j + 2.0) / (a * a);
  }}
  return sum;
}}""")

_define("em_zeta", """
static double em_zeta(double s, double q) { /* Hurwitz zeta(s, q) = sum_k (q + k)^-s */
  if (isnan(s) || isnan(q)) return NAN;
  if (s == 1.0) return INFINITY;
  if (s < 1.0) return NAN;
  if (q > 0.0) return em_sp_zeta_positive(s, q);
  if (q == floor(q)) return INFINITY; /* a term with q + k = 0 (and q = -inf) */
  if (s != floor(s)) return NAN; /* negative bases to a fractional power */
  if (isinf(s)) return INFINITY;
  const double m = -floor(q); /* q = f - m, 0 < f < 1 */
  if (m <= 64.0) {
    double sum = 0.0;
    for (double k = 0.0; k < m; k += 1.0) sum += pow(q + k, -s);
    return sum + em_sp_zeta_positive(s, q + m);
  }
  /* the m negative terms are (-1)^s sum_{j=1..m} (j - f)^-s = (-1)^s (zeta(s, 1-f) - zeta(s, m+1-f));
     zeta(s, f) + (-1)^s zeta(s, 1 - f), the sum over all integers k of (k + f)^-s, is added up
     first: for an odd s it cancels (to 0 at f = 1/2), the small far part must not be lost */
  const double f = q + m, even = fmod(s, 2.0) == 0.0;
  const double near = em_sp_zeta_positive(s, f)
                      + (even ? 1.0 : -1.0) * em_sp_zeta_positive(s, 1.0 - f);
  const double far = em_sp_zeta_positive(s, m + 1.0 - f);
  return even ? near - far : near + far;
}""", "em_sp_zeta_positive")

_define("em_polygamma", """
static double em_polygamma(double n, double x) { /* n >= 0 an integer */
  if (n == 0.0) return em_digamma(x);
  if (isnan(n) || isnan(x) || n < 0.0 || n != floor(n)) return NAN;
  /* psi^(n)(x) = (-1)^(n+1) n! zeta(n + 1, x) */
  double factorial = 1.0;
  for (double k = 2.0; k <= n && k <= 171.0; k += 1.0) factorial *= k; /* 171! = inf */
  const double z = em_zeta(n + 1.0, x);
  const double sign = fmod(n, 2.0) == 1.0 ? 1.0 : -1.0;
  if (isinf(factorial)) return sign * exp(em_lgamma(n + 1.0) + log(z));
  return sign * factorial * z;
}""", "em_digamma", "em_zeta", "em_lgamma")

_define("em_sp_exp_square", """
static double em_sp_exp_square(double x) { /* exp(x * x) with the rounding of x * x compensated */
  const double high = x * x;
  if (high > 710.0) return INFINITY;
  const double low = fma(x, x, -high);
  return exp(high) * (1.0 + low);
}""")

_define("em_sp_erfcx_positive", """
static double em_sp_erfcx_positive(double x) { /* exp(x^2) erfc(x) for x >= 0 */
  if (x < 10.0) return em_sp_exp_square(x) * erfc(x);
  if (isinf(x)) return 0.0;
  /* asymptotic: (1 - 1/(2x^2) + 1*3/(2x^2)^2 - ...) / (x sqrt(pi)) */
  const double r = 0.5 / (x * x);
  double term = 1.0, sum = 1.0;
  for (int k = 1; k < 24; ++k) {
    term *= -(2.0 * k - 1.0) * r;
    sum += term;
    if (fabs(term) < 1e-17) break;
  }
  return sum / (x * 1.7724538509055159);
}""", "em_sp_exp_square")

_define("em_erfcx", """
static double em_erfcx(double x) { /* exp(x^2) erfc(x) */
  if (isnan(x)) return x;
  if (x >= 0.0) return em_sp_erfcx_positive(x);
  return 2.0 * em_sp_exp_square(x) - em_sp_erfcx_positive(-x); /* erfc(x) = 2 - erfc(-x) */
}""", "em_sp_erfcx_positive", "em_sp_exp_square")

_define("em_sp_erfc_inverse", f"""
static double em_sp_erfc_inverse(double q) {{ /* x >= 0 with erfc(x) = q, 0 < q <= 1 */
  /* Winitzki's approximation of erfinv(1 - q) (relative error < 2e-3) as the start, with
     log(1 - y^2) = log(q (2 - q)) accurate for small q; then Halley's method on erfc */
  const double a = 0.147, l = log(q * (2.0 - q));
  const double b = 2.0 / ({_PI} * a) + 0.5 * l;
  double x = sqrt(sqrt(b * b - l / a) - b);
  for (int i = 0; i < 6; ++i) {{
    const double d = (erfc(x) - q) / (-1.1283791670955126 * exp(-x * x)); /* f / f' */
    x -= d / (1.0 + x * d); /* f'' / f' = -2x */
    if (fabs(d) <= 1e-17 * x) break;
  }}
  return x;
}}""")

_define("em_erfinv", f"""
static double em_erfinv(double y) {{
  if (isnan(y) || y == 0.0) return y;
  const double ay = fabs(y);
  if (ay > 1.0) return NAN;
  if (ay == 1.0) return copysign(INFINITY, y);
  if (ay > 0.5) return copysign(em_sp_erfc_inverse(1.0 - ay), y); /* 1 - |y| is exact */
  /* Halley's method on erf from Winitzki's start (never below the tangent at 0) */
  const double a = 0.147, l = log1p(-ay * ay);
  const double b = 2.0 / ({_PI} * a) + 0.5 * l;
  double x = fmax(sqrt(sqrt(b * b - l / a) - b), 0.886226925452758 * ay);
  for (int i = 0; i < 6; ++i) {{
    const double d = (erf(x) - ay) / (1.1283791670955126 * exp(-x * x));
    x -= d / (1.0 + x * d);
    if (fabs(d) <= 1e-17 * x) break;
  }}
  return copysign(x, y);
}}""", "em_sp_erfc_inverse")

_define("em_ndtri", """
static double em_ndtri(double p) { /* the standard normal quantile: Phi(x) = p */
  if (isnan(p)) return p;
  if (p < 0.0 || p > 1.0) return NAN;
  if (p == 0.0) return -INFINITY;
  if (p == 1.0) return INFINITY;
  if (p < 0.25) return -1.4142135623730951 * em_sp_erfc_inverse(2.0 * p); /* 2p exact */
  return 1.4142135623730951 * em_erfinv(2.0 * p - 1.0); /* 2p - 1 exact for p >= 1/4 */
}""", "em_sp_erfc_inverse", "em_erfinv")

_define("em_sp_bessel_i", f"""
static double em_sp_bessel_i(double x, int order, int scaled) {{
  /* I_order(x), times exp(-x) if scaled; x >= 0 finite, order 0 or 1 */
  if (x <= 20.0) {{ /* sum (x/2)^(2k+order) / (k! (k+order)!): positive terms */
    const double q = 0.25 * x * x;
    double term = order ? 0.5 * x : 1.0, sum = term;
    for (int k = 1; k < 200; ++k) {{
      term *= q / ((double)k * (double)(k + order));
      sum += term;
      if (term <= 1e-17 * sum) break;
    }}
    return scaled ? sum * exp(-x) : sum;
  }}
  /* asymptotic: e^x / sqrt(2 pi x) sum (-1)^k a_k(order) / x^k, stopped at its smallest term */
  const double mu = 4.0 * order * order;
  double term = 1.0, sum = 1.0;
  for (int k = 1; k < 100; ++k) {{
    const double next = term * ((2.0 * k - 1.0) * (2.0 * k - 1.0) - mu) / (8.0 * k * x);
    if (fabs(next) >= fabs(term)) break;
    term = next;
    sum += term;
    if (fabs(term) <= 1e-17 * fabs(sum)) break;
  }}
  sum /= sqrt(2.0 * {_PI} * x);
  if (scaled) return sum;
  const double half = exp(0.5 * x); /* e^x may overflow where the result does not */
  return sum * half * half;
}}""")


def _bessel_i(name: str, order: int, scaled: bool) -> None:
    at_infinity = "0.0" if scaled else "INFINITY"
    odd = order == 1
    _define(name, f"""
static double {name}(double x) {{
  if (isnan(x)) return x;
  const double ax = fabs(x);
  const double r = isinf(x) ? {at_infinity} : em_sp_bessel_i(ax, {order}, {int(scaled)});
  return {"copysign(r, x)" if odd else "r"};
}}""", "em_sp_bessel_i")


_bessel_i("em_bessel_i0", 0, False)
_bessel_i("em_bessel_i0e", 0, True)
_bessel_i("em_bessel_i1", 1, False)
_bessel_i("em_bessel_i1e", 1, True)

_define("em_sp_bessel_k", f"""
static double em_sp_bessel_k(double x, int order, int scaled) {{
  /* K_order(x), times exp(x) if scaled; order 0 or 1 */
  if (isnan(x)) return x;
  if (x < 0.0) return NAN;
  if (x == 0.0) return INFINITY;
  if (isinf(x)) return 0.0;
  if (x <= 1.0) {{ /* DLMF 10.31.1 (the log term and the sum cancel more above 1) */
    const double q = 0.25 * x * x, log_half = log(0.5 * x);
    double k;
    if (order == 0) {{ /* -(log(x/2) + gamma) I0(x) + sum H_k q^k / (k!)^2 */
      double term = 1.0, i0 = 1.0, harmonic = 0.0, sum = 0.0;
      for (int j = 1; j < 60; ++j) {{
        term *= q / ((double)j * j);
        harmonic += 1.0 / j;
        i0 += term;
        sum += harmonic * term;
        if (term <= 1e-17 * i0) break;
      }}
      k = -(log_half + {_EULER}) * i0 + sum;
    }} else {{ /* 1/x + log(x/2) I1(x) - x/4 sum (psi(j+1) + psi(j+2)) q^j / (j! (j+1)!) */
      double term = 1.0, psi1 = -{_EULER}, psi2 = 1.0 - {_EULER};
      double i1 = 1.0, sum = psi1 + psi2;
      for (int j = 1; j < 60; ++j) {{
        term *= q / ((double)j * (j + 1));
        psi1 += 1.0 / j;
        psi2 += 1.0 / (j + 1);
        i1 += term;
        sum += (psi1 + psi2) * term;
        if (term <= 1e-17 * i1) break;
      }}
      k = 1.0 / x + log_half * 0.5 * x * i1 - 0.25 * x * sum;
    }}
    return scaled ? k * exp(x) : k;
  }}
  double k_scaled;
  if (x <= 30.0) {{
    /* e^x K_nu(x) = integral_0^inf exp(-x (cosh t - 1)) cosh(nu t) dt: the trapezoidal rule
       converges geometrically on this entire, even integrand (step 0.1: error < 1e-20) */
    const double h = 0.1;
    double sum = 0.5;
    for (int j = 1; j < 1000; ++j) {{
      const double t = j * h, sh = sinh(0.5 * t);
      const double f = exp(-2.0 * x * sh * sh) * (order ? cosh(t) : 1.0);
      sum += f;
      if (f <= 1e-18 * sum) break;
    }}
    k_scaled = h * sum;
  }} else {{ /* asymptotic: sqrt(pi / 2x) sum a_k(order) / x^k */
    const double mu = 4.0 * order * order;
    double term = 1.0, sum = 1.0;
    for (int j = 1; j < 100; ++j) {{
      const double next = term * (mu - (2.0 * j - 1.0) * (2.0 * j - 1.0)) / (8.0 * j * x);
      if (fabs(next) >= fabs(term)) break;
      term = next;
      sum += term;
      if (fabs(term) <= 1e-17 * fabs(sum)) break;
    }}
    k_scaled = sum * sqrt({_PI} / (2.0 * x));
  }}
  return scaled ? k_scaled : k_scaled * exp(-x);
}}""")

for _order in (0, 1):
    for _scaled in (False, True):
        _name = f"em_bessel_k{_order}{'e' if _scaled else ''}"
        _define(_name, f"static double {_name}(double x) "
                       f"{{ return em_sp_bessel_k(x, {_order}, {int(_scaled)}); }}",
                "em_sp_bessel_k")

_define("em_sp_bessel_jy", f"""
static void em_sp_bessel_jy(double x, double r[4]) {{ /* J0, J1, Y0, Y1 at x > 0, finite */
  const double two_over_pi = 0.6366197723675814;
  if (x <= 4.0) {{ /* power series (DLMF 10.2.2, 10.8.1) */
    const double q = -0.25 * x * x, log_half = log(0.5 * x);
    double t0 = 1.0, t1 = 1.0, j0 = 1.0, j1 = 1.0, harmonic = 0.0, h0 = 0.0;
    double psi1 = -{_EULER}, psi2 = 1.0 - {_EULER}, h1 = psi1 + psi2;
    for (int k = 1; k < 60; ++k) {{
      t0 *= q / ((double)k * k); /* (-q)^k / (k!)^2 */
      t1 *= q / ((double)k * (k + 1)); /* (-q)^k / (k! (k+1)!) */
      harmonic += 1.0 / k;
      psi1 += 1.0 / k;
      psi2 += 1.0 / (k + 1);
      j0 += t0;
      j1 += t1;
      h0 += harmonic * t0;
      h1 += (psi1 + psi2) * t1;
      if (fabs(t0) + fabs(t1) <= 1e-17 * (fabs(j0) + fabs(j1))) break;
    }}
    j1 *= 0.5 * x;
    r[0] = j0;
    r[1] = j1;
    r[2] = two_over_pi * ((log_half + {_EULER}) * j0 - h0);
    r[3] = -two_over_pi / x + two_over_pi * log_half * j1 - x / (2.0 * {_PI}) * h1;
    return;
  }}
  if (x < 25.0) {{
    /* Miller's backward recurrence J_(k-1) = (2k/x) J_k - J_(k+1) from a negligible J_n,
       normalized by J0 + 2 sum J_2k = 1; Y from the Neumann series
       Y0 = (2/pi) (log(x/2) + gamma) J0 - (4/pi) sum (-1)^k J_2k / k, and Y1 = -Y0' */
    const int n = 2 * (int)((x + 32.0) * 0.5);
    double above = 0.0, current = 1.0, norm = 0.0, s0 = 0.0, s1 = 0.0, j1 = 0.0;
    for (int k = n; k >= 1; --k) {{
      const double below = (2.0 * k / x) * current - above; /* J_(k-1) */
      if (k % 2 == 0) {{ /* current is J_2m, m = k/2 */
        const double m = 0.5 * k, sign = (k / 2) % 2 ? -1.0 : 1.0;
        norm += 2.0 * current;
        s0 += sign * current / m;
        s1 += sign * (below - above) / m;
      }}
      if (k == 1) j1 = current;
      above = current;
      current = below;
      if (fabs(current) > 1e250) {{ /* keep the unnormalized values finite */
        current *= 1e-250; above *= 1e-250; norm *= 1e-250; s0 *= 1e-250; s1 *= 1e-250;
        j1 *= 1e-250;
      }}
    }}
    norm += current;
    const double j0 = current / norm, lg = log(0.5 * x) + {_EULER};
    j1 /= norm;
    r[0] = j0;
    r[1] = j1;
    r[2] = two_over_pi * (lg * j0 - 2.0 * s0 / norm);
    r[3] = two_over_pi * (-j0 / x + lg * j1 + s1 / norm);
    return;
  }}
  /* Hankel's expansion (DLMF 10.17.3): P and Q series stopped at their smallest term */
  const double s = sin(x), c = cos(x), amplitude = 1.0 / sqrt({_PI} * x);
  for (int order = 0; order < 2; ++order) {{
    const double mu = 4.0 * order * order;
    double term = 1.0, p = 1.0, qs = 0.0;
    for (int k = 1; k < 100; ++k) {{
      const double next = term * (mu - (2.0 * k - 1.0) * (2.0 * k - 1.0)) / (8.0 * k * x);
      if (fabs(next) >= fabs(term)) break;
      term = next;
      const double signed_term = (k / 2) % 2 ? -term : term; /* (-1)^floor(k/2) */
      if (k % 2) qs += signed_term; else p += signed_term;
      if (fabs(term) <= 1e-17) break;
    }}
    /* omega = x - (2 order + 1) pi / 4; cos and sin of omega times sqrt(2) */
    const double cw = order ? s - c : c + s, sw = order ? -(s + c) : s - c;
    r[order] = amplitude * (p * cw - qs * sw);
    r[order + 2] = amplitude * (p * sw + qs * cw);
  }}
}}""")


def _bessel_jy(name: str, index: int) -> None:
    if index == 0:  # J0: even
        edges = "if (isinf(x)) return 0.0;\n  if (x == 0.0) return 1.0;\n  x = fabs(x);"
        result = "r[0]"
    elif index == 1:  # J1: odd
        edges = "if (isinf(x)) return copysign(0.0, x);\n  if (x == 0.0) return x;"
        result = "x < 0.0 ? -r[1] : r[1]"
    else:  # Y0, Y1: -inf at 0, NaN below
        edges = "if (x < 0.0) return NAN;\n  if (x == 0.0) return -INFINITY;\n" \
                "  if (isinf(x)) return 0.0;"
        result = f"r[{index}]"
    _define(name, f"""
static double {name}(double x) {{
  if (isnan(x)) return x;
  {edges}
  double r[4];
  em_sp_bessel_jy(fabs(x), r);
  return {result};
}}""", "em_sp_bessel_jy")


_bessel_jy("em_bessel_j0", 0)
_bessel_jy("em_bessel_j1", 1)
_bessel_jy("em_bessel_y0", 2)
_bessel_jy("em_bessel_y1", 3)

_define("em_spherical_bessel_j0", """
static double em_spherical_bessel_j0(double x) { /* sin(x) / x */
  if (isinf(x)) return 0.0;
  if (x == 0.0) return 1.0;
  return sin(x) / x;
}""")

_define("em_airy_ai", f"""
static double em_airy_ai(double x) {{
  if (isnan(x) || isinf(x)) return NAN; /* as PyTorch */
  if (x > 1.0) {{
    /* Ai(x) = sqrt(x/3) / pi K_1/3(zeta), zeta = 2/3 x^3/2, with
       e^zeta K_nu(zeta) = integral_0^inf exp(-zeta (cosh t - 1)) cosh(nu t) dt (trapezoidal,
       accurate for zeta <= 30 with step 0.1, see em_sp_bessel_k) */
    const double zeta = (2.0 / 3.0) * x * sqrt(x), h = 0.1;
    if (zeta > 20.0) {{ /* asymptotic expansion (DLMF 9.7.5), stopped at its smallest term */
      double u = 1.0, sum = 1.0;
      for (int k = 1; k < 100; ++k) {{
        const double next = u * (6.0 * k - 5.0) * (6.0 * k - 3.0) * (6.0 * k - 1.0)
                            / (216.0 * k * (2.0 * k - 1.0) * zeta); /* u_k / zeta^k */
        if (fabs(next) >= fabs(u)) break;
        u = next;
        sum += k % 2 ? -u : u;
        if (u <= 1e-17) break;
      }}
      return exp(-zeta) * sum / (3.5449077018110318 * sqrt(sqrt(x))); /* 2 sqrt(pi) */
    }}
    double sum = 0.5;
    for (int j = 1; j < 1000; ++j) {{
      const double t = j * h, sh = sinh(0.5 * t);
      const double f = exp(-2.0 * zeta * sh * sh) * cosh(t / 3.0);
      sum += f;
      if (f <= 1e-18 * sum) break;
    }}
    return sqrt(x / 3.0) / {_PI} * exp(-zeta) * (h * sum);
  }}
  if (x >= -7.0) {{ /* Maclaurin series: Ai(x) = Ai(0) f(x) + Ai'(0) g(x) (DLMF 9.4.1) */
    const double x3 = x * x * x;
    double tf = 1.0, tg = x, f = 1.0, g = x;
    for (int k = 1; k < 200; ++k) {{
      tf *= x3 / ((3.0 * k - 1.0) * (3.0 * k));
      tg *= x3 / ((3.0 * k) * (3.0 * k + 1.0));
      f += tf;
      g += tg;
      if (fabs(tf) + fabs(tg) <= 1e-18 * (fabs(f) + fabs(g))) break;
    }}
    return 0.3550280538878172 * f - 0.2588194037928068 * g;
  }}
  /* asymptotic expansion for x -> -inf (DLMF 9.7.9), stopped at its smallest term */
  /* zeta = 2/3 z^3/2 as zeta + zeta_low (the roundings compensated: the phase of the result
     needs zeta to an absolute, not relative, accuracy) */
  const double z = -x, root = sqrt(z), root_low = fma(-root, root, z) / (2.0 * root);
  const double power = z * root, power_low = fma(z, root, -power) + z * root_low;
  const double zeta = 2.0 * power / 3.0;
  const double zeta_low = (fma(-zeta, 3.0, 2.0 * power) + 2.0 * power_low) / 3.0;
  if (isinf(zeta)) return 0.0; /* |x| > 1e205: the phase is lost, the amplitude ~1e-51 */
  double u = 1.0, p = 1.0, q = 0.0;
  for (int k = 1; k < 100; ++k) {{
    const double next = u * (6.0 * k - 5.0) * (6.0 * k - 3.0) * (6.0 * k - 1.0)
                        / (216.0 * k * (2.0 * k - 1.0) * zeta); /* u_k / zeta^k */
    if (fabs(next) >= fabs(u)) break;
    u = next;
    const double signed_u = (k / 2) % 2 ? -u : u; /* (-1)^floor(k/2) */
    if (k % 2) q += signed_u; else p += signed_u;
    if (fabs(u) <= 1e-17) break;
  }}
  const double s0 = sin(zeta), c0 = cos(zeta);
  const double s = s0 + c0 * zeta_low, c = c0 - s0 * zeta_low; /* of zeta + zeta_low */
  /* c + s and s - c are cos and sin of zeta - pi/4, times sqrt(2) */
  return (p * (c + s) + q * (s - c)) / (2.5066282746310002 * sqrt(sqrt(z))); /* sqrt(2 pi) */
}}""")

_define("em_sp_igamma_phi", """
static double em_sp_igamma_phi(double a, double x) { /* lambda - 1 - log(lambda), lambda = x / a */
  const double d = (x - a) / a;
  if (fabs(d) >= 0.1) return d - log(x / a);
  double power = d * d, sum = 0.0; /* sum_k>=2 (-1)^k d^k / k */
  for (int k = 2; k < 40; ++k) {
    const double term = power / k;
    sum += (k % 2) ? -term : term;
    if (fabs(term) <= 1e-17 * sum) break;
    power *= d;
  }
  return sum;
}""")

_define("em_sp_igamma_front", f"""
static double em_sp_igamma_front(double a, double x) {{ /* x^a e^-x / gamma(a), a, x > 0 */
  if (a < 10.0) return exp(a * log(x) - x - em_lgamma(a));
  /* sqrt(a / 2 pi) exp(-a (lambda - 1 - log lambda) - stirling(a)), lambda = x / a: no
     cancellation between a log x, x and lgamma(a) (DiDonato and Morris) */
  const double phi = em_sp_igamma_phi(a, x);
  return sqrt(a / (2.0 * {_PI})) * exp(-a * phi - em_sp_stirling(a));
}}""", "em_lgamma", "em_sp_igamma_phi", "em_sp_stirling")

_define("em_sp_igamma_pair", f"""
static void em_sp_igamma_pair(double a, double x, double r[2]) {{
  /* r[0] = P(a, x), r[1] = Q(a, x): the regularized incomplete gamma functions */
  if (isnan(a) || isnan(x) || a < 0.0 || x < 0.0) {{ r[0] = r[1] = NAN; return; }}
  if (a == 0.0) {{
    if (x > 0.0) {{ r[0] = 1.0; r[1] = 0.0; }} else {{ r[0] = r[1] = NAN; }}
    return;
  }}
  if (x == 0.0) {{ r[0] = 0.0; r[1] = 1.0; return; }}
  if (isinf(a)) {{
    if (isinf(x)) {{ r[0] = r[1] = NAN; }} else {{ r[0] = 0.0; r[1] = 1.0; }}
    return;
  }}
  if (isinf(x)) {{ r[0] = 1.0; r[1] = 0.0; return; }}
  if (a > 20000.0) {{
    /* Temme's uniform expansion (DLMF 8.12.3-8.12.9), two terms:
       Q = erfc(eta sqrt(a/2)) / 2 + exp(-a eta^2 / 2) / sqrt(2 pi a) (c0 + c1 / a) */
    const double d = (x - a) / a; /* lambda - 1 */
    const double half_eta2 = em_sp_igamma_phi(a, x); /* lambda - 1 - log(lambda) */
    const double eta = copysign(sqrt(2.0 * half_eta2), d);
    double c0, c1;
    if (fabs(eta) < 0.01) {{
      c0 = -1.0 / 3.0 + eta * (1.0 / 12.0 + eta * (-2.0 / 135.0 + eta * (1.0 / 864.0
           + eta / 2835.0)));
      c1 = -1.0 / 540.0 + eta * (-1.0 / 288.0 + eta / 378.0);
    }} else {{
      c0 = 1.0 / d - 1.0 / eta;
      c1 = 1.0 / (eta * eta * eta) - 1.0 / (d * d * d) - 1.0 / (d * d) - 1.0 / (12.0 * d);
    }}
    const double rest = exp(-a * half_eta2) / sqrt(2.0 * {_PI} * a) * (c0 + c1 / a);
    const double y = eta * sqrt(0.5 * a);
    r[0] = 0.5 * erfc(-y) - rest;
    r[1] = 0.5 * erfc(y) + rest;
    return;
  }}
  const double log_x = log(x);
  if (x < a + 1.0) {{
    if (a < 1.0) {{
      /* gamma(a, x) = sum (-1)^k x^(a+k) / (k! (a+k)), so with S = sum_k>=1 (-1)^k x^k / (k! (a+k)),
         P = x^a / gamma(a+1) (1 + a S), Q = -expm1(a log x - lgamma(1+a)) - x^a / gamma(a+1) a S:
         no cancellation in Q for tiny a */
      double term = 1.0, s = 0.0;
      for (int k = 1; k < 100; ++k) {{
        term *= -x / k;
        const double t = term / (a + k);
        s += t;
        if (fabs(t) <= 1e-17 * fabs(s)) break;
      }}
      const double e = a * log_x - em_sp_lgamma1p(a);
      const double front = exp(e);
      r[0] = front * (1.0 + a * s);
      r[1] = -expm1(e) - front * a * s;
      return;
    }}
    /* P = x^a e^-x / gamma(a+1) sum x^k / ((a+1) ... (a+k)) */
    double term = 1.0, sum = 1.0;
    for (int k = 1; k < 5000; ++k) {{
      term *= x / (a + k);
      sum += term;
      if (term <= 1e-17 * sum) break;
    }}
    r[0] = em_sp_igamma_front(a, x) / a * sum;
    r[1] = 1.0 - r[0];
    return;
  }}
  /* Q = x^a e^-x / gamma(a) / (x + 1 - a - 1 (1 - a) / (x + 3 - a - 2 (2 - a) / ...)),
     Legendre's continued fraction by the modified Lentz method */
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 5000; ++i) {{
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (fabs(delta - 1.0) <= 1e-16) break;
  }}
  r[1] = em_sp_igamma_front(a, x) * h;
  r[0] = 1.0 - r[1];
}}""", "em_sp_lgamma1p", "em_sp_igamma_phi", "em_sp_igamma_front")

_define("em_igamma", "static double em_igamma(double a, double x) "
                     "{ double r[2]; em_sp_igamma_pair(a, x, r); return r[0]; }",
        "em_sp_igamma_pair")
_define("em_igammac", "static double em_igammac(double a, double x) "
                      "{ double r[2]; em_sp_igamma_pair(a, x, r); return r[1]; }",
        "em_sp_igamma_pair")


# --------------------------------------------------------------------------- typed helpers
# The orthogonal polynomials, in the kernel's compute type T with PyTorch's branches (a float
# recurrence that overflows gives NaN there, as in PyTorch).  $T is the type, $F the libm
# suffix, $S the helper suffix.  The degree is PyTorch's int64 truncation of n; where PyTorch's
# conversion is undefined (NaN, infinities, |n| >= 2^63) it is -1: x86's conversion gives
# INT64_MIN there, a negative degree too, and negative degrees give 0.  Recurrences run at most
# EM_POLY_STEPS steps: beyond, the Chebyshev kinds use their closed forms for |x| > 1 and
# Legendre and Laguerre (oscillating, so PyTorch would run all n steps) give NaN.
POLYNOMIAL_MAX_STEPS = 1 << 20

_DEGREE = Template("""
static int64_t em_sp_degree_$S($T n) {
  if (!(n > ($T)-9.2e18 && n < ($T)9.2e18)) return -1;
  return (int64_t)n;
}""")


def _chebyshev(kind: str, shifted: bool) -> Template:
    """T/U/V/W_n(y), y = x (or 2x - 1 shifted), PyTorch's special cases and branches."""
    y = "(x + x - ($T)1)" if shifted else "x"
    # the value of P_n(1) and P_n(-1) for each kind
    at_one = {"t": "($T)1", "u": "($T)n + ($T)1", "v": "($T)1", "w": "($T)(2.0 * n + 1.0)"}[kind]
    at_minus_one = {"t": "(n % 2 == 0 ? ($T)1 : ($T)-1)",
                    "u": "(n % 2 == 0 ? ($T)n + ($T)1 : -(($T)n + ($T)1))",
                    "v": "(n % 2 == 0 ? ($T)(2.0 * n + 1.0) : ($T)-(2.0 * n + 1.0))",
                    "w": "(n % 2 == 0 ? ($T)1 : ($T)-1)"}[kind]
    threshold = {"t": 6, "u": 6 if shifted else 8, "v": 6 if shifted else 8,
                 "w": 4 if shifted else 8}[kind]
    # the trigonometric form for |y| < 1, theta = acos(y), with PyTorch's degenerate cases
    trig = {
        "t": "return cos$F(($T)n * theta);",
        "u": "if (sin$F(theta) != ($T)0) return sin$F((($T)n + ($T)1) * theta) / sin$F(theta);\n"
             "    return (($T)n + ($T)1) * cos$F((($T)n + ($T)1) * theta) / y;",
        "v": "if (sin$F(theta / ($T)2) != ($T)1)\n"
             "      return cos$F((($T)n + ($T)0.5) * theta) / cos$F(theta / ($T)2);\n"
             f"    return {at_minus_one};",
        "w": "if (cos$F(theta / ($T)2) != ($T)1)\n"
             "      return sin$F((($T)n + ($T)0.5) * theta) / sin$F(theta / ($T)2);\n"
             + ("    return (n % 2 == 0 ? ($T)1 : ($T)-1);" if shifted else
                f"    return y > ($T)0 ? {at_one} : (n % 2 == 0 ? ($T)1 : ($T)-1);"),
    }[kind]
    first = {"t": "y", "u": "y + y", "v": "y + y - ($T)1", "w": "y + y + ($T)1"}[kind]
    # closed forms for |y| > 1 (a = acosh|y|), used past the step limit
    hyperbolic = {"t": ("cosh$F(($T)n * a)", "cosh$F(($T)n * a)"),
                  "u": ("sinh$F((($T)n + ($T)1) * a) / sinh$F(a)",
                        "sinh$F((($T)n + ($T)1) * a) / sinh$F(a)"),
                  "v": ("cosh$F((($T)n + ($T)0.5) * a) / cosh$F(a / ($T)2)",
                        "sinh$F((($T)n + ($T)0.5) * a) / sinh$F(a / ($T)2)"),
                  "w": ("sinh$F((($T)n + ($T)0.5) * a) / sinh$F(a / ($T)2)",
                        "cosh$F((($T)n + ($T)0.5) * a) / cosh$F(a / ($T)2)")}[kind]
    special = ("if (x == ($T)1) return " + at_one + ";\n"
               "  if (x == ($T)0) return " + at_minus_one + ";") if shifted else (
        "if (fabs$F(x) == ($T)1) return x > ($T)0 ? " + at_one + " : " + at_minus_one + ";")
    name = f"em_{'shifted_' if shifted else ''}chebyshev_{kind}_$S"
    return Template(f"""
static $T {name}($T x, $T degree) {{
  const int64_t n = em_sp_degree_$S(degree);
  if (n < 0) return ($T)0;
  {special}
  const $T y = {y};
  if (n > {threshold} && fabs$F(y) < ($T)1) {{
    const $T theta = acos$F(y);
    {trig}
  }}
  if (n == 0) return ($T)1;
  if (n == 1) return {first};
  if (n > {POLYNOMIAL_MAX_STEPS} && isfinite(y)) {{ /* |y| > 1 */
    const $T a = acosh$F(fabs$F(y));
    return y > ($T)0 ? {hyperbolic[0]} : (n % 2 == 0 ? ($T)1 : ($T)-1) * ({hyperbolic[1]});
  }}
  $T p = ($T)1, q = {first}, r = q;
  for (int64_t k = 2; k <= n && !isnan(q); ++k) {{
    r = (y + y) * q - p;
    p = q;
    q = r;
  }}
  return r;
}}""")


_HERMITE_H = Template("""
static $T em_hermite_h_$S($T x, $T degree) {
  const int64_t n = em_sp_degree_$S(degree);
  if (n < 0) return ($T)0;
  if (n == 0) return ($T)1;
  if (n == 1) return x + x;
  if (n > $LIMIT) return NAN; /* PyTorch's limit for the type */
  $T p = ($T)1, q = x + x, r = ($T)0;
  for (int64_t k = 2; k < n + n; k += 2) {
    r = (x + x) * q - ($T)k * p;
    p = q;
    q = r;
  }
  return r;
}""")

_HERMITE_HE = Template("""
static $T em_hermite_he_$S($T x, $T degree) {
  const int64_t n = em_sp_degree_$S(degree);
  if (n < 0) return ($T)0;
  if (n == 0) return ($T)1;
  if (n == 1) return x;
  if (n > $LIMIT) return NAN; /* PyTorch's limit for the type */
  $T p = ($T)1, q = x, r = q;
  for (int64_t k = 1; k < n; ++k) {
    r = x * q - ($T)k * p;
    p = q;
    q = r;
  }
  return r;
}""")

_LAGUERRE = Template(f"""
static $T em_laguerre_l_$S($T x, $T degree) {{
  const int64_t n = em_sp_degree_$S(degree);
  if (n < 0) return ($T)0;
  if (fabs$F(x) == ($T)0) return ($T)1;
  if (n == 0) return ($T)1;
  if (n == 1) return ($T)1 - x;
  if (n > {POLYNOMIAL_MAX_STEPS}) return NAN;
  $T p = ($T)1, q = ($T)1 - x, r = q;
  for (int64_t k = 1; k < n && !isnan(q); ++k) {{
    r = ((($T)(k + k) + (($T)1 - x)) * q - ($T)k * p) / ($T)(k + 1);
    p = q;
    q = r;
  }}
  return r;
}}""")

_LEGENDRE = Template(f"""
static $T em_legendre_p_$S($T x, $T degree) {{
  const int64_t n = em_sp_degree_$S(degree);
  if (n < 0) return ($T)0;
  if (fabs$F(x) == ($T)1) return (x > ($T)0 || n % 2 == 0) ? ($T)1 : ($T)-1;
  if (n == 0) return ($T)1;
  if (n == 1) return x;
  if (n > {POLYNOMIAL_MAX_STEPS}) return NAN;
  $T p = ($T)1, q = x, r = q;
  for (int64_t k = 1; k < n && !isnan(q); ++k) {{
    r = (($T)(k + k + 1) * x * q - ($T)k * p) / ($T)(k + 1);
    p = q;
    q = r;
  }}
  return r;
}}""")

_TYPED: dict[str, Template] = {
    **{f"chebyshev_{k}": _chebyshev(k, False) for k in "tuvw"},
    **{f"shifted_chebyshev_{k}": _chebyshev(k, True) for k in "tuvw"},
    "hermite_h": _HERMITE_H, "hermite_he": _HERMITE_HE,
    "laguerre_l": _LAGUERRE, "legendre_p": _LEGENDRE,
}
_TYPE_PARTS = {"float": {"T": "float", "F": "f", "S": "f", "LIMIT": "128"},
               "double": {"T": "double", "F": "", "S": "d", "LIMIT": "512"}}


# --------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Special:
    """How an intrinsic is called: its arity and its double helper, or typed helper stem."""

    arity: int
    helper: str = ""  # a double helper of _DOUBLE
    typed: bool = False  # a polynomial of _TYPED, one helper per compute type


SPECIALS: dict[str, Special] = {
    **{name: Special(1, f"em_{name}") for name in (
        "lgamma", "digamma", "erfinv", "ndtri", "erfcx", "bessel_i0", "bessel_i0e",
        "bessel_i1", "bessel_i1e", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1",
        "bessel_k0", "bessel_k0e", "bessel_k1", "bessel_k1e", "spherical_bessel_j0",
        "airy_ai")},
    "polygamma": Special(2, "em_polygamma"), "zeta": Special(2, "em_zeta"),
    "igamma": Special(2, "em_igamma"), "igammac": Special(2, "em_igammac"),
    **{name: Special(2, typed=True) for name in _TYPED},
}
SPECIAL_ARITY = {name: spec.arity for name, spec in SPECIALS.items()}
if set(SPECIALS) != SPECIAL_INTRINSICS:  # pragma: no cover - a table out of step with the IR
    raise ImportError(f"c_special covers {sorted(set(SPECIALS) ^ SPECIAL_INTRINSICS)} "
                      f"differently from ember.ir.loop.expr.SPECIAL_INTRINSICS")


def _need_double(hs: HelperSet, name: str) -> str:
    return hs.need_with_deps(name, _DOUBLE.__getitem__)


def _need_typed(hs: HelperSet, stem: str, ctype: str) -> str:
    parts = _TYPE_PARTS[ctype]
    degree = f"em_sp_degree_{parts['S']}"
    hs.need(degree, lambda: _DEGREE.substitute(parts).strip())
    name = f"em_{stem}_{parts['S']}"
    return hs.need(name, lambda: _TYPED[stem].substitute(parts).strip())


def special_call(hs: HelperSet, name: str, compute_ctype: str, args: list[str]) -> str:
    """C code of special function ``name`` on ``args`` (C expressions of ``compute_ctype``),
    adding the helpers it needs to ``hs``."""
    spec = SPECIALS.get(name)
    if spec is None:
        raise CodegenError(f"internal: no C helper for special function '{name}'")
    if compute_ctype not in _TYPE_PARTS:
        raise CodegenError(f"special function '{name}' computes in float or double, "
                           f"not {compute_ctype}")
    if spec.typed:
        return f"{_need_typed(hs, name, compute_ctype)}({', '.join(args)})"
    helper = _need_double(hs, spec.helper)
    if compute_ctype == "double":
        return f"{helper}({', '.join(args)})"
    return f"((float){helper}({', '.join(f'(double)({a})' for a in args)}))"


def helper_source(names: list[str], compute_ctype: str = "double") -> str:
    """The C source of the helpers that ``names`` (intrinsics) need, in order: for tests that
    build the functions on their own."""
    hs = HelperSet()
    for name in names:
        special_call(hs, name, compute_ctype, ["0"] * SPECIALS[name].arity)
    return hs.source()

"""The small ``static inline`` C functions that give IR operations defined behaviour.

C leaves many integer and conversion corner cases undefined; the loop IR must not.  Each
helper here pins one down, in the spirit of numpy (what ember's reference executor computes):

* signed ``add``/``sub``/``mul``/``neg`` wrap (two's complement), computed in unsigned
  arithmetic of at least 32 bits (so ``uint16 * uint16`` never overflows a promoted ``int``);
* ``div``/``mod`` truncate (C), ``floordiv``/``floormod`` floor (Python); a zero divisor gives
  0, ``MIN / -1`` wraps to ``MIN`` and ``MIN % -1`` is 0, like numpy;
* float ``floordiv``/``floormod`` follow numpy's ``divmod`` exactly;
* ``shl`` by a count outside ``[0, bits)`` gives 0 (ONNX BitShift); ``shr`` gives 0 for
  unsigned and the sign fill (0 or -1) for signed values, like numpy;
* float ``min``/``max`` propagate NaN (``numpy.minimum``/``maximum``, ONNX Min/Max);
* float -> integer conversion saturates (NaN -> 0), like WebAssembly ``trunc_sat``: C makes
  out-of-range conversion undefined and numpy's result is whatever the CPU returns;
* f16/bf16 <-> float/double conversions round to nearest even, integer-only bit manipulation
  (so they hold under any ``-ffp-contract`` setting), NaN stays NaN (quiet), overflow gives inf.

Helpers are generated on demand, one per (operation, C type), and emitted once per module in
dependency order.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ember.core.dtypes import DType
from ember.codegen.c_types import (CodegenError, compute_ctype, lane_ctype, tag, wide_unsigned)


class HelperSet:
    """The helper functions one module needs, in an order where each follows its deps."""

    def __init__(self) -> None:
        self._code: dict[str, str] = {}

    def need(self, name: str, build: Callable[[], str]) -> str:
        """Ensure helper ``name`` exists (``build`` may itself ``need`` others); return name."""
        if name not in self._code:
            self._code[name] = ""  # reserve: recursion guard and position after deps
            code = build()
            del self._code[name]
            self._code[name] = code
        return name

    def need_with_deps(self, name: str,
                       definition: Callable[[str], tuple[str, Sequence[str]]]) -> str:
        """Ensure helper ``name`` and, before it, the helpers it uses: ``definition(name)``
        gives its code and their names (looked up the same way)."""
        code, deps = definition(name)

        def build() -> str:
            for dep in deps:
                self.need_with_deps(dep, definition)
            return code

        return self.need(name, build)

    def __contains__(self, name: str) -> bool:
        return name in self._code

    def source(self) -> str:
        return "\n".join(code for code in self._code.values() if code)


# --------------------------------------------------------------------------- integers
_INT_SYMBOLS = {"add": "+", "sub": "-", "mul": "*"}


def int_arith(hs: HelperSet, op: str, dtype: DType) -> str:
    """``em_add_i32`` and friends: wrapping add/sub/mul computed without signed overflow."""
    t, u = compute_ctype(dtype), wide_unsigned(dtype)
    return hs.need(f"em_{op}_{tag(t)}", lambda: (
        f"static inline {t} em_{op}_{tag(t)}({t} a, {t} b) "
        f"{{ return ({t})(({u})a {_INT_SYMBOLS[op]} ({u})b); }}"))


def int_neg(hs: HelperSet, dtype: DType) -> str:
    t, u = compute_ctype(dtype), wide_unsigned(dtype)
    return hs.need(f"em_neg_{tag(t)}", lambda: (
        f"static inline {t} em_neg_{tag(t)}({t} a) {{ return ({t})(({u})0 - ({u})a); }}"))


def int_abs(hs: HelperSet, dtype: DType) -> str:
    t = compute_ctype(dtype)
    if not dtype.is_signed:
        return hs.need(f"em_abs_{tag(t)}", lambda: (
            f"static inline {t} em_abs_{tag(t)}({t} a) {{ return a; }}"))
    neg = int_neg(hs, dtype)
    return hs.need(f"em_abs_{tag(t)}", lambda: (
        f"static inline {t} em_abs_{tag(t)}({t} a) {{ return a < 0 ? {neg}(a) : a; }}"))


def int_divmod(hs: HelperSet, op: str, dtype: DType) -> str:
    """Integer ``div``/``mod`` (truncating) and ``floordiv``/``floormod``, total functions."""
    t = compute_ctype(dtype)
    name = f"em_{op}_{tag(t)}"
    if not dtype.is_signed:  # unsigned: truncation is floor
        sym = "/" if op in ("div", "floordiv") else "%"
        return hs.need(name, lambda: (
            f"static inline {t} {name}({t} a, {t} b) "
            f"{{ return b == 0 ? 0 : ({t})(a {sym} b); }}"))
    neg = int_neg(hs, dtype)
    bodies = {
        "div": f"if (b == 0) return 0;\n  if (b == -1) return {neg}(a);\n"
               f"  return ({t})(a / b);",
        "mod": f"if (b == 0 || b == -1) return 0;\n  return ({t})(a % b);",
        "floordiv": f"if (b == 0) return 0;\n  if (b == -1) return {neg}(a);\n"
                    f"  const {t} q = ({t})(a / b);\n"
                    f"  return ({t})((a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q);",
        "floormod": f"if (b == 0 || b == -1) return 0;\n  const {t} r = ({t})(a % b);\n"
                    f"  return ({t})((r != 0 && ((r < 0) != (b < 0))) ? r + b : r);",
    }
    return hs.need(name, lambda: f"static inline {t} {name}({t} a, {t} b) {{\n  "
                                 f"{bodies[op]}\n}}")


def int_shift(hs: HelperSet, op: str, dtype: DType) -> str:
    """``shl``/``shr`` defined for every count (see the module docstring)."""
    t, u = compute_ctype(dtype), wide_unsigned(dtype)
    bits = 8 * dtype.itemsize
    name = f"em_{op}_{tag(t)}"
    out_of_range = f"(uint64_t)b >= {bits}u" if not dtype.is_signed else \
        f"b < 0 || b >= {bits}"
    if op == "shl":
        body = f"if ({out_of_range}) return 0;\n  return ({t})(({u})a << b);"
    elif dtype.is_signed:
        body = f"if ({out_of_range}) return a < 0 ? -1 : 0;\n  return ({t})(a >> b);"
    else:
        body = f"if ({out_of_range}) return 0;\n  return ({t})(a >> b);"
    return hs.need(name, lambda: f"static inline {t} {name}({t} a, {t} b) {{\n  {body}\n}}")


def minmax(hs: HelperSet, op: str, dtype: DType) -> str:
    """``min``/``max``; for floats NaN-propagating, returning ``b`` on ties like numpy."""
    t = lane_ctype(dtype) if dtype is not DType.BOOL else "bool"
    cmp = "<" if op == "min" else ">"
    nan = " || a != a" if dtype.is_float else ""
    name = f"em_{op}_{tag(t)}"
    return hs.need(name, lambda: (
        f"static inline {t} {name}({t} a, {t} b) {{ return (a {cmp} b{nan}) ? a : b; }}"))


# --------------------------------------------------------------------------- floats
def float_divmod(hs: HelperSet, op: str, ctype: str) -> str:
    """numpy's float ``floor_divide`` (op ``floordiv``) and ``remainder`` (``floormod``)."""
    f = "f" if ctype == "float" else ""
    name = f"em_{op}_{tag(ctype)}"
    if op == "floormod":
        return hs.need(name, lambda: f"""static inline {ctype} {name}({ctype} a, {ctype} b) {{
  {ctype} mod = fmod{f}(a, b);
  if (b == 0) return mod;
  if (mod != 0) {{
    if ((b < 0) != (mod < 0)) mod += b;
  }} else {{
    mod = copysign{f}(0.0{f}, b);
  }}
  return mod;
}}""")
    return hs.need(name, lambda: f"""static inline {ctype} {name}({ctype} a, {ctype} b) {{
  const {ctype} mod = fmod{f}(a, b);
  if (b == 0) return a / b;
  {ctype} div = (a - mod) / b;
  if (mod != 0 && (b < 0) != (mod < 0)) div -= 1.0{f};
  if (div == 0) return copysign{f}(0.0{f}, a / b);
  {ctype} floordiv = floor{f}(div);
  if (div - floordiv > 0.5{f}) floordiv += 1.0{f};
  return floordiv;
}}""")


def float_to_int(hs: HelperSet, to: DType, source_ctype: str) -> str:
    """Saturating float -> integer conversion (NaN -> 0)."""
    t = compute_ctype(to)
    bits = 8 * to.itemsize
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if to.is_signed else (0, 2 ** bits)
    limit = t.upper().removesuffix("_T")  # int8_t -> INT8 (for INT8_MIN / INT8_MAX)
    lo_c, hi_c = (f"{limit}_MIN" if to.is_signed else "0"), f"{limit}_MAX"
    name = f"em_cast_{tag(t)}_{tag(source_ctype)}"
    return hs.need(name, lambda: f"""static inline {t} {name}({source_ctype} x) {{
  if (x != x) return 0;
  if (x < {float(lo)!r}) return {lo_c};
  if (x >= {float(hi)!r}) return {hi_c};
  return ({t})x;
}}""")


_NARROW_TO = """static inline uint32_t em_f64_to_narrow(double d, int ebits, int mbits) {
  /* round-to-nearest-even of d to a binary float with ebits exponent, mbits mantissa bits */
  uint64_t x;
  memcpy(&x, &d, sizeof x);
  const uint32_t sign = (uint32_t)(x >> 63) << (ebits + mbits);
  const uint64_t ax = x & UINT64_C(0x7fffffffffffffff);
  const uint32_t inf = ((UINT32_C(1) << ebits) - 1u) << mbits;
  if (ax >= UINT64_C(0x7ff0000000000000)) {
    if (ax == UINT64_C(0x7ff0000000000000)) return sign | inf;
    return sign | inf | (UINT32_C(1) << (mbits - 1))
        | (uint32_t)((ax >> (52 - mbits)) & ((UINT64_C(1) << mbits) - 1u));
  }
  const int dexp = (int)(ax >> 52);
  if (dexp == 0) return sign; /* zero or double subnormal: below any target subnormal */
  const int e = dexp - 1023 + (1 << (ebits - 1)) - 1; /* target biased exponent */
  int shift = 52 - mbits;
  if (e <= 0) shift += 1 - e; /* target subnormal */
  if (shift > 53) return sign;
  const uint64_t m = (ax & UINT64_C(0xfffffffffffff)) | (UINT64_C(1) << 52);
  uint64_t q = m >> shift;
  const uint64_t rem = m & ((UINT64_C(1) << shift) - 1u);
  const uint64_t half = UINT64_C(1) << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q += 1u;
  const uint64_t r = e > 0 ? ((uint64_t)(e - 1) << mbits) + q : q;
  return r >= inf ? (sign | inf) : (sign | (uint32_t)r);
}"""

_CONVERSIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "em_f64_to_narrow": (_NARROW_TO, ()),
    "em_f64_to_f16": ("static inline uint16_t em_f64_to_f16(double d) "
                      "{ return (uint16_t)em_f64_to_narrow(d, 5, 10); }", ("em_f64_to_narrow",)),
    "em_f32_to_f16": ("static inline uint16_t em_f32_to_f16(float f) "
                      "{ return (uint16_t)em_f64_to_narrow((double)f, 5, 10); }",
                      ("em_f64_to_narrow",)),
    "em_f64_to_bf16": ("static inline uint16_t em_f64_to_bf16(double d) "
                       "{ return (uint16_t)em_f64_to_narrow(d, 8, 7); }", ("em_f64_to_narrow",)),
    "em_f32_to_bf16": ("""static inline uint16_t em_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}""", ()),
    "em_f16_to_f32": ("""static inline float em_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t e = (uint32_t)(h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t bits;
  float f;
  if (e == 0x1fu) {
    bits = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  } else {
    f = (float)m * 0x1p-24f; /* exact: subnormal halves are normal floats */
    memcpy(&bits, &f, sizeof bits);
    bits |= sign;
  }
  memcpy(&f, &bits, sizeof f);
  return f;
}""", ()),
    "em_bf16_to_f32": ("""static inline float em_bf16_to_f32(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}""", ()),
    "em_rnd_f16": ("static inline float em_rnd_f16(float x) "
                   "{ return em_f16_to_f32(em_f32_to_f16(x)); }",
                   ("em_f16_to_f32", "em_f32_to_f16")),
    "em_rnd_bf16": ("static inline float em_rnd_bf16(float x) "
                    "{ return em_bf16_to_f32(em_f32_to_bf16(x)); }",
                    ("em_bf16_to_f32", "em_f32_to_bf16")),
    "em_rnd_f16_d": ("static inline float em_rnd_f16_d(double x) "
                     "{ return em_f16_to_f32(em_f64_to_f16(x)); }",
                     ("em_f16_to_f32", "em_f64_to_f16")),
    "em_rnd_bf16_d": ("static inline float em_rnd_bf16_d(double x) "
                      "{ return em_bf16_to_f32(em_f64_to_bf16(x)); }",
                      ("em_bf16_to_f32", "em_f64_to_bf16")),
}


def conversion(hs: HelperSet, name: str) -> str:
    """One of the f16/bf16 conversion helpers of ``_CONVERSIONS``, with its dependencies."""
    if name not in _CONVERSIONS:
        raise CodegenError(f"internal: unknown conversion helper {name}")
    code, deps = _CONVERSIONS[name]
    for dep in deps:
        conversion(hs, dep)
    return hs.need(name, lambda: code)


def narrow_suffix(dtype: DType) -> str:
    """``f16`` or ``bf16``: the helper-name part of a narrow float type."""
    return {DType.FLOAT16: "f16", DType.BFLOAT16: "bf16"}[dtype]


def round_narrow(hs: HelperSet, dtype: DType, value: str, from_double: bool = False) -> str:
    """C code rounding the float (or double) ``value`` to f16/bf16, as a float."""
    suffix = narrow_suffix(dtype) + ("_d" if from_double else "")
    return f"{conversion(hs, 'em_rnd_' + suffix)}({value})"

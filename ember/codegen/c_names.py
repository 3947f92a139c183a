"""Names and comments in the generated C: the only way text reaches the source.

Everything a model file names -- nodes, values, graphs, ops, doc strings -- is untrusted: a node
called ``n*\\<newline>/ system("...") /*`` must not turn a comment into code.  Text from the
IR reaches generated C only through the functions here, which are safe by construction:

* :func:`c_identifier` and :class:`Names` produce ``[A-Za-z_][A-Za-z0-9_]*`` (ASCII), never a
  keyword, a libc/libm name or a reserved prefix; a sanitized name gets a hash suffix so that
  distinct names stay distinct;
* :func:`c_comment` keeps a short allow-list of printable ASCII characters in which no comment
  terminator (``*/``), line splice (backslash-newline), trigraph (``??/``), NUL or line
  separator can be spelled, and bounds the length.
"""

from __future__ import annotations

import hashlib
import re

C_KEYWORDS = frozenset("""
auto break case char const continue default do double else enum extern float for goto if inline
int long register restrict return short signed sizeof static struct switch typedef union
unsigned void volatile while _Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary
_Noreturn _Static_assert _Thread_local bool true false NULL NAN INFINITY main errno assert
int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t ptrdiff_t intptr_t
uintptr_t
""".split())
# Functions and macros of the headers the generated code includes: a kernel named ``exp`` or
# a buffer named ``memcpy`` must not clash with them.
_MATH = """acos asin atan atan2 cos sin tan acosh asinh atanh cosh sinh tanh exp exp2 expm1 frexp
ilogb ldexp log log10 log1p log2 logb modf scalbn scalbln cbrt fabs hypot pow sqrt erf erfc
lgamma tgamma ceil floor nearbyint rint lrint llrint round lround llround trunc fmod remainder
remquo copysign nan nextafter nexttoward fdim fmax fmin fma""".split()
_LIBC = """fpclassify isfinite isinf isnan isnormal signbit isgreater isgreaterequal isless
islessequal islessgreater isunordered abs labs llabs div ldiv lldiv atof atoi atol atoll strtod
strtof strtol strtoll strtoul strtoull rand srand malloc calloc realloc free aligned_alloc abort
atexit exit getenv system bsearch qsort memcpy memmove memset memcmp memchr strcpy strncpy strcat
strncat strcmp strncmp strlen strchr strrchr strstr strtok strerror offsetof
kill_dependency""".split()
RESERVED_NAMES = C_KEYWORDS | frozenset(_LIBC) | frozenset(
    name + suffix for name in _MATH for suffix in ("", "f", "l"))
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def c_identifier(name: str) -> str:
    """The C name of a kernel (or any IR name): unchanged if it is a valid identifier that no
    generated code uses, otherwise sanitized with a hash suffix so distinct names stay
    distinct.  The pipeline calls kernels by ``c_identifier(func.name)``."""
    if _IDENT.match(name) and not _reserved(name):
        return name
    base = re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_") or "k"
    if not base[0].isalpha() or _reserved(base):  # "ember_run" must not become "ember_run_..."
        base = "k_" + base
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:6]
    return f"{base}_{digest}"


def _reserved(name: str) -> bool:
    return (name in RESERVED_NAMES
            or name.startswith(("em_", "ember_", "__", "_mm", "omp_", "atomic_", "memory_order"))
            or (name.startswith("_") and len(name) > 1 and name[1].isupper()))


class Names:
    """Unique C names within one function: every binding of a Var or Buffer gets its own, so
    shadowing in the IR can never capture a use in C."""

    def __init__(self, reserved: frozenset[str] | set[str] = frozenset()):
        self._used: set[str] = set(reserved)

    def fresh(self, hint: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", hint) or "v"
        if not (base[0].isalpha() or base[0] == "_") or _reserved(base):
            base = "v_" + base.lstrip("_")
        name, n = base, 1
        while name in self._used or _reserved(name):
            name, n = f"{base}_{n}", n + 1
        self._used.add(name)
        return name


# Characters a comment may keep: no '*' or '/' (no comment delimiters), no backslash (no line
# splicing), no '?' (no trigraphs), nothing outside printable ASCII (no NUL, no newlines).
_COMMENT_UNSAFE = re.compile(r"[^A-Za-z0-9_ .,:;=+#@()\[\]<>'-]")
COMMENT_MAX_CHARS = 80


def c_comment(text: str) -> str:
    """``text`` made safe to place between ``/*`` and ``*/`` (for readers of the source only).

    Unsafe characters become ``_``; text longer than :data:`COMMENT_MAX_CHARS` is cut and ends
    with a hash of the whole text, so two long names that differ late stay distinguishable.
    """
    safe = _COMMENT_UNSAFE.sub("_", text)
    if len(safe) > COMMENT_MAX_CHARS:
        digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        safe = f"{safe[:COMMENT_MAX_CHARS - 10]}..{digest}"
    return safe

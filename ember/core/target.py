"""The machine a compiled model runs on.

Code generation needs three facts about the target: which SIMD width to vectorize for
(``vector_bits``, hence :meth:`Target.lanes_for`), which CPU features it may use (``features``:
a kernel calling an AVX-512 VNNI instruction must not be built for a plain AVX2 machine) and how
to tell the C compiler (``march``).  A :class:`Target` is plain data so that it can be written to
the manifest of a compiled model (:meth:`Target.to_dict`) and checked again at load time.

``Target.native()`` describes the host by reading ``/proc/cpuinfo`` (no dependency); the named
targets of :meth:`Target.parse` describe portable baselines for cross-compiling or for building
one library that runs on a whole fleet::

    native                 the host, with -march=native
    x86_64                 SSE2 baseline (x86-64-v1, 128-bit vectors)
    x86_64-avx2            x86-64-v3: AVX2 + FMA + F16C (256-bit vectors)
    x86_64-avx512          x86-64-v4: AVX-512 F/BW/CD/DQ/VL (512-bit vectors)
    aarch64                ARMv8-A with NEON (128-bit vectors)
    wasm32                 WebAssembly with SIMD128

and ``+feature`` suffixes add features: ``x86_64-avx512+avx512_vnni+avx512_bf16``.
"""

from __future__ import annotations

import functools
import platform
import sys
from dataclasses import dataclass
from typing import Any

from ember.core.dtypes import DType
from ember.core.errors import EmberError

KINDS = ("native", "x86_64", "aarch64", "wasm32")


class TargetError(EmberError, ValueError):
    """A target name or description that ember does not understand."""


# x86 features ember knows (the spelling of /proc/cpuinfo) and the GCC/Clang flag enabling each.
_X86_FEATURE_FLAGS: dict[str, tuple[str, ...]] = {
    "sse": ("-msse",), "sse2": ("-msse2",), "ssse3": ("-mssse3",), "sse4_1": ("-msse4.1",),
    "sse4_2": ("-msse4.2",), "avx": ("-mavx",), "avx2": ("-mavx2",), "fma": ("-mfma",),
    "f16c": ("-mf16c",), "bmi1": ("-mbmi",), "bmi2": ("-mbmi2",), "popcnt": ("-mpopcnt",),
    "avx512f": ("-mavx512f",), "avx512bw": ("-mavx512bw",), "avx512cd": ("-mavx512cd",),
    "avx512dq": ("-mavx512dq",), "avx512vl": ("-mavx512vl",),
    "avx512_bf16": ("-mavx512bf16",), "avx512_vnni": ("-mavx512vnni",),
    "avx512_fp16": ("-mavx512fp16",), "avx_vnni": ("-mavxvnni",),
    "amx_tile": ("-mamx-tile",), "amx_int8": ("-mamx-int8",), "amx_bf16": ("-mamx-bf16",),
    "amx": ("-mamx-tile", "-mamx-int8", "-mamx-bf16"),
}
_X86_V1 = frozenset({"sse", "sse2"})
_X86_V3 = _X86_V1 | {"ssse3", "sse4_1", "sse4_2", "popcnt", "avx", "avx2", "fma", "f16c",
                     "bmi1", "bmi2"}
_X86_V4 = _X86_V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_X86_LEVELS = {"": (_X86_V1, "x86-64"), "avx2": (_X86_V3, "x86-64-v3"),
               "avx512": (_X86_V4, "x86-64-v4")}

# aarch64 features: our name -> (/proc/cpuinfo spelling, -march extension).
_ARM_FEATURES: dict[str, tuple[str, str]] = {
    "neon": ("asimd", ""), "fp16": ("asimdhp", "+fp16"), "dotprod": ("asimddp", "+dotprod"),
    "bf16": ("bf16", "+bf16"), "i8mm": ("i8mm", "+i8mm"), "sve": ("sve", "+sve"),
}
_WASM_FEATURES = frozenset({"simd128", "relaxed_simd"})

_TRIPLES = {"x86_64": "x86_64-unknown-linux-gnu", "aarch64": "aarch64-unknown-linux-gnu",
            "wasm32": "wasm32-unknown-wasi"}


@dataclass(frozen=True)
class Target:
    """A compilation target.  Build one with :meth:`native` or :meth:`parse`."""

    kind: str
    triple: str
    features: frozenset[str] = frozenset()
    march: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TargetError(f"unknown target kind {self.kind!r}; expected one of {KINDS}")
        object.__setattr__(self, "features", frozenset(self.features))
        object.__setattr__(self, "march", tuple(self.march))

    # ----------------------------------------------------------------- construction
    @classmethod
    def native(cls) -> "Target":
        """The host machine (features from /proc/cpuinfo where the OS has one)."""
        return _native()

    @classmethod
    def parse(cls, name: str) -> "Target":
        """``native``, ``x86_64[-avx2|-avx512]``, ``aarch64`` or ``wasm32``, plus ``+feature``s."""
        base, *extra = name.strip().lower().split("+")
        if base in ("native", "host"):
            target = _native()
            return target if not extra else target._with_features(extra)
        arch, _, level = base.replace("amd64", "x86_64").replace("arm64", "aarch64") \
            .partition("-")
        if arch == "x86_64" and level in _X86_LEVELS:
            features, cpu = _X86_LEVELS[level]
            target = cls("x86_64", _TRIPLES["x86_64"], features, (f"-march={cpu}",
                                                                   "-mtune=generic"))
        elif arch == "aarch64" and not level:
            target = cls("aarch64", _TRIPLES["aarch64"], frozenset({"neon"}),
                         ("-march=armv8-a",))
        elif arch == "wasm32" and not level:
            target = cls("wasm32", _TRIPLES["wasm32"], frozenset({"simd128"}), ("-msimd128",))
        else:
            raise TargetError(
                f"unknown target {name!r}; expected native, x86_64, x86_64-avx2, "
                "x86_64-avx512, aarch64 or wasm32, optionally with +feature suffixes")
        return target._with_features(extra) if extra else target

    def _with_features(self, extra: list[str]) -> "Target":
        """This target with more features and the compiler flags that enable them."""
        known = {"x86_64": _X86_FEATURE_FLAGS, "aarch64": _ARM_FEATURES,
                 "wasm32": dict.fromkeys(_WASM_FEATURES)}.get(self.arch, {})
        unknown = [f for f in extra if f not in known]
        if unknown:
            raise TargetError(f"unknown {self.arch} feature(s) {unknown}; known: {sorted(known)}")
        features = self.features | set(extra)
        if self.kind == "native":  # -march=native already enables what the host has
            return Target(self.kind, self.triple, features, self.march)
        if self.arch == "x86_64":
            flags = [flag for f in extra for flag in _X86_FEATURE_FLAGS[f]]
            return Target(self.kind, self.triple, features, self.march + tuple(flags))
        if self.arch == "aarch64":
            extensions = "".join(_ARM_FEATURES[f][1] for f in sorted(features))
            return Target(self.kind, self.triple, features, (f"-march=armv8.2-a{extensions}",))
        flags = tuple(f"-m{f.replace('_', '-')}" for f in sorted(features))
        return Target(self.kind, self.triple, features, flags)

    # ----------------------------------------------------------------- properties
    @property
    def arch(self) -> str:
        """The instruction set: ``x86_64``, ``aarch64``, ``wasm32`` (or the host's machine)."""
        return self.triple.split("-", 1)[0]

    @property
    def vector_bits(self) -> int:
        """The widest SIMD register codegen should fill."""
        if "avx512f" in self.features:
            return 512
        if "avx2" in self.features or "avx" in self.features:
            return 256
        return 128  # SSE2, NEON, SIMD128 and, as a safe default, unknown machines

    def lanes_for(self, dtype: DType) -> int:
        """How many ``dtype`` elements fill one vector register."""
        return max(1, self.vector_bits // (8 * dtype.itemsize))

    def has(self, *features: str) -> bool:
        return all(f in self.features for f in features)

    # ----------------------------------------------------------------- manifests
    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "triple": self.triple, "features": sorted(self.features),
                "vector_bits": self.vector_bits, "march": list(self.march)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Target":
        """Inverse of :meth:`to_dict` (``vector_bits`` is derived from the features)."""
        try:
            return cls(data["kind"], data["triple"], frozenset(data.get("features", ())),
                       tuple(data.get("march", ())))
        except KeyError as missing:
            raise TargetError(f"target description lacks {missing}: {data!r}") from None

    def __str__(self) -> str:
        extras = ",".join(sorted(self.features))
        return f"{self.kind}({self.triple}; {self.vector_bits}-bit; {extras})"


# --------------------------------------------------------------------- host detection
def _host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _cpuinfo_flags(text: str) -> set[str]:
    """The feature words of the first processor in a /proc/cpuinfo text."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return set()


def features_from_cpuinfo(arch: str, flags: set[str]) -> frozenset[str]:
    """ember's feature names for a machine whose /proc/cpuinfo lists ``flags``."""
    if arch == "x86_64":
        found = {f for f in _X86_FEATURE_FLAGS if f in flags}
        if {"amx_tile", "amx_int8", "amx_bf16"} <= found:
            found.add("amx")
        return frozenset(found | _X86_V1)  # SSE2 is architectural on x86-64
    if arch == "aarch64":
        return frozenset({name for name, (word, _) in _ARM_FEATURES.items() if word in flags}
                         | {"neon"})  # Advanced SIMD is mandatory on ARMv8-A
    return frozenset()


@functools.lru_cache(maxsize=1)
def _native() -> Target:
    arch = _host_arch()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = _cpuinfo_flags(f.read())
    except OSError:  # not Linux: only the architectural baseline is known
        flags = set()
    system = {"linux": "unknown-linux-gnu", "darwin": "apple-darwin"}.get(
        sys.platform, f"unknown-{sys.platform}")
    march = ("-mcpu=native",) if arch == "aarch64" else ("-march=native",)
    return Target("native", f"{arch}-{system}", features_from_cpuinfo(arch, flags), march)

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

The schedule also needs the memory hierarchy and the parallelism of the machine: the sizes of
the L1 data, L2 and L3 caches (a GEMM's reduction blocks are sized so that a panel of B stays
in L1) and the number of threads the kernels will share.  ``Target.native()`` reads them from
``/sys/devices/system/cpu`` and the process's CPU affinity, once; the named targets assume a
common machine (32 KiB L1, 1 MiB L2, 32 MiB L3, 2 threads).  Either can be overridden for a
build with :meth:`Target.with_machine` (``Target.native().with_machine(l2_bytes=2 << 20)``).
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from dataclasses import dataclass, replace
from pathlib import Path
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


DEFAULT_L1D_BYTES = 32 << 10
DEFAULT_L2_BYTES = 1 << 20
DEFAULT_L3_BYTES = 32 << 20
DEFAULT_THREADS = 2


@dataclass(frozen=True)
class Target:
    """A compilation target.  Build one with :meth:`native` or :meth:`parse`."""

    kind: str
    triple: str
    features: frozenset[str] = frozenset()
    march: tuple[str, ...] = ()
    # The machine's memory hierarchy and parallelism (see the module docstring).
    l1d_bytes: int = DEFAULT_L1D_BYTES
    l2_bytes: int = DEFAULT_L2_BYTES
    l3_bytes: int = DEFAULT_L3_BYTES
    threads: int = DEFAULT_THREADS

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TargetError(f"unknown target kind {self.kind!r}; expected one of {KINDS}")
        object.__setattr__(self, "features", frozenset(self.features))
        object.__setattr__(self, "march", tuple(self.march))
        for name in ("l1d_bytes", "l2_bytes", "l3_bytes", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TargetError(f"target {name} must be a positive integer, got {value!r}")

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

    def with_machine(self, *, l1d_bytes: int | None = None, l2_bytes: int | None = None,
                     l3_bytes: int | None = None, threads: int | None = None) -> "Target":
        """This target with the given cache sizes or thread count instead of the detected
        (or assumed) ones."""
        changes = {name: value for name, value in (
            ("l1d_bytes", l1d_bytes), ("l2_bytes", l2_bytes), ("l3_bytes", l3_bytes),
            ("threads", threads)) if value is not None}
        return replace(self, **changes)

    def machine_dict(self) -> dict[str, int]:
        """The memory hierarchy and thread count the schedule assumed (for manifests and
        tuning records; not part of :meth:`to_dict`, which names the instruction set)."""
        return {"l1d_bytes": self.l1d_bytes, "l2_bytes": self.l2_bytes,
                "l3_bytes": self.l3_bytes, "threads": self.threads}

    def _with_features(self, extra: list[str]) -> "Target":
        """This target with more features and the compiler flags that enable them."""
        known = {"x86_64": _X86_FEATURE_FLAGS, "aarch64": _ARM_FEATURES,
                 "wasm32": dict.fromkeys(_WASM_FEATURES)}.get(self.arch, {})
        unknown = [f for f in extra if f not in known]
        if unknown:
            raise TargetError(f"unknown {self.arch} feature(s) {unknown}; known: {sorted(known)}")
        features = self.features | set(extra)
        if self.kind == "native":  # -march=native already enables what the host has
            return replace(self, features=features)
        if self.arch == "x86_64":
            flags = [flag for f in extra for flag in _X86_FEATURE_FLAGS[f]]
            return replace(self, features=features, march=self.march + tuple(flags))
        if self.arch == "aarch64":
            extensions = "".join(_ARM_FEATURES[f][1] for f in sorted(features))
            return replace(self, features=features, march=(f"-march=armv8.2-a{extensions}",))
        flags = tuple(f"-m{f.replace('_', '-')}" for f in sorted(features))
        return replace(self, features=features, march=flags)

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
    caches = read_cache_sizes(Path("/sys/devices/system/cpu/cpu0/cache"))
    try:
        threads = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        threads = os.cpu_count() or DEFAULT_THREADS
    return Target("native", f"{arch}-{system}", features_from_cpuinfo(arch, flags), march,
                  l1d_bytes=caches.get(1, DEFAULT_L1D_BYTES),
                  l2_bytes=caches.get(2, DEFAULT_L2_BYTES),
                  l3_bytes=caches.get(3, DEFAULT_L3_BYTES), threads=max(1, threads))


def read_cache_sizes(folder: Path) -> dict[int, int]:
    """Bytes of the data (or unified) cache at each level, from a Linux sysfs cache folder
    (``index0`` ... with ``level``, ``type`` and ``size`` files such as ``48K``); levels it
    does not describe are absent (a machine without sysfs gives an empty dict)."""
    sizes: dict[int, int] = {}
    try:
        entries = sorted(folder.glob("index*"))
    except OSError:
        return sizes
    for entry in entries:
        try:
            level = int((entry / "level").read_text().strip())
            kind = (entry / "type").read_text().strip()
            size = _parse_size((entry / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and size > 0:
            sizes[level] = size
    return sizes


def _parse_size(text: str) -> int:
    """``48K`` / ``2048K`` / ``32M`` / ``1048576`` as bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)

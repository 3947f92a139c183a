"""Every test kernel runs clean under AddressSanitizer + UBSan.

An ASan-instrumented library cannot be loaded into this (uninstrumented) Python, so it runs in a
subprocess with the ASan runtime in LD_PRELOAD.  Negative controls prove that the sanitizers
are really active: an out-of-bounds read and a signed overflow must each abort the subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from codegen_cases import runnable_cases

from ember.codegen import CModule, generate_c
from ember.core.dtypes import DType
from ember.core.target import Target
from ember.ir.loop import Buffer, Load, PrimFunc, Store, const
from ember.toolchain import ToolchainError, compile_shared, sanitizer_preload

HERE = Path(__file__).parent
ALIGN = 16  # what malloc guarantees: arrays are allocated exactly, so ASan sees overruns

RUNNER = textwrap.dedent("""
    import ctypes, sys
    sys.path.insert(0, {here!r})
    from codegen_cases import all_cases, host_has, run_case
    lib = ctypes.CDLL(sys.argv[1])
    names = sys.argv[2:]
    ran = 0
    for case in all_cases(align={align}):
        if host_has(case.needs) and (not names or case.name in names):
            run_case(lib, case, align={align})
            ran += 1
    print("ran", ran)
""")


@pytest.fixture(scope="module")
def preload() -> str:
    try:
        return sanitizer_preload()
    except ToolchainError as err:
        pytest.skip(f"no ASan runtime: {err}")


def build_sanitized(source: str, cache) -> Path:
    return compile_shared(source, Target.native(), opt_level=1, sanitize=True, cache=cache)


def run_sanitized(library: Path, preload: str, *case_names: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_PRELOAD=preload, ASAN_OPTIONS="detect_leaks=0",
               UBSAN_OPTIONS="print_stacktrace=1", OMP_NUM_THREADS="2")
    script = RUNNER.format(here=str(HERE), align=ALIGN)
    return subprocess.run([sys.executable, "-c", script, str(library), *case_names],
                          capture_output=True, text=True, env=env, timeout=120)


def test_all_kernels_are_clean_under_asan_and_ubsan(preload, cache):
    kernels = [c.func for c in runnable_cases(ALIGN)]
    source = generate_c(CModule(kernels, Target.native(), exports=[k.name for k in kernels]))
    library = build_sanitized(source, cache)
    result = run_sanitized(library, preload)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert f"ran {len(kernels)}" in result.stdout


def test_sanitizers_catch_out_of_bounds_and_overflow(preload, cache):
    """The sanitized build really checks: the same runner must die on real bugs."""
    x = Buffer("x", DType.FLOAT32, (1000,), align=ALIGN)
    y = Buffer("y", x.dtype, (1000,), align=ALIGN)
    past_end = PrimFunc("vector_tail", (x, y), Store(y, const(0), Load(x, const(1000))))
    source = generate_c(CModule([past_end], Target.native(), exports=["vector_tail"]))
    library = build_sanitized(source, cache)
    result = run_sanitized(library, preload, "vector_tail")
    assert result.returncode != 0 and "AddressSanitizer" in result.stderr, result.stderr[-2000:]

    overflow = "EMBER_EXPORT int ember_overflow(int a) { return a + 1; }\n"
    source = generate_c(CModule([], Target.native(), extra_source=overflow,
                                exports=["ember_overflow"]))
    library = build_sanitized(source, cache)
    env = dict(os.environ, LD_PRELOAD=preload, ASAN_OPTIONS="detect_leaks=0")
    call = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
            "lib.ember_overflow(2147483647)")
    result = subprocess.run([sys.executable, "-c", call, str(library)], capture_output=True,
                            text=True, env=env, timeout=60)
    assert result.returncode != 0 and "signed integer overflow" in result.stderr, \
        result.stderr[-2000:]

"""This machine's fp32 FMA peak and memory bandwidth, measured now: the yardsticks of
"% of peak" in the profiler and the fusion benchmark.

Both kernels are C, built with ember's own toolchain (same compiler, ``-march`` and OpenMP
as the models; cached like any other build) and timed from Python around calls that last
tens of milliseconds, so the timer's resolution does not matter:

* FMA peak: 12 independent vector FMA chains per thread (enough to cover the FMA latency on
  the CPUs this project runs on) at the widest vector width the host has (AVX-512, else
  AVX2+FMA, through GCC vector extensions), on ``threads`` OpenMP threads; best of 5.
* Bandwidth: the STREAM triad ``a[i] = b[i] + s * c[i]`` over float64 arrays well beyond the
  last-level cache, counted as STREAM does (3 x 8 bytes per element; the write-allocate read
  of ``a`` is not counted -- as the profiler's "bytes moved" does not count it either); best
  of 5 after one untimed pass.

The host's load drifts: measure the peak in the same run as the numbers it divides.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ember.core.errors import ExecutionError
from ember.core.target import Target
from ember.runtime.cpu import available_cpus

FMA_ITERATIONS = 20_000_000
ROUNDS = 5
# float64 elements per triad array: 3 arrays of 32 MiB, beyond the caches of the machines
# this runs on (a larger last-level cache would flatter the bandwidth).
TRIAD_ELEMENTS = 1 << 22

_SOURCE = r"""
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#define EXPORT __attribute__((visibility("default")))
#ifdef __AVX512F__
#define LANES 16
#else
#define LANES 8
#endif
#define CHAINS 12
typedef float vec __attribute__((vector_size(LANES * 4)));

EXPORT int em_peak_lanes(void) { return LANES; }
EXPORT int em_peak_chains(void) { return CHAINS; }

/* The threads a parallel region of `threads` gets (OpenMP's default for 0). */
EXPORT int em_peak_threads(int threads)
{
#ifdef _OPENMP
  int used = 1;
  if (threads <= 0)
    threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
#pragma omp single
    used = omp_get_num_threads();
  }
  return used;
#else
  (void)threads;
  return 1;
#endif
}

/* 2 * LANES * CHAINS * iterations flops per thread; the sum keeps the chains alive. */
EXPORT float em_peak_fma(int threads, int64_t iterations)
{
  float sink = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+:sink)
#endif
  {
    int thread = 0;
#ifdef _OPENMP
    thread = omp_get_thread_num();
#endif
    vec acc[CHAINS], a, b;
    for (int l = 0; l < LANES; ++l) { a[l] = 0.999999f; b[l] = 1e-7f; }
    for (int c = 0; c < CHAINS; ++c) acc[c] = a * (float)(c + thread);
    for (int64_t i = 0; i < iterations; ++i)
      for (int c = 0; c < CHAINS; ++c) acc[c] = acc[c] * a + b;
    for (int c = 0; c < CHAINS; ++c) for (int l = 0; l < LANES; ++l) sink += acc[c][l];
  }
  return sink;
}

EXPORT void em_peak_triad(double *restrict a, const double *restrict b,
                          const double *restrict c, double s, int64_t n, int threads)
{
  (void)threads;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
  for (int64_t i = 0; i < n; ++i)
    a[i] = b[i] + s * c[i];
}
"""


@dataclass(frozen=True)
class Peak:
    """What this machine can do at most, on ``threads`` threads."""

    fma_gflops: float  # fp32 FMA throughput, GFLOP/s (a multiply-add counts as two)
    bandwidth_gbs: float  # triad memory bandwidth, GB/s (10**9 bytes)
    threads: int
    lanes: int  # fp32 lanes of the vectors the FMA peak used

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_peak(threads: int | None = None, *, iterations: int = FMA_ITERATIONS,
                 triad_elements: int = TRIAD_ELEMENTS, rounds: int = ROUNDS) -> Peak:
    """Measure the FMA peak and the triad bandwidth on ``threads`` threads (default: as many
    as a compiled model uses, the CPUs this process may run on).  Smaller sizes than the
    defaults are for tests: they measure less well."""
    lib = _library()
    threads = int(lib.em_peak_threads(threads or available_cpus()))
    lanes = int(lib.em_peak_lanes())
    return Peak(fma_gflops=_fma_gflops(lib, threads, lanes, iterations, rounds),
                bandwidth_gbs=_triad_gbs(lib, threads, triad_elements, rounds),
                threads=threads, lanes=lanes)


def measure_fma_peak(threads: int, iterations: int = FMA_ITERATIONS,
                     rounds: int = ROUNDS) -> tuple[float, int]:
    """(GFLOP/s, vector lanes) of the fp32 FMA peak on ``threads`` threads, best of
    ``rounds``."""
    lib = _library()
    used = int(lib.em_peak_threads(threads or 0))
    lanes = int(lib.em_peak_lanes())
    return _fma_gflops(lib, used, lanes, iterations, rounds), lanes


def _fma_gflops(lib: ctypes.CDLL, threads: int, lanes: int, iterations: int,
                rounds: int) -> float:
    flops = 2.0 * lanes * int(lib.em_peak_chains()) * iterations * threads
    best = float("inf")
    for _ in range(max(rounds, 1)):
        start = time.perf_counter()
        lib.em_peak_fma(threads, iterations)
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e9


def _triad_gbs(lib: ctypes.CDLL, threads: int, elements: int, rounds: int) -> float:
    a = np.zeros(elements)
    b = np.ones(elements)
    c = np.full(elements, 2.0)
    arguments = (a.ctypes.data, b.ctypes.data, c.ctypes.data, 3.0, elements, threads)
    lib.em_peak_triad(*arguments)  # untimed: the first touch of a's pages
    best = float("inf")
    for _ in range(max(rounds, 1)):
        start = time.perf_counter()
        lib.em_peak_triad(*arguments)
        best = min(best, time.perf_counter() - start)
    if a[0] != 7.0 or a[-1] != 7.0:
        raise ExecutionError("the triad kernel computed a wrong result; the bandwidth measurement "
                        "cannot be trusted")
    return 3 * 8 * elements / best / 1e9


_loaded: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    """The peak kernels, built once per process (and cached on disk by the toolchain)."""
    global _loaded
    if _loaded is None:
        from ember.toolchain import compile_shared, find_compiler, openmp_supported

        target = Target.native()
        # the measurement loops are OpenMP's (compiled models use ember's own pool)
        openmp = ("-fopenmp",) if openmp_supported(find_compiler(target), target) else ()
        path = compile_shared(_SOURCE, target, extra_flags=openmp)
        lib = ctypes.CDLL(str(path))
        lib.em_peak_lanes.restype = ctypes.c_int
        lib.em_peak_lanes.argtypes = []
        lib.em_peak_chains.restype = ctypes.c_int
        lib.em_peak_chains.argtypes = []
        lib.em_peak_threads.restype = ctypes.c_int
        lib.em_peak_threads.argtypes = [ctypes.c_int]
        lib.em_peak_fma.restype = ctypes.c_float
        lib.em_peak_fma.argtypes = [ctypes.c_int, ctypes.c_int64]
        lib.em_peak_triad.restype = None
        lib.em_peak_triad.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_double, ctypes.c_int64, ctypes.c_int]
        _loaded = lib
    return _loaded

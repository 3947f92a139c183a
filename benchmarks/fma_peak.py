"""The fp32 FMA peak of this machine, measured now: the yardstick for "% of peak".

A C loop keeps 12 independent vector FMA chains per thread in flight (enough to cover the
FMA latency on the CPUs this project runs on), at the widest vector width the host has
(AVX-512, else AVX2+FMA, through GCC vector extensions and ``-march=native``), on ``threads``
OpenMP threads.  The peak drifts with the host's load: measure it in the same run as the
numbers it divides.

    .venv/bin/python benchmarks/fma_peak.py --threads 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

_SOURCE = r"""
#include <omp.h>
#include <stdio.h>
#include <time.h>
#ifdef __AVX512F__
#define LANES 16
#else
#define LANES 8
#endif
typedef float vec __attribute__((vector_size(LANES * 4)));
#define CHAINS 12
static double now(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char **argv) {
  const long iterations = 20000000;
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  double best = 0;
  for (int repeat = 0; repeat < 5; ++repeat) {
    double start = now();
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+:sink)
    {
      vec acc[CHAINS], a, b;
      for (int l = 0; l < LANES; ++l) { a[l] = 0.999999f; b[l] = 1e-7f; }
      for (int c = 0; c < CHAINS; ++c) acc[c] = a * (float)(c + omp_get_thread_num());
      for (long i = 0; i < iterations; ++i)
        for (int c = 0; c < CHAINS; ++c) acc[c] = acc[c] * a + b;
      for (int c = 0; c < CHAINS; ++c) for (int l = 0; l < LANES; ++l) sink += acc[c][l];
    }
    double seconds = now() - start;
    double gflops = 2.0 * LANES * CHAINS * iterations * threads / seconds / 1e9;
    if (gflops > best) best = gflops;
    if (sink == 12345.f) printf("!");
  }
  printf("%.1f %d\n", best, LANES);
  return 0;
}
"""


def measure_fma_peak(threads: int) -> tuple[float, int]:
    """(GFLOP/s, vector lanes) of the fp32 FMA peak on ``threads`` threads, best of 5."""
    with tempfile.TemporaryDirectory() as work:
        source, binary = Path(work) / "peak.c", Path(work) / "peak"
        source.write_text(_SOURCE.replace("#include <omp.h>", "#include <omp.h>\n#include <stdlib.h>"))
        subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-o", str(binary), str(source)],
                       check=True, capture_output=True)
        out = subprocess.run([str(binary), str(threads)], check=True, capture_output=True,
                             text=True).stdout.split()
    return float(out[0]), int(out[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    gflops, lanes = measure_fma_peak(args.threads)
    print(f"fp32 FMA peak, {args.threads} thread(s), {lanes} lanes: {gflops:.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The fp32 FMA peak of this machine, measured now: the yardstick for "% of peak".

The kernel lives in the package (``ember.profile.peak``, which ``ember profile --peak`` also
uses): 12 independent vector FMA chains per thread at the widest vector width the host has
(AVX-512, else AVX2+FMA), on ``threads`` OpenMP threads, built with ember's toolchain.  The
peak drifts with the host's load: measure it in the same run as the numbers it divides.

    .venv/bin/python benchmarks/fma_peak.py --threads 2
    .venv/bin/python benchmarks/fma_peak.py --threads 2 --bandwidth   # and the triad GB/s
"""

from __future__ import annotations

import argparse
import sys

from ember.profile.peak import measure_fma_peak, measure_peak

__all__ = ["measure_fma_peak", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bandwidth", action="store_true",
                        help="also measure the memory bandwidth (STREAM triad)")
    args = parser.parse_args(argv)
    if args.bandwidth:
        peak = measure_peak(args.threads)
        print(f"fp32 FMA peak, {peak.threads} thread(s), {peak.lanes} lanes: "
              f"{peak.fma_gflops:.1f} GFLOP/s; triad bandwidth {peak.bandwidth_gbs:.1f} GB/s")
        return 0
    gflops, lanes = measure_fma_peak(args.threads)
    print(f"fp32 FMA peak, {args.threads} thread(s), {lanes} lanes: {gflops:.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run PyTorch's OpInfo database through ``torch.compile(backend="ember")``.

    python tools/opinfo.py                       # every float32 CPU OpInfo, 3 samples each
    python tools/opinfo.py --samples 1 -j 2      # quicker, in 2 worker processes
    python tools/opinfo.py -k "^nn.functional" -v
    python tools/opinfo.py --json opinfo.json
    python tools/opinfo.py --samples 1 -j 2 --write-expected
                                                 # regenerate the suite's expected failures

Prints the number of OpInfos whose samples all pass (compiled by ember, no fallback, outputs
matching eager; see tests/torch_opinfo/opinfo_harness.py) and the failures with their first reason.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "torch_opinfo"))


def _run(args: tuple[str, int]) -> tuple[str, str, int, str]:
    import opinfo_harness as harness

    name, limit = args
    ops = {harness.op_name(op): op for op in harness.float32_ops()}
    result = harness.run_op(ops[name], limit)
    return result.name, result.status, result.samples, result.detail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3, help="samples per OpInfo")
    parser.add_argument("-k", dest="pattern", help="regex over OpInfo names")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every OpInfo")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--write-expected", action="store_true",
                        help="write tests/torch_opinfo/opinfo_expected_failures.py from this run's "
                             "failures (with their reasons)")
    args = parser.parse_args(argv)

    import opinfo_harness as harness

    names = [harness.op_name(op) for op in harness.float32_ops()]
    if args.pattern:
        names = [n for n in names if re.search(args.pattern, n)]
    started = time.time()
    work = [(name, args.samples) for name in names]
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=40) as pool:
            results = list(pool.imap_unordered(_run, work))
    else:
        results = [_run(item) for item in work]
    results.sort()
    counts = collections.Counter(status for _, status, _, _ in results)
    for name, status, samples, detail in results:
        if args.verbose or status == "fail":
            print(f"{status:8s} {name}: {detail}" if detail else f"{status:8s} {name}")
    print(f"OpInfos (float32, CPU, {args.samples} samples each): {counts['pass']} pass, "
          f"{counts['fail']} fail, {counts['skipped']} skipped, of {len(results)}; "
          f"{time.time() - started:.0f} s")
    if args.write_expected:
        _write_expected([(n, d) for n, s, _, d in results if s == "fail"], args.samples)
    if args.json:
        args.json.write_text(json.dumps([dict(name=n, status=s, samples=c, detail=d)
                                         for n, s, c, d in results], indent=1))
    return 0


def _write_expected(failures: list[tuple[str, str]], samples: int) -> None:
    path = ROOT / "tests" / "torch_opinfo" / "opinfo_expected_failures.py"
    lines = ['"""OpInfos that do not pass through ember yet, each with the reason its first failing',
             f'sample gave (``tools/opinfo.py --samples {samples} --write-expected`` writes this',
             'file).  "fallback" means an ATen op ran in PyTorch; "error" that compiling or',
             'tracing failed (a Dynamo graph break under fullgraph=True is one: random ops,',
             'data-dependent shapes); "mismatch" a wrong result."""', "",
             "EXPECTED_FAILURES: dict[str, str] = {"]
    for name, detail in sorted(failures):
        lines.append(f"    {name!r}: {detail[:160]!r},")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(failures)} expected failures to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())

"""Run the ONNX backend test suite (shipped in the ``onnx`` package) against ember.

    python tools/conformance.py                      # node cases, summary + failures
    python tools/conformance.py --mode compiled      # through the compiled path
    python tools/conformance.py --kind all --mode both --report docs/coverage.md
    python tools/conformance.py -k "test_conv" -v    # a subset, with error details
    python tools/conformance.py --kind all --mode compiled --opt-level 0 --opt-level 2
                                                     # compiled at each opt level

Prints pass counts per kind and checks them against tests/conformance/expected_failures.py:
an unexpected failure or an unexpected pass makes the exit status non-zero.  The comparison is
the suite's own (``onnx.backend.test.runner.Runner.assert_similar_outputs``, its rtol/atol).
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import re
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "conformance"))

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator", "real")


def _load_cases(kinds: list[str], pattern: str | None):
    from onnx.backend.test.loader import load_model_tests

    cases = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind in kinds:
            for case in load_model_tests(kind=kind):
                if pattern and not re.search(pattern, case.name):
                    continue
                cases.append((kind, case))
    return cases


def run_case(args) -> tuple[str, str, str, str, list[str]]:
    """Returns (kind, name, status, detail, op_types)."""
    kind, case, mode, opt_level = args
    from backend_harness import run_suite_case

    try:
        status, detail = run_suite_case(case, mode, opt_level)
    except Exception as error:  # the harness itself broke: report, keep going
        status, detail = "error", f"{type(error).__name__}: {error}"
    return kind, case.name, status, detail, _op_types(case)


def _op_types(case) -> list[str]:
    import onnx

    model = case.model
    if model is None:
        path = os.path.join(case.model_dir or "", "model.onnx")
        if not os.path.exists(path):
            return []
        model = onnx.load(path, load_external_data=False)
    ops = set()

    def walk(graph):
        for node in graph.node:
            ops.add(node.op_type if node.domain in ("", "ai.onnx") else
                    f"{node.domain}.{node.op_type}")
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g)
                for sub in attr.graphs:
                    walk(sub)

    walk(model.graph)
    return sorted(ops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", default="node", help=f"one of {KINDS} or 'all'")
    parser.add_argument("-k", "--filter", default=None, help="regex on test names")
    parser.add_argument("--mode", default="reference",
                        help="ember backend mode: reference, compiled, or both")
    parser.add_argument("--opt-level", type=int, action="append", choices=(0, 1, 2),
                        help="compiled mode: the opt level(s) to run, repeatable (default: 2)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print failure details")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--report", type=Path, help="write a Markdown coverage report here")
    parser.add_argument("--json", type=Path, help="write per-case results as JSON here")
    args = parser.parse_args(argv)

    os.environ.setdefault("ONNX_HOME", str(ROOT / ".onnx_home"))
    kinds = list(KINDS) if args.kind == "all" else args.kind.split(",")
    modes = ["reference", "compiled"] if args.mode == "both" else args.mode.split(",")
    cases = _load_cases(kinds, args.filter)
    results_by_mode = {}
    status = 0
    opt_levels = args.opt_level or [2]
    runs = [(mode, level) for mode in modes
            for level in (opt_levels if mode == "compiled" else [2])]
    for mode, level in runs:
        results = _run_mode(cases, mode, level, args.jobs)
        label = mode if mode != "compiled" or args.opt_level is None else f"{mode}-O{level}"
        results_by_mode[label] = results
        status |= _summarize(results, mode, label, kinds, args.verbose)
    if args.json:
        args.json.write_text(json.dumps(
            {mode: [dict(kind=k, name=n, status=s, detail=d, ops=o) for k, n, s, d, o in results]
             for mode, results in results_by_mode.items()}, indent=1))
    if args.report:
        from coverage_report import write_report

        write_report(args.report, results_by_mode)
        print(f"\nwrote {args.report}")
    return status


def _run_mode(cases, mode: str, opt_level: int, jobs: int):
    work = [(kind, case, mode, opt_level) for kind, case in cases]
    if jobs > 1 and len(work) > 20:
        with multiprocessing.get_context("fork").Pool(jobs, maxtasksperchild=200) as pool:
            results = list(pool.imap_unordered(run_case, work, chunksize=4))
    else:
        results = [run_case(w) for w in work]
    results.sort(key=lambda r: (KINDS.index(r[0]) if r[0] in KINDS else 99, r[1]))
    return results


def _summarize(results, mode: str, label: str, kinds: list[str], verbose: bool) -> int:
    """Print pass counts and surprises; 1 if any result differs from the expected list."""
    from expected_failures import expected_failures

    known_failures = expected_failures(mode)
    per_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    unexpected_fail, unexpected_pass = [], []
    for kind, name, status, detail, _ in results:
        per_kind[kind][status] += 1
        expected = name in known_failures
        if status == "pass" and expected:
            unexpected_pass.append(name)
        elif status != "pass" and not expected:
            unexpected_fail.append((name, detail))
        if verbose and status != "pass":
            note = f"(expected: {known_failures[name]})" if expected else ""
            print(f"--- {name} [{status}] {note}")
            print("    " + detail.replace("\n", "\n    ")[:2000])

    print(f"\nONNX backend suite, ember mode={label}")
    for kind in kinds:
        counts = per_kind[kind]
        total = sum(counts.values())
        others = {k: v for k, v in counts.items() if k != "pass"}
        print(f"  {kind:18s} {counts['pass']:5d} / {total:5d} passed"
              f"  ({total - counts['pass']} not: {others})")
    if mode == "compiled":
        fallback_cases = [(n, d) for _, n, s, d, _ in results if s == "pass" and d]
        fallback_ops = collections.Counter(op for _, d in fallback_cases
                                           for op in d.removeprefix("fallback: ").split(", "))
        print(f"  passing cases with numpy-fallback nodes: {len(fallback_cases)} "
              f"(ops: {', '.join(f'{op}×{c}' for op, c in fallback_ops.most_common(25))})")
    if unexpected_fail:
        print(f"\n{len(unexpected_fail)} unexpected failure(s):")
        for name, detail in unexpected_fail:
            print(f"  {name}: {detail.splitlines()[0][:160] if detail else ''}")
    if unexpected_pass:
        print(f"\n{len(unexpected_pass)} unexpected pass(es) (remove from expected_failures.py):")
        for name in unexpected_pass:
            print(f"  {name}")
    return 1 if (unexpected_fail or unexpected_pass) else 0


if __name__ == "__main__":
    sys.exit(main())

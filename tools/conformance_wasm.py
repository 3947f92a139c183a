"""Run the ONNX backend suite's cases exported for wasm32-wasi, in wasmtime.

    .venv/bin/python tools/conformance_wasm.py                 # every node case, 2 processes
    .venv/bin/python tools/conformance_wasm.py -k test_conv -v # a subset, with details

Each case is exported with ``ember export --target wasm32-wasi`` for the shapes of its data
and run through ``ember.runtime.wasm.WasmModel``; outputs are compared by the suite's own
rule (``tests/conformance/backend_harness.run_wasm_case``).  A case is *skipped* when it is
not exportable as it stands (nodes that only numpy fallbacks run, inputs that are not
tensors, ops or graphs ember does not compile); *fail* means wrong numbers, *error* that
something broke.  Prints the counts and every fail and error; the exit status is 1 if any.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "conformance"))
os.environ.setdefault("ONNX_HOME", str(ROOT / ".onnx_home"))


def _run(case) -> tuple[str, str, str]:
    from backend_harness import run_wasm_case

    with tempfile.TemporaryDirectory(prefix="ember-wasm-case-") as directory:
        try:
            status, detail = run_wasm_case(case, directory)
        except Exception as error:  # the harness itself broke: report, keep going
            status, detail = "error", f"{type(error).__name__}: {error}"
    return case.name, status, detail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kind", default="node", help="node, simple, pytorch-converted, ...")
    parser.add_argument("-k", dest="pattern", help="only cases whose name matches (regex)")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("-v", "--verbose", action="store_true", help="print skip reasons too")
    args = parser.parse_args()
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [case for case in load_model_tests(kind=args.kind)
                 if not args.pattern or re.search(args.pattern, case.name)]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(_run, cases, chunksize=4)
    counts = collections.Counter(status for _, status, _ in results)
    for name, status, detail in results:
        if status in ("fail", "error") or (args.verbose and status == "skip"):
            print(f"{name} [{status}] {detail.splitlines()[0][:200] if detail else ''}")
    print(f"ONNX backend suite ({args.kind}) through wasm32-wasi: {counts['pass']} pass, "
          f"{counts['fail']} fail, {counts['error']} error, {counts['skip']} not exportable, "
          f"of {len(results)}")
    return 1 if counts["fail"] or counts["error"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""Fuzz ember with malformed models, tampered artifacts, generated graphs, hostile external
data, control characters on the command line and odd save targets; print the outcome table.

    .venv/bin/python tools/fuzz.py                          # 300 cases, session seed 0
    .venv/bin/python tools/fuzz.py --cases 3000 --seed 4    # more, other cases
    .venv/bin/python tools/fuzz.py --kind dims --kind artifact/flip --cases 200
    .venv/bin/python tools/fuzz.py --kind deep --cases 200  # one family, its large sizes too
    .venv/bin/python tools/fuzz.py --case model/dims/17     # one case, with its details
    .venv/bin/python tools/fuzz.py --case artifact/replace/3 --dump /tmp/cases

The property of every case: ember raises an EmberError or returns a correct result (the
oracle: ONNX's reference evaluator and ONNX Runtime for models, or outputs known exactly;
the untampered artifact's outputs bit for bit for artifacts; no raw control character on
the terminal for the command line; no file ember did not write touched for saves); never a
crash, a hang, another exception or a wrong result.  The exit status is 1 when a case
fails.  The library lives in tests/fuzz/ (see its README.md); tests/fuzz/test_fuzz.py runs a
fixed set of cases in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# tests/ first: this file is tools/fuzz.py, and the library is the package tests/fuzz.
sys.path.insert(0, str(ROOT / "tests"))

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from fuzz.cases import CaseId, all_kinds, plan  # noqa: E402
from fuzz.outcomes import FAILURES, CaseResult, Verdict  # noqa: E402
from fuzz.report import causes_text, header, outcome_rows  # noqa: E402
from fuzz.session import Session  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=300, help="number of cases (default 300)")
    parser.add_argument("--seed", type=int, default=0,
                        help="session seed: which case numbers run (default 0)")
    parser.add_argument("--kind", action="append", metavar="KIND",
                        help="only these kinds (repeatable): 'model', 'artifact', a kind "
                             "('dims') or 'category/kind'; known: " + ", ".join(all_kinds()))
    parser.add_argument("--case", action="append", metavar="ID",
                        help="run exactly these case ids (repeatable), e.g. model/dims/17")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="worker processes (default: 2, or 1 on a 1-core machine)")
    parser.add_argument("--dump", type=Path, metavar="DIR",
                        help="keep each case's model / tampered artifact in DIR")
    parser.add_argument("--keep", action="store_true",
                        help="keep the session directory (worker logs, base artifacts)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write all results as JSON")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list every failing and to-review case with its diagnostics")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    console = Console() if sys.stdout.isatty() else Console(width=150)
    try:
        cases = ([CaseId.parse(text) for text in args.case] if args.case
                 else plan(args.cases, args.seed, args.kind))
    except ValueError as error:
        console.print(f"[red]{error}[/red]")
        return 2
    started = time.monotonic()
    with Session(workers=args.workers, keep=args.keep, dump=args.dump) as session, Progress(
            "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("fuzzing", total=len(cases))
        results = session.run(cases, progress=lambda _: progress.advance(task))
    elapsed = time.monotonic() - started
    if args.keep:
        console.print(f"session directory kept: {session.workdir}")

    console.print(_table(results, elapsed))
    if args.case or args.verbose:
        _print_cases(console, results, everything=bool(args.case))
    failing = [r for r in results if r.is_failure]
    if failing:
        console.rule(f"[red]failures: {len(failing)} cases")
        console.print(causes_text(results), markup=False, highlight=False)
    review = [r for r in results if r.verdict is Verdict.ORACLE_REJECTS]
    if review:
        console.rule(f"[yellow]to review (accepted, oracle rejects): {len(review)} cases")
        console.print(causes_text(results, (Verdict.ORACLE_REJECTS,)), markup=False,
                      highlight=False)
    if args.json:
        args.json.write_text(json.dumps([_as_json(r) for r in results], indent=1))
    return 1 if failing else 0


def _table(results: list[CaseResult], elapsed: float) -> Table:
    table = Table(title=f"ember fuzz: {len(results)} cases in {elapsed:.0f} s")
    failure_columns = {"crash", "hang", "foreign", "wrong", "harness"}
    for name in header():
        style = "red" if name in failure_columns else "yellow" if name == "oracle-rej" else None
        table.add_column(name, justify="left" if name == "kind" else "right", style=style)
    rows = outcome_rows(results)
    for row in rows[:-1]:
        table.add_row(*row)
    table.add_section()
    table.add_row(*rows[-1], style="bold")
    return table


def _print_cases(console: Console, results: list[CaseResult], everything: bool) -> None:
    shown = (*FAILURES, Verdict.HARNESS, Verdict.ORACLE_REJECTS)
    for result in results:
        if not everything and result.verdict not in shown:
            continue
        console.rule(f"{result.case}: {result.verdict.value}")
        console.print(f"seed: {result.seed}\nmutation: {result.description}\n"
                      f"detail: {result.detail}\ncause: {result.cause}\n"
                      f"seconds: {result.seconds:.2f}", markup=False, highlight=False)
        if result.log_tail:
            console.print(result.log_tail, markup=False, highlight=False)


def _as_json(result: CaseResult) -> dict:
    data = asdict(result)
    data["verdict"] = result.verdict.value
    return data


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

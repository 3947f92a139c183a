"""The outcome table and the failure list of a session, as plain text (pytest) or rich
tables (tools/fuzz.py).

Failures are listed grouped by cause, each group with the number of cases, one case id to
reproduce it and the command that does, since that is what the people fixing ember need
first; every failing case is listed after that, with its seed and mutation.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from fuzz.outcomes import FAILURES, CaseResult, Verdict

REPRODUCE = ".venv/bin/python tools/fuzz.py --case {case}"
COLUMNS = [Verdict.EMBER_ERROR, Verdict.CORRECT, Verdict.CRASH, Verdict.HANG, Verdict.FOREIGN,
           Verdict.WRONG, Verdict.ORACLE_REJECTS, Verdict.HARNESS, Verdict.NOT_APPLICABLE]
SHORT = {Verdict.EMBER_ERROR: "ember-err", Verdict.CORRECT: "correct", Verdict.CRASH: "crash",
         Verdict.HANG: "hang", Verdict.FOREIGN: "foreign", Verdict.WRONG: "wrong",
         Verdict.ORACLE_REJECTS: "oracle-rej", Verdict.HARNESS: "harness",
         Verdict.NOT_APPLICABLE: "n/a"}


def outcome_rows(results: list[CaseResult]) -> list[list[str]]:
    """One row per category/kind: cases, a count per verdict, seconds; then a total."""
    by_kind: dict[str, Counter] = defaultdict(Counter)
    seconds: Counter = Counter()
    for result in results:
        key = f"{result.category}/{result.kind}"
        by_kind[key][result.verdict] += 1
        seconds[key] += result.seconds
    rows = []
    total: Counter = Counter()
    for key in sorted(by_kind):
        counts = by_kind[key]
        total.update(counts)
        rows.append([key, str(sum(counts.values()))] + [_count(counts[v]) for v in COLUMNS]
                    + [f"{seconds[key]:.0f}"])
    rows.append(["total", str(sum(total.values()))] + [_count(total[v]) for v in COLUMNS]
                + [f"{sum(seconds.values()):.0f}"])
    return rows


def header() -> list[str]:
    return ["kind", "cases"] + [SHORT[v] for v in COLUMNS] + ["secs"]


def _count(value: int) -> str:
    return str(value) if value else "."


def text_table(results: list[CaseResult]) -> str:
    rows = [header()] + outcome_rows(results)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) if i == 0 else cell.rjust(width)
                 for i, (cell, width) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells))
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def grouped(results: list[CaseResult], verdicts: tuple[Verdict, ...]
            ) -> list[tuple[str, list[CaseResult]]]:
    """Results with one of ``verdicts``, grouped by verdict and cause, biggest group first."""
    groups: dict[str, list[CaseResult]] = defaultdict(list)
    for result in results:
        if result.verdict in verdicts:
            groups[f"{result.verdict.value}: {result.cause or result.detail[:80]}"].append(result)
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))


def causes_text(results: list[CaseResult],
                verdicts: tuple[Verdict, ...] = (*FAILURES, Verdict.HARNESS)) -> str:
    lines = []
    for cause, members in grouped(results, verdicts):
        first = members[0]
        lines.append(f"[{len(members)}x] {cause}")
        lines.append(f"      e.g. {first.case} (seed {first.seed}): {first.description[:160]}")
        lines.append(f"      {first.detail[:300]}")
        lines.append(f"      reproduce: {REPRODUCE.format(case=first.case)}")
    return "\n".join(lines)


def cases_text(results: list[CaseResult], verdicts: tuple[Verdict, ...]) -> str:
    return "\n".join(
        f"{r.case}  {r.verdict.value}  seed={r.seed}  {r.description[:140]}\n"
        f"    {r.detail[:300]}"
        for r in results if r.verdict in verdicts)


def full_report(results: list[CaseResult]) -> str:
    """Table, failure causes, review list: what the pytest failure message shows."""
    parts = ["ember fuzz outcomes", text_table(results)]
    failing = [r for r in results if r.is_failure]
    if failing:
        parts += ["", f"FAILURES ({len(failing)} cases) grouped by cause:", causes_text(results),
                  "", "all failing cases:", cases_text(results, (*FAILURES, Verdict.HARNESS))]
    review = [r for r in results if r.verdict is Verdict.ORACLE_REJECTS]
    if review:
        parts += ["", f"TO REVIEW: ember accepted, the oracles rejected ({len(review)} cases):",
                  causes_text(results, (Verdict.ORACLE_REJECTS,))]
    return "\n".join(parts)

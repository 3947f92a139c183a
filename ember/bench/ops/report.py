"""What ``ember bench --ops`` shows and writes: the per-configuration table, its summary line,
the failures and mismatches, and the JSON rows.

Rows are sorted by what each configuration costs the selected zoo under ONNX Runtime (count x
ORT's median): the top rows are where a faster kernel would save the most, whatever its own
ratio.  The ratio is ORT's median over ember's (above 1: ember faster), the convention of
``benchmarks/bench_compiled.py``; rows under :data:`MARK_BELOW` are marked.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ember.bench.ops.configs import Extraction
from ember.bench.ops.run import CONTENDERS, LABELS, OpResult
from ember.bench.report import run_header
from ember.bench.runner import Settings

MARK_BELOW = 0.8  # ORT/ember under this: ember is clearly behind, the row is marked
MARKER = "◀"
ERROR_LINES = 6


def sorted_by_zoo_time(results: Sequence[OpResult]) -> list[OpResult]:
    """Most zoo time (count x ORT ms) first; rows ORT could not time go last."""
    return sorted(results, key=lambda r: -(r.zoo_ms if r.zoo_ms is not None else -1.0))


def _total_zoo_ms(results: Sequence[OpResult]) -> float:
    return sum(r.zoo_ms for r in results if r.zoo_ms is not None)


# --------------------------------------------------------------------------- table


def _ms(result: OpResult, contender: str) -> Text:
    if contender in result.errors:
        return Text(result.errors[contender].split(":", 1)[0] + " failed", style="red")
    median = result.median_ms(contender)
    if median is None:
        return Text("—")
    shown = f"{median:.3f}" if median < 10 else f"{median:.1f}"
    agreement = result.agreement.get(contender)
    if agreement is not None and not agreement.ok:
        return Text(shown + " ≠", style="yellow")
    return Text(shown)


def _number(value: float) -> str:
    """Three significant digits, without the exponent for the sizes this table sees."""
    return f"{value:.1f}" if value >= 100 else f"{value:.3g}"


def _gflop(flops: int) -> str:
    """GFLOP per call in plain digits: 0.0336, 0.00161, 0.000021 (no exponents)."""
    value = flops / 1e9
    return _number(value) if value >= 1e-3 else f"{value:.6f}"


def _noise(result: OpResult) -> str:
    """The row's worst interquartile range / median: how far to trust its ratio."""
    spreads = [s.spread for s in result.series.values() if not math.isnan(s.spread)]
    return f"±{max(spreads) * 100:.0f}%" if spreads else "—"


def _ratio(value: float | None) -> Text:
    if value is None:
        return Text("—")
    if value < MARK_BELOW:
        return Text(f"{value:.2f}x {MARKER}", style="bold red")
    return Text(f"{value:.2f}x", style="green" if value >= 1.0 else "yellow")


def _check(result: OpResult) -> Text:
    """ok, or what is wrong with the row: a failure, a mismatch with ORT, a numpy fallback."""
    if result.error:
        return Text("single-op model failed", style="red")
    problems = [f"{LABELS[name]} {error.split(':', 1)[0]} failed"
                for name, error in result.errors.items()]
    problems += [f"{LABELS[name]} ≠ ORT ({agreement.worst:.3g}x tol)"
                 if agreement.worst is not None else f"{LABELS[name]} ≠ ORT"
                 for name, agreement in result.agreement.items() if not agreement.ok]
    if result.ember_details.get("fallbacks"):
        problems.append("ember numpy fallback")
    if problems:
        return Text("; ".join(problems), style="red")
    return Text("ok", style="green")


def render_ops_table(results: Sequence[OpResult], settings: Settings,
                     peak_gflops: float | None = None, title_note: str = "") -> Table:
    """One row per configuration, sorted by zoo time (see the module docstring)."""
    rows = sorted_by_zoo_time(results)
    total = _total_zoo_ms(rows)
    with_mkl = any("mkl" in r.series or "mkl" in r.errors for r in rows)
    title = (f"ember bench --ops — {len(rows)} distinct Conv/ConvTranspose/MatMul/Gemm "
             f"configs{title_note}, {settings.threads} thread(s), fp32, median ms per call")
    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("op", no_wrap=True)
    table.add_column("shape", no_wrap=True)
    table.add_column("count (models)")
    table.add_column("GFLOP", justify="right")
    for name in CONTENDERS:
        if name != "mkl" or with_mkl:
            table.add_column(f"{LABELS[name]} ms", justify="right")
    table.add_column("ORT/ember", justify="right")
    table.add_column("noise", justify="right")
    table.add_column("ember GFLOP/s", justify="right")
    if peak_gflops:
        table.add_column("% peak", justify="right")
    table.add_column("zoo share", justify="right")
    table.add_column("check")
    for index, result in enumerate(rows, 1):
        config = result.use.config
        gflops = result.gflops("ember")
        cells: list[Text | str] = [
            str(index), config.op, result.summary.removeprefix(config.op + " "),
            f"{result.use.count} ({result.use.where()})",
            _gflop(result.flops) if result.flops else "—"]
        cells += [_ms(result, name) for name in CONTENDERS if name != "mkl" or with_mkl]
        cells += [_ratio(result.ratio), _noise(result), _number(gflops) if gflops else "—"]
        if peak_gflops:
            cells.append(f"{gflops / peak_gflops:.0%}" if gflops else "—")
        cells += [f"{result.zoo_ms / total:.1%}" if result.zoo_ms and total else "—",
                  _check(result)]
        table.add_row(*cells)
    peak_note = (f" % peak: ember's GFLOP/s over the fp32 FMA peak measured in this run "
                 f"({peak_gflops:.1f} GFLOP/s)." if peak_gflops else "")
    table.caption = (f"ORT/ember: ORT's median over ember's (> 1: ember faster; {MARKER}: "
                     f"below {MARK_BELOW}x). noise: the largest interquartile range / median "
                     f"of the row's series. count: nodes with this configuration over the selected "
                     f"models, batches and exporters. zoo share: count x ORT ms over the sum "
                     f"of all rows (the sort order). mkl: torch.matmul (MatMul/Gemm only). "
                     f"GFLOP: ember's cost rules (2 per multiply-add). ≠: output differs from "
                     f"ORT's beyond rtol {settings.rtol:g} / atol {settings.atol:g} x the "
                     f"output's largest magnitude (see below).{peak_note}")
    table.caption_justify = "left"
    return table


def summary_line(results: Sequence[OpResult], extraction: Extraction | None = None) -> str:
    """How many configurations ember wins, holds and loses against ORT; the zoo-weighted
    ratio; failures, mismatches and skipped nodes."""
    ratios = [r.ratio for r in results if r.ratio is not None]
    at_par = sum(ratio >= 1.0 for ratio in ratios)
    close = sum(ratio >= MARK_BELOW for ratio in ratios)
    parts = [f"{len(ratios)} of {len(results)} configs timed: {at_par} at >= 1.0x ORT, "
             f"{close} at >= {MARK_BELOW}x, {len(ratios) - close} below {MARK_BELOW}x "
             f"({MARKER})"]
    both = [r for r in results if r.ratio is not None]
    ember_total = sum(r.median_ms("ember") * r.use.count for r in both)  # type: ignore[operator]
    ort_total = sum(r.zoo_ms for r in both)  # type: ignore[misc]
    if ember_total > 0:
        parts.append(f"count-weighted ORT/ember {ort_total / ember_total:.2f}x "
                     f"(sum of count x median: ORT {ort_total:.1f} ms, ember "
                     f"{ember_total:.1f} ms)")
    failed = sum(r.failed for r in results)
    mismatched = sum(r.mismatch for r in results)
    if failed:
        parts.append(f"{failed} with a failure")
    if mismatched:
        parts.append(f"{mismatched} with outputs that differ from ORT's")
    if extraction is not None and extraction.skipped:
        by_model = ", ".join(f"{model} {count}"
                             for model, count in extraction.skipped_by_model().items())
        parts.append(f"{len(extraction.skipped)} node(s) skipped, shapes not static "
                     f"or not float32 ({by_model})")
    return "; ".join(parts)


def print_ops_problems(results: Sequence[OpResult], console: Console) -> None:
    """Failures verbatim (first lines; the JSON has all), mismatches, numpy fallbacks."""
    for result in sorted_by_zoo_time(results):
        if result.error:
            console.print(Text(f"{result.summary}: {result.error}", style="red"))
        for name, error in result.errors.items():
            console.print(Text(f"{result.summary}: {LABELS[name]} {error.split(':', 1)[0]} "
                               f"failed", style="red"))
            lines = error.split(":", 1)[-1].strip().splitlines() or [""]
            for line in lines[:ERROR_LINES]:
                console.print(Text("  " + line))
        for name, agreement in result.agreement.items():
            if not agreement.ok:
                console.print(Text(f"{result.summary}: {LABELS[name]} differs from ORT: "
                                   f"{agreement.message}", style="yellow"))
        for line in result.ember_details.get("fallback_nodes") or []:
            console.print(Text(f"{result.summary}: ember fallback {line}", style="yellow"))


# --------------------------------------------------------------------------- JSON


def ops_json(results: Sequence[OpResult], extraction: Extraction, settings: Settings,
             exports: Sequence[dict[str, Any]], peak_gflops: float | None = None,
             argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The whole ``--ops`` run: the common header, the exports it read, the skipped nodes,
    the summary and every row (sorted as the table)."""
    rows = sorted_by_zoo_time(results)
    total = _total_zoo_ms(rows)
    return {
        **run_header(settings, argv),
        "mode": "ops",
        "fma_peak_gflops": peak_gflops,
        "exports": list(exports),
        "skipped_nodes": [asdict(node) for node in extraction.skipped],
        "summary": summary_line(rows, extraction),
        "ops": [_row_json(result, total, peak_gflops) for result in rows],
    }


def _row_json(result: OpResult, total_zoo_ms: float,
              peak_gflops: float | None) -> dict[str, Any]:
    config = result.use.config
    gflops = result.gflops("ember")
    ratio = result.ratio
    return {
        "op": config.op, "summary": result.summary,
        "input_shapes": [list(s) if s is not None else None for s in config.shapes],
        "constant_inputs": list(config.constant),
        "attributes": {name: list(v) if isinstance(v, tuple) else v
                       for name, v in config.attributes},
        "count": result.use.count, "uses": dict(result.use.uses),
        "flops": result.flops, "error": result.error,
        "contenders": {name: _contender_json(result, name) for name in CONTENDERS
                       if name in result.series or name in result.errors},
        "ort_over_ember": ratio,
        "below_mark": ratio is not None and ratio < MARK_BELOW,
        "zoo_ms": result.zoo_ms,
        "zoo_share": result.zoo_ms / total_zoo_ms if result.zoo_ms and total_zoo_ms else None,
        "ember_gflops": gflops,
        "ember_peak_fraction": gflops / peak_gflops if gflops and peak_gflops else None,
        "mismatch": result.mismatch,
        "ember_details": result.ember_details,
    }


def _contender_json(result: OpResult, name: str) -> dict[str, Any]:
    series = result.series.get(name)
    agreement = result.agreement.get(name)
    median = result.median_ms(name)
    return {"median_ms": median if median is not None and math.isfinite(median) else None,
            "timing": series.summary() if series is not None else None,
            "setup_seconds": result.setup_seconds.get(name),
            "error": result.errors.get(name),
            "agreement_with_ort": asdict(agreement) if agreement is not None else None}

"""What ``ember bench`` shows and writes: the table, the problems, JSON and a bar chart.

The table has one row per (model, batch, exporter): each contender's median (ms), ember's
median over the best peer's (above 1: ember is that many times slower), ember's compile time
and fallback count.  Torch columns do not depend on the exporter and repeat across a model's
rows (they were measured once, in the same interleaved rounds).  Below the table come the
failures (export, compile, run) with their errors verbatim, and the contenders whose outputs
disagree with PyTorch eager.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ember.bench.peers import Peer
from ember.bench.runner import CaseResult, ContenderResult, Settings

# Error lines printed under the table per failure (the JSON keeps every line).
ERROR_LINES = 12


# --------------------------------------------------------------------------- table


def _ms(contender: ContenderResult | None) -> Text:
    if contender is None:
        return Text("")
    if contender.error:
        return Text(f"{contender.error_stage} failed", style="red")
    median = contender.median_ms
    if median is None:
        return Text("—")
    shown = f"{median:.3f}" if median < 10 else f"{median:.1f}"
    if contender.agreement is not None and not contender.agreement.ok:
        return Text(shown + " ≠", style="yellow")  # ran, but disagrees with torch eager
    return Text(shown)


def _ratio(value: float | None) -> Text:
    if value is None:
        return Text("—")
    shown = f"{value:.2f}x" if value < 100 else f"{value:.0f}x"
    return Text(shown, style="green" if value <= 1.0 else "yellow")


def _noise(row: dict[str, ContenderResult]) -> str:
    """The row's worst relative spread: how far to trust its ratios (see benchmarks/README)."""
    spreads = [c.series.spread for c in row.values()
               if c.series is not None and not math.isnan(c.series.spread)]
    return f"±{max(spreads) * 100:.0f}%" if spreads else "—"


def render_table(results: Sequence[CaseResult], peers: Sequence[Peer], settings: Settings,
                 exporters: Sequence[str]) -> Table:
    title = (f"ember bench — {settings.threads} thread(s), fp32, median ms per call"
             + (", each contender in its own process" if settings.isolate else
                ", all contenders in one process")
             + (", tiny sizes (--quick)" if settings.size == "tiny" else ""))
    table = Table(title=title, title_justify="left")
    table.add_column("model", no_wrap=True)
    table.add_column("batch", justify="right")
    table.add_column("exporter", no_wrap=True)
    for peer in peers:
        table.add_column(peer.label, justify="right")
    table.add_column("ember/best", justify="right")
    table.add_column("noise", justify="right")
    table.add_column("ember compile s", justify="right")
    table.add_column("fallbacks", justify="right")
    for case in results:
        if case.error:
            failed = [Text("model failed", style="red")] * len(peers)
            table.add_row(case.model, str(case.batch), "—", *failed, "—", "—", "—", "—")
            continue
        for exporter in exporters:
            record = case.exports.get(exporter)
            if record is not None and not record.ok:
                cells = [Text("export failed", style="red") if peer.source == "onnx"
                         else _ms(case.row(exporter).get(peer.name)) for peer in peers]
                table.add_row(case.model, str(case.batch), exporter, *cells, "—",
                              _noise(case.row(exporter)), "—", "—")
                continue
            row = case.row(exporter)
            ember = row.get("ember")
            compile_cell, fallback_cell = "—", "—"
            if ember is not None and ember.setup_seconds is not None:
                cached = ember.details.get("library_from_cache")
                compile_cell = f"{ember.setup_seconds:.1f}" + (" *" if cached else "")
            if ember is not None and "fallbacks" in ember.details:
                fallback_cell = f"{ember.details['fallbacks']}/{ember.details['nodes']}"
            table.add_row(case.model, str(case.batch), exporter,
                          *[_ms(row.get(peer.name)) for peer in peers],
                          _ratio(case.ember_over_best(exporter)), _noise(row), compile_cell,
                          fallback_cell)
    table.caption = ("ember/best: ember's median over the fastest other contender's in the row "
                     "(> 1: ember slower). noise: the largest interquartile range / median "
                     "among the row's contenders. ≠: outputs disagree with torch eager (see "
                     "below). *: ember's C library came from its compile cache (a rerun; "
                     "--cold-compile for first compiles). fallbacks: numpy nodes / all nodes.")
    table.caption_justify = "left"
    return table


# The contenders that compile on their first call: their setup time is a compile time.
COMPILING_PEERS = ("ember", "ember_torch", "torch_compile")


def render_compile_table(results: Sequence[CaseResult], peers: Sequence[Peer],
                         settings: Settings) -> Table | None:
    """Seconds from nothing to the first result (prepare + first call) of every compiler in
    the run, per case: ember from the ONNX file, ember and inductor under torch.compile
    (Dynamo's tracing included).  None when fewer than one compiler ran."""
    compilers = [peer for peer in peers if peer.name in COMPILING_PEERS]
    if not compilers:
        return None
    kind = "first compiles, caches off" if settings.cold_compile else \
        "caches on: a rerun reuses them (--cold-compile for first compiles)"
    table = Table(title=f"compile: seconds to the first result ({kind})", title_justify="left")
    table.add_column("model", no_wrap=True)
    table.add_column("batch", justify="right")
    for peer in compilers:
        table.add_column(peer.label, justify="right")
    for case in results:
        cells = []
        for peer in compilers:
            times = [c.setup_seconds for c in case.contenders.values()
                     if c.peer == peer.name and c.setup_seconds is not None and not c.error]
            cells.append(" / ".join(f"{t:.1f}" for t in times) if times else "—")
        table.add_row(case.model, str(case.batch), *cells)
    table.caption = ("ember (ONNX) compiles once per exported file (torchscript / dynamo when "
                     "both ran).")
    table.caption_justify = "left"
    return table


def print_problems(results: Sequence[CaseResult], console: Console) -> None:
    """Export failures, contender failures (errors verbatim), disagreements, fallbacks."""
    for case in results:
        where = f"{case.model} b{case.batch}"
        if case.error:
            _print_error(console, f"{where}: the torch model failed", case.error)
        for exporter, record in case.exports.items():
            if not record.ok:
                _print_error(console, f"{where}: {exporter} export failed", record.error or "")
        for contender in case.contenders.values():
            label = f"{where} {contender.key}"
            if contender.error:
                _print_error(console, f"{label}: {contender.error_stage} failed",
                             contender.error)
            elif contender.agreement is not None and not contender.agreement.ok:
                console.print(Text(f"{label}: outputs disagree with torch eager: "
                                   f"{contender.agreement.message}", style="yellow"))
            fallbacks = contender.details.get("fallback_nodes") or []
            if fallbacks:
                console.print(Text(f"{label}: {len(fallbacks)} fallback node(s)",
                                   style="yellow"))
                for line, count in _grouped(fallbacks):
                    console.print(Text(f"  {count:3d} x {line}"))


def _print_error(console: Console, heading: str, error: str) -> None:
    console.print(Text(heading, style="red"))
    lines = error.splitlines() or [""]
    for line in lines[:ERROR_LINES]:
        console.print(Text("  " + line))
    if len(lines) > ERROR_LINES:
        console.print(Text(f"  [... {len(lines) - ERROR_LINES} more lines in the JSON]"))


def _grouped(fallbacks: Sequence[str]) -> list[tuple[str, int]]:
    """Fallback entries "Op 'node': reason" grouped by (op, reason), most frequent first."""
    groups: dict[str, int] = {}
    for entry in fallbacks:
        op, _, rest = entry.partition(" ")
        key = f"{op}: {rest.partition(': ')[2]}"
        groups[key] = groups.get(key, 0) + 1
    return sorted(groups.items(), key=lambda item: -item[1])


# --------------------------------------------------------------------------- JSON


def cpu_model() -> str:
    """The CPU's model name as lscpu reports it (else /proc/cpuinfo, else platform)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                              env={**os.environ, "LC_ALL": "C"}).stdout
        match = re.search(r"^Model name:\s*(.+)$", text, re.MULTILINE)
        if match:
            return match.group(1).strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(),
                          re.MULTILINE)
        if match:
            return match.group(1).strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _contender_json(contender: ContenderResult) -> dict[str, Any]:
    return {"peer": contender.peer, "exporter": contender.exporter,
            "setup_seconds": contender.setup_seconds, "error": contender.error,
            "error_stage": contender.error_stage,
            "agreement": asdict(contender.agreement) if contender.agreement else None,
            "timing": contender.series.summary() if contender.series else None,
            "details": contender.details}


def _case_json(case: CaseResult) -> dict[str, Any]:
    return {"model": case.model, "description": case.description, "batch": case.batch,
            "size": case.size, "shape": case.shape, "error": case.error,
            "exports": {name: asdict(record) for name, record in case.exports.items()},
            "contenders": {key: _contender_json(c) for key, c in case.contenders.items()},
            "ember_over_best": {exporter: _none_if_nan(case.ember_over_best(exporter))
                                for exporter in case.exports},
            "round_orders": case.orders}


def _none_if_nan(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def run_header(settings: Settings, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """What every ``ember bench`` JSON starts with (whole models or ``--ops``): when, the
    command, the machine, the settings, the environment that changes timings, versions."""
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": list(argv) if argv is not None else None,
        "machine": {"cpu_model": cpu_model(), "cpus": os.cpu_count(),
                    "platform": platform.platform(), "python": platform.python_version()},
        "settings": {key: (str(value) if isinstance(value, Path) else value)
                     for key, value in asdict(settings).items()},
        "threads": settings.threads,
        "environment": {name: os.environ.get(name) for name in
                        ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "HF_HUB_OFFLINE",
                         "EMBER_CACHE_DIR")},
        "versions": _versions(),
    }


def results_json(results: Sequence[CaseResult], peers: Sequence[Peer], settings: Settings,
                 skipped_peers: dict[str, str], skipped_models: dict[str, str],
                 argv: Sequence[str] | None = None) -> dict[str, Any]:
    return {
        **run_header(settings, argv),
        "peers": {peer.name: {"label": peer.label, "version": peer.version()}
                  for peer in peers},
        "skipped_peers": skipped_peers,
        "skipped_models": skipped_models,
        "results": [_case_json(case) for case in results],
    }


def _versions() -> dict[str, str | None]:
    import importlib.metadata

    versions: dict[str, str | None] = {}
    for package in ("ember", "numpy", "onnx", "torch", "onnxruntime", "openvino", "onnxscript",
                    "transformers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def write_json(payload: dict[str, Any], path: Path) -> None:
    """Write strict JSON: non-finite floats (never valid JSON) become null."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite_only(payload), indent=2, allow_nan=False) + "\n")


def _finite_only(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_only(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_only(item) for item in value]
    return value


# --------------------------------------------------------------------------- chart


def write_png(results: Sequence[CaseResult], peers: Sequence[Peer], exporters: Sequence[str],
              settings: Settings, path: Path) -> None:
    """A grouped bar chart: one group per (model, batch, exporter) row, one bar per
    contender, log-scale milliseconds (ember and the peers can be orders of magnitude
    apart).  matplotlib is imported here only: the rest of the bench never needs it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{case.model}\nb{case.batch} {exporter}", case.row(exporter))
            for case in results if not case.error for exporter in exporters
            if exporter in case.exports]
    width = 0.8 / max(1, len(peers))
    figure, axes = plt.subplots(figsize=(max(6.0, 1.3 * len(rows) + 2), 5))
    failed_x = []
    for index, peer in enumerate(peers):
        xs, heights = [], []
        for position, (_, row) in enumerate(rows):
            x = position + (index - (len(peers) - 1) / 2) * width
            contender = row.get(peer.name)
            median = contender.median_ms if contender is not None else None
            if median is not None and median > 0:
                xs.append(x)
                heights.append(median)
            elif contender is not None and contender.error:
                failed_x.append(x)
        axes.bar(xs, heights, width, label=peer.label)
    # A failed contender has no bar: mark its slot at the bottom so it does not read as "0".
    for x in failed_x:
        axes.text(x, 0.01, "×", color="red", ha="center", va="bottom",
                  transform=axes.get_xaxis_transform())
    axes.set_xticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    axes.set_yscale("log")
    axes.set_ylabel("median ms per call (log scale)")
    axes.set_title(f"ember bench: {settings.threads} thread(s), fp32, lower is better "
                   f"(× failed)")
    axes.legend(fontsize=8)
    axes.grid(axis="y", which="both", alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)

"""What fusion and memory planning do to whole models: opt level 0 against opt level 2.

For each zoo model (``ember/bench/zoo.py``, exported to ONNX and cached like ``ember bench``
does), compile it at opt level 0 (one kernel per node, as imported) and at the default level
2 (graph passes, fused groups), then report

* kernels: compiled kernels (and numpy fallbacks) at O0 and O2, and the ratio;
* memory: the activation workspace without reuse (every value its own buffer), the planned
  arena, and the peak of live bytes, at O2 (and the O0 arena for comparison);
* latency: ember O0, ember O2, ONNX Runtime and OpenVINO (those installed), all timed in one
  interleaved measurement with the same thread count (``ember.bench.timing``), medians;
* agreement: every contender's outputs against PyTorch eager (rtol/atol as ``ember bench``);
* with ``--peak``: the fp32 FMA peak measured in the same run (``benchmarks/fma_peak.py``), and
  each contender's achieved GFLOP/s (the model's FLOPs, ``ember.ops.cost``) as % of it.

    .venv/bin/python benchmarks/fusion.py                       # resnet18 mobilenet_v2 bert_base gpt2
    .venv/bin/python benchmarks/fusion.py --quick               # tiny sizes, a minute or two
    .venv/bin/python benchmarks/fusion.py --models bert_base --exporter dynamo --json out.json

Compare ratios within one run: the machine is shared and absolute times drift between runs
(see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = ("resnet18", "mobilenet_v2", "bert_base", "gpt2")
PEERS = ("onnxruntime", "openvino")


@dataclass
class LevelResult:
    """One ember build of a model."""

    opt_level: int
    nodes: int = 0
    kernels: int = 0
    fused_kernels: int = 0
    fallbacks: int = 0
    workspace_bytes: int = 0
    naive_bytes: int = 0
    peak_live_bytes: int = 0
    in_place: int = 0
    compile_seconds: float = 0.0
    agrees: bool | None = None
    error: str | None = None


@dataclass
class ModelResult:
    model: str
    exporter: str
    batch: int
    size: str
    imported_nodes: int = 0
    flops: int | None = None
    levels: dict[int, LevelResult] = field(default_factory=dict)
    median_ms: dict[str, float] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)
    agreement: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--exporter", choices=("auto", "torchscript", "dynamo"), default="auto",
                        help="which PyTorch ONNX exporter writes the model; auto: TorchScript, "
                             "else dynamo where TorchScript fails (GPT-2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--budget", type=float, default=60.0,
                        help="most seconds one contender spends in timed samples per model")
    parser.add_argument("--quick", action="store_true", help="tiny model sizes, 5 rounds")
    parser.add_argument("--no-timing", action="store_true",
                        help="only kernel counts and memory (no latency)")
    parser.add_argument("--peak", action="store_true",
                        help="measure the FMA peak and report %% of it per contender")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where exported ONNX files are cached (default: ember's zoo cache)")
    args = parser.parse_args(argv)

    peak = None
    if args.peak:
        from benchmarks.fma_peak import measure_fma_peak

        peak, lanes = measure_fma_peak(args.threads)
        print(f"fp32 FMA peak, {args.threads} threads, {lanes}-lane vectors: {peak:.1f} GFLOP/s")
    size = "tiny" if args.quick else "full"
    rounds = 5 if args.quick else args.rounds
    results = []
    for model in args.models:
        print(f"== {model} (batch {args.batch}, {size})", flush=True)
        results.append(_run_model(model, args.batch, size, args.exporter, args.threads,
                                  rounds, args.warmup, args.budget, not args.no_timing,
                                  args.cache_dir))
    _print_tables(results, peak)
    if args.json:
        args.json.write_text(json.dumps({
            "machine": _machine(), "threads": args.threads, "rounds": rounds,
            "fma_peak_gflops": peak,
            "results": [asdict(r) for r in results]}, indent=1))
        print(f"wrote {args.json}")
    return 1 if any(r.error or any(level.error for level in r.levels.values())
                    for r in results) else 0


def _run_model(model: str, batch: int, size: str, exporter: str, threads: int, rounds: int,
               warmup: int, budget: float, timing: bool,
               cache_dir: Path | None = None) -> ModelResult:
    import onnx

    from ember.bench.export import export_model
    from ember.bench.peers import OnnxRuntimePeer, OpenVinoPeer, Workload
    from ember.bench.timing import compare_outputs, measure_interleaved
    from ember.bench.zoo import get_entry

    result = ModelResult(model, exporter, batch, size)
    entry = get_entry(model)
    built = entry.build(batch, size)
    reference = _torch_outputs(built)
    exporters = ("torchscript", "dynamo") if exporter == "auto" else (exporter,)
    for name in exporters:
        record = export_model(entry, built, size, batch, name, cache_dir)
        if record.ok:
            result.exporter = name
            break
        print(f"  {name} export failed: {(record.error or '').splitlines()[0][:200]}")
    if not record.ok:
        result.error = f"export failed: {record.error}"
        print(f"  {result.error}")
        return result
    result.imported_nodes = len(onnx.load(record.path, load_external_data=False).graph.node)
    result.flops = _model_flops(record.path)

    contenders: dict[str, Callable[[], Any]] = {}
    for level in (0, 2):
        outcome, run = _ember_level(record.path, level, built, threads)
        result.levels[level] = outcome
        if run is not None:
            agreement = compare_outputs(reference, run(), 1e-4, 1e-5)
            outcome.agrees = agreement.ok
            result.agreement[f"ember O{level}"] = _describe(agreement)
            contenders[f"ember O{level}"] = run
        print(f"  O{level}: {outcome.kernels} kernels ({outcome.fused_kernels} fused), "
              f"{outcome.fallbacks} fallbacks, workspace {outcome.workspace_bytes:,} B "
              f"(naive {outcome.naive_bytes:,} B), compiled in {outcome.compile_seconds:.1f} s"
              + (f"  ERROR {outcome.error}" if outcome.error else ""), flush=True)

    workload = Workload(model, built, threads, record.path, result.exporter)
    for peer in (OnnxRuntimePeer(), OpenVinoPeer()):
        if not peer.available():
            print(f"  {peer.name}: {peer.unavailable_reason()}")
            continue
        prepared = peer.prepare(workload)
        agreement = compare_outputs(reference, prepared(built.inputs), 1e-4, 1e-5)
        result.agreement[peer.name] = _describe(agreement)
        contenders[peer.name] = (lambda p=prepared: p(built.inputs))

    if timing and contenders:
        measurement = measure_interleaved(contenders, rounds, warmup, budget_seconds=budget)
        for name, series in measurement.series.items():
            result.median_ms[name] = series.median
            result.spread[name] = series.spread
    return result


def _ember_level(path: str, level: int, built, threads: int
                 ) -> tuple[LevelResult, Callable[[], list[np.ndarray]] | None]:
    import ember

    outcome = LevelResult(level)
    started = time.perf_counter()
    try:
        module = ember.compile(path, opt_level=level)
    except ember.EmberError as error:
        outcome.error = str(error).splitlines()[0][:300]
        return outcome, None
    outcome.compile_seconds = time.perf_counter() - started
    module.set_num_threads(threads)
    build = module.build
    memory = build.memory
    outcome.nodes = sum(len(impl.nodes) for impl in build.impls)
    outcome.kernels = len(build.kernels)
    outcome.fused_kernels = sum(1 for impl in build.kernels if len(impl.nodes) > 1)
    outcome.fallbacks = len(build.host_nodes)
    outcome.workspace_bytes = build.workspace_size
    if memory is not None:
        outcome.naive_bytes = memory.naive_bytes
        outcome.peak_live_bytes = memory.peak_live_bytes
        outcome.in_place = len(memory.in_place)
    names, outputs = module.input_names, module.output_names
    feeds = {name: built.inputs[name] for name in names}

    def run() -> list[np.ndarray]:
        results = module.run(feeds)
        return [results[name] for name in outputs]

    return outcome, run


def _model_flops(path: str) -> int | None:
    """The model's FLOPs (ember's estimate over the imported graph; None if not static)."""
    import ember
    from ember.ops.cost import estimate_flops

    total = estimate_flops(ember.import_onnx(path)).total
    return total if isinstance(total, int) else None


def _describe(agreement) -> str:
    if agreement.ok:
        return f"ok, max |diff| {agreement.max_abs_diff or 0:.2g} vs torch eager"
    return agreement.message


def _torch_outputs(built) -> list[np.ndarray]:
    import torch

    with torch.inference_mode():
        output = built.module(*(torch.from_numpy(a) for a in built.inputs.values()))
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    return [o.detach().numpy().copy() for o in outputs]


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f}"


def _print_tables(results: list[ModelResult], peak: float | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    kernels = Table(title="Kernels and activation memory, opt level 0 vs 2", title_justify="left")
    for column in ("model", "export", "ONNX nodes", "O0 kernels", "O2 kernels", "O0/O2",
                   "O2 fused", "fallbacks O0/O2", "O2 naive MiB", "O2 planned MiB",
                   "O2 peak live MiB", "O0 planned MiB"):
        kernels.add_column(column, justify="left" if column in ("model", "export") else "right")
    for r in results:
        o0, o2 = r.levels.get(0), r.levels.get(2)
        if r.error or o0 is None or o2 is None:
            kernels.add_row(r.model, r.exporter, *["-"] * 10)
            continue
        ratio = f"{o0.kernels / o2.kernels:.2f}x" if o2.kernels else "-"
        kernels.add_row(r.model, r.exporter, str(r.imported_nodes), str(o0.kernels),
                        str(o2.kernels), ratio,
                        str(o2.fused_kernels), f"{o0.fallbacks}/{o2.fallbacks}",
                        _mib(o2.naive_bytes), _mib(o2.workspace_bytes),
                        _mib(o2.peak_live_bytes), _mib(o0.workspace_bytes))
    console.print(kernels)
    for r in results:
        for problem in [r.error] + [f"O{lv.opt_level}: {lv.error}" for lv in r.levels.values()
                                    if lv.error]:
            if problem:
                console.print(f"  {r.model}: {problem}")

    latency = Table(title="Latency, medians (ms), one interleaved run per model",
                    title_justify="left")
    names = ["ember O0", "ember O2", *PEERS]
    for column in ("model", *names, "O0/O2", "O2/best peer", "noise"):
        latency.add_column(column, justify="left" if column == "model" else "right")
    for r in results:
        if not r.median_ms:
            continue
        cells = [f"{r.median_ms[n]:.2f}" if n in r.median_ms else "-" for n in names]
        o0, o2 = r.median_ms.get("ember O0"), r.median_ms.get("ember O2")
        peers = [r.median_ms[p] for p in PEERS if p in r.median_ms]
        speedup = f"{o0 / o2:.2f}x" if o0 and o2 else "-"
        versus = f"{o2 / min(peers):.2f}x" if o2 and peers else "-"
        spreads = [v for v in r.spread.values() if np.isfinite(v)]
        noise = f"±{max(spreads) * 100:.0f}%" if spreads else "-"
        latency.add_row(r.model, *cells, speedup, versus, noise)
    console.print(latency)
    if peak:
        efficiency = Table(title=f"Achieved GFLOP/s as % of the FMA peak measured in this run "
                                 f"({peak:.1f} GFLOP/s)", title_justify="left")
        efficiency.add_column("model")
        efficiency.add_column("GFLOPs", justify="right")
        for name in names:
            efficiency.add_column(name, justify="right")
        for r in results:
            if not r.median_ms or not r.flops:
                continue
            cells = [f"{r.flops / r.median_ms[n] / 1e6:.1f} ({r.flops / r.median_ms[n] / 1e6 / peak:.1%})"
                     if n in r.median_ms else "-" for n in names]
            efficiency.add_row(r.model, f"{r.flops / 1e9:.2f}", *cells)
        console.print(efficiency)
    console.print("O0/O2 above 1: fusion made ember faster; O2/best peer above 1: ember is "
                  "slower than the fastest peer by that factor.")
    disagreements = [(r.model, name, message) for r in results
                     for name, message in r.agreement.items() if message and
                     not message.startswith("ok")]
    for model, name, message in disagreements:
        console.print(f"  {model} {name} DISAGREES with torch eager: {message}")


def _machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "python": platform.python_version(), "cores": os.cpu_count()}


if __name__ == "__main__":
    sys.exit(main())

"""``ember bench``: ember against PyTorch eager, torch.compile, ONNX Runtime and OpenVINO.

    ember bench --quick                                  # tiny models, a couple of minutes
    ember bench --models resnet18 bert_base --batch 1 --json out.json --png out.png
    ember bench --batch 1 --exporter both --peers ember onnxruntime openvino
    ember bench --peak                                   # + GFLOP/s as % of the FMA peak
    ember bench --models mlp bert_base --batch 1 16 --ops --peak   # each distinct heavy op

ember/cli.py declares the subcommand through :func:`add_bench_parser`; this module imports
nothing heavy at import time (torch, the runtimes and matplotlib load when the bench runs),
so ``ember --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ember.bench.export import EXPORTERS, ExportRecord, export_model
from ember.bench.peers import PEERS, Peer
from ember.bench.runner import CaseResult, Log, Settings, run_case
from ember.bench.zoo import ZOO, ZooEntry
from ember.core.text import TerminalConsole

if TYPE_CHECKING:
    from ember.bench.efficiency import Machine
    from ember.profile.peak import Peak

DEFAULT_THREADS = 2
DEFAULT_ROUNDS, QUICK_ROUNDS = 10, 5
DEFAULT_WARMUP, QUICK_WARMUP = 2, 1
QUICK_MODELS = ("mlp", "resnet18", "bert_base")


def add_bench_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bench", help="benchmark ember against PyTorch, torch.compile, ONNX Runtime, OpenVINO",
        description="Build the zoo models, export each with the TorchScript and the dynamo "
                    "ONNX exporter (cached), run every contender on the same inputs, check "
                    "its outputs against PyTorch eager and time all of them interleaved. "
                    "Compare ratios within one run, not milliseconds across runs "
                    "(see benchmarks/README.md).")
    parser.add_argument("--models", nargs="+", choices=list(ZOO), metavar="MODEL",
                        help=f"zoo models (default: all; with --quick: "
                             f"{' '.join(QUICK_MODELS)}); choices: {', '.join(ZOO)}")
    parser.add_argument("--batch", nargs="+", type=_positive, default=None, metavar="N",
                        help="batch sizes (default: 1 16; with --quick: 1)")
    parser.add_argument("--exporter", choices=(*EXPORTERS, "both"), default="both",
                        help="which PyTorch ONNX exporter's files the ONNX peers run "
                             "(default: both)")
    parser.add_argument("--peers", nargs="+", choices=list(PEERS), metavar="PEER",
                        help=f"contenders (default: all installed but the ember variants "
                             f"ember-tuned and ember-predicted, which are named to run; "
                             f"--tuning-db adds ember-tuned); choices: {', '.join(PEERS)}")
    parser.add_argument("--threads", type=_positive, default=DEFAULT_THREADS,
                        help="intra-op threads of every contender (default: %(default)s)")
    parser.add_argument("--rounds", type=_positive, default=None,
                        help=f"timed interleaved rounds per case (default: {DEFAULT_ROUNDS}; "
                             f"--quick: {QUICK_ROUNDS})")
    parser.add_argument("--warmup", type=_non_negative, default=None,
                        help=f"untimed calls per contender first (default: {DEFAULT_WARMUP}; "
                             f"--quick: {QUICK_WARMUP})")
    parser.add_argument("--budget", type=float, default=60.0, metavar="SECONDS",
                        help="most time one contender spends in timed samples per case; a "
                             "slower one keeps at least 3 samples (default: %(default)s)")
    parser.add_argument("--rtol", type=float, default=1e-4,
                        help="relative tolerance of the output check (default: %(default)g)")
    parser.add_argument("--atol", type=float, default=1e-5,
                        help="absolute tolerance of the output check (default: %(default)g)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny model sizes (same structure), fewer rounds, batch 1, a few "
                             "models: a couple of minutes")
    parser.add_argument("--json", type=Path, metavar="OUT",
                        help="write every sample, the versions and the machine to OUT")
    parser.add_argument("--png", type=Path, metavar="OUT",
                        help="draw a bar chart of the medians to OUT (needs matplotlib)")
    parser.add_argument("--cold-compile", action="store_true",
                        help="compile ember and torch.compile without their caches, so the "
                             "compile times are first compiles even on a rerun")
    parser.add_argument("--omp-passive", action="store_true",
                        help="make torch's OpenMP workers sleep as soon as they are idle "
                             "(OMP_WAIT_POLICY=PASSIVE; default: OpenMP's own waiting, as "
                             "deployed; ember's own thread pool does not read it; see "
                             "benchmarks/README.md)")
    parser.add_argument("--ort-spin", action="store_true",
                        help="let ONNX Runtime's idle workers spin after each run, its default "
                             "(default: they stop when a run returns, so that they do not take "
                             "a core from the contender timed next; see benchmarks/README.md)")
    parser.add_argument("--tuning-db", type=Path, metavar="DB",
                        help="the tuning database (ember tune) the ember-tuned contender "
                             "compiles with; add ember-tuned to --peers")
    parser.add_argument("--in-process", action="store_true",
                        help="prepare and time every contender in this one process (default: "
                             "each in a worker process of its own, as deployed, still timed in "
                             "interleaved rounds)")
    parser.add_argument("--ops", action="store_true",
                        help="instead of whole models, benchmark every distinct Conv / "
                             "ConvTranspose / MatMul / Gemm configuration of the selected "
                             "models as a single-op model: ember against ONNX Runtime and, for "
                             "MatMul/Gemm, torch's matmul ('mkl'; dropped when --peers omits "
                             "torch), sorted by count x ORT time")
    parser.add_argument("--peak", action="store_true",
                        help="measure the fp32 FMA peak (and, for whole models, the memory "
                             "bandwidth) in this run and show GFLOP/s as %% of it: per model "
                             "and contender, or with --ops per op for ember")
    parser.add_argument("--export-only", action="store_true",
                        help="only build and export the models; print which exporter worked")
    parser.add_argument("--refresh-exports", action="store_true",
                        help="export again even when the zoo cache has the file (or failure)")
    parser.add_argument("--cache-dir", type=Path, default=None, metavar="DIR",
                        help="where exported models are cached (default: $EMBER_CACHE_DIR/zoo "
                             "or ~/.cache/ember/zoo)")
    parser.set_defaults(handler=run_bench_command)


def _positive(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None


# --------------------------------------------------------------------------- running


def run_bench_command(args: argparse.Namespace, console: Console) -> int:
    """The handler ember/cli.py dispatches ``ember bench`` to."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # zoo weights are local: never ask the hub
    if args.omp_passive:
        _passive_openmp()
    log_console = TerminalConsole(stderr=True, highlight=False, markup=False,
                                  soft_wrap=True)

    def log(message: str) -> None:
        log_console.print(message)

    settings = Settings(
        threads=args.threads,
        rounds=args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS),
        warmup=args.warmup if args.warmup is not None else (
            QUICK_WARMUP if args.quick else DEFAULT_WARMUP),
        size="tiny" if args.quick else "full", rtol=args.rtol, atol=args.atol,
        budget_seconds=args.budget if args.budget > 0 else None, cache_dir=args.cache_dir,
        refresh_exports=args.refresh_exports, cold_compile=args.cold_compile,
        ort_spin=args.ort_spin, traceback=getattr(args, "traceback", False),
        isolate=not args.in_process,
        tuning_db=str(args.tuning_db.resolve()) if args.tuning_db else None)
    exporters = list(EXPORTERS) if args.exporter == "both" else [args.exporter]
    batches = args.batch or ([1] if args.quick else [1, 16])
    names = args.models or (list(QUICK_MODELS) if args.quick else list(ZOO))

    entries, skipped_models = _usable_models(names)
    for name, reason in skipped_models.items():
        console.print(Text(f"skipping model {name}: {reason}", style="yellow"))
    if args.export_only:
        records = export_zoo(entries, batches, exporters, settings, log)
        _wide(console).print(render_zoo_table(records))
        return 0
    if args.ops:
        return _run_ops(entries, batches, exporters, settings, args, console, log)

    names = args.peers
    if names is None and args.tuning_db is not None:
        names = [name for name, peer in PEERS.items() if not peer.opt_in] + ["ember-tuned"]
    peers, skipped_peers = select_peers(names)
    for name, reason in skipped_peers.items():
        console.print(Text(f"skipping peer {name}: {reason}", style="yellow"))
    if not peers:
        console.print(Text("no peer is available: nothing to measure", style="red"))
        return 2

    before = _measure_peak(settings, log) if args.peak else None
    with _thread_limits(settings.threads):
        results = run_bench(entries, batches, exporters, peers, settings, log)
    machine = None
    if before is not None:
        from ember.bench.efficiency import Machine

        machine = Machine(before, _measure_peak(settings, log))
    _report(results, peers, exporters, settings, skipped_peers, skipped_models, args,
            _wide(console), machine)
    return 0


def _measure_peak(settings: Settings, log: Log) -> Peak:
    from ember.profile.peak import measure_peak

    log(f"measuring the FMA peak and the memory bandwidth on {settings.threads} thread(s) ...")
    peak = measure_peak(settings.threads)
    log(f"  {peak.fma_gflops:.1f} GFLOP/s, {peak.bandwidth_gbs:.1f} GB/s")
    return peak


def _wide(console: Console) -> Console:
    """A console wide enough for the table when the output is a file or a pipe (rich would
    wrap it at 80 columns and cut every cell)."""
    if console.is_terminal:
        return console
    return TerminalConsole(width=240, markup=False, highlight=False, soft_wrap=True)


def _passive_openmp() -> None:
    """Make torch's OpenMP workers sleep instead of spinning when idle (``--omp-passive``).
    ember's kernels run on ember's own thread pool, which no environment variable changes.

    Not the default: every parallel region then starts by waking the workers.  It helps when
    another process keeps one of the two cores busy: libgomp's brief spinning at a barrier
    then waits out a scheduler time slice (torch eager on a tiny ResNet once took 950 ms
    instead of 6 ms that way, when ONNX Runtime's workers kept spinning between runs; they no
    longer do, see ``peers.OnnxRuntimePeer``).  libgomp reads the variable when it loads, i.e.
    when torch is imported, which happens after this (an explicit OMP_WAIT_POLICY in the
    environment wins).
    """
    if "torch" in sys.modules:
        return  # too late for torch's libgomp; leave the environment as the user set it
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _usable_models(names: Sequence[str]) -> tuple[list[ZooEntry], dict[str, str]]:
    entries, skipped = [], {}
    for name in dict.fromkeys(names):  # keep the order, drop repeats
        entry = ZOO[name]
        missing = entry.missing()
        if missing:
            skipped[name] = (f"needs {', '.join(missing)} (pip install -e '.[bench]')")
        else:
            entries.append(entry)
    return entries, skipped


def select_peers(names: Sequence[str] | None) -> tuple[list[Peer], dict[str, str]]:
    """The requested peers (default: all) that can run here, and why the others cannot."""
    peers, skipped = [], {}
    for name in dict.fromkeys(names or [n for n, peer in PEERS.items() if not peer.opt_in]):
        peer = PEERS[name]()
        reason = peer.unavailable_reason()
        if reason:
            skipped[name] = reason
        else:
            peers.append(peer)
    return peers, skipped


def run_bench(entries: Sequence[ZooEntry], batches: Sequence[int], exporters: Sequence[str],
              peers: Sequence[Peer], settings: Settings,
              log: Log = lambda message: None) -> list[CaseResult]:
    """Every (model, batch) case in turn; the library entry point behind the command."""
    results = []
    for entry in entries:
        for batch in batches:
            log(f"{entry.name} batch {batch} ({settings.size}):")
            results.append(run_case(entry, batch, exporters, peers, settings, log))
    return results


@contextlib.contextmanager
def _thread_limits(threads: int) -> Iterator[None]:
    """Hold numpy's BLAS (used by ember's fallback nodes) to the same thread budget as the
    contenders, when threadpoolctl is installed (it comes with the bench extra)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=threads):
        yield


def _report(results: list[CaseResult], peers: list[Peer], exporters: list[str],
            settings: Settings, skipped_peers: dict[str, str], skipped_models: dict[str, str],
            args: argparse.Namespace, console: Console, machine: Machine | None = None
            ) -> None:
    from ember.bench.efficiency import count_work, efficiency_json, render_efficiency_table
    from ember.bench.report import (print_problems, render_compile_table, render_table,
                                    results_json, write_json, write_png)

    console.print(render_table(results, peers, settings, exporters))
    console.print(_fairness_note(peers, settings, args))
    work = count_work(results) if machine is not None else None
    if machine is not None and work is not None:
        console.print(render_efficiency_table(results, peers, exporters, work, machine))
    compile_table = render_compile_table(results, peers, settings)
    if compile_table is not None:
        console.print(compile_table)
    print_problems(results, console)
    if args.json is not None:
        payload = results_json(results, peers, settings, skipped_peers, skipped_models,
                               sys.argv)
        if machine is not None and work is not None:
            payload.update(efficiency_json(work, machine))
        write_json(payload, args.json)
        console.print(f"wrote {args.json}")
    if args.png is not None:
        write_png(results, peers, exporters, settings, args.png)
        console.print(f"wrote {args.png}")


def _fairness_note(peers: list[Peer], settings: Settings, args: argparse.Namespace) -> str:
    """What the bench set on a contender that a user would not have set, said in the output."""
    made = []
    if any(peer.name == "onnxruntime" for peer in peers) and not settings.ort_spin:
        made.append("ONNX Runtime: session.force_spinning_stop=1 (its idle workers stop "
                    "spinning when a run returns, so they do not take a core from the "
                    "contender timed next; --ort-spin leaves its default)")
    if getattr(args, "omp_passive", False):
        made.append("torch: OMP_WAIT_POLICY=PASSIVE (--omp-passive)")
    ember = "ember: nothing (its thread pool reads no environment variable)"
    return "Set for fairness, not as deployed: " + ("; ".join(made) or "nothing") + \
        f". {ember}; every contender at {settings.threads} threads."


# --------------------------------------------------------------------------- --ops


def _run_ops(entries: Sequence[ZooEntry], batches: Sequence[int], exporters: Sequence[str],
             settings: Settings, args: argparse.Namespace, console: Console, log: Log) -> int:
    """``--ops``: export the models, pull out their distinct heavy ops and benchmark each
    alone, then print and write the per-op report (ember.bench.ops)."""
    from dataclasses import asdict

    from ember.bench import ops
    from ember.bench.ops.report import (ops_json, print_ops_problems, render_ops_table,
                                        summary_line)
    from ember.bench.peers import OnnxRuntimePeer
    from ember.bench.report import write_json

    reason = OnnxRuntimePeer().unavailable_reason()
    if reason:
        console.print(Text(f"--ops measures against ONNX Runtime, which cannot run here: "
                           f"{reason}", style="red"))
        return 2
    records = export_zoo(entries, batches, exporters, settings, log)
    for record in records:
        if not record.ok:
            first = (record.error or "").strip().splitlines()[:1]
            console.print(Text(f"skipping {record.model} b{record.batch} {record.exporter}: "
                               f"export failed: {first[0] if first else '?'}", style="yellow"))
    usable = [record for record in records if record.ok]
    extraction = ops.extract_configs((record.model, record.path) for record in usable)
    log(f"{len(extraction.configs)} distinct configuration(s) in {len(usable)} export(s); "
        f"{len(extraction.skipped)} node(s) skipped")
    peak = None
    if args.peak:
        from ember.profile.peak import measure_fma_peak

        peak, lanes = measure_fma_peak(settings.threads)
        log(f"fp32 FMA peak, {settings.threads} thread(s), {lanes} lanes: {peak:.1f} GFLOP/s")
    with_mkl = ops.torch_matmul_available() and (not args.peers or "torch" in args.peers)
    with _thread_limits(settings.threads):
        results = ops.run_ops(extraction.configs, settings, with_mkl=with_mkl, log=log)

    wide = _wide(console)
    note = (f" of {', '.join(entry.name for entry in entries)} (batch "
            f"{' '.join(map(str, batches))}, {'+'.join(exporters)}"
            f"{', tiny sizes' if settings.size == 'tiny' else ''})")
    wide.print(render_ops_table(results, settings, peak, note))
    wide.print(summary_line(results, extraction))
    print_ops_problems(results, wide)
    if args.json is not None:
        write_json(ops_json(results, extraction, settings, [asdict(r) for r in records], peak,
                            sys.argv), args.json)
        wide.print(f"wrote {args.json}")
    if args.png is not None:
        wide.print(Text("--png draws whole-model results: no chart with --ops", style="yellow"))
    return 0


# --------------------------------------------------------------------------- --export-only


def export_zoo(entries: Sequence[ZooEntry], batches: Sequence[int], exporters: Sequence[str],
               settings: Settings, log: Log = lambda message: None) -> list[ExportRecord]:
    """Build and export every (model, batch, exporter): the zoo's own report."""
    records = []
    for entry in entries:
        for batch in batches:
            try:
                built = entry.build(batch, settings.size)
            except Exception as error:  # report the model and go on
                for exporter in exporters:
                    records.append(ExportRecord(entry.name, settings.size, batch, exporter,
                                                error=f"building the model failed: "
                                                      f"{type(error).__name__}: {error}"))
                continue
            for exporter in exporters:
                log(f"exporting {entry.name} b{batch} with {exporter} ...")
                records.append(export_model(entry, built, settings.size, batch, exporter,
                                            settings.cache_dir, settings.refresh_exports))
    return records


def render_zoo_table(records: Sequence[ExportRecord]) -> Table:
    table = Table(title="zoo exports", title_justify="left")
    for column in ("model", "size", "batch", "exporter", "result", "opset", "nodes",
                   "export s"):
        table.add_column(column, overflow="fold")
    for record in records:
        if record.ok:
            result = Text("ok" + (" (cached)" if record.cached else ""), style="green")
        else:
            first = (record.error or "").strip().splitlines()[:1]
            result = Text("failed: " + (first[0] if first else "?"), style="red")
        table.add_row(record.model, record.size, str(record.batch), record.exporter, result,
                      str(record.opset or "—"), str(record.nodes or "—"),
                      f"{record.seconds:.1f}")
    return table

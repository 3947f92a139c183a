"""ember's compiled models against ONNX Runtime: latency, compile time, fallbacks, agreement.

    .venv/bin/python benchmarks/bench_compiled.py                 # mlp b1/b64, resnet18, bert
    .venv/bin/python benchmarks/bench_compiled.py --quick         # smaller sizes, ~1 minute
    .venv/bin/python benchmarks/bench_compiled.py --models mlp_b1 bert_base_b1 --json out.json

For each model: build it (benchmarks/models.py), compile it with ``ember.compile`` (timed),
compare ember's output with ONNX Runtime's (max |diff|), then time both INTERLEAVED — one
sample of each per round, the order swapped every round — so that the drift of a shared,
noisy machine hits both contenders alike. The figure to read is the ratio ORT/ember of the
medians (> 1: ember is faster), taken within one run; absolute milliseconds move with the
host's load (see /work/shared/FACTS.md and benchmarks/README.md).

A model that ember fails to compile (or to run) is reported in the table with its error and
the run goes on: the point of the table is also to tell the compiler engineers what to fix.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DEFAULT_THREADS = 2


def _pin_library_threads(argv: Sequence[str]) -> None:
    """Give numpy's BLAS the same thread budget as the contenders, before numpy loads.

    ember's fallback nodes run numpy references; an uncapped OpenBLAS would use every core
    while ONNX Runtime is held to ``--threads``, making the comparison unfair either way.
    """
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    threads, _ = early.parse_known_args(argv)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(max(1, threads.threads)))


if __name__ == "__main__":
    _pin_library_threads(sys.argv[1:])

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import ember  # noqa: E402
from ember.bench.timing import Series as Timing  # noqa: E402
from ember.bench.timing import measure_interleaved  # noqa: E402
from benchmarks.models import bert, bert_base, example_inputs, mlp, resnet18  # noqa: E402


# ----------------------------------------------------------------------------- the models


@dataclass(frozen=True)
class Case:
    """One benchmark entry: a builder at full and at ``--quick`` size.

    ``repeat`` is the default number of timed rounds: 30 for models that run in
    milliseconds, fewer for those that take 10-100 ms a call so a run stays a few minutes.
    """

    name: str
    describe: str
    build: Callable[[], onnx.ModelProto]
    quick_describe: str
    quick_build: Callable[[], onnx.ModelProto]
    repeat: int = 30
    default: bool = True


CASES: dict[str, Case] = {c.name: c for c in [
    Case("mlp_b1", "784-1024-1024-10, batch 1", lambda: mlp(1),
         "784-1024-1024-10, batch 1", lambda: mlp(1)),
    Case("mlp_b64", "784-1024-1024-10, batch 64", lambda: mlp(64),
         "784-1024-1024-10, batch 64", lambda: mlp(64)),
    Case("resnet18_b1", "3x224x224, batch 1", lambda: resnet18(1, 224),
         "3x64x64, batch 1", lambda: resnet18(1, 64), repeat=15),
    Case("bert_small_b1", "2 layers, h256, 4 heads, seq 128", lambda: bert(1, 128),
         "2 layers, h128, 4 heads, seq 32",
         lambda: bert(1, 32, layers=2, hidden=128, heads=4, vocab=8192), repeat=20),
    Case("bert_base_b1", "12 layers, h768, 12 heads, seq 128", lambda: bert_base(1, 128),
         "12 layers, h768, 12 heads, seq 32", lambda: bert_base(1, 32), repeat=10,
         default=False),
]}


# ----------------------------------------------------------------------------- results


@dataclass
class Result:
    """Everything measured for one model; also the record ``--json`` writes."""

    model: str
    size: str
    ember: Timing = field(default_factory=Timing)
    ort: Timing = field(default_factory=Timing)
    compile_seconds: float | None = None
    nodes: int | None = None
    fallbacks: int | None = None
    fallback_nodes: list[str] = field(default_factory=list)
    max_abs_diff: float | None = None
    output_scale: float | None = None
    error: str | None = None
    error_stage: str | None = None

    @property
    def ratio(self) -> float:
        """ORT median / ember median: > 1 means ember is faster."""
        if not self.ember.samples_ms or not self.ort.samples_ms:
            return math.nan
        return self.ort.median / self.ember.median

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        for key, timing in (("ember", self.ember), ("ort", self.ort)):
            record[key].update(median_ms=_finite(timing.median), spread=_finite(timing.spread))
        record["ratio_ort_over_ember"] = _finite(self.ratio)
        return record


def _finite(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value


# ----------------------------------------------------------------------------- measuring


def _ort_session(model: onnx.ModelProto, threads: int,
                 spinning: bool = True) -> ort.InferenceSession:
    """ONNX Runtime as it is usually deployed on CPU: all graph optimizations, sequential
    execution, ``threads`` intra-op threads (the peers in FACTS.md were measured so).

    ``spinning=False`` stops ORT's idle workers from busy-waiting after a call; on a 2-vCPU
    host their spinning can steal the core ember's next interleaved sample needs.
    """
    options = ort.SessionOptions()
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _short(error: BaseException, lines: int = 4) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    more = f" [... {len(text) - lines} more lines]" if len(text) > lines else ""
    return "\n".join(text[:lines]) + more


def _max_abs_diff(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> float:
    worst = 0.0
    for name, want in theirs.items():
        got = np.asarray(ours[name])
        if got.shape != want.shape:
            raise ValueError(f"output '{name}': ember shape {got.shape}, ORT {want.shape}")
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        worst = max(worst, float(np.max(diff)) if diff.size else 0.0)
    return worst


def bench_one(case: Case, quick: bool, threads: int, repeat: int | None, warmup: int,
              log: Console, show_traceback: bool = False, ort_spinning: bool = True) -> Result:
    """Build, compile, check and time one model; never raises for ember's failures."""
    result = Result(case.name, case.quick_describe if quick else case.describe)
    model = (case.quick_build if quick else case.build)()
    feeds = example_inputs(model)
    session = _ort_session(model, threads, ort_spinning)
    output_names = [o.name for o in session.get_outputs()]
    expected = dict(zip(output_names, session.run(None, feeds)))
    result.output_scale = max(float(np.max(np.abs(v))) for v in expected.values())
    contenders: dict[str, Callable[[], Any]] = {"ort": lambda: session.run(None, feeds)}

    log.print(f"[bold]{case.name}[/] ({result.size}): compiling with ember ...")
    stage = "compile"
    start = time.perf_counter()
    try:
        module = ember.compile(model)
        result.compile_seconds = time.perf_counter() - start
        module.set_num_threads(threads)
        build = module.build
        result.nodes = len(build.impls)
        result.fallbacks = len(build.host_nodes)
        result.fallback_nodes = [f"{i.node.op} '{i.node.name}': {i.reason}"
                                 for i in build.host_nodes]
        stage = "run"
        ours = module.run(feeds)
        stage = "check"
        result.max_abs_diff = _max_abs_diff(ours, expected)
        contenders["ember"] = lambda: module.run(feeds)
    except Exception as error:  # report and go on: one broken model must not stop the run
        if result.compile_seconds is None:
            result.compile_seconds = time.perf_counter() - start
        result.error, result.error_stage = _short(error), stage
        log.print(f"  [red]ember {stage} failed[/]: {_short(error, 2)}")
        if show_traceback:
            traceback.print_exc()

    rounds = repeat or case.repeat
    log.print(f"  timing {', '.join(sorted(contenders))}: {warmup} warm-up + {rounds} "
              "interleaved rounds ...")
    measured = measure_interleaved(contenders, rounds, warmup)
    for name, series in measured.series.items():
        setattr(result, name, series)
    return result


# ----------------------------------------------------------------------------- reporting


def _ms(timing: Timing) -> str:
    return f"{timing.median:.3f}" if timing.samples_ms else "—"


def _diff_cell(result: Result) -> str:
    if result.max_abs_diff is None:
        return "—"
    scale = max(result.output_scale or 1.0, 1.0)
    style = "green" if result.max_abs_diff <= 1e-3 * scale else "red"
    return f"[{style}]{result.max_abs_diff:.1e}[/]"


def render(results: list[Result], threads: int, quick: bool) -> Table:
    """The comparison table; ratios are the column to read (see README)."""
    title = (f"ember vs ONNX Runtime {ort.__version__} — {threads} thread(s), medians"
             + (", --quick sizes" if quick else ""))
    table = Table(title=title, title_justify="left")
    table.add_column("model", no_wrap=True)
    table.add_column("size", no_wrap=True)
    table.add_column("ember ms", justify="right")
    table.add_column("ORT ms", justify="right")
    table.add_column("ORT/ember", justify="right")
    table.add_column("noise", justify="right")
    table.add_column("compile s", justify="right")
    table.add_column("fallbacks", justify="right")
    table.add_column("max |diff|", justify="right")
    for r in results:
        ratio = r.ratio
        if math.isnan(ratio):
            ratio_cell = f"[red]{r.error_stage} failed[/]" if r.error else "—"
        else:
            shown = f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.2g}"
            ratio_cell = f"[{'green' if ratio >= 1 else 'yellow'}]{shown}x[/]"
        spreads = [t.spread for t in (r.ember, r.ort) if not math.isnan(t.spread)]
        compile_cell = "—" if r.compile_seconds is None else f"{r.compile_seconds:.1f}"
        fallback_cell = "—" if r.fallbacks is None else f"{r.fallbacks}/{r.nodes}"
        table.add_row(r.model, r.size, _ms(r.ember), _ms(r.ort), ratio_cell,
                      f"±{max(spreads) * 100:.0f}%" if spreads else "—", compile_cell,
                      fallback_cell, _diff_cell(r))
    table.caption = ("ORT/ember > 1: ember faster. noise: largest IQR/median of the two series. "
                     "fallbacks: numpy nodes / all nodes.")
    table.caption_justify = "left"
    return table


def print_problems(results: list[Result], console: Console) -> None:
    """Errors and fallback nodes, grouped, for the engineers who own the compiler."""
    for r in results:
        if r.error:
            console.print(f"[red]{r.model}: ember {r.error_stage} failed[/]")
            console.print("  " + r.error.replace("\n", "\n  "), markup=False, highlight=False)
        if r.fallback_nodes:
            groups: dict[str, int] = {}
            for entry in r.fallback_nodes:
                op, _, rest = entry.partition(" ")
                key = f"{op}: {rest.partition(': ')[2]}"
                groups[key] = groups.get(key, 0) + 1
            console.print(f"[yellow]{r.model}: {r.fallbacks} fallback node(s)[/]")
            for key, count in sorted(groups.items(), key=lambda kv: -kv[1]):
                console.print(f"  {count:3d} x {key}", markup=False, highlight=False)


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Latency of ember-compiled models vs ONNX Runtime (interleaved medians).")
    defaults = " ".join(n for n, c in CASES.items() if c.default)
    parser.add_argument("--models", nargs="+", choices=list(CASES), metavar="MODEL",
                        help=f"models to run (default: {defaults}; "
                             f"choices: {', '.join(CASES)})")
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes (ResNet-18 at 64x64, BERT seq 32 hidden 128)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help="threads for ember and ORT intra-op (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed rounds per model (default: 30 for small models, "
                             "10-20 for big ones)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed rounds per contender first (default: %(default)s)")
    parser.add_argument("--no-ort-spin", action="store_true",
                        help="turn ORT's idle-thread spinning off (default: on, as deployed)")
    parser.add_argument("--traceback", action="store_true",
                        help="print the full traceback of ember failures (stderr)")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT",
                        help="also write the results (all samples) as JSON to OUT")
    args = parser.parse_args(argv)
    if args.threads < 1 or (args.repeat is not None and args.repeat < 1) or args.warmup < 0:
        parser.error("--threads and --repeat must be >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.models or [n for n, c in CASES.items() if c.default]
    console = Console(width=None if sys.stdout.isatty() else 140)
    log = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
    results = [bench_one(CASES[name], args.quick, args.threads, args.repeat, args.warmup, log,
                         args.traceback, not args.no_ort_spin)
               for name in names]
    console.print(render(results, args.threads, args.quick))
    print_problems(results, console)
    if args.json:
        payload = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "quick": args.quick, "threads": args.threads, "warmup": args.warmup,
            "ort_spinning": not args.no_ort_spin,
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "python": platform.python_version()},
            "versions": {"ember": ember.__version__, "onnxruntime": ort.__version__,
                         "onnx": onnx.__version__, "numpy": np.__version__},
            "results": [r.to_json() for r in results],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        console.print(f"results written to {args.json}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

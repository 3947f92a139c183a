"""ember against ONNX Runtime on an idle and on a busy machine: how the threads wait.

    .venv/bin/python benchmarks/bench_threads.py                       # tinynet b8, ResNet-18 b1
    .venv/bin/python benchmarks/bench_threads.py --models tinynet --calls 300 --json out.json
    .venv/bin/python benchmarks/bench_threads.py --policies default PASSIVE ACTIVE

A user's server is never idle, so a latency measured on an idle machine alone says little.
This benchmark times every contender on the idle machine and again while one busy-loop
process (``while True: pass``, not pinned) keeps one core's worth of CPU busy, as another
job on a shared server or CI runner does.

Each contender runs in a process of its own, started with the environment a user has: no
``OMP_*`` variable set (the ``--policies`` rows add ``OMP_WAIT_POLICY`` to ember's process
alone, to show that ember's latency does not depend on it).  ember runs the saved artifact
through the numpy-only runtime (``ember.runtime.load(path, threads=N)``), ONNX Runtime a
session with ``intra_op_num_threads=N`` (its defaults otherwise, spinning included).  The
contenders are interleaved: each takes a block of ``--block`` calls in turn, ``--pause``
seconds after the last block ended (so that the workers of the one before have stopped
spinning), until every one has ``--calls`` timed calls; the drift of a shared machine hits
them alike.  The table gives each one's median and 99th-percentile call
latency, ember's median over ONNX Runtime's, and each one's slowdown from idle to busy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODELS = {"tinynet": 8, "resnet18": 1}  # model -> batch
LOADS = ("idle", "busy")


# ----------------------------------------------------------------------------- worker side


def _worker(kind: str, path: str, threads: int) -> None:
    """A contender's process: load once, then answer "run N" with N call latencies (s)."""
    import numpy as np

    feeds = dict(np.load(Path(path).parent / "feeds.npz"))
    if kind == "ember":
        import ember.runtime

        model = ember.runtime.load(path, threads=threads)
        call = lambda: model.run(feeds)  # noqa: E731
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        call = lambda: session.run(None, feeds)  # noqa: E731
    for _ in range(5):  # warm-up: first touches, worker threads started
        call()
    print("ready", flush=True)
    for line in sys.stdin:
        count = int(line)
        samples = []
        for _ in range(count):
            start = time.perf_counter()
            call()
            samples.append(time.perf_counter() - start)
        print(json.dumps(samples), flush=True)


# ----------------------------------------------------------------------------- driver side


@dataclass
class Contender:
    """A contender's process and its timed calls."""

    label: str
    kind: str
    path: Path
    env: dict[str, str]
    samples: list[float] = field(default_factory=list)
    process: subprocess.Popen | None = None

    def start(self, threads: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker", self.kind, str(self.path),
             "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env)
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{self.label} did not start")

    def run(self, count: int) -> None:
        self.process.stdin.write(f"{count}\n")
        self.process.stdin.flush()
        self.samples.extend(json.loads(self.process.stdout.readline()))

    def stop(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait(timeout=60)


def _user_environment() -> dict[str, str]:
    """The environment a user's process has: this one's, less any OMP_* setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}


def _prepare(model: str, batch: int, root: Path, threads: int) -> tuple[Path, Path]:
    """Write the ONNX file, the inputs and ember's saved artifact for ``model``."""
    import numpy as np
    import onnx

    import ember
    from benchmarks.models import example_inputs, resnet18
    from ember.models import default_model_path

    folder = root / model
    folder.mkdir()
    if model == "tinynet":
        proto = onnx.load(default_model_path())
        name = proto.graph.input[0].name
        feeds = {name: np.random.default_rng(0).standard_normal((batch, 3, 32, 32))
                 .astype(np.float32)}
    elif model == "resnet18":
        proto = resnet18(batch=batch, image=224)
        feeds = example_inputs(proto)
    else:
        raise SystemExit(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    onnx_path = folder / "model.onnx"
    onnx.save(proto, onnx_path)
    np.savez(folder / "feeds.npz", **feeds)
    module = ember.compile(proto, input_shapes={k: v.shape for k, v in feeds.items()})
    artifact = module.save(folder / "model.ember")
    return onnx_path, artifact / "manifest.json"


def _busy_loop() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _time_interleaved(contenders: list[Contender], threads: int, calls: int,
                      block: int, pause: float) -> None:
    """Time ``contenders`` in turns of ``block`` calls until each has ``calls`` samples,
    ``pause`` seconds apart: a runtime's idle workers may spin for a while after its last
    call (ONNX Runtime's do, by default), and the next contender's block must not start
    while they hold a core."""
    for contender in contenders:
        contender.start(threads)
    try:
        order = list(contenders)
        while any(len(c.samples) < calls for c in order):
            for contender in order:
                left = calls - len(contender.samples)
                if left > 0:
                    time.sleep(pause)
                    contender.run(min(block, left))
            order.append(order.pop(0))  # rotate who goes first
    finally:
        for contender in contenders:
            contender.stop()


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--loads", nargs="+", default=list(LOADS), choices=LOADS)
    parser.add_argument("--policies", nargs="*", default=[],
                        help="OMP_WAIT_POLICY values for extra ember rows (default: none)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per contender")
    parser.add_argument("--block", type=int, default=50, help="calls per interleaved block")
    parser.add_argument("--pause", type=float, default=0.5,
                        help="seconds between two blocks (default 0.5), so that no "
                             "contender's idle workers still spin when the next one starts")
    parser.add_argument("--json", type=Path, help="write every contender's figures here")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(*args.worker, args.threads)
        return 0

    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 140))
    from ember.runtime.cpu import cpu_model_name

    cpu = cpu_model_name()
    console.print(f"CPU: {cpu}; {os.cpu_count()} logical CPUs; {args.threads} threads each; "
                  f"{args.calls} calls per contender")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ember-threads-") as tmp:
        prepared = {m: _prepare(m, MODELS[m], Path(tmp), args.threads) for m in args.models}
        for load in args.loads:
            busy = _busy_loop() if load == "busy" else None
            try:
                if busy is not None:
                    time.sleep(1.0)  # let the scheduler see the busy process
                for model in args.models:
                    onnx_path, manifest = prepared[model]
                    env = _user_environment()
                    contenders = [Contender("ember", "ember", manifest.parent, env),
                                  Contender("onnxruntime", "ort", onnx_path, env)]
                    for policy in args.policies:  # ember reads no OMP variable: all interleaved
                        contenders.append(Contender(f"ember, OMP_WAIT_POLICY={policy}", "ember",
                                                    manifest.parent,
                                                    env | {"OMP_WAIT_POLICY": policy}))
                    _time_interleaved(contenders, args.threads, args.calls, args.block,
                                      args.pause)
                    for contender in contenders:
                        rows.append({"load": load, "model": model, "batch": MODELS[model],
                                     "contender": contender.label,
                                     "median_ms": statistics.median(contender.samples) * 1e3,
                                     "p99_ms": _percentile(contender.samples, 0.99) * 1e3,
                                     "calls": len(contender.samples)})
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()

    table = Table(title=f"ember vs ONNX Runtime, {args.threads} threads, idle and with one "
                        f"busy-loop process ({cpu})")
    for column in ("load", "model", "contender", "median ms", "p99 ms", "p99/median",
                   "vs ORT", "busy/idle"):
        table.add_column(column, justify="right" if "ms" in column or "/" in column or
                         "vs" in column else "left")
    by_key = {(r["load"], r["model"], r["contender"]): r for r in rows}
    for r in rows:
        ort = by_key.get((r["load"], r["model"], "onnxruntime"))
        idle = by_key.get(("idle", r["model"], r["contender"]))
        table.add_row(r["load"], f"{r['model']} b{r['batch']}", r["contender"],
                      f"{r['median_ms']:.3f}", f"{r['p99_ms']:.3f}",
                      f"{r['p99_ms'] / r['median_ms']:.2f}",
                      f"{r['median_ms'] / ort['median_ms']:.2f}x" if ort else "",
                      f"{r['median_ms'] / idle['median_ms']:.2f}x"
                      if idle and r["load"] != "idle" else "")
    console.print(table)
    console.print("vs ORT: the contender's median over ONNX Runtime's in the same load "
                  "(above 1: slower); busy/idle: its median busy over its median idle.")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "threads": args.threads, "rows": rows},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

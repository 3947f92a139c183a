"""Load generator for ``ember serve``: throughput and latency per concurrency level, batching on
against batching off, overload and a bounded soak -- every response checked by request id.

    .venv/bin/python benchmarks/serve_load.py               # mlp, mlp_wide, resnet18, ~15 min
    .venv/bin/python benchmarks/serve_load.py --models mlp --concurrency 1 16 --seconds 5
    .venv/bin/python benchmarks/serve_load.py --soak 180 --json out.json

For each model (of ``ember bench``'s zoo at full size, or ``mlp_wide``) the script exports ONNX
with a dynamic batch (TorchScript exporter), compiles it with ember into a batch-blocked
artifact (blocks of 1, 2, 4, 8 and 16 samples), and computes the expected outputs of a pool of
distinct inputs with ONNX Runtime -- the oracle every response is compared with.  Then it
starts ``ember serve`` in a process of its own, once with batching (``--max-batch 16``) and
once without (``--max-batch 1``), and drives each from closed-loop clients: C concurrent
connections, each sending its next request when the last one is answered, for a bounded
number of requests and seconds.  The two servers are measured in alternation, ``--rounds``
times per level, and the medians reported.  Requests carry their tensors in binary (the
protocol's binary tensor extension, as ``tritonclient`` sends them).

Everything stays on 127.0.0.1.  The client shares the machine with the server (on 2 cores,
its own work is part of what limits the numbers; the report says so).

* overload: concurrency 4x the queue bound of a server started with ``--max-queue``: every
  request must get its own result, a 429 or a 504 -- none lost, none mismatched -- and the
  server's memory must stay bounded.
* soak: ``--soak`` seconds at concurrency 8 with batching; resident memory sampled
  throughout; any error but the intended ones is reported.
"""

from __future__ import annotations

import argparse
import warnings
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
POOL = 32  # distinct single-sample inputs per model
BLOCKS = (16, 8, 4, 2, 1)
TOLERANCE = 1e-3


@dataclass
class Prepared:
    name: str
    artifact: Path
    input_name: str
    output_name: str
    inputs: np.ndarray  # [POOL, ...] one sample per row
    expected: np.ndarray  # [POOL, ...]


@dataclass
class LevelResult:
    model: str
    mode: str
    concurrency: int
    requests: int
    seconds: float
    throughput: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    statuses: dict[str, int] = field(default_factory=dict)
    mismatched: int = 0
    lost: int = 0


# ---------------------------------------------------------------------- models


# A model whose weights (100 MB) do not fit in the caches: a call of one sample streams them
# from memory, as does a call of 16, so its calls cost the same at any small batch -- the
# case batching exists for, beside the zoo's MLP, whose 13 MB of weights stay in cache and
# whose call (under 0.1 ms) is far cheaper than the HTTP request around it.
WIDE_MLP_SIZES = (1024, 4096, 4096, 1024)


def build_model(name: str):
    """A model of ``ember bench``'s zoo (full size), or ``mlp_wide``."""
    from ember.bench.zoo import BuiltModel, get_entry

    if name != "mlp_wide":
        return get_entry(name).build(1, "full")
    import torch

    from ember.bench.nets import MLP

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = MLP(WIDE_MLP_SIZES).eval()
    features = np.random.default_rng(0).standard_normal((1, WIDE_MLP_SIZES[0]))
    return BuiltModel(module, {"input": features.astype(np.float32)}, ["probabilities"],
                      "-".join(map(str, WIDE_MLP_SIZES)))


def prepare(name: str, workdir: Path) -> Prepared:
    """Export, compile (batch blocks of BLOCKS), save, and compute the oracle's outputs."""
    import onnxruntime as ort
    import torch

    import ember

    built = build_model(name)
    (input_name, sample), = built.inputs.items()
    output_name = built.output_names[0]
    onnx_path = workdir / f"{name}.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(built.module, (torch.from_numpy(sample),), str(onnx_path),
                          dynamo=False, input_names=[input_name], output_names=[output_name],
                          dynamic_axes={input_name: {0: "batch"}, output_name: {0: "batch"}})
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((POOL, *sample.shape[1:])).astype(np.float32)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    expected = session.run([output_name], {input_name: inputs})[0]
    print(f"[{name}] compiling blocks {list(BLOCKS)} ...", flush=True)
    module = ember.compile(str(onnx_path))
    module(inputs[:BLOCKS[0]])
    artifact = module.save(workdir / f"{name}.ember", batch_blocks=list(BLOCKS))
    blocks = sorted(int(p.name[1:]) for p in artifact.iterdir() if p.name[1:].isdigit())
    print(f"[{name}] artifact {artifact} with blocks {blocks}", flush=True)
    return Prepared(name, artifact, input_name, output_name, inputs, expected)


# ---------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """``ember serve`` in a process of its own on a free localhost port."""

    def __init__(self, model: Prepared, *options: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ember", "serve", f"{model.name}={model.artifact}",
             "--port", str(self.port), "--log-level", "warning", *options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)

    def wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ember serve exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/v2/health/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError("ember serve did not get ready in 120 s")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


# ---------------------------------------------------------------------- load


def request_body(model: Prepared, index: int, request_id: str) -> tuple[bytes, dict]:
    sample = model.inputs[index % POOL][None]
    header = json.dumps({
        "id": request_id,
        "inputs": [{"name": model.input_name, "shape": list(sample.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": sample.nbytes}}],
        "outputs": [{"name": model.output_name, "parameters": {"binary_data": True}}],
    }).encode()
    return header + sample.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def check_response(model: Prepared, index: int, request_id: str, response) -> bool:
    """Whether the response is this request's and its output matches the oracle."""
    length = int(response.headers["inference-header-content-length"])
    document = json.loads(response.content[:length])
    if document.get("id") != request_id:
        return False
    entry = document["outputs"][0]
    output = np.frombuffer(response.content[length:], np.float32).reshape(entry["shape"])
    expected = model.expected[index % POOL][None]
    return output.shape == expected.shape and bool(
        np.allclose(output, expected, rtol=TOLERANCE, atol=TOLERANCE))


async def drive(model: Prepared, url: str, concurrency: int, max_requests: int,
                seconds: float, mode: str, timeout: float = 60.0) -> LevelResult:
    """Closed-loop clients: ``concurrency`` connections, each sending its next request when
    its last is answered, until ``max_requests`` are sent or ``seconds`` have passed."""
    import httpx

    latencies: list[float] = []
    statuses: dict[str, int] = {}
    counters = {"sent": 0, "mismatched": 0, "lost": 0}
    deadline = time.monotonic() + seconds

    async def client_loop() -> None:
        # A client (and connection) per user: one shared pool of many connections costs
        # httpx more per request than the server spends.
        async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
            while counters["sent"] < max_requests and time.monotonic() < deadline:
                index = counters["sent"]
                counters["sent"] += 1
                request_id = f"{mode}-{concurrency}-{index}"
                body, headers = request_body(model, index, request_id)
                start = time.perf_counter()
                try:
                    response = await client.post(f"/v2/models/{model.name}/infer",
                                                 content=body, headers=headers)
                except httpx.HTTPError:
                    counters["lost"] += 1
                    continue
                elapsed = time.perf_counter() - start
                key = str(response.status_code)
                statuses[key] = statuses.get(key, 0) + 1
                if response.status_code == 200:
                    latencies.append(elapsed)
                    if not check_response(model, index, request_id, response):
                        counters["mismatched"] += 1
                elif response.status_code not in (429, 504):
                    counters["mismatched"] += 1  # an error that overload does not explain

    start = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    done = len(latencies)
    ms = sorted(x * 1e3 for x in latencies) or [float("nan")]

    def percentile(q: float) -> float:
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    return LevelResult(model.name, mode, concurrency, counters["sent"], wall, done / wall,
                       percentile(0.50), percentile(0.95), percentile(0.99), statuses,
                       counters["mismatched"], counters["lost"])


def median_result(results: list[LevelResult]) -> LevelResult:
    """The round with the median throughput (its latencies go with it)."""
    ordered = sorted(results, key=lambda r: r.throughput)
    chosen = ordered[len(ordered) // 2]
    total_mismatched = sum(r.mismatched for r in results)
    total_lost = sum(r.lost for r in results)
    return LevelResult(**{**asdict(chosen), "mismatched": total_mismatched, "lost": total_lost})


# ---------------------------------------------------------------------- scenarios


def compare_batching(model: Prepared, levels: list[int], rounds: int, seconds: float,
                     max_requests: int) -> list[LevelResult]:
    modes = {"batching": ["--max-batch", "16"], "no batching": ["--max-batch", "1"]}
    servers = {mode: Server(model, *options) for mode, options in modes.items()}
    results: list[LevelResult] = []
    try:
        for server in servers.values():
            server.wait_ready()
        for level in levels:
            rounds_by_mode: dict[str, list[LevelResult]] = {mode: [] for mode in servers}
            for round_index in range(rounds):
                order = list(servers) if round_index % 2 == 0 else list(servers)[::-1]
                for mode in order:
                    asyncio.run(drive(model, servers[mode].url, level, 20, 2.0, "warm"))
                    rounds_by_mode[mode].append(asyncio.run(drive(
                        model, servers[mode].url, level, max_requests, seconds, mode)))
            for mode in servers:
                result = median_result(rounds_by_mode[mode])
                results.append(result)
                print(f"[{model.name}] {mode:12s} c={level:3d}: {result.throughput:8.1f} req/s "
                      f"p50 {result.p50_ms:7.2f} p95 {result.p95_ms:7.2f} p99 "
                      f"{result.p99_ms:7.2f} ms  statuses {result.statuses} mismatched "
                      f"{result.mismatched} lost {result.lost}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return results


def overload(model: Prepared, queue: int, seconds: float) -> dict:
    server = Server(model, "--max-batch", "16", "--max-queue", str(queue), "--timeout", "2")
    try:
        server.wait_ready()
        before = server.rss_mb()
        result = asyncio.run(drive(model, server.url, 4 * queue, 100_000, seconds, "overload"))
        after = server.rss_mb()
    finally:
        server.stop()
    report = {"model": model.name, "queue": queue, "concurrency": 4 * queue,
              **asdict(result), "rss_before_mb": before, "rss_after_mb": after}
    print(f"[{model.name}] overload c={4 * queue} queue={queue}: statuses {result.statuses}, "
          f"mismatched {result.mismatched}, lost {result.lost}, RSS {before:.0f} -> "
          f"{after:.0f} MB", flush=True)
    return report


def soak(model: Prepared, seconds: float, concurrency: int = 8) -> dict:
    server = Server(model, "--max-batch", "16")
    samples: list[float] = []
    try:
        server.wait_ready()
        asyncio.run(drive(model, server.url, concurrency, 200, 5.0, "warm"))

        async def sample_memory(stop: asyncio.Event) -> None:
            while not stop.is_set():
                samples.append(server.rss_mb())
                try:
                    await asyncio.wait_for(stop.wait(), 5.0)
                except TimeoutError:
                    pass

        async def run() -> LevelResult:
            stop = asyncio.Event()
            sampler = asyncio.create_task(sample_memory(stop))
            result = await drive(model, server.url, concurrency, 10_000_000, seconds, "soak")
            stop.set()
            await sampler
            return result

        result = asyncio.run(run())
    finally:
        server.stop()
    third = max(1, len(samples) // 3)
    report = {"model": model.name, "seconds": seconds, **asdict(result),
              "rss_mb_first_third_max": max(samples[:third]),
              "rss_mb_last_third_max": max(samples[-third:]), "rss_mb_samples": samples}
    print(f"[{model.name}] soak {seconds:g} s c={concurrency}: {result.requests} requests, "
          f"statuses {result.statuses}, mismatched {result.mismatched}, lost {result.lost}, "
          f"RSS max {report['rss_mb_first_third_max']:.0f} MB (first third) -> "
          f"{report['rss_mb_last_third_max']:.0f} MB (last third)", flush=True)
    return report


def print_table(results: list[LevelResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="ember serve: batching on (max 16) vs off, closed-loop clients")
    for column in ("model", "mode", "conc.", "req/s", "p50 ms", "p95 ms", "p99 ms",
                   "vs off", "statuses", "wrong", "lost"):
        table.add_column(column, justify="right" if column not in ("model", "mode") else "left")
    off = {(r.model, r.concurrency): r.throughput for r in results if r.mode == "no batching"}
    for r in results:
        ratio = r.throughput / off[(r.model, r.concurrency)]
        table.add_row(r.model, r.mode, str(r.concurrency), f"{r.throughput:.1f}",
                      f"{r.p50_ms:.2f}", f"{r.p95_ms:.2f}", f"{r.p99_ms:.2f}", f"{ratio:.2f}x",
                      " ".join(f"{k}:{v}" for k, v in sorted(r.statuses.items())),
                      str(r.mismatched), str(r.lost))
    Console(width=160).print(table)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "mlp_wide", "resnet18"],
                        help="models of ember bench's zoo, or mlp_wide (default: %(default)s)")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per level")
    parser.add_argument("--seconds", type=float, default=6.0, help="bound per round")
    parser.add_argument("--requests", type=int, default=5000, help="bound per round")
    parser.add_argument("--overload-queue", type=int, default=8,
                        help="queue bound of the overload run (0: skip it)")
    parser.add_argument("--overload-seconds", type=float, default=10.0)
    parser.add_argument("--soak", type=float, default=0.0,
                        help="seconds of the soak run on the first model (0: skip it)")
    parser.add_argument("--json", type=Path, help="write every result to this file")
    args = parser.parse_args()

    print(f"CPU: {cpu_name()}, {len(os.sched_getaffinity(0))} CPUs", flush=True)
    report: dict = {"cpu": cpu_name(), "levels": [], "overload": [], "soak": None}
    with tempfile.TemporaryDirectory(prefix="ember-serve-load-") as tmp:
        prepared = [prepare(name, Path(tmp)) for name in args.models]
        for model in prepared:
            results = compare_batching(model, args.concurrency, args.rounds, args.seconds,
                                       args.requests)
            report["levels"].extend(asdict(r) for r in results)
            if args.overload_queue:
                report["overload"].append(overload(model, args.overload_queue,
                                                   args.overload_seconds))
        if args.soak:
            report["soak"] = soak(prepared[0], args.soak)
    print_table([LevelResult(**r) for r in report["levels"]])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    bad = sum(r["mismatched"] + r["lost"] for r in report["levels"]) + sum(
        r["mismatched"] + r["lost"] for r in report["overload"])
    if report["soak"]:
        bad += report["soak"]["mismatched"] + report["soak"]["lost"]
    if bad:
        print(f"{bad} responses were lost, mismatched or unexpected errors", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

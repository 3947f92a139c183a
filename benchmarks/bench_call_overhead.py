"""What one call costs beyond its kernels: ember's Python -> C -> Python path vs ONNX Runtime's.

    .venv/bin/python benchmarks/bench_call_overhead.py                  # Add and Relu of [1, 16]
    .venv/bin/python benchmarks/bench_call_overhead.py --rounds 400 --calls 500 --json out.json

The models are single nodes on 16 floats (``Add`` of two ``float32[1, 16]``, ``Relu`` of one),
so the kernel takes nanoseconds and a call's latency IS its overhead: binding and checking
the inputs, allocating the outputs, crossing into the library and back.  Contenders, per
model, all in this one process and with the defaults a user gets (no environment variable
set, default thread counts):

* ``ember module``      ``module(x, y)``: the module ``ember.compile`` returns
* ``ember loaded``      ``model(x, y)``: the saved artifact, ``ember.runtime.load``-ed
* ``ember module out=`` / ``ember loaded out=``: the same with caller-given output arrays
  (``model(x, y, out=[z])``, ``z`` an array an earlier call returned: 64-byte aligned, so
  the library writes it directly); ``ember loaded out=, +16B``: ``z`` 16 bytes past a
  64-byte boundary, as ``np.empty`` often places it (the results are copied in).  Skipped
  by an ember without ``out=``.
* ``ember_run (ctypes)`` the library's entry point called directly through ctypes on
  prepared pointer arrays: the floor any Python caller pays (a ctypes call and the kernel)
* ``ORT run``           ``session.run(None, {"x": x, "y": y})``
* ``ORT io_binding``    ``session.run_with_iobinding`` on inputs and outputs bound once
  (ONNX Runtime's own caller-given outputs)

Every round takes one sample of each contender -- ``--calls`` back-to-back calls, timed with
``perf_counter_ns`` -- in an order that rotates every round, so that the drift of a shared
machine hits every contender alike; GC is off while timing.  The table gives each
contender's median over ``--rounds`` rounds in microseconds per call, its interquartile
spread, and its median over ONNX Runtime's ``run`` (< 1: cheaper than ORT).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import ember  # noqa: E402
import ember.runtime  # noqa: E402
from ember.runtime.cpu import cpu_model_name  # noqa: E402

SHAPE = [1, 16]


def one_node_model(op: str) -> onnx.ModelProto:
    """``op`` of one (Relu) or two (Add) float32 [1, 16] inputs, as a one-node ONNX model."""
    names = ["x", "y"] if op == "Add" else ["x"]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["z"])], op.lower(),
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in names],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, SHAPE)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _takes_out(model: Any, arrays: list[np.ndarray]) -> bool:
    try:
        model(*arrays, out=[np.empty(SHAPE, np.float32)])
    except TypeError:
        return False
    except ember.EmberError as error:  # an ember whose call has no out= takes it for an input
        return "out" not in str(error)
    return True


def off_boundary(shape: list[int], offset: int) -> np.ndarray:
    """An uninitialized float32 array whose data starts ``offset`` bytes past a 64-byte
    boundary."""
    count = int(np.prod(shape))
    raw = np.empty(count * 4 + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    return raw[start:start + count * 4].view(np.float32).reshape(shape)


def raw_entry_point(model: Any, arrays: list[np.ndarray], out: np.ndarray) -> Callable[[], Any]:
    """``ember_run`` on prepared pointer arrays, past every Python step of the runtime."""
    lib = model._lib
    ins = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    outs = (ctypes.c_void_p * 1)(out.ctypes.data)
    weights, workspace = model._weights_address, model._workspace_address
    callback = model._host_callback
    run = lib.ember_run

    def call() -> Any:
        return run(ins, outs, weights, workspace, callback, None)

    return call


def contenders(op: str, workdir: Path) -> tuple[dict[str, Callable[[], Any]], np.ndarray]:
    proto = one_node_model(op)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(SHAPE).astype(np.float32)
              for _ in proto.graph.input]
    feeds = {i.name: a for i, a in zip(proto.graph.input, arrays)}
    expected = arrays[0] + arrays[1] if op == "Add" else np.maximum(arrays[0], 0)

    module = ember.compile(proto)
    module(*arrays)
    loaded = ember.runtime.load(module.save(workdir / f"{op.lower()}.ember"))
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])

    runs: dict[str, Callable[[], Any]] = {
        "ember module": lambda: module(*arrays),
        "ember loaded": lambda: loaded(*arrays),
    }
    targets: dict[str, np.ndarray] = {}   # the array each out= contender writes
    for name, model in (("ember module out=", module), ("ember loaded out=", loaded),
                        ("ember loaded out=, +16B", loaded)):
        if _takes_out(model, arrays):
            # the arrays a call returns (64-byte aligned: written in place), or one 16 bytes
            # past a 64-byte boundary, as np.empty often gives (written through a copy)
            targets[name] = off_boundary(SHAPE, 16) if name.endswith("+16B") else \
                model(*arrays)
            runs[name] = (lambda m, t: lambda: m(*arrays, out=t))(model, [targets[name]])
    raw_out = loaded(*arrays)  # a fresh output array, 64-byte aligned as the code assumes
    runs["ember_run (ctypes)"] = raw_entry_point(loaded, arrays, raw_out)
    runs["ORT run"] = lambda: session.run(None, feeds)
    binding = session.io_binding()
    ort_out = np.empty(SHAPE, np.float32)
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    binding.bind_output("z", "cpu", 0, np.float32, SHAPE, ort_out.ctypes.data)
    runs["ORT io_binding"] = lambda: session.run_with_iobinding(binding)

    # every contender computes the same thing
    for name, run in runs.items():
        result = run()
        if name == "ember_run (ctypes)":
            assert result == 0, result
            result = raw_out
        elif name == "ORT io_binding":
            result = ort_out
        elif name == "ORT run":
            result = result[0]
        elif name in targets:
            assert result is targets[name], f"{name} returned another array"
        np.testing.assert_allclose(result, expected, rtol=1e-6, atol=1e-6, err_msg=name)
    return runs, expected


def measure(runs: dict[str, Callable[[], Any]], rounds: int, calls: int,
            warmup: int) -> dict[str, list[float]]:
    """Per-call microseconds of every contender, one sample a round, rotated order."""
    names = list(runs)
    for name in names:
        for _ in range(warmup):
            runs[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter_ns
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for index in range(rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                run = runs[name]
                start = clock()
                for _ in range(calls):
                    run()
                samples[name].append((clock() - start) / calls / 1e3)
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def spread(values: list[float]) -> float:
    q1, _, q3 = statistics.quantiles(values, n=4)
    return (q3 - q1) / statistics.median(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", nargs="+", default=["Add", "Relu"], choices=["Add", "Relu"])
    parser.add_argument("--rounds", type=int, default=200, help="samples per contender")
    parser.add_argument("--calls", type=int, default=200, help="calls per sample")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls first")
    parser.add_argument("--json", type=Path, help="write every sample here")
    args = parser.parse_args(argv)

    print(f"CPU: {cpu_model_name()}; ember {getattr(ember, '__version__', '?')}, "
          f"onnxruntime {ort.__version__}, numpy {np.__version__}, Python "
          f"{sys.version.split()[0]}")
    print(f"{args.rounds} rounds x {args.calls} calls per contender, interleaved; "
          f"median us per call")
    report: dict[str, Any] = {"cpu": cpu_model_name(), "rounds": args.rounds,
                              "calls": args.calls, "models": {}}
    with tempfile.TemporaryDirectory(prefix="ember-call-overhead-") as tmp:
        for op in args.ops:
            runs, _ = contenders(op, Path(tmp))
            samples = measure(runs, args.rounds, args.calls, args.warmup)
            medians = {name: statistics.median(values) for name, values in samples.items()}
            ort_median = medians["ORT run"]
            print(f"\n{op} of float32{SHAPE}")
            print(f"  {'contender':<26}{'median us':>10}{'IQR/med':>9}{'/ ORT run':>11}")
            for name, median in medians.items():
                print(f"  {name:<26}{median:>10.2f}{spread(samples[name]):>9.2f}"
                      f"{median / ort_median:>11.2f}")
            report["models"][op] = {name: {"median_us": medians[name],
                                           "ratio_to_ort_run": medians[name] / ort_median,
                                           "samples_us": samples[name]} for name in samples}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

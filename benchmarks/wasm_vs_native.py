"""A wasm32 export in wasmtime against the native build, one thread each, with ONNX Runtime.

    .venv/bin/python benchmarks/wasm_vs_native.py                       # ResNet-18, MobileNetV2
    .venv/bin/python benchmarks/wasm_vs_native.py --models mobilenet_v2 --rounds 5
    .venv/bin/python benchmarks/wasm_vs_native.py --onnx model.onnx --shape 1,3,224,224

The zoo models come from ``ember bench``'s zoo (torchscript exporter, batch 1, 224x224). Each
model is exported for ``wasm32-wasi`` (``ember.export``) and run through
``ember.runtime.wasm.WasmModel`` (wasmtime, one thread: wasm has no threads here), and
compiled natively for this machine (``ember.compile(..., threads=1)``) and for plain SSE2
(``target="x86_64"``, 128-bit vectors like wasm's SIMD128, no FMA: what the ISA alone costs);
ONNX Runtime runs with one intra-op thread.  Every round times each contender in turn
(``ember.bench.timing.measure_interleaved``: samples of back-to-back calls, rounds rotating
the order); the table gives the medians over rounds and the ratios to the native build.
The outputs are checked against the native build first.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ember  # noqa: E402
from ember.bench.export import zoo_model_path  # noqa: E402
from ember.bench.timing import measure_interleaved  # noqa: E402


def measure(path: Path, shape: tuple[int, ...] | None, rounds: int) -> dict[str, float]:
    import onnxruntime
    from ember.runtime.wasm import WasmModel

    model = onnx.load(str(path))
    initializers = {i.name for i in model.graph.initializer}
    first = next(vi for vi in model.graph.input if vi.name not in initializers)
    if shape is None:
        shape = tuple(d.dim_value or 1 for d in first.type.tensor_type.shape.dim)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    feeds = {first.name: x}
    directory = tempfile.mkdtemp(prefix="ember-wasm-")
    ember.export(path, directory, target="wasm32-wasi", input_shapes={first.name: shape},
                 name="model")
    wasm = WasmModel(directory)
    native = ember.compile(path, input_shapes={first.name: shape}, threads=1)
    sse2 = ember.compile(path, input_shapes={first.name: shape}, threads=1, target="x86_64")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options,
                                           providers=["CPUExecutionProvider"])
    expected = native(x)
    got = next(iter(wasm.run(feeds).values()))
    error = float(np.max(np.abs(got - expected)))
    print(f"  max |wasm - native| = {error:.2e}")
    contenders = {"wasm32 (wasmtime)": lambda: wasm.run(feeds), "native": lambda: native(x),
                  "native SSE2": lambda: sse2(x),
                  "ONNX Runtime": lambda: session.run(None, feeds)}
    measured = measure_interleaved(contenders, rounds, min_sample_seconds=0.2)
    return {name: series.median for name, series in measured.series.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=["resnet18", "mobilenet_v2"])
    parser.add_argument("--onnx", type=Path, help="an ONNX model instead of the zoo's")
    parser.add_argument("--shape", help="its first input's shape, e.g. 1,3,224,224")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cases = [(str(args.onnx), args.onnx)] if args.onnx else \
        [(name, zoo_model_path(name)) for name in args.models]
    shape = tuple(int(d) for d in args.shape.split(",")) if args.shape else None
    print("CPU:", ember.Target.native().triple, "| one thread each")
    for name, path in cases:
        print(f"{name}:")
        medians = measure(path, shape, args.rounds)
        native = medians["native"]
        for contender, ms in medians.items():
            print(f"  {contender:18s} {ms:9.2f} ms   {ms / native:5.2f}x native")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every export target on the zoo's models: do the outputs match, and how fast do they run?

    .venv/bin/python benchmarks/export_targets.py                    # tiny zoo sizes, batch 1
    .venv/bin/python benchmarks/export_targets.py --size full --models resnet18 mobilenet_v2
    .venv/bin/python benchmarks/export_targets.py --targets host wasm32-wasi

Each zoo model (``ember bench``'s zoo, torchscript exporter) is exported with ``ember.export``
for each target and run on the zoo's inputs: ``host`` through the C API (ctypes on the shared
library), ``aarch64-linux`` as ``examples/c/run_model.c`` linked statically and run under
``qemu-aarch64-static``, ``wasm32-wasi`` in wasmtime (``ember.runtime.wasm``).  The table
gives, per model and target, the largest absolute difference from ember's numpy reference
executor (the oracle the tests use) and the time per call where it means something (host
and wasm32 on one thread; qemu's time is an emulator's).  Models an export refuses (numpy
fallback nodes) say why.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ember  # noqa: E402
from ember.bench.timing import time_calls  # noqa: E402
from ember.frontend.onnx import import_onnx  # noqa: E402
from ember.interp import ReferenceExecutor  # noqa: E402

TARGETS = ("host", "aarch64-linux", "wasm32-wasi")


def _median_ms(fn, calls: int = 5) -> float:
    """The median of ``calls`` single calls, in milliseconds."""
    return statistics.median(time_calls(fn, 1) * 1e3 for _ in range(calls))


def _run_host(directory: Path, prefix: str, feeds: list[np.ndarray]
              ) -> tuple[list[np.ndarray], float]:
    lib = ctypes.CDLL(str(directory / f"lib{prefix}.so"))
    api = {name: getattr(lib, f"{prefix}_{name}") for name in (
        "open", "run", "destroy", "num_outputs", "output_nbytes", "output_shape",
        "output_dtype", "set_num_threads")}
    api["output_nbytes"].restype = ctypes.c_size_t
    api["output_shape"].restype = ctypes.POINTER(ctypes.c_int64)
    api["output_rank"] = getattr(lib, f"{prefix}_output_rank")
    api["open"].argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    api["run"].argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    api["destroy"].argtypes = [ctypes.c_void_p]
    handle = ctypes.c_void_p()
    weights = str(directory / f"{prefix}.weights").encode()
    if api["open"](1, weights, ctypes.byref(handle)) != 0:
        raise RuntimeError("cannot open the model")
    api["set_num_threads"](1)
    dtypes = {1: np.float32, 7: np.int64, 6: np.int32, 11: np.float64, 9: np.bool_}
    outputs = []
    for j in range(api["num_outputs"]()):
        rank = api["output_rank"](j)
        shape = tuple(api["output_shape"](j)[:rank])
        outputs.append(np.empty(shape, dtypes[api["output_dtype"](j)]))
    inputs = (ctypes.c_void_p * len(feeds))(*[f.ctypes.data for f in feeds])
    pointers = (ctypes.c_void_p * len(outputs))(*[o.ctypes.data for o in outputs])

    def call() -> None:
        if api["run"](handle, inputs, pointers) != 0:
            raise RuntimeError("run failed")

    call()
    ms = _median_ms(call, 10)
    api["destroy"](handle)
    return outputs, ms


def _run_aarch64(directory: Path, prefix: str, feeds: list[np.ndarray], work: Path,
                 output_specs: list[tuple]) -> list[np.ndarray]:
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        raise RuntimeError("no qemu-aarch64")
    program = work / "run_model"
    subprocess.run([sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-linux-musl",
                    "-static", "-O2", f"-I{directory}", f"-DMODEL={prefix}",
                    str(ROOT / "examples" / "c" / "run_model.c"),
                    str(directory / f"lib{prefix}.a"), "-lm", "-o", str(program)], check=True,
                   capture_output=True)
    arguments = []
    for i, feed in enumerate(feeds):
        path = work / f"input{i}.bin"
        path.write_bytes(np.ascontiguousarray(feed).tobytes())
        arguments += ["-i", str(path)]
    out = work / "out"
    out.mkdir(exist_ok=True)
    subprocess.run([qemu, str(program), str(directory / f"{prefix}.weights"), *arguments,
                    "-o", str(out)], check=True, capture_output=True, timeout=1800)
    return [np.fromfile(out / f"output{j}.bin", dtype).reshape(shape)
            for j, (dtype, shape) in enumerate(output_specs)]


def main() -> int:
    from ember.bench.export import export_model
    from ember.bench.zoo import get_entry

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*",
                        default=["mlp", "resnet18", "mobilenet_v2", "bert_base"])
    parser.add_argument("--size", default="tiny", choices=("tiny", "full"))
    parser.add_argument("--targets", nargs="*", default=list(TARGETS))
    args = parser.parse_args()
    print(f"CPU: {ember.Target.native().triple}; zoo size {args.size}, batch 1")
    print(f"{'model':14s} {'target':15s} {'max |diff|':>11s} {'ms/call':>9s}  note")
    for name in args.models:
        entry = get_entry(name)
        built = entry.build(1, args.size)
        record = export_model(entry, built, args.size, 1, "torchscript")
        if record.path is None:
            print(f"{name:14s} {'-':15s} export failed: {record.error[:80]}")
            continue
        graph = import_onnx(record.path)
        feeds = {n: np.asarray(v) for n, v in built.inputs.items()}
        ordered = [np.ascontiguousarray(feeds[n]) for n in graph.inputs]
        expected = ReferenceExecutor(graph).run(dict(zip(graph.inputs, ordered)))
        expected = [expected[n] for n in graph.outputs]
        shapes = {n: a.shape for n, a in zip(graph.inputs, ordered)}
        for target in args.targets:
            work = Path(tempfile.mkdtemp(prefix="ember-export-"))
            note, ms = "", float("nan")
            try:
                ember.export(record.path, work / "model", target=target, input_shapes=shapes,
                             name="model")
                if target == "host":
                    got, ms = _run_host(work / "model", "model", ordered)
                elif target.startswith("wasm32"):
                    from ember.runtime.wasm import WasmModel

                    model = WasmModel(work / "model")
                    named = dict(zip(graph.inputs, ordered))
                    got = list(model.run(named).values())
                    ms = _median_ms(lambda: model.run(named), 5)
                else:
                    got = _run_aarch64(work / "model", "model", ordered, work,
                                       [(e.dtype, e.shape) for e in expected])
                    note = "under qemu"
                diff = max(float(np.max(np.abs(g.astype(np.float64) - e.astype(np.float64))))
                           for g, e in zip(got, expected))
                print(f"{name:14s} {target:15s} {diff:11.2e} {ms:9.3f}  {note}")
            except Exception as error:  # report and go on to the next
                print(f"{name:14s} {target:15s} {'-':>11s} {'-':>9s}  "
                      f"{type(error).__name__}: {str(error).splitlines()[0][:90]}")
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

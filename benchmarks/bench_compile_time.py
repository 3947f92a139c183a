"""Compile time against model size: chains, wide fans and a 32-layer decoder, time per node.

    .venv/bin/python benchmarks/bench_compile_time.py                   # the default ladder
    .venv/bin/python benchmarks/bench_compile_time.py --families relu_chain --sizes 1000 20000
    .venv/bin/python benchmarks/bench_compile_time.py --families decoder --json out.json

A compiler whose time grows faster than the model walks into a wall on large real models (a
32-layer decoder has thousands of nodes).  This benchmark builds graphs of growing size and
reports, per graph, the seconds of each compile phase and the milliseconds per node: if the
per-node figure stays flat as the size grows 10x, compile time is linear.

Families (``--families``; ONNX graphs built with ``onnx.helper``, fp32, static shapes):

* ``relu_chain`` -- ``x -> Relu -> Relu -> ...`` (one fused chain);
* ``add_chain`` -- ``v = Add(v, x)`` repeated (every node also reads the graph input);
* ``mixed_chain`` -- a chain cycling through Relu, Mul by a constant, Sigmoid, Add of the
  input, Tanh, a 64x64 MatMul and a Reshape/Transpose pair;
* ``wide_fan`` -- one input feeding N branches (Mul by a constant, Relu), joined by a ``Sum``
  of all N;
* ``wide_concat`` -- N branches joined by a ``Concat`` of all N;
* ``decoder`` -- a Llama-style decoder (transformers ``LlamaConfig``, 32 layers, hidden 64,
  random weights, eager attention, sequence 16) exported once with ``torch.onnx.export`` and
  cached under the output directory; its size is fixed (``--sizes`` does not apply).

Every compile runs in a fresh process with an empty compile cache (``EMBER_CACHE_DIR`` set to
a new directory: the cost a user pays the first time), so nothing is shared between sizes.
Phases, as :class:`ember.driver.pipeline.Build` records them (``phase_seconds``): ``import``
(ONNX to ember's graph), ``passes`` (specialization, graph passes and fusion), ``lower``
(fused groups to loop IR), ``kernels`` (scheduling and C generation; the C compiler starts
on each kernel meanwhile), ``finish`` (memory plan, entry point, waiting for the C compiler
and linking).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_SIZES = (250, 1000, 4000, 20000)
FAMILIES = ("relu_chain", "add_chain", "mixed_chain", "wide_fan", "wide_concat", "decoder")
DEFAULT_FAMILIES = ("relu_chain", "add_chain", "mixed_chain", "wide_fan", "decoder")


# ----------------------------------------------------------------------------- graphs


def build_model(family: str, size: int):
    """The ONNX model of ``family`` with about ``size`` nodes."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    shape = [4, 64]
    prev = "x"

    def const(name: str, array) -> str:
        inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    if family in ("relu_chain", "add_chain"):
        for i in range(size):
            inputs = [prev] if family == "relu_chain" else [prev, "x"]
            nodes.append(helper.make_node("Relu" if family == "relu_chain" else "Add",
                                          inputs, [f"v{i}"]))
            prev = f"v{i}"
        output = prev
    elif family == "mixed_chain":
        weight = const("w", rng.standard_normal((64, 64)) * 0.1)
        scale = const("c", [0.5])
        inits.append(numpy_helper.from_array(np.array([4, 64], np.int64), "shape"))
        inits.append(numpy_helper.from_array(np.array([64, 4], np.int64), "shape_t"))
        i = 0
        while len(nodes) < size:
            step = i % 8
            out = f"v{i}"
            if step == 0:
                nodes.append(helper.make_node("Relu", [prev], [out]))
            elif step == 1:
                nodes.append(helper.make_node("Mul", [prev, scale], [out]))
            elif step == 2:
                nodes.append(helper.make_node("Sigmoid", [prev], [out]))
            elif step == 3:
                nodes.append(helper.make_node("Add", [prev, "x"], [out]))
            elif step == 4:
                nodes.append(helper.make_node("Tanh", [prev], [out]))
            elif step == 5:
                nodes.append(helper.make_node("MatMul", [prev, weight], [out]))
            elif step == 6:
                nodes.append(helper.make_node("Transpose", [prev], [out], perm=[1, 0]))
            else:
                nodes.append(helper.make_node("Transpose", [prev], [out], perm=[1, 0]))
            prev = out
            i += 1
        output = prev
    elif family in ("wide_fan", "wide_concat"):
        branches = []
        for i in range(size):
            scale = const(f"c{i}", [1.0 + i / size])
            nodes.append(helper.make_node("Mul", ["x", scale], [f"m{i}"]))
            nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"]))
            branches.append(f"r{i}")
        if family == "wide_fan":
            nodes.append(helper.make_node("Sum", branches, ["y"]))
        else:
            nodes.append(helper.make_node("Concat", branches, ["y"], axis=0))
            shape_out = [4 * size, 64]
        output = "y"
    else:
        raise ValueError(f"unknown family {family!r}")
    out_shape = shape_out if family == "wide_concat" else shape
    graph = helper.make_graph(
        nodes, family, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by ONNX Runtime too
    return model


def export_decoder(path: Path) -> Path:
    """A 32-layer Llama-style decoder from a config, exported to ONNX once (then reused)."""
    if path.exists():
        return path
    import torch
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=32,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                         max_position_embeddings=64, attn_implementation="eager")
    torch.manual_seed(0)
    model = LlamaModel(config).eval()
    model.config.use_cache = False
    ids = torch.randint(0, 256, (1, 16))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(model, (ids,), str(path), input_names=["input_ids"],
                      output_names=["hidden"], dynamo=True, external_data=False)
    return path


# ----------------------------------------------------------------------------- one compile


def _compile_once(model_path: str) -> dict:
    """Compile one model in this (fresh) process; the phase times as a dict."""
    import onnx

    import ember
    from ember.frontend.onnx import import_onnx

    proto = onnx.load(model_path)
    nodes = len(proto.graph.node)
    started = time.perf_counter()
    graph = import_onnx(proto)
    imported = time.perf_counter() - started
    started = time.perf_counter()
    module = ember.compile(graph)
    total = time.perf_counter() - started
    build = module.build if hasattr(module, "build") else None
    phases = dict(getattr(build, "phase_seconds", {}) or {})
    return {"nodes": nodes, "import": imported, "compile": total, **phases,
            "kernels_built": len(build.kernels) if build is not None else None}


def run_one(model_path: Path, timeout: float) -> dict:
    """Compile ``model_path`` in a fresh process with an empty cache."""
    with tempfile.TemporaryDirectory(prefix="ember-ct-cache-") as cache:
        env = {**os.environ, "EMBER_CACHE_DIR": cache}
        code = (f"import json, sys; sys.path.insert(0, {str(REPO)!r}); "
                f"from benchmarks.bench_compile_time import _compile_once; "
                f"print(json.dumps(_compile_once({str(model_path)!r})))")
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"over {timeout:.0f} s"}
        wall = time.perf_counter() - started
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:200]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process"] = wall
    return result


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=DEFAULT_FAMILIES)
    parser.add_argument("--sizes", nargs="+", type=int, default=DEFAULT_SIZES)
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds one compile may take (default 900)")
    parser.add_argument("--work-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "ember-compile-time")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    import onnx

    from ember.runtime.cpu import cpu_model_name

    args.work_dir.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_model_name()}; {os.cpu_count()} CPUs; fresh process and empty compile "
          f"cache per compile")
    header = (f"{'family':<12} {'nodes':>6} {'kernels':>7} {'import':>7} {'passes':>7} "
              f"{'lower':>7} {'sched+C':>8} {'finish':>7} {'total':>7} {'ms/node':>8}")
    print(header)
    rows = []
    for family in args.families:
        sizes = [None] if family == "decoder" else args.sizes
        for size in sizes:
            if family == "decoder":
                path = export_decoder(args.work_dir / "decoder32.onnx")
            else:
                path = args.work_dir / f"{family}_{size}.onnx"
                onnx.save(build_model(family, size), str(path))
            result = run_one(path, args.timeout)
            result["family"] = family
            rows.append(result)
            if "error" in result:
                print(f"{family:<12} {size or '':>6} failed: {result['error']}")
                continue
            total = result["import"] + result["compile"]
            per_node = 1000 * total / max(result["nodes"], 1)
            print(f"{family:<12} {result['nodes']:>6} {result['kernels_built'] or 0:>7} "
                  f"{result['import']:>7.2f} "
                  f"{result.get('specialize', 0) + result.get('passes', 0):>7.2f} "
                  f"{result.get('lower', 0):>7.2f} {result.get('kernels', 0):>8.2f} "
                  f"{result.get('finish', 0):>7.2f} {total:>7.2f} {per_node:>8.2f}",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

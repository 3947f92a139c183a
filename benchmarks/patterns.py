"""Fused patterns against ONNX Runtime: SiLU, GroupNorm, LayerNorm + GELU, softmax.

Each pattern is a small ONNX model written the way the exporters write it (SiLU as
``x * Sigmoid(x)``, GroupNorm as Reshape + InstanceNormalization + Reshape + Mul + Add, GELU
as the erf formula), compiled by ember and run by ONNX Runtime on the same input, each in a
worker process of its own (``ember.bench.isolation``: one runtime's spinning thread pool is
not charged to the other) and timed in interleaved rounds (``ember.bench.timing``) with the
same thread count; outputs are checked against each other.  Ratios within one run are the figures to read: the machine is
shared and absolute times drift (see benchmarks/README.md).

    .venv/bin/python benchmarks/patterns.py
    .venv/bin/python benchmarks/patterns.py --patterns silu groupnorm --rounds 20
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ember  # noqa: E402
from ember.bench.isolation import IsolatedContender, Recipe  # noqa: E402
from ember.bench.peers import Prepared  # noqa: E402
from ember.bench.timing import measure_interleaved  # noqa: E402

F32 = TensorProto.FLOAT


def _model(nodes, x_shape, constants: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "pattern", [helper.make_tensor_value_info("x", F32, list(x_shape))],
        [helper.make_tensor_value_info("y", F32, None)],
        [numpy_helper.from_array(v, k) for k, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def silu(rng) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    shape = (8, 64, 56, 56)
    return _model([helper.make_node("Sigmoid", ["x"], ["s"]),
                   helper.make_node("Mul", ["x", "s"], ["y"])], shape, {}), shape


def groupnorm(rng) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    n, c, h, w, groups = 8, 64, 56, 56, 32
    constants = {"shape": np.array([n, groups, -1], np.int64),
                 "back": np.array([n, c, h, w], np.int64),
                 "ones": np.ones(groups, np.float32), "zeros": np.zeros(groups, np.float32),
                 "gamma": rng.standard_normal((c, 1, 1)).astype(np.float32),
                 "beta": rng.standard_normal((c, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["i"],
                              epsilon=1e-5),
             helper.make_node("Reshape", ["i", "back"], ["b"]),
             helper.make_node("Mul", ["b", "gamma"], ["g"]),
             helper.make_node("Add", ["g", "beta"], ["y"])]
    return _model(nodes, (n, c, h, w), constants), (n, c, h, w)


def layernorm_gelu(rng) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    shape = (8, 128, 768)
    constants = {"gamma": rng.standard_normal(768).astype(np.float32),
                 "beta": rng.standard_normal(768).astype(np.float32),
                 "sqrt2": np.array(np.sqrt(2.0), np.float32),
                 "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["l"], axis=-1),
             helper.make_node("Div", ["l", "sqrt2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["p"]),
             helper.make_node("Mul", ["l", "p"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    return _model(nodes, shape, constants), shape


def relu(rng) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """The memory-bound floor of the elementwise patterns above (same size as SiLU's)."""
    shape = (8, 64, 56, 56)
    return _model([helper.make_node("Relu", ["x"], ["y"])], shape, {}), shape


def softmax(rng) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    shape = (8, 12, 128, 128)
    return _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], shape, {}), shape


PATTERNS: dict[str, Callable] = {"relu": relu, "silu": silu, "groupnorm": groupnorm,
                                 "layernorm_gelu": layernorm_gelu, "softmax": softmax}


def prepare_ember(model_bytes: bytes, threads: int | None) -> Prepared:
    """A recipe for a worker process: the pattern compiled by ember."""
    module = ember.compile(onnx.load_from_string(model_bytes), threads=threads,
                           dynamic_batch=False)
    return Prepared(lambda inputs: [module(inputs["x"])])


def prepare_onnxruntime(model_bytes: bytes, threads: int | None) -> Prepared:
    """A recipe for a worker process: the pattern run by ONNX Runtime, configured as
    ``ember bench`` configures it (its workers stop spinning when a run returns, or they
    spin for hundreds of milliseconds and take a core from whoever runs next: see
    ``ember.bench.peers``)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.force_spinning_stop", "1")
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    return Prepared(lambda inputs: session.run(None, inputs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--patterns", nargs="+", choices=sorted(PATTERNS),
                        default=list(PATTERNS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2,
                        help="threads of both runtimes (default: 2)")
    parser.add_argument("--sample-ms", type=float, default=2.0,
                        help="each sample runs back-to-back calls for at least this long "
                             "after an idle pause (default 2 ms, as ember bench; longer "
                             "samples weigh the first, cold call less)")
    args = parser.parse_args(argv)

    print(f"CPU: {_cpu_name()}; {args.threads} threads; median of {args.rounds} interleaved "
          f"rounds, each runtime in its own process")
    print(f"{'pattern':16} {'shape':18} {'ember ms':>9} {'ORT ms':>9} {'ember/ORT':>10}")
    rng = np.random.default_rng(0)
    for name in args.patterns:
        model, shape = PATTERNS[name](rng)
        inputs = {"x": rng.standard_normal(shape).astype(np.float32)}
        data = model.SerializeToString()
        with IsolatedContender(Recipe(prepare_ember, (data, args.threads)), inputs,
                               args.threads) as ours, \
                IsolatedContender(Recipe(prepare_onnxruntime, (data, args.threads)), inputs,
                                  args.threads) as theirs:
            np.testing.assert_allclose(ours.outputs[0], theirs.outputs[0], rtol=1e-3,
                                       atol=1e-3)
            series = measure_interleaved({"ember": ours, "onnxruntime": theirs},
                                         rounds=args.rounds,
                                         min_sample_seconds=args.sample_ms / 1e3).series
        mine, peer = series["ember"].median, series["onnxruntime"].median
        print(f"{name:16} {'x'.join(map(str, shape)):18} {mine:9.3f} {peer:9.3f} "
              f"{mine / peer:10.2f}", flush=True)
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


if __name__ == "__main__":
    sys.exit(main())

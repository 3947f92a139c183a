"""Single ops of the issue tracker's table, each runtime timed alone in its own process.

``ember bench --ops`` times every contender in one process, interleaved.  On the 2-vCPU
machines here that understates whoever runs after ONNX Runtime: ORT's workers keep spinning
for well over 100 ms after a run, so the next contender's second thread shares a core (ember's
128x768 @ 768x3072 GEMM: 5.9 ms alone, 8.5-9.6 ms right after an ORT run even with a 100 ms
pause).  This script measures each runtime in a fresh process, one after the other, for the
same ONNX model, and reports medians and the ratio; read it beside the interleaved table.

    python benchmarks/ops_alone.py                  # every case, 2 threads
    python benchmarks/ops_alone.py gemm_transB conv3x3 --threads 1 --repeat 30
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _depthwise(channels: int, size: int, stride: int = 1) -> tuple:
    """A 3x3 depthwise convolution with bias over a square image, padded to keep its size."""
    return ("Conv", [1, channels, size, size],
            {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": channels,
             "strides": [stride, stride]}, [(channels, 1, 3, 3), (channels,)])


# name -> (node, input shape, weights): the single ops, and the zoo's GEMM shapes
CASES = {
    "conv_transpose": ("ConvTranspose", [1, 128, 32, 32],
                       {"kernel_shape": [2, 2], "strides": [2, 2]}, [(128, 64, 2, 2), (64,)]),
    "gemm_transB": ("Gemm", [64, 784], {"transB": 1}, [(1024, 784), (1024,)]),
    "conv3x3": ("Conv", [1, 64, 128, 128], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
                [(32, 64, 3, 3), (32,)]),
    "matmul_1024": ("MatMul", [1024, 1024], {}, [(1024, 1024)]),
    "bert_ffn_up": ("MatMul", [128, 768], {}, [(768, 3072)]),
    "bert_ffn_down": ("MatMul", [128, 3072], {}, [(3072, 768)]),
    "gemm_2048x768x3072": ("MatMul", [2048, 768], {}, [(768, 3072)]),
    # MobileNetV2's three kinds of convolution at its largest sizes
    "conv1x1_16to96_112": ("Conv", [1, 16, 112, 112], {"kernel_shape": [1, 1]},
                           [(96, 16, 1, 1), (96,)]),
    "dwconv3x3_144_56": _depthwise(144, 56),
    "dwconv3x3_384_14": _depthwise(384, 14),
    "dwconv3x3_s2_96_112": _depthwise(96, 112, stride=2),
    # grouped convolutions (ResNeXt, RegNet): a product per group on the GEMM template
    "grouped_conv3x3_256_g16_14": ("Conv", [1, 256, 14, 14],
                                   {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 16},
                                   [(256, 16, 3, 3), (256,)]),
    "grouped_conv3x3_128_g8_28": ("Conv", [1, 128, 28, 28],
                                  {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 8},
                                  [(128, 16, 3, 3), (128,)]),
    # recurrent layers, written out over their time steps (passes/unroll_recurrent.py)
    "lstm_t32_h128": ("LSTM", [32, 1, 64], {"hidden_size": 128},
                      [(1, 512, 64), (1, 512, 128), (1, 1024)]),
    "gru_t32_h128": ("GRU", [32, 1, 64], {"hidden_size": 128},
                     [(1, 384, 64), (1, 384, 128), (1, 768)]),
    "lstm_bidir_t16_b8": ("LSTM", [16, 8, 64], {"hidden_size": 96,
                                                "direction": "bidirectional"},
                          [(2, 384, 64), (2, 384, 96), (2, 768)]),
    # TopK by selection passes (K <= 8) and by counted ranks (sorts of lines up to 512)
    "topk_8_of_2048": ("TopK", [8, 2048], {}, [np.array([8])]),
    "topk_smallest_5_of_1000": ("TopK", [32, 1000], {"largest": 0}, [np.array([5])]),
    "moe_router_top2_of_8": ("TopK", [256, 8], {}, [np.array([2])]),
    "sort_64x256": ("TopK", [64, 256], {}, [np.array([256])]),
    # scatters (repeated positions): slices of rows added, elements replaced
    "scatter_nd_add_slices": ("ScatterND", [64, 512, 64], {"reduction": "add"},
                              [np.arange(100).reshape(100, 1) % 64, (100, 512, 64)]),
    "scatter_elements_300_of_1000": (
        "ScatterElements", [256, 1000], {"axis": 1},
        [np.random.default_rng(2).integers(0, 1000, (256, 300)), (256, 300)]),
}
# ops whose outputs beyond the first the case leaves unread (TopK's indices)
EXTRA_OUTPUTS = {"TopK": 1}

CHILD = r"""
import json, sys, time
import numpy as np
runtime, path, threads, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
x = np.random.default_rng(0).standard_normal(json.loads(sys.argv[5])).astype(np.float32)
if runtime == "ember":
    import ember
    model = ember.compile(path)
    model.set_num_threads(threads)
    run = lambda: model(x)
else:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    run = lambda: session.run(None, {"x": x})
for _ in range(3):
    run()
samples = []
for _ in range(repeat):
    start = time.perf_counter()
    run()
    samples.append(time.perf_counter() - start)
print(json.dumps(sorted(samples)[len(samples) // 2] * 1e3))
"""


def build_model(name: str) -> onnx.ModelProto:
    """The case's one-node model: ``x`` and constants, random floats of the shapes given, or
    the integer arrays given (a K, indices) as int64."""
    op, x_shape, attrs, weights = CASES[name]
    rng = np.random.default_rng(1)
    names = [f"w{i}" for i in range(len(weights))]
    extra = [f"unread{i}" for i in range(EXTRA_OUTPUTS.get(op, 0))]
    node = helper.make_node(op, ["x", *names], ["y", *extra], **attrs)
    constants = [np.asarray(w, dtype=np.int64) if isinstance(w, np.ndarray) else
                 rng.standard_normal(w).astype(np.float32) for w in weights]
    graph = helper.make_graph(
        [node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(c, n) for n, c in zip(names, constants)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def time_alone(runtime: str, path: Path, x_shape: list[int], threads: int, repeat: int) -> float:
    result = subprocess.run([sys.executable, "-c", CHILD, runtime, str(path), str(threads),
                             str(repeat), json.dumps(x_shape)],
                            capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", metavar="CASE",
                        help=f"cases to run (default: all): {', '.join(CASES)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternate ember/ORT processes this many times per case")
    args = parser.parse_args()
    unknown = [name for name in args.cases if name not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    print(f"{'case':28s} {'ember ms':>9s} {'ORT ms':>9s} {'ORT/ember':>9s}   (medians, "
          f"{args.threads} thread(s), each runtime alone in its process)")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.cases or list(CASES):
            path = Path(folder) / f"{name}.onnx"
            onnx.save(build_model(name), path)
            x_shape = CASES[name][1]
            times: dict[str, list[float]] = {"ember": [], "ort": []}
            for _ in range(args.rounds):
                for runtime in times:
                    times[runtime].append(time_alone(runtime, path, x_shape, args.threads,
                                                     args.repeat))
            ember_ms, ort_ms = min(times["ember"]), min(times["ort"])
            print(f"{name:28s} {ember_ms:9.3f} {ort_ms:9.3f} {ort_ms / ember_ms:8.2f}x")


if __name__ == "__main__":
    main()

"""Helpers of the export tests: the bundled model and one with two inputs, two outputs, a
run-time index input and names no C identifier could hold; building and feeding
examples/c/run_model.c."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ember.frontend.onnx import import_onnx
from ember.interp import ReferenceExecutor

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLE = REPOSITORY / "examples" / "c" / "run_model.c"
TINYNET = REPOSITORY / "ember" / "models" / "tinynet.onnx"

# Names with quotes, a comment terminator, a newline, a backslash and non-ASCII text: they
# reach the C API only as escaped string literals.
HOSTILE_INPUT = 'ids"\n*/ \\ évil'
HOSTILE_OUTPUT = 'y/out "quoted"'


def two_way_model() -> onnx.ModelProto:
    """x[2, 5] float -> Relu(x @ w) as HOSTILE_OUTPUT; ids[3] int64 -> table rows as
    'rows' (ids are range-checked at run time)."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "w")
    table = numpy_helper.from_array(rng.standard_normal((6, 3)).astype(np.float32), "table")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
             helper.make_node("Relu", ["h"], [HOSTILE_OUTPUT], name="clamp"),
             helper.make_node("Gather", ["table", HOSTILE_INPUT], ["rows"], axis=0,
                              name="lookup")]
    graph = helper.make_graph(
        nodes, "two_way",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5]),
         helper.make_tensor_value_info(HOSTILE_INPUT, TensorProto.INT64, [3])],
        [helper.make_tensor_value_info(HOSTILE_OUTPUT, TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("rows", TensorProto.FLOAT, [3, 3])],
        initializer=[w, table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=9)


def two_way_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    return {"x": rng.standard_normal((2, 5)).astype(np.float32),
            HOSTILE_INPUT: np.array([5, 0, 2], np.int64)}


def reference(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]
              ) -> dict[str, np.ndarray]:
    """ember's numpy reference executor on the ONNX model: the oracle."""
    return ReferenceExecutor(import_onnx(model)).run(feeds)


def compile_example(directory: Path, prefix: str, out: Path, static: bool = False,
                    compiler: list[str] | None = None, extra: list[str] | None = None) -> Path:
    """examples/c/run_model.c built against an export, with ``cc`` (or ``compiler``)."""
    command = [*(compiler or [shutil.which("cc") or "cc"]), "-O2", "-std=c11", "-Wall",
               "-Werror", f"-I{directory}", f"-DMODEL={prefix}", str(EXAMPLE)]
    if static:
        command += [str(directory / f"lib{prefix}.a"), "-lm", "-pthread"]
    else:
        command += [f"-L{directory}", f"-l{prefix}", f"-Wl,-rpath,{directory}"]
    command += [*(extra or []), "-o", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return out


def write_inputs(directory: Path, arrays: list[np.ndarray]) -> list[str]:
    """Each array's raw bytes in its own file; the run_model arguments naming them."""
    arguments = []
    for i, array in enumerate(arrays):
        path = directory / f"input{i}.bin"
        path.write_bytes(np.ascontiguousarray(array).tobytes())
        arguments += ["-i", str(path)]
    return arguments


def sequence_model() -> onnx.ModelProto:
    """x[1, seq, 8] -> Relu(Softmax(x @ w, axis=1)): a length the export may take at run
    time."""
    w = numpy_helper.from_array(
        np.random.default_rng(5).standard_normal((8, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
             helper.make_node("Softmax", ["h"], ["s"], axis=1, name="over_positions"),
             helper.make_node("Relu", ["s"], ["y"], name="clamp")]
    graph = helper.make_graph(
        nodes, "seqnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", 8])], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)

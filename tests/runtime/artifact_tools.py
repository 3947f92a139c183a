"""What an attacker does to an artifact, for the tampering tests.

The digests are recomputed here from the format's definition (SHA-256 of every file; the
manifest's SHA-256 over its canonical JSON without the digest field), not with the writer's
code, so the tests also pin the format.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "manifest_sha256"


def mlp_model(batch: int = 3, seed: int = 0):
    """x[batch, 16] -> MatMul/Add/Relu/MatMul -> y[batch, 4], with random weights."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 4)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        initializer=[w1, b1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def numpy_mlp(model, x: np.ndarray) -> np.ndarray:
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"]


def canonical_digest(manifest: dict[str, Any]) -> str:
    body = {key: value for key, value in manifest.items() if key != DIGEST}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def read_manifest(artifact: Path) -> dict[str, Any]:
    return json.loads((artifact / "manifest.json").read_text())


def write_manifest(artifact: Path, manifest: Any, reseal: bool = True) -> None:
    """Write ``manifest``; with ``reseal`` recompute its digest as an attacker would."""
    if reseal and isinstance(manifest, dict):
        manifest = {**manifest, DIGEST: canonical_digest(manifest)}
    (artifact / "manifest.json").write_text(json.dumps(manifest, indent=1))


def edit_manifest(artifact: Path, edit: Callable[[dict[str, Any]], Any],
                  reseal: bool = True) -> None:
    """Change the manifest in place with ``edit`` (its return value is ignored)."""
    manifest = read_manifest(artifact)
    edit(manifest)
    write_manifest(artifact, manifest, reseal)


def refresh_digests(artifact: Path) -> None:
    """Recompute every file digest listed in the manifest, then the manifest's own."""
    manifest = read_manifest(artifact)
    for name in manifest.get("files", {}):
        path = artifact / name
        if path.is_file() and not path.is_symlink():
            manifest["files"][name] = hashlib.sha256(path.read_bytes()).hexdigest()
    write_manifest(artifact, manifest)


LOAD_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import ember.runtime
    try:
        ember.runtime.load(sys.argv[2])
        print(json.dumps({"error": None, "message": ""}))
    except Exception as error:
        print(json.dumps({"error": type(error).__name__, "message": str(error)}))
""")


def load_in_subprocess(artifact: Path, timeout: float = 60) -> dict[str, Any]:
    """Load ``artifact`` with ember.runtime in a fresh process (a hang fails the test by the
    timeout instead of blocking the test run); the error's type name and message."""
    result = subprocess.run([sys.executable, "-c", LOAD_CHILD, str(ROOT), str(artifact)],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def compile_c(source: str, output: Path) -> Path:
    """A shared library from C ``source`` with the compiler ember uses."""
    from ember.toolchain import find_compiler

    c_file = output.with_suffix(".c")
    c_file.write_text(source)
    command = [*find_compiler().argv, "-shared", "-fPIC", "-o", str(output), str(c_file)]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return output


# The TopK of topk_model: 9 smallest of lines of 600 -- past what the compiled TopK takes
# (up to 8 values by selection from any line, any K from lines of up to 512 by counting
# ranks), so the node stays a host node running its numpy reference.
TOPK_ROWS, TOPK_LENGTH, TOPK_K = 3, 600, 9


def topk_model():
    """x[3, 600] -> Relu -> TopK(k=9, smallest: no compiled kernel, a host node) -> Mul 2 ->
    y, indices."""
    k = numpy_helper.from_array(np.array([TOPK_K], np.int64), "k")
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("TopK", ["r", "k"], ["values", "indices"], axis=1, largest=0,
                              name="topk"),
             helper.make_node("Mul", ["values", "two"], ["y"], name="mul")]
    graph = helper.make_graph(
        nodes, "topk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [TOPK_ROWS, TOPK_LENGTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [TOPK_ROWS, TOPK_K]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, [TOPK_ROWS, TOPK_K])],
        initializer=[k, two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def numpy_topk(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The outputs of :func:`topk_model` for ``x`` with distinct positive values per row."""
    indices = np.argsort(x, axis=1, kind="stable")[:, :TOPK_K]  # the smallest
    return 2 * np.take_along_axis(x, indices, axis=1), indices

"""A saved artifact runs in a fresh process that can import only numpy and ember.runtime.

The child process installs an import blocker for onnx, onnxruntime, torch, ml_dtypes, rich and
every compiler layer of ember, loads the artifact with ``ember.runtime.load`` and checks its
output against the numpy oracle computed here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from artifact_tools import edit_manifest
from ember.core.errors import ModelLoadError

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import sys, json
    import importlib.abc

    BLOCKED = ("onnx", "onnxruntime", "torch", "ml_dtypes", "rich", "safetensors")
    COMPILER = ("ember.core", "ember.ir", "ember.ops", "ember.passes", "ember.interp",
                "ember.frontend", "ember.lower", "ember.schedule", "ember.codegen",
                "ember.toolchain", "ember.driver", "ember.package", "ember.api", "ember.cli")

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCKED or name.startswith(COMPILER):
                raise ImportError(f"blocked in this test: {name}")
            return None

    sys.meta_path.insert(0, Blocker())
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import ember.runtime
    model = ember.runtime.load(sys.argv[2])
    x = np.load(sys.argv[3])
    out = model.run({"x": x})["y"]
    np.save(sys.argv[4], out)
    loaded = sorted(m for m in sys.modules if m == "ember" or m.startswith("ember."))
    print(json.dumps(loaded))
""")


def _mlp_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 4)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                              initializer=[w1, b1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _numpy_mlp(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"]


def test_artifact_runs_with_only_numpy_and_the_runtime(tmp_path):
    model = _mlp_model()
    module = ember.compile(model)
    assert module.build.host_nodes == [], module.report()
    artifact = module.save(tmp_path / "mlp.ember")
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = subprocess.run(
        [sys.executable, "-I", "-c", CHILD, str(ROOT), str(artifact), str(tmp_path / "x.npy"),
         str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(m == "ember" or m.startswith("ember.runtime") for m in loaded), loaded
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), _numpy_mlp(model, x), rtol=1e-4,
                               atol=1e-4)


def test_corrupted_artifact_is_refused(tmp_path):
    module = ember.compile(_mlp_model())
    artifact = module.save(tmp_path / "mlp.ember")
    weights = artifact / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="corrupted"):
        ember.load(artifact)


def test_artifact_for_another_cpu_is_refused(tmp_path):
    module = ember.compile(_mlp_model())
    artifact = module.save(tmp_path / "mlp.ember")
    # resealed (the digest only proves the manifest is intact, not where it came from)
    edit_manifest(artifact, lambda m: m["target"].update(
        required_features=["avx512f", "imaginary_isa_extension"]))
    with pytest.raises(ModelLoadError, match="imaginary_isa_extension"):
        ember.load(artifact)


def test_not_an_artifact(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        ember.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="not an ember artifact"):
        ember.load(tmp_path / "empty")

"""benchmarks/fusion.py: kernel counts and memory at opt level 0 vs 2, checked on a tiny zoo
model against PyTorch eager (the script's own oracle) -- no timing here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fusion.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("fusion_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_fusion_benchmark_reports_fewer_kernels_and_correct_outputs(tmp_path, zoo_cache):
    out = tmp_path / "fusion.json"
    status = _load_script().main(["--quick", "--models", "mlp", "--no-timing", "--json",
                                  str(out), "--cache-dir", str(zoo_cache)])
    assert status == 0
    (result,) = json.loads(out.read_text())["results"]
    o0, o2 = result["levels"]["0"], result["levels"]["2"]
    assert o0["agrees"] is True and o2["agrees"] is True  # both match torch eager
    assert o0["fallbacks"] == o2["fallbacks"] == 0
    # Gemm+Gelu and Gemm+Softmax fuse: fewer kernels, each value's memory reused
    assert o2["kernels"] < o0["kernels"] and o2["fused_kernels"] >= 1
    assert 0 < o2["workspace_bytes"] <= o2["naive_bytes"]
    assert result["agreement"]["onnxruntime"].startswith("ok")

"""ember's main job on the bundled default model (``make demo``).

Imports ember/models/tinynet.onnx, shows its IR summary, runs it with ember's reference
executor on a random batch, and checks the result against ONNX Runtime.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ember.frontend.onnx import import_onnx  # noqa: E402
from ember.interp import ReferenceExecutor  # noqa: E402
from ember.models import default_model_path  # noqa: E402


def main() -> int:
    path = default_model_path()
    print(f"model: {path.name}")
    graph = import_onnx(path)
    print(f"  inputs:  {', '.join(f'{n}: {graph.types[n]}' for n in graph.inputs)}")
    print(f"  outputs: {', '.join(f'{n}: {graph.types[n]}' for n in graph.outputs)}")
    print(f"  {len(graph.nodes)} nodes, {graph.parameter_count():,} parameters; ops: "
          + ", ".join(f"{op}×{count}" for op, count in graph.op_histogram().items()))

    batch = 4
    x = np.random.default_rng(0).standard_normal((batch, 3, 32, 32)).astype(np.float32)
    executor = ReferenceExecutor(graph)
    start = time.perf_counter()
    ours = executor.run({"input": x})["logits"]
    elapsed = time.perf_counter() - start
    print(f"ember reference executor: batch {batch} -> {ours.shape} in {elapsed * 1e3:.1f} ms")

    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {"input": x})[0]
    error = float(np.max(np.abs(ours - theirs)))
    same_classes = bool(np.array_equal(ours.argmax(1), theirs.argmax(1)))
    print(f"ONNX Runtime agrees: max |diff| = {error:.2e}, same predicted classes: {same_classes}")
    ok = error < 1e-4 and same_classes
    print("demo: OK" if ok else "demo: MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

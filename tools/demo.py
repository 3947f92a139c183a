"""ember's main job on the bundled default model (``make demo``).

Imports ember/models/tinynet.onnx, compiles it to one native library, saves the artifact,
reloads it with the numpy-only runtime, checks the outputs against ONNX Runtime and ember's
reference executor, and compares latency with ONNX Runtime (interleaved rounds, medians).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ember  # noqa: E402
import ember.runtime  # noqa: E402
from ember.frontend.onnx import import_onnx  # noqa: E402
from ember.interp import ReferenceExecutor  # noqa: E402
from ember.models import default_model_path  # noqa: E402

BATCH = 8
ROUNDS = 30


def _median_ms(fn, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> int:
    import onnxruntime

    path = default_model_path()
    graph = import_onnx(path)
    print(f"model: {path.name}: {len(graph.nodes)} nodes, {graph.parameter_count():,} "
          f"parameters; input {graph.types['input']}, output {graph.types['logits']}")

    x = np.random.default_rng(0).standard_normal((BATCH, 3, 32, 32)).astype(np.float32)
    start = time.perf_counter()
    module = ember.compile(path, input_shapes={"input": x.shape})
    print(f"compiled for batch {BATCH} in {time.perf_counter() - start:.2f} s")
    print("  " + module.report().replace("\n", "\n  "))

    with tempfile.TemporaryDirectory() as tmp:
        artifact = module.save(Path(tmp) / "tinynet.ember")
        files = ", ".join(sorted(p.name for p in artifact.iterdir()))
        deployed = ember.runtime.load(artifact) if not module.build.host_nodes else \
            ember.load(artifact)
        ours = deployed.run({"input": x})["logits"]
        print(f"artifact {artifact.name}/ ({files}) reloaded and run")
        if isinstance(deployed, ember.runtime.BatchBlockedModel):
            odd = np.random.default_rng(1).standard_normal((BATCH + 3, 3, 32, 32)).astype(
                np.float32)
            other = deployed.run({"input": odd})["logits"]
            check = ReferenceExecutor(graph).run({"input": odd})["logits"]
            print(f"  it runs any batch size in blocks of {deployed.block_sizes}: batch "
                  f"{BATCH + 3} matches the reference within "
                  f"{float(np.max(np.abs(other - check))):.1e}")

    reference = ReferenceExecutor(graph).run({"input": x})["logits"]
    # As ember bench runs it: ONNX Runtime's workers stop spinning when a run returns;
    # otherwise they spin on for hundreds of milliseconds and take a core from ember's
    # calls timed next in this process (see ember/bench/peers.py).
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.force_spinning_stop", "1")
    session = onnxruntime.InferenceSession(str(path), options,
                                           providers=["CPUExecutionProvider"])
    theirs = session.run(None, {"input": x})[0]
    err_ort = float(np.max(np.abs(ours - theirs)))
    err_ref = float(np.max(np.abs(ours - reference)))
    same = bool(np.array_equal(ours.argmax(1), theirs.argmax(1)))
    print(f"max |ember - ONNX Runtime| = {err_ort:.2e}, max |ember - reference| = "
          f"{err_ref:.2e}, same predicted classes: {same}")

    ember_ms, ort_ms = [], []
    for _ in range(3):  # interleave the contenders; machines here are shared and noisy
        ember_ms.append(_median_ms(lambda: module(x), ROUNDS))
        ort_ms.append(_median_ms(lambda: session.run(None, {"input": x}), ROUNDS))
    e, o = statistics.median(ember_ms), statistics.median(ort_ms)
    print(f"latency, batch {BATCH} (median): ember {e:.3f} ms, ONNX Runtime {o:.3f} ms "
          f"-> ember is {o / e:.2f}x ONNX Runtime's speed")
    ok = err_ort < 1e-3 and same
    print("demo: OK" if ok else "demo: MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

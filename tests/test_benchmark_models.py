"""The benchmark models (benchmarks/models.py) are valid ONNX and mean what ONNX Runtime says.

The speed comparison in benchmarks/bench_compiled.py is only worth something if ember and ONNX
Runtime run the same, correct graph. So each builder's model, at small sizes that keep this file
well under 20 s, must pass the ONNX checker and give the same outputs under ONNX Runtime and
under ember's reference executor (the semantics ember's compiled code is tested against).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.models import OPSET, bert, example_inputs, mlp, resnet18  # noqa: E402
from ember.frontend.onnx import import_onnx  # noqa: E402
from ember.interp import ReferenceExecutor  # noqa: E402

ort = pytest.importorskip("onnxruntime")

# name -> builder at test size (batch 1, image 32 for ResNet, seq 16 and hidden 64 for BERT).
SMALL: dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp_matmul": lambda: mlp(1),
    "mlp_gemm_b3": lambda: mlp(3, use_gemm=True),
    "resnet18_32": lambda: resnet18(1, image=32),
    "bert_tiny": lambda: bert(1, seq=16, layers=2, hidden=64, heads=4, vocab=1000),
}


def _ops(model: onnx.ModelProto) -> set[str]:
    return {node.op_type for node in model.graph.node}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_model_matches_onnxruntime(name: str) -> None:
    model = SMALL[name]()
    onnx.checker.check_model(model, full_check=True)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [OPSET]

    feeds = example_inputs(model)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    graph = import_onnx(model)
    actual = ReferenceExecutor(graph).run(feeds)
    for output, want in zip(graph.outputs, expected):
        got = actual[output]
        assert got.shape == want.shape and got.dtype == want.dtype
        assert np.all(np.isfinite(want))
        # float32 sums in different orders: relative to the output's scale.
        scale = float(np.max(np.abs(want)))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(scale, 1.0))


def test_models_are_deterministic() -> None:
    """Same arguments, same bytes: benchmark figures stay comparable between runs."""
    assert mlp(1).SerializeToString() == mlp(1).SerializeToString()
    assert mlp(1, seed=1).SerializeToString() != mlp(1).SerializeToString()


def test_resnet18_topology() -> None:
    """A real ResNet-18: 20 convs (stem, 16 in blocks, 3 downsample), each with its BN."""
    model = resnet18(1, image=32)
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("Conv") == 20 and ops.count("BatchNormalization") == 20
    assert ops.count("Add") == 8 and ops.count("MaxPool") == 1
    assert {"GlobalAveragePool", "Flatten", "Gemm"} <= set(ops)
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer
                 if not t.name.endswith(("running_mean", "running_var")))
    assert params == 11_689_512  # torchvision resnet18's parameter count
    stem = model.graph.node[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in stem.attribute}
    assert attrs["kernel_shape"] == [7, 7] and attrs["strides"] == [2, 2]
    with pytest.raises(ValueError):
        resnet18(1, image=100)


def test_bert_structure() -> None:
    """Per layer: 6 MatMul+Add linears, 2 attention MatMuls, Erf GELU, 2 LayerNorms."""
    layers, hidden = 3, 64
    model = bert(2, seq=16, layers=layers, hidden=hidden, heads=4, vocab=500)
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("MatMul") == 8 * layers
    assert ops.count("LayerNormalization") == 1 + 2 * layers
    assert ops.count("Softmax") == layers and ops.count("Erf") == layers
    assert ops.count("Gather") == 2
    assert {"Reshape", "Transpose", "Div", "Cast", "Unsqueeze"} <= _ops(model)
    out = model.graph.output[0].type.tensor_type.shape
    assert [d.dim_value for d in out.dim] == [2, 16, hidden]
    with pytest.raises(ValueError):
        bert(1, heads=5)


def test_interleaved_timing_alternates_contenders() -> None:
    """The bench script's timing loop: order swaps every round, one sample each per round."""
    from benchmarks.bench_compiled import Result, Timing, measure_interleaved

    calls: list[str] = []
    contenders = {"ember": lambda: calls.append("ember"), "ort": lambda: calls.append("ort")}
    result = Result("fake", "size")
    measured = measure_interleaved(contenders, 4, warmup=1, settle_seconds=0)
    result.ember, result.ort = measured.series["ember"], measured.series["ort"]
    assert len(result.ember.samples_ms) == len(result.ort.samples_ms) == 4
    k_e, k_o = result.ember.calls_per_sample, result.ort.calls_per_sample
    timed = calls[2 + 2:]  # after 1 warm-up round and one calibration call each
    runs = [(name, len(list(group))) for name, group in itertools.groupby(timed)]
    # Rounds E O | O E | E O | O E: neighbouring rounds merge into runs of two samples.
    assert runs == [("ember", k_e), ("ort", 2 * k_o), ("ember", 2 * k_e), ("ort", 2 * k_o),
                    ("ember", k_e)]
    assert Result("x", "y", ember=Timing([2.0]), ort=Timing([4.0])).ratio == 2.0

"""Whole models through the PyTorch frontend: ``torch.compile(backend="ember")`` and the AOT
path ``ember.compile(module, example_inputs)`` (torch.export).

The models are the zoo's (``ember.bench.zoo``) at their tiny sizes: ResNet-18 and -50 and
MobileNetV2 in plain torch, BERT and GPT-2 from transformers configs, MiniLM-L6 with its real
weights.  Each must match torch eager within rtol 1e-4 / atol 1e-5 with no op fallen back, and
serve other batch sizes without Dynamo recompiling and, every one of these graphs keeping its
samples apart, without ember compiling more than two specializations per part (the first
batch size and a batch-1 block: ``ember.passes.batch_split``).
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

import ember
from ember.bench.zoo import get_entry
from ember.torch_backend import REPORTS

RTOL, ATOL = 1e-4, 1e-5
MODELS = ["mlp", "resnet18", "resnet50", "mobilenet_v2", "bert_base", "gpt2", "minilm"]


def _built(name: str, batch: int):
    entry = get_entry(name)
    missing = entry.missing()
    if missing:
        pytest.fail(f"{name} needs {missing}: install ember[test]")
    return entry.build(batch, "tiny")


def _tensors(inputs: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in inputs.values())


class _Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, gm, example_inputs):
        from ember.torch_backend import ember_backend

        self.calls += 1
        return ember_backend(gm, example_inputs)


@pytest.mark.parametrize("name", MODELS)
def test_torch_compile_matches_eager_without_fallback(name: str, logged_builds) -> None:
    import torch._dynamo

    built = _built(name, 2)
    torch._dynamo.reset()
    backend = _Counting()
    start = len(REPORTS)
    compiled = torch.compile(built.module, backend=backend, dynamic=True)
    calls_after_first = None
    with torch.no_grad():
        for batch in (2, 3, 5):
            inputs = _tensors(built.inputs if batch == 2 else _built(name, batch).inputs)
            expected = built.module(*inputs)
            actual = compiled(*inputs)
            torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
            calls_after_first = calls_after_first or backend.calls
    assert backend.calls >= 1, "the model ran eagerly: the ember backend was never invoked"
    assert backend.calls == calls_after_first, "a second batch size made Dynamo recompile"
    reports = REPORTS.since(start)
    assert reports and all(r.compiled for r in reports)
    fallbacks = [f for r in reports for f in r.fallbacks]
    assert fallbacks == [], f"ops fell back to PyTorch: {fallbacks}"
    builds = logged_builds()
    parts = sum(r.kernels for r in reports)
    assert len(builds) <= 2 * parts, f"{len(builds)} builds for {parts} parts: {builds}"


@pytest.mark.parametrize("name", MODELS)
def test_aot_compile_through_torch_export(name: str) -> None:
    built = _built(name, 2)
    inputs = _tensors(built.inputs)
    module = ember.compile(built.module, inputs)
    with torch.no_grad():
        expected = built.module(*inputs)
    actual = module(*[t.numpy() for t in inputs])
    np.testing.assert_allclose(actual, expected.numpy(), rtol=RTOL, atol=ATOL)
    assert module.build.host_nodes == [], "nodes fell back to numpy references"

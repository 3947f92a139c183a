"""The ``torch.compile`` backend's contract: registration, fallback, zero-copy tensors,
training graphs, weight changes, ``ember.explain`` and the AOT path's errors.

The oracle is torch eager throughout.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
import torch._dynamo
from torch import nn

import ember
from ember.core.errors import EmberError, UnsupportedOpError
from ember.torch_backend import REPORTS, explain


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm(self.conv(x))).mean((2, 3))
        return torch.softmax(self.head(y), dim=-1)


# An op ember has no converter for: a custom op, defined with torch.library.
@torch.library.custom_op("ember_test::cube_plus_one", mutates_args=())
def cube_plus_one(x: torch.Tensor) -> torch.Tensor:
    return x * x * x + 1


@cube_plus_one.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class _WithCustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(cube_plus_one(self.fc(x))) * 2


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_backend_is_registered_by_name() -> None:
    from torch._dynamo.backends.registry import list_backends, lookup_backend

    assert "ember" in list_backends(exclude_tags=())
    model = _Block().eval()
    x = torch.randn(2, 3, 8, 8)
    start = len(REPORTS)
    with torch.no_grad():
        actual = torch.compile(model, backend="ember")(x)
        expected = model(x)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
    assert len(REPORTS) > start, "backend='ember' did not reach ember's backend"
    assert lookup_backend("ember").__name__ == "ember_backend"


def test_unsupported_op_falls_back_and_is_reported(caplog) -> None:
    model = _WithCustomOp().eval()
    x = torch.randn(3, 6)
    start = len(REPORTS)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="ember.torch"):
        actual = torch.compile(model, backend="ember")(x)
        expected = model(x)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    reports = REPORTS.since(start)
    fallbacks = [f for r in reports for f in r.fallbacks]
    assert [f.op for f in fallbacks] == ["ember_test.cube_plus_one.default"]
    assert "no converter" in fallbacks[0].reason
    assert reports[-1].kernels == 2  # the Linear before the custom op, tanh*2 after it
    assert "cube_plus_one" in caplog.text


def test_explain_lists_graph_breaks_fallbacks_and_flop_share() -> None:
    class Breaking(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(8, 8)
            self.fc2 = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc1(x)
            print("a graph break")  # Dynamo cannot trace print: the graph splits here
            return cube_plus_one(self.fc2(y))

    model, x = Breaking().eval(), torch.randn(2, 8)
    result = explain(model, x)
    assert result.graph_count == 2
    assert len(result.graph_breaks) == 1 and "print" in result.graph_breaks[0]
    assert [f.op for f in result.fallbacks] == ["ember_test.cube_plus_one.default"]
    # Every call counts: both Linear layers by PyTorch's formulas (2 x 2 x 8 x 8 each), the
    # custom op that PyTorch ran by its 2 x 8 output elements.
    assert result.flops_total >= 2 * (2 * 2 * 8 * 8) + 16
    assert result.flops_total - result.flops_compiled == 16
    assert result.compiled_flop_share < 1.0
    text = str(result)
    assert "fell back: ember_test.cube_plus_one.default" in text
    # graphs numbered within the explanation, not across the process
    assert "  graph 0:" in text and "  graph 1:" in text
    with torch.no_grad():  # the compiled model comes back, warm: no second compile
        torch.testing.assert_close(result.compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_explain_says_when_dynamo_captures_nothing() -> None:
    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.LSTM(4, 8)
            self.head = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(x)[0])

    result = explain(Recurrent().eval(), torch.randn(3, 2, 4))
    # Dynamo (allow_rnn off) leaves the whole forward to Python: nothing reached ember
    assert result.graph_count == 0 and not result.graphs
    assert result.compiled_flop_share == 0.0
    text = str(result)
    assert "0.0% of FLOPs compiled by ember" in text
    assert "captured no graph" in text and "LSTM" in text


class _Selecting(nn.Module):
    """A Linear, then topk (a compiled TopK of 3) and a scatter of its values (compiled), and
    ops ember converts but has no kernels for: a sort of lines longer than the compiled TopK
    sorts (a TopK of the whole axis, ascending), and a determinant."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 10)
        self.wide = nn.Linear(6, 600)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values, indices = torch.topk(torch.relu(self.fc(x)), 3, dim=-1)
        spread = torch.zeros(x.shape[0], 10).scatter(1, indices, values)
        lowest = torch.sort(self.wide(x), dim=-1)[0][:, :10]
        return spread + lowest + torch.linalg.det(x[:, :4].reshape(-1, 2, 2))[:, None]


def test_ops_without_kernels_run_in_pytorch_and_are_not_counted_compiled() -> None:
    model, x = _Selecting().eval(), torch.randn(4, 6)
    result = explain(model, x)
    fallen = {f.op: f.reason for f in result.fallbacks}
    assert set(fallen) == {"aten._linalg_det.default", "aten.sort.default"}
    assert "no kernel for Det" in fallen["aten._linalg_det.default"]
    assert "TopK kernel does not cover it" in fallen["aten.sort.default"]
    assert "a line of 600 elements" in fallen["aten.sort.default"]
    (graph,) = result.graphs
    assert graph.compiled_nodes == graph.compute_nodes - 2
    assert 0.0 < result.compiled_flop_share < 1.0
    with torch.no_grad():
        torch.testing.assert_close(result.compiled(x), model(x), rtol=1e-5, atol=1e-6)


def test_explain_counts_numpy_references_inside_ember_parts(monkeypatch) -> None:
    # Were TopK & co. handed to ember, they would run as numpy references inside its part:
    # the report must then count them out of what ember compiled.
    import ember.torch_backend.partition as partition

    monkeypatch.setattr(partition, "_compiled_by_ember", lambda graph: None)
    model, x = _Selecting().eval(), torch.randn(4, 6)
    result = explain(model, x)
    (graph,) = result.graphs
    assert not graph.fallbacks
    referenced = {f.op for f in graph.references}
    assert referenced == {"aten._linalg_det.default", "aten.sort.default"}
    assert graph.compiled_nodes == graph.compute_nodes - 2
    assert result.compiled_flop_share < 1.0
    assert "2 as numpy references" in str(result)
    with torch.no_grad():
        torch.testing.assert_close(result.compiled(x), model(x), rtol=1e-5, atol=1e-6)


def test_explain_leaves_other_compiled_models_alone() -> None:
    # torch._dynamo.explain resets Dynamo, which would make every model compiled before
    # compile again at its next call; ember.explain does not.
    calls = []

    def counting(gm, example_inputs):
        calls.append(1)
        return gm.forward

    first, x = _Block().eval(), torch.randn(1, 3, 8, 8)
    fast = torch.compile(first, backend=counting)
    with torch.no_grad():
        fast(x)
        compiled_before = len(calls)
        explain(_Selecting().eval(), torch.randn(4, 6))
        fast(x)
    assert compiled_before == 1 and len(calls) == 1


def test_tensors_cross_without_copies(monkeypatch) -> None:
    """An input tensor reaches ember's runtime as a view of its memory, and the output tensor
    is a view of the array the runtime wrote."""
    from ember.runtime.model import CompiledModel

    seen: dict[str, int] = {}
    original = CompiledModel._run

    def spy(self, feeds):
        for array in feeds.values():
            seen.setdefault("input", array.ctypes.data)
        outputs = original(self, feeds)
        seen["output"] = next(iter(outputs.values())).ctypes.data
        return outputs

    monkeypatch.setattr(CompiledModel, "_run", spy)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        y = torch.compile(model, backend="ember")(x)
    assert seen["input"] == x.data_ptr()
    assert seen["output"] == y.data_ptr()


def test_training_graph_runs_in_pytorch_whole(caplog) -> None:
    model = _Block().train()
    x = torch.randn(2, 3, 8, 8)
    start = len(REPORTS)
    with caplog.at_level(logging.WARNING, logger="ember.torch"):
        y = torch.compile(model, backend="ember")(x)
    y.sum().backward()  # autograd still works: PyTorch ran the graph
    assert model.conv.weight.grad is not None
    reports = REPORTS.since(start)
    assert reports and not any(r.compiled for r in reports)
    assert "training graph" in reports[0].reason and "no_grad" in caplog.text


def test_weights_changed_in_place_are_picked_up() -> None:
    model = nn.Linear(5, 3).eval()
    compiled = torch.compile(model, backend="ember")
    x = torch.randn(2, 5)
    with torch.no_grad():
        compiled(x)
        model.weight.mul_(2)  # in place: the frozen copy in ember is stale
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)


def test_weights_replaced_through_data_or_an_optimizer_step_are_picked_up() -> None:
    """``param.data = other`` leaves the version counter alone (it used to serve the old
    weights, silently); an optimizer step writes in place."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    compiled = torch.compile(model, backend="ember")
    x = torch.randn(4, 5)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
        model[0].weight.data = torch.randn(8, 5)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
        model[2].bias.data = model[2].bias.data + 1.0
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    model(x).square().sum().backward()
    optimizer.step()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x) + x)


class _BlocksBehindBreaks(nn.Module):
    """Three modules of one class, a graph break after each: Dynamo compiles the block's
    forward once and calls that one graph with each block's weights."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Residual() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
            torch._dynamo.graph_break()
        return x


def test_modules_of_one_class_keep_a_build_each() -> None:
    torch.manual_seed(0)
    model = _BlocksBehindBreaks().eval()
    compiled = torch.compile(model, backend="ember")
    x = torch.randn(2, 8, 6, 6)
    start = len(REPORTS)

    def builds() -> int:
        return sum(len(report.recompiles) for report in REPORTS.since(start))

    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        first = builds()
        assert first <= 2, [r.recompiles for r in REPORTS.since(start)]  # blocks 2, 3: once
        for _ in range(3):  # warm: no block compiles again
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        assert builds() == first
        model.blocks[1].conv.weight.mul_(0.5)  # in place: that block's build is redone
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        assert builds() == first + 1


def test_aot_compile_of_a_module_with_dynamic_batch(tmp_path) -> None:
    """The module serves every batch size, and so does its saved artifact (in blocks)."""
    model = _Block().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    module = ember.compile(model, (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: batch},))
    assert "batch" in str(module.graph.types[module.input_names[0]])
    for size in (1, 5):
        x = torch.randn(size, 3, 8, 8)
        with torch.no_grad():
            expected = model(x).numpy()
        np.testing.assert_allclose(module(x.numpy()), expected, rtol=1e-4, atol=1e-5)
    loaded = ember.load(module.save(tmp_path / "block.ember"))
    assert loaded.block_sizes == [5, 1]
    for size in (3, 11):
        x = torch.randn(size, 3, 8, 8)
        with torch.no_grad():
            expected = model(x).numpy()
        np.testing.assert_allclose(loaded(x.numpy()), expected, rtol=1e-4, atol=1e-5)


def test_aot_compile_names_every_unsupported_op() -> None:
    with pytest.raises(UnsupportedOpError) as caught:
        ember.compile(_WithCustomOp().eval(), (torch.randn(3, 6),))
    assert "ember_test.cube_plus_one.default" in str(caught.value)


def test_aot_compile_refuses_ops_without_kernels_unless_allowed(tmp_path, caplog) -> None:
    # The determinant and the sort of long lines (an ascending TopK of the whole axis)
    # convert but have no compiled kernel: the artifact would need ember's numpy references,
    # which the bare runtime does not have.  The topk of 3 and the scatter compile.
    model, x = _Selecting().eval(), torch.randn(4, 6)
    with pytest.raises(UnsupportedOpError) as caught:
        ember.compile(model, (x,))
    message = str(caught.value)
    assert "TopK (node 'sort')" in message and "TopK (node 'topk')" not in message
    assert "Det (node" in message and "ScatterElements" not in message
    assert "allow_fallbacks=True" in message

    module = ember.compile(model, (x,), allow_fallbacks=True)
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(module(x.numpy()), expected, rtol=1e-5, atol=1e-6)
    with caplog.at_level(logging.WARNING, logger="ember"):
        path = module.save(tmp_path / "references.ember")
    assert "ember.runtime.load() will refuse it" in caplog.text
    with pytest.raises(EmberError, match="ember.load"):
        ember.runtime.load(path)
    np.testing.assert_allclose(ember.load(path)(x.numpy()), expected, rtol=1e-5, atol=1e-6)


class _Pooling(nn.Module):
    """Keyword inputs, a dict of outputs (as transformers' ModelOutput)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.relu(self.embed(tokens)) * mask.unsqueeze(-1)
        return {"hidden": hidden, "pooled": hidden.sum(1) / mask.sum(1, keepdim=True)}


def test_aot_compile_takes_keyword_inputs_and_names_outputs_as_the_model_does() -> None:
    model = _Pooling().eval()
    tokens, mask = torch.randn(2, 5, 4), torch.ones(2, 5)
    batch = torch.export.Dim("batch", max=32)
    # the dynamic dims keyed by argument name, in another order than the signature's
    module = ember.compile(model, {"tokens": tokens, "mask": mask},
                           dynamic_shapes={"mask": {0: batch}, "tokens": {0: batch}})
    assert module.input_names == ["tokens", "mask"]
    assert module.graph.outputs == ["hidden", "pooled"]
    assert "batch" in str(module.graph.types["mask"])
    tokens, mask = torch.randn(3, 5, 4), (torch.rand(3, 5) > 0.3).float()
    mask[:, 0] = 1
    with torch.no_grad():
        expected = model(tokens=tokens, mask=mask)
    outputs = module.run({"mask": mask.numpy(), "tokens": tokens.numpy()})
    assert list(outputs) == ["hidden", "pooled"]
    for name in ("hidden", "pooled"):
        np.testing.assert_allclose(outputs[name], expected[name].numpy(), rtol=1e-5, atol=1e-6)


def test_aot_compile_restores_the_mode_of_every_submodule() -> None:
    # A wrapper left in training mode around a model in evaluation mode: export runs it all
    # in evaluation mode, then each part gets its own mode back (the inner model's dropout
    # stays off, as its owner set it).
    inner = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).eval()
    wrapper = nn.Sequential(inner, nn.ReLU())
    assert wrapper.training and not inner.training
    ember.compile(wrapper, (torch.randn(2, 4),))
    assert wrapper.training and wrapper[1].training
    assert not inner.training and not inner[1].training


def test_aot_compile_needs_example_inputs() -> None:
    with pytest.raises(EmberError, match="example inputs"):
        ember.compile(_Block())


def test_dynamic_batch_is_served_without_compiling_per_size(caplog) -> None:
    """torch.compile(dynamic=True): Dynamo hands one graph with a symbolic batch; ember
    compiles the first size and a batch-1 block, and every other size runs on those.
    (A call with batch 1 would get a graph of its own: Dynamo specializes sizes 0 and 1.)"""
    caplog.set_level(logging.INFO, logger="ember")
    model = _Block().eval()
    compiled = torch.compile(model, backend="ember", dynamic=True)
    with torch.no_grad():
        for size in (4, 3, 7, 4, 8, 5):
            x = torch.randn(size, 3, 8, 8)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    # (the image's size is symbolic too: one build serves every size of its class)
    builds = [r.getMessage() for r in caplog.records
              if "compiling a specialization" in r.getMessage() or
              "compiling once for every size" in r.getMessage()]
    assert len(builds) == 2, builds
    assert "the first call" in builds[0] and "=1 (compiled for 4)" in builds[1], builds


class _TanhGelu(nn.Module):
    """A Linear and the tanh approximation of GELU written out (transformers' gelu_new), its
    coefficient a Python float attribute and math.pi a global: Dynamo passes both as 0-d
    tensors, not constants."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.coefficient = 0.044715

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        inner = math.sqrt(2.0 / math.pi) * (h + self.coefficient * torch.pow(h, 3.0))
        return 0.5 * h * (1.0 + torch.tanh(inner))


def test_python_floats_are_frozen_so_patterns_see_constants(caplog) -> None:
    import ember.torch_backend.backend as backend

    torch._dynamo.reset()
    built = []
    original = backend._EmberKernel._module_for

    def recording(self, sizes):
        module = original(self, sizes)
        built.append(module)
        return module

    model = _TanhGelu().eval()
    fast = torch.compile(model, backend="ember", dynamic=True)
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(backend._EmberKernel, "_module_for", recording)
        caplog.set_level(logging.INFO, logger="ember")
        x = torch.randn(4, 8)
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
        graph = built[-1].build.graph
        assert "Gelu" in {n.op for n in graph.nodes}, sorted({n.op for n in graph.nodes})
        assert all(graph.types[name].shape != () for name in graph.inputs)
        # a new value recompiles with it; values that keep changing become run-time inputs
        for step in range(backend.MAX_FLOAT_RECOMPILES + 2):
            model.coefficient = 0.05 + 0.01 * step
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    messages = [r.getMessage() for r in caplog.records]
    assert any("Python floats of the graph have new values" in m for m in messages)
    assert any("they are run-time inputs from now on" in m for m in messages)
    torch._dynamo.reset()
